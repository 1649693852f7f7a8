# scripts/check-artifacts, function config_keys(): see the comment above it there for what it checks; arguments as passed there.
import sys, tomllib, yaml
defaults = tomllib.load(open(sys.argv[1], "rb"))
def kind(v):
    return "number" if isinstance(v, (int, float)) and not isinstance(v, bool) else type(v).__name__
bad = 0
for manifest in sys.argv[2:]:
    for doc in yaml.safe_load_all(open(manifest)):
        if not doc or doc.get("kind") != "ConfigMap" or "config.toml" not in doc.get("data", {}):
            continue
        cfg = tomllib.loads(doc["data"]["config.toml"])
        for section, table in cfg.items():
            if section not in defaults:
                print(f"{manifest}: unknown section [{section}]"); bad += 1; continue
            for key, value in table.items():
                if isinstance(value, dict):
                    if not all(isinstance(x, str) for x in value.values()):
                        print(f"{manifest}: {section}.{key}: librdkafka values must be strings"); bad += 1
                    continue
                if key not in defaults[section]:
                    print(f"{manifest}: unknown key {section}.{key}"); bad += 1
                elif kind(value) != kind(defaults[section][key]):
                    print(f"{manifest}: {section}.{key} is {kind(value)}, default.toml has {kind(defaults[section][key])}"); bad += 1
        print(f"{manifest}: {sum(len(t) for t in cfg.values())} keys")
sys.exit(1 if bad else 0)
