# scripts/check-artifacts, function split_builtin(): see the comment above it there for what it checks; arguments as passed there.
import sys, yaml
src, dst, crds = sys.argv[1], sys.argv[2], set(sys.argv[3:])
docs = [d for d in yaml.safe_load_all(open(src)) if d]
keep = [d for d in docs if d["kind"] not in crds]
yaml.safe_dump_all(keep, open(dst, "w"), sort_keys=False)
skipped = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in docs if d["kind"] in crds)
print(f"{len(keep)} built-in, skipped CRDs: {', '.join(skipped) or 'none'}")
