# scripts/check-artifacts, function extract_rules(): see the comment above it there for what it checks; arguments as passed there.
import sys, yaml
rules = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d and d["kind"] == "PrometheusRule"]
assert len(rules) == 1, f"expected one PrometheusRule, found {len(rules)}"
yaml.safe_dump(rules[0]["spec"], open(sys.argv[2], "w"), sort_keys=False)
