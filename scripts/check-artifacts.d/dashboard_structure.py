# scripts/check-artifacts, function dashboard_structure(): see the comment above it there for what it checks; arguments as passed there.
import json, re, sys, yaml
dash = json.load(open(sys.argv[1]))
source = open(sys.argv[2]).read()
metrics = set(re.findall(r'pub const [A-Z_]+: &str = "(deductor_[a-z0-9_]+)";', source))
histograms = {m for m in metrics if m.endswith("_seconds")}
known = metrics | {h + s for h in histograms for s in ("_bucket", "_sum", "_count")}
bad = []
for key in ("title", "uid", "panels", "templating", "schemaVersion"):
    if key not in dash:
        bad.append(f"no {key}")
variables = {v["name"] for v in dash.get("templating", {}).get("list", [])}
for v in ("datasource", "namespace", "job"):
    if v not in variables:
        bad.append(f"no ${v} variable")
ids, exprs = set(), []
for p in dash.get("panels", []):
    pid = p.get("id")
    if pid in ids:
        bad.append(f"panel id {pid} twice")
    ids.add(pid)
    g = p.get("gridPos", {})
    if not all(isinstance(g.get(k), int) for k in "hwxy") or g["x"] + g["w"] > 24:
        bad.append(f"panel {p.get('title')}: bad gridPos {g}")
    if p.get("type") == "row":
        continue
    if not p.get("title") or not p.get("targets"):
        bad.append(f"panel {pid}: no title or no targets")
    if p.get("datasource", {}).get("uid") != "${datasource}":
        bad.append(f"panel {p.get('title')}: not on the $datasource variable")
    for t in p.get("targets", []):
        e = t.get("expr", "")
        exprs.append(e)
        names = set(re.findall(r"\bdeductor_[a-z0-9_]+", e))
        if not names:
            bad.append(f"panel {p.get('title')}: {e!r} names no deductor metric")
        for n in sorted(names - known):
            bad.append(f"panel {p.get('title')}: {n} is not a metric of src/metrics.rs")
        for sel in re.findall(r"\bdeductor_[a-z0-9_]+(\{[^}]*\})?", e):
            if 'namespace=~"$namespace"' not in sel or 'job=~"$job"' not in sel:
                bad.append(f"panel {p.get('title')}: {e!r}: every selector takes $namespace and $job")
unused = sorted(m for m in metrics if not any(m in e for e in exprs))
print(f"{len(ids)} panels, {len(exprs)} queries, metrics not shown: {', '.join(unused) or 'none'}")
# promtool parses PromQL in rule files: one recording rule per query.
subst = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h", "$namespace": ".*", "$job": ".*"}
rules = []
for i, e in enumerate(exprs):
    for k, v in subst.items():
        e = e.replace(k, v)
    if "$" in e:
        bad.append(f"query {i}: an unknown Grafana variable in {e!r}")
    rules.append({"record": f"dashboard:query_{i}", "expr": e})
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[3], "w"))
for b in bad:
    print(b)
sys.exit(1 if bad else 0)
