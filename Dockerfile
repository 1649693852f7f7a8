# syntax=docker/dockerfile:1
#
# deductor container image.
#
#   docker build -t deductor:dev \
#     --build-arg REVISION="$(git rev-parse HEAD)" \
#     --build-arg CREATED="$(date -u +%Y-%m-%dT%H:%M:%SZ)" .
#   docker run --rm deductor:dev --version
#
# Stage 1 builds the release binary (rdkafka builds its bundled librdkafka,
# linked against the system OpenSSL and zlib) and its CycloneDX SBOM
# (cargo-cyclonedx, from Cargo.lock). Stage 2 is a slim Debian with only the
# shared libraries the binary needs, running as uid 10001, with the SBOM in
# /usr/share/doc/deductor/deductor.cdx.json and the OCI annotations as labels
# (scripts/check-artifacts checks both).
#
# REVISION (the git commit) goes into the binary too (`deductor --version`,
# the deductor_build_info metric): the build context has no .git, so
# build.rs takes it from DEDUCTOR_GIT_COMMIT; without it the binary says
# "unknown". SOURCE_DATE_EPOCH, when given, fixes the build date.

ARG RUST_VERSION=1
ARG DEBIAN_RELEASE=bookworm

# ---------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS builder

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# Build dependencies of rdkafka-sys (librdkafka: cmake or its own configure
# script, OpenSSL for TLS and SASL/SCRAM, zlib) and of fred's native TLS.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends cmake libssl-dev pkg-config zlib1g-dev \
 && rm -rf /var/lib/apt/lists/*

# The SBOM generator, pinned (the same version scripts/check-artifacts uses).
ARG CYCLONEDX_VERSION=0.5.9
RUN cargo install --locked --version "${CYCLONEDX_VERSION}" cargo-cyclonedx

WORKDIR /src

# Dependency layer: compile every dependency against stub sources, so that
# a change to src/ only recompiles deductor itself. This layer is rebuilt
# only when a manifest or Cargo.lock changes. Every target file the manifest
# names (path = "...": the library, extra binaries) gets a stub, since cargo
# refuses a manifest whose targets are missing. The workspace's other
# members (tools/*: the benchmark, the chaos suite and their testkit) are
# not built here, but cargo loads every member and --locked wants the whole
# Cargo.lock: their manifests come too (a new member needs a line here),
# each with an empty library as its stub.
COPY Cargo.toml Cargo.lock ./
COPY tools/bench/Cargo.toml tools/bench/
COPY tools/chaos/Cargo.toml tools/chaos/
COPY tools/testkit/Cargo.toml tools/testkit/
RUN mkdir -p src \
 && printf 'fn main() {}\n' > src/main.rs \
 && sed -n 's/^path *= *"\(.*\)"/\1/p' Cargo.toml | while read -r target; do \
      mkdir -p "$(dirname "$target")" && printf 'fn main() {}\n' > "$target"; \
    done \
 && for member in tools/*/; do mkdir -p "$member/src" && : > "$member/src/lib.rs"; done \
 && cargo build --release --locked --bin deductor \
 && rm -rf src tools benches examples tests \
    target/release/deductor* \
    target/release/deps/deductor-* target/release/deps/libdeductor-* \
    target/release/.fingerprint/deductor-*

# The real sources (lua/ and config/ are compiled in with include_str!).
# Only the service binary: the benchmark and chaos tools stay out of the image.
# The SBOM: the service's normal dependencies for the image's platform, as
# resolved by Cargo.lock (cargo-cyclonedx writes one per workspace member,
# deductor.sbom.json beside each Cargo.toml; the root one is the service's).
COPY . .
ARG REVISION=unknown
ARG SOURCE_DATE_EPOCH
RUN DEDUCTOR_GIT_COMMIT=${REVISION} cargo build --release --locked --bin deductor \
 && install -D -m 0755 target/release/deductor /out/deductor \
 && cargo cyclonedx --format json --spec-version 1.5 --no-build-deps \
      --target "$(rustc -vV | sed -n 's/^host: //p')" --override-filename deductor.sbom \
 && install -D -m 0644 deductor.sbom.json /out/deductor.cdx.json

# ---------------------------------------------------------------------------
FROM debian:${DEBIAN_RELEASE}-slim AS runtime

ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
# The repository the image is built from (a URL); pass it with --build-arg.
ARG SOURCE=unknown

LABEL org.opencontainers.image.title="deductor" \
      org.opencontainers.image.description="Applies promotion deductions from a Kafka event stream with atomic Redis Lua scripts" \
      org.opencontainers.image.source="${SOURCE}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.base.name="docker.io/library/debian:${DEBIAN_RELEASE}-slim"

# Runtime libraries only: CA roots for TLS to Kafka and Redis, OpenSSL 3, zlib.
# Versions are not pinned: the security updates of the Debian release are wanted.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates libssl3 zlib1g \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 deductor \
 && useradd --system --uid 10001 --gid 10001 --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin deductor

COPY --from=builder /out/deductor /usr/local/bin/deductor
# The CycloneDX SBOM of the binary (what ships, with versions and licenses).
COPY --from=builder /out/deductor.cdx.json /usr/share/doc/deductor/deductor.cdx.json

# Numeric ids, so that Kubernetes' runAsNonRoot can verify them.
USER 10001:10001

# /metrics, /healthz, /readyz (http.listen).
EXPOSE 9464

# The binary is PID 1 (exec form) and drains on SIGTERM within
# pipeline.drain_timeout_secs; give `docker stop` at least that (-t 30).
STOPSIGNAL SIGTERM

# The image has no curl: the binary checks its own /healthz. Pass
# --url when http.listen is not 0.0.0.0:9464.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/deductor", "healthcheck"]

ENTRYPOINT ["/usr/local/bin/deductor"]
CMD ["run"]
