"""Static checks of the Dockerfile (there is no Docker daemon here): the
image's OCI annotations and what makes the shipped image auditable.

Usage: dockerfile_check.py Dockerfile

- The runtime stage labels org.opencontainers.image.{source, revision,
  version, licenses} (and created), each non-empty; revision and version
  come from build arguments, licenses is the workspace's license.
- The builder stage passes the REVISION build argument to build.rs as
  DEDUCTOR_GIT_COMMIT (the build context has no .git), generates the SBOM
  with cargo-cyclonedx at a pinned version (the same one scripts/check-artifacts
  checks), and the runtime stage copies it into the image.
"""

import re
import sys

REQUIRED = ["source", "revision", "version", "licenses", "created"]


def main(path, license_expected, cyclonedx_version):
    text = open(path).read()
    # Join continuation lines, drop comments.
    lines = []
    for raw in re.sub(r"\\\n", " ", text).splitlines():
        if raw.strip() and not raw.lstrip().startswith("#"):
            lines.append(raw.strip())
    stages = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    problems = []
    if len(stages) < 2:
        return fail([f"expected a builder and a runtime stage, found {len(stages)}"])
    builder, runtime = stages[0], stages[-1]

    labels = {}
    for line in runtime:
        if line.upper().startswith("LABEL "):
            for key, value in re.findall(r'(\S+?)="([^"]*)"', line[6:]):
                labels[key] = value
    for name in REQUIRED:
        key = f"org.opencontainers.image.{name}"
        if not labels.get(key, "").strip():
            problems.append(f"runtime stage: no {key} label")
    if labels.get("org.opencontainers.image.licenses") != license_expected:
        problems.append(
            f"licenses label is {labels.get('org.opencontainers.image.licenses')!r}, "
            f"the workspace's license is {license_expected!r}")
    for name, arg in (("revision", "REVISION"), ("version", "VERSION"), ("source", "SOURCE"),
                      ("created", "CREATED")):
        value = labels.get(f"org.opencontainers.image.{name}", "")
        if f"${{{arg}}}" not in value:
            problems.append(f"{name} label does not come from the {arg} build argument")
        if not any(re.match(rf"ARG {arg}\b", l) for l in runtime):
            problems.append(f"runtime stage has no ARG {arg}")

    b = "\n".join(builder)
    if not re.search(r"^ARG REVISION\b", b, re.M):
        problems.append("builder stage has no ARG REVISION")
    if not re.search(r"DEDUCTOR_GIT_COMMIT=\$\{?REVISION\}?", b):
        problems.append("builder stage does not pass REVISION to build.rs as DEDUCTOR_GIT_COMMIT")
    m = re.search(r"cargo install .*cargo-cyclonedx", b)
    if not m:
        problems.append("builder stage does not install cargo-cyclonedx")
    elif not re.search(rf"--version[ =]{re.escape(cyclonedx_version)}\b.*cargo-cyclonedx|cargo-cyclonedx.*--version[ =]{re.escape(cyclonedx_version)}\b|CYCLONEDX_VERSION={re.escape(cyclonedx_version)}\b", b):
        problems.append(f"builder stage does not pin cargo-cyclonedx {cyclonedx_version}")
    if "cargo cyclonedx" not in b:
        problems.append("builder stage does not run cargo cyclonedx")
    r = "\n".join(runtime)
    if not re.search(r"COPY --from=builder \S*\.cdx\.json \S+", r):
        problems.append("runtime stage does not copy the SBOM (*.cdx.json) from the builder")
    if problems:
        return fail(problems)
    print("labels: " + ", ".join(f"{k}={v}" for k, v in sorted(labels.items())))
    return 0


def fail(problems):
    for p in problems:
        print(p)
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
