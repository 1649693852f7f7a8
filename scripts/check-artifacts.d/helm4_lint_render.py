# scripts/check-artifacts, function helm4_lint_render(): see the comment above it there for what it checks; arguments as passed there.
import sys, yaml, helm_python as helm
chart, all_values, kube = sys.argv[1:4]
bad = 0
for label, values in (("default", None), ("all features", yaml.safe_load(open(all_values)))):
    report = helm.lint(chart, values, strict=True, kube_version=kube)
    for m in report["messages"]:
        if m["severity"] >= 2:
            print(f"{label}: {m['path']}: {m['error']}")
            bad += 1
    for e in report["errors"]:
        print(f"{label}: {e}")
        bad += 1
    with helm.Chart.load(chart) as c:
        rendered = c.render(values, name="deductor", namespace="promotions")
        for path, text in rendered.items():
            if not path.endswith("NOTES.txt") and text.strip():
                list(yaml.safe_load_all(text))
sys.exit(1 if bad else 0)
