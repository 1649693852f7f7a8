"""The service's CycloneDX SBOM (cargo-cyclonedx, from Cargo.lock) against
the crates of its release build.

Usage: sbom_check.py SBOM.json CRATES.txt

CRATES.txt: `cargo tree -p deductor -e normal --target <triple> --prefix none
--format '{p}'` of the release build (one `name vX.Y.Z` per line, repeats and
`(*)` / `(proc-macro)` marks allowed). The SBOM must parse as CycloneDX JSON,
describe deductor as its main component, and list every one of those crates
with its version, a purl and a license (an id, a name or an expression).
Prints the crates with version and license; exits 1 naming what is missing.
"""

import json
import re
import sys


def licenses_of(component):
    out = []
    for entry in component.get("licenses", []) or []:
        if "expression" in entry:
            out.append(entry["expression"])
        lic = entry.get("license") or {}
        if lic.get("id") or lic.get("name"):
            out.append(lic.get("id") or lic.get("name"))
    return out


def main(sbom_path, crates_path):
    with open(sbom_path) as f:
        bom = json.load(f)
    problems = []
    if bom.get("bomFormat") != "CycloneDX":
        problems.append(f"bomFormat is {bom.get('bomFormat')!r}, not CycloneDX")
    if not str(bom.get("specVersion", "")).startswith("1."):
        problems.append(f"specVersion {bom.get('specVersion')!r}")
    main_component = (bom.get("metadata") or {}).get("component") or {}
    if main_component.get("name") != "deductor":
        problems.append(f"metadata.component is {main_component.get('name')!r}, not deductor")

    # Every component, nested ones included (cargo-cyclonedx nests the
    # binary's targets under the package).
    components = {}
    stack = list(bom.get("components", []))
    while stack:
        c = stack.pop()
        stack.extend(c.get("components", []) or [])
        components.setdefault((c.get("name"), c.get("version")), c)

    wanted = set()
    pattern = re.compile(r"^([A-Za-z0-9_.-]+) v(\S+)")
    with open(crates_path) as f:
        for line in f:
            m = pattern.match(line.strip())
            if m and m.group(1) != "deductor":
                wanted.add((m.group(1), m.group(2)))
    if not wanted:
        problems.append(f"{crates_path} names no crate (cargo tree failed?)")

    rows = []
    for name, version in sorted(wanted):
        c = components.get((name, version))
        if c is None:
            problems.append(f"{name} {version}: not in the SBOM")
            continue
        lics = licenses_of(c)
        if not lics:
            problems.append(f"{name} {version}: no license")
        if not str(c.get("purl", "")).startswith(f"pkg:cargo/{name}@{version}"):
            problems.append(f"{name} {version}: purl {c.get('purl')!r}")
        rows.append(f"{name:<40} {version:<16} {' OR '.join(lics)}")

    print(f"{len(rows)} crates of the release build in the SBOM ({len(components)} components):")
    for row in rows:
        print("  " + row)
    if problems:
        print(f"{len(problems)} problem(s):")
        for p in problems:
            print("  " + p)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
