# scripts/check-artifacts, function runbook_anchors(): see the comment above it there for what it checks; arguments as passed there.
import re, sys, yaml
spec = yaml.safe_load(open(sys.argv[1]))
headings = {re.sub(r"[^a-z0-9_ -]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", open(sys.argv[2]).read(), re.M)}
missing = [r["alert"] for g in spec["groups"] for r in g["rules"]
           if "alert" in r and "runbook_url" in r.get("annotations", {})
           and r["annotations"]["runbook_url"].rsplit("#", 1)[1] not in headings]
print("alerts without a runbook section:", ", ".join(missing) or "none")
sys.exit(1 if missing else 0)
