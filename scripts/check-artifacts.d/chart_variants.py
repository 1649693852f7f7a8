# scripts/check-artifacts, check "chart variants": every combination the docs
# describe, rendered and checked. Arguments: HELM CHART ROOT WORKDIR KUBE_VERSION.
#
# For each variant (Redis single / TLS / Cluster / Sentinel / Sentinel+TLS,
# Kafka plain / SASL / SASL over TLS, at_least_once / exactly_once, the
# secrets none / created as variables / created as files / existing as
# variables / existing as files, KEDA and tracing on or off, NetworkPolicy
# on) it:
#   - renders the chart (helm template, values.schema.json included);
#   - asserts the NetworkPolicy lets out every endpoint the rendered
#     config.toml names (bootstrap servers, the Redis url's hosts, sentinels
#     and Cluster nodes, the OTLP endpoint);
#   - asserts the pod uses only the Secret keys the config needs (the
#     sentinels' password only with Sentinel, the Kafka SASL password only
#     with SASL), that exactly_once pods get ids of their own, and that the
#     HTTP endpoints listen on the pod IP (httpListen);
#   - starts the pod's container as the kubelet would, without Kubernetes:
#     the ConfigMap and the Secret files mounted into a directory, the env
#     resolved (secretKeyRef, fieldRef, $(VAR)), a missing Secret key failing
#     the start; then runs `deductor check` with that config and env against
#     the dev stack's real servers where the topology exists there, with
#     only the addresses overridden (--brokers, --redis-url; and the Kafka
#     CA file's path, a volume of the pod);
# then checks that values.schema.json's `config` and config/default.toml
# agree key for key (and type for type), and that the chart refuses a
# shared transactional.id, a password in the Redis url and a sentinels'
# password without Sentinel.
import base64, copy, itertools, json, os, re, secrets, shutil, socket, subprocess, sys, tomllib
import yaml

helm, chart, root, work, kube_version = sys.argv[1:6]
work = os.path.join(work, "variants")
os.makedirs(work, exist_ok=True)
problems = []
notes = []


def problem(variant, text):
    problems.append(f"{variant}: {text}")


# ------------------------------------------------------------ the stack ---
def stack_env():
    env = {k: v for k, v in os.environ.items() if k.startswith("DEDUCTOR_")}
    if "DEDUCTOR_KAFKA_BROKERS" not in env:
        out = subprocess.run([f"{root}/scripts/dev-stack", "env"], capture_output=True, text=True)
        for line in out.stdout.splitlines():
            m = re.match(r"export (\w+)='(.*)'$", line)
            if m:
                env[m.group(1)] = m.group(2)
    return env


def answers(hostport):
    host, _, port = hostport.rpartition(":")
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except (OSError, ValueError):
        return False


def first_host(url):
    rest = url.split("://", 1)[-1]
    return re.split(r"[,/?]", rest)[0]


stack = stack_env()
servers = {
    "kafka": stack.get("DEDUCTOR_KAFKA_BROKERS", ""),
    "kafka-sasl": stack.get("DEDUCTOR_KAFKA_SASL_BROKERS", ""),
    "kafka-sasl-tls": stack.get("DEDUCTOR_KAFKA_TLS_BROKERS", ""),
    "single": stack.get("DEDUCTOR_REDIS_URL", ""),
    "cluster": stack.get("DEDUCTOR_REDIS_CLUSTER_URL", ""),
    "sentinel": stack.get("DEDUCTOR_REDIS_SENTINEL_URL", ""),
}
up = {k: bool(v) and answers(first_host(v) if "://" in v else v.split(",")[0]) for k, v in servers.items()}
kafka_ca = stack.get("DEDUCTOR_KAFKA_TLS_CA", "")
if os.environ.get("CI") == "true" and not (up["kafka"] and up["single"] and up["cluster"]):
    print(f"CI: the dev stack (Kafka, Redis, Redis Cluster) must be up for the checks: {up}")
    sys.exit(1)

binary = None
if any(up.values()):
    # `--test it` too: cargo then resolves the dependencies' features as
    # `cargo test` did, and the build scripts/test made is reused instead
    # of ~100 crates being compiled (and stored) again (as scripts/chaos).
    build = subprocess.run(["cargo", "build", "--quiet", "--locked", "--bin", "deductor", "--test", "it"], cwd=root,
                           capture_output=True, text=True)
    if build.returncode != 0:
        print("cargo build --bin deductor --test it failed:\n" + build.stderr[-3000:])
        sys.exit(1)
    binary = os.path.join(os.environ.get("CARGO_TARGET_DIR", f"{root}/target"), "debug", "deductor")


def redis_ports(topology):
    """host:port of every Redis data node of a dev-stack topology."""
    if topology == "single":
        return [first_host(servers["single"])]
    if topology == "cluster":
        url = servers["cluster"]
        return [first_host(url)] + re.findall(r"node=([^&]+)", url)
    if topology == "sentinel":
        ports = stack.get("DEDUCTOR_SENTINEL_REDIS_PORTS", "6385 6386").split()
        return [f"127.0.0.1:{p}" for p in ports]
    return []


# An ACL user of this run on the dev stack's Redis nodes, so that the
# secret variants authenticate for real. Removed at the end.
ACL_USER = "chart-variants"
ACL_PASSWORD = "cv-" + secrets.token_hex(12)
SASL_PASSWORD = stack.get("DEDUCTOR_KAFKA_SASL_PASSWORD", "deductor-secret")
SASL_USER = stack.get("DEDUCTOR_KAFKA_SASL_USERNAME", "deductor")
SASL_MECHANISM = stack.get("DEDUCTOR_KAFKA_SASL_MECHANISM", "SCRAM-SHA-512")
acl_nodes = []


def redis_cli(hostport, *args):
    host, _, port = hostport.rpartition(":")
    return subprocess.run(["redis-cli", "-h", host, "-p", port, *args], capture_output=True, text=True, timeout=10)


for topology in ("single", "cluster", "sentinel"):
    if not up[topology] or not shutil.which("redis-cli"):
        continue
    for node in redis_ports(topology):
        r = redis_cli(node, "ACL", "SETUSER", ACL_USER, "reset", "on", f">{ACL_PASSWORD}", "~*", "&*", "+@all")
        if r.returncode == 0 and r.stdout.strip() == "OK":
            acl_nodes.append(node)
        else:
            notes.append(f"ACL SETUSER on {node}: {r.stdout.strip()} {r.stderr.strip()}")

PREFIX = "chart-variants"
TOPICS = {"input_topic": f"{PREFIX}-orders", "outcome_topic": f"{PREFIX}-outcomes", "dlq_topic": f"{PREFIX}-orders.dlq"}
if up["kafka"]:
    for t in TOPICS.values():
        subprocess.run([f"{root}/scripts/dev-stack", "topic", t, "3"], capture_output=True)


# -------------------------------------------------------------- variants ---
REDIS = {
    "single": {"config": {"redis": {"url": "redis://redis-master.redis:6379"}}},
    "tls": {"config": {"redis": {"url": "rediss://redis-master.redis:6380",
                                 "tls_ca_file": "/etc/deductor-redis-ca/ca.crt"}}},
    "cluster": {"config": {"redis": {"url": "redis-cluster://redis-0.redis:7000?node=redis-1.redis:7001&node=redis-2.redis:7002"}},
                "networkPolicy": {"redis": {"ports": [7000, 7001, 7002, 7003, 7004, 7005]}}},
    "sentinel": {"redis": {"sentinel": {"enabled": True, "hosts": ["redis.redis.svc:26379", "redis-node-1.redis-headless.redis.svc:26380"],
                                        "masterSet": "deductor"}}},
    "sentinel-tls": {"redis": {"sentinel": {"enabled": True, "hosts": ["redis.redis.svc"], "masterSet": "deductor", "tls": True}},
                     "config": {"redis": {"tls_ca_file": "/etc/deductor-redis-ca/ca.crt"}}},
}
KAFKA = {
    "plain": {"config": {"kafka": {"brokers": "kafka-0.kafka:9092,kafka-1.kafka:9092"}}},
    "sasl": {"config": {"kafka": {"brokers": "kafka-0.kafka:9094",
                                  "consumer": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SASL_MECHANISM,
                                               "sasl.username": SASL_USER, "session.timeout.ms": 30000},
                                  "producer": {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": SASL_MECHANISM,
                                               "sasl.username": SASL_USER, "enable.ssl.certificate.verification": True}}}},
    "sasl-tls": {"config": {"kafka": {"brokers": "kafka-0.kafka:9093,kafka-1.kafka:9095",
                                      "consumer": {"security.protocol": "SASL_SSL", "sasl.mechanism": SASL_MECHANISM,
                                                   "sasl.username": SASL_USER, "ssl.ca.location": "/etc/deductor-ca/ca.crt"},
                                      "producer": {"security.protocol": "SASL_SSL", "sasl.mechanism": SASL_MECHANISM,
                                                   "sasl.username": SASL_USER, "ssl.ca.location": "/etc/deductor-ca/ca.crt"}}},
                 "extraVolumes": [{"name": "kafka-ca", "secret": {"secretName": "kafka-ca"}}],
                 "extraVolumeMounts": [{"name": "kafka-ca", "mountPath": "/etc/deductor-ca", "readOnly": True}]},
}
SECRETS = ["none", "created-env", "created-files", "existing-env", "existing-files"]


def merge(a, b):
    out = copy.deepcopy(a)
    for k, v in b.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else copy.deepcopy(v)
    return out


def variant_values(redis, kafka, secret, index):
    sentinel = redis.startswith("sentinel")
    sasl = kafka != "plain"
    v = {"networkPolicy": {"enabled": True},
         "config": {"kafka": dict(TOPICS, group_id=PREFIX), "redis": {"key_prefix": PREFIX}}}
    v = merge(v, REDIS[redis])
    v = merge(v, KAFKA[kafka])
    if index % 2:
        v = merge(v, {"config": {"kafka": {"delivery": "exactly_once"}}, "replicaCount": 3})
        if index % 4 == 1:
            v = merge(v, {"workloadKind": "StatefulSet", "staticMembership": {"enabled": True}})
    if index % 3 == 0:
        v = merge(v, {"autoscaling": {"keda": {"enabled": True, "maxReplicaCount": 6}}})
    if index % 3 == 1:
        v = merge(v, {"config": {"tracing": {"otlp_endpoint": "http://otel-collector.monitoring:4318"}},
                      "networkPolicy": {"otlp": {"peers": [{"namespaceSelector": {}}]}}})
    if index % 5 == 2:
        v = merge(v, {"httpListen": "all"})
    if secret == "none" and sasl:
        # No chart Secret: the SASL password from the operator's own Secret
        # through extraEnv (docs: secret properties in extraEnv).
        v = merge(v, {"extraEnv": [
            {"name": f"DEDUCTOR_KAFKA_{c}_SASL_PASSWORD",
             "valueFrom": {"secretKeyRef": {"name": "kafka-credentials", "key": "password"}}}
            for c in ("CONSUMER", "PRODUCER")]})
    if secret != "none":
        v = merge(v, {"config": {"redis": {"username": ACL_USER}}})
        if secret.startswith("created"):
            s = {"redisPassword": ACL_PASSWORD}
            if sasl:
                s["kafkaSaslPassword"] = SASL_PASSWORD
        else:
            s = {"existingSecret": "deductor-credentials"}
        if sentinel:
            # The dev stack's sentinels have no password: the Secret holds
            # none for them (docs: set the key's name to "").
            s["keys"] = {"sentinelPassword": ""}
        s["mountAsFiles"] = secret.endswith("files")
        v = merge(v, {"secret": s})
    return v


def existing_secret(redis, kafka):
    """The Secret the docs tell an operator to create: exactly the keys the config needs."""
    data = {"redis-password": ACL_PASSWORD}
    if kafka != "plain":
        data["kafka-sasl-password"] = SASL_PASSWORD
    return data


def render(name, values, extra=()):
    path = os.path.join(work, f"{name}.values.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(values, f)
    out = subprocess.run([helm, "template", "deductor", chart, "--namespace", "promotions", "--kube-version", kube_version,
                          "-f", path, *extra],
                         capture_output=True, text=True)
    return out, path


# --------------------------------------------------------------- checks ---
def config_endpoints(cfg):
    """(what, port) of every endpoint config.toml names."""
    eps = []
    for b in cfg.get("kafka", {}).get("brokers", "").split(","):
        b = re.sub(r"^[A-Za-z_]+://", "", b.strip())
        if b:
            m = re.search(r":(\d+)$", b)
            eps.append((f"kafka {b}", int(m.group(1)) if m else 9092))
    url = cfg.get("redis", {}).get("url", "redis://127.0.0.1:6379")
    sentinel = re.match(r"^rediss?-sentinel://", url) is not None
    rest = url.split("://", 1)[1]
    hosts = re.split(r"[/?]", rest.split("?")[0].rsplit("@", 1)[-1])[0].split(",")
    hosts += re.findall(r"node=([^&]+)", url)
    for h in filter(None, hosts):
        m = re.search(r":(\d+)$", h)
        eps.append((f"redis {h}", int(m.group(1)) if m else (26379 if sentinel else 6379)))
    otlp = cfg.get("tracing", {}).get("otlp_endpoint", "")
    if otlp:
        authority = otlp.split("://", 1)[1].split("/")[0]
        m = re.search(r":(\d+)$", authority)
        eps.append((f"otlp {otlp}", int(m.group(1)) if m else (443 if otlp.startswith("https") else 80)))
    return eps


def check_network_policy(name, docs, cfg):
    nps = [d for d in docs if d["kind"] == "NetworkPolicy"]
    if len(nps) != 1:
        return problem(name, f"{len(nps)} NetworkPolicies")
    open_ports = {(p["port"], p.get("protocol", "TCP")) for r in nps[0]["spec"]["egress"] for p in r.get("ports", [])}
    for what, port in config_endpoints(cfg):
        if (port, "TCP") not in open_ports:
            problem(name, f"the NetworkPolicy blocks {what} (port {port}); egress opens {sorted(open_ports)}")


def check_secret_use(name, container, volumes, cfg, secret):
    env = {e["name"]: e for e in container.get("env", [])}
    sentinel = re.match(r"^rediss?-sentinel://", cfg["redis"].get("url", "")) is not None
    sasl = any(str(cfg["kafka"].get(c, {}).get("security.protocol", "")).upper().startswith("SASL")
               for c in ("consumer", "producer"))
    for var in ("DEDUCTOR_REDIS_SENTINEL_PASSWORD", "DEDUCTOR_REDIS_SENTINEL_PASSWORD_FILE"):
        if var in env and not sentinel:
            problem(name, f"{var} without Sentinel (the service refuses sentinel credentials then)")
    for var in ("DEDUCTOR_KAFKA_SASL_PASSWORD_FILE", "DEDUCTOR_KAFKA_CONSUMER_SASL_PASSWORD"):
        if var in env and not sasl:
            problem(name, f"{var} without SASL")
    if secret != "none" and not [v for v in env if "REDIS_PASSWORD" in v and "SENTINEL" not in v]:
        problem(name, "no Redis password reaches the pod")
    if sasl and secret != "none" and not [v for v in env if "SASL_PASSWORD" in v]:
        problem(name, "no Kafka SASL password reaches the pod")
    for v in volumes:
        for item in (v.get("secret") or {}).get("items", []):
            if item["key"] == "redis-sentinel-password" and not sentinel:
                problem(name, "the sentinels' password is mounted without Sentinel")
            if item["key"] == "kafka-sasl-password" and not sasl:
                problem(name, "the Kafka SASL password is mounted without SASL")


def check_listen(name, env, cfg, values):
    """The HTTP endpoints listen on the pod's IP unless httpListen is all."""
    port = values.get("httpPort", 9464)
    listen = env.get("DEDUCTOR_HTTP_LISTEN", cfg.get("http", {}).get("listen"))
    want = f"0.0.0.0:{port}" if values.get("httpListen") == "all" else f"127.0.0.1:{port}"
    if listen != want:
        problem(name, f"http.listen is {listen!r} in the pod (pod IP 127.0.0.1), want {want!r}")


def check_no_mixed_releases(name, docs):
    """Issue 27 item 3: an upgrade never runs two releases in one group (a
    previous release cannot read the lean record layout)."""
    workload = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")][0]
    if workload["kind"] == "Deployment":
        got = (workload["spec"].get("strategy") or {}).get("type")
        if got != "Recreate":
            problem(name, f"Deployment strategy {got!r}: an upgrade would run old and new pods in one group")
    else:
        got = (workload["spec"].get("updateStrategy") or {}).get("type")
        if got != "OnDelete":
            problem(name, f"StatefulSet updateStrategy {got!r}: an upgrade would run old and new pods in one group")


def check_transactional_ids(name, container, cfg, values):
    if cfg["kafka"].get("delivery") != "exactly_once":
        return
    pods = values.get("replicaCount", 2)
    if values.get("autoscaling", {}).get("keda", {}).get("enabled"):
        pods = values["autoscaling"]["keda"].get("maxReplicaCount", 6)
    ids = set()
    for pod in ("deductor-0", "deductor-1"):
        plain = {"env": [e for e in container.get("env", []) if "value" in e or "fieldRef" in e.get("valueFrom", {})]}
        env = resolve_env(plain, pod, {}, {})
        # Neither set: the service derives <group_id>-<hostname>-<pid>, per pod.
        ids.add(env.get("DEDUCTOR_KAFKA_TRANSACTIONAL_ID") or cfg["kafka"].get("transactional_id") or f"derived for {pod}")
    if pods > 1 and len(ids) != 2:
        problem(name, f"exactly_once with {pods} pods, yet transactional ids {sorted(ids)} are not one per pod")


class PodCannotStart(Exception):
    pass


def resolve_env(container, pod_name, store, mounts):
    """The container's env as the kubelet makes it; `store`: Secret name -> its data."""
    env = {}
    for e in container.get("env", []):
        if "value" in e:
            value = re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(e["value"]))
        else:
            src = e["valueFrom"]
            if "fieldRef" in src:
                value = {"metadata.name": pod_name, "metadata.namespace": "promotions",
                         "status.podIP": "127.0.0.1"}[src["fieldRef"]["fieldPath"]]
            elif "secretKeyRef" in src:
                ref = src["secretKeyRef"]
                if ref["key"] not in store.get(ref["name"], {}):
                    if ref.get("optional"):
                        continue
                    raise PodCannotStart(f"env {e['name']}: Secret {ref['name']} has no key {ref['key']}")
                value = store[ref["name"]][ref["key"]]
            else:
                raise PodCannotStart(f"env {e['name']}: unsupported source {src}")
        for path, local in sorted(mounts.items(), key=lambda m: -len(m[0])):
            if value == path or value.startswith(path + "/"):
                value = local + value[len(path):]
                break
        env[e["name"]] = value
    return env


def start_pod(name, docs, existing):
    """The container's env and files as the kubelet would make them, under work/<name>/."""
    workload = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")][0]
    spec = workload["spec"]["template"]["spec"]
    container = spec["containers"][0]
    secret_docs = [d for d in docs if d["kind"] == "Secret"]
    if existing is not None:
        secret_name, secret_data = "deductor-credentials", existing
    elif secret_docs:
        secret_name = secret_docs[0]["metadata"]["name"]
        secret_data = {k: base64.b64decode(v).decode() for k, v in (secret_docs[0].get("data") or {}).items()}
    else:
        secret_name, secret_data = None, {}
    base = os.path.join(work, name)
    shutil.rmtree(base, ignore_errors=True)
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    mounts = {}
    for m in container.get("volumeMounts", []):
        local = os.path.join(base, m["mountPath"].lstrip("/"))
        os.makedirs(local, exist_ok=True)
        mounts[m["mountPath"]] = local
        vol = volumes[m["name"]]
        if "configMap" in vol:
            cm = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == vol["configMap"]["name"]][0]
            for k, text in cm["data"].items():
                with open(os.path.join(local, k), "w") as f:
                    f.write(text)
        elif "secret" in vol and vol["secret"]["secretName"] == secret_name:
            items = vol["secret"].get("items") or [{"key": k, "path": k} for k in secret_data]
            for item in items:
                if item["key"] not in secret_data:
                    if vol["secret"].get("optional"):
                        continue
                    raise PodCannotStart(f"volume {m['name']}: Secret {secret_name} has no key {item['key']}")
                with open(os.path.join(local, item["path"]), "w") as f:
                    f.write(secret_data[item["key"]])
    store = {"kafka-credentials": {"password": SASL_PASSWORD}}
    if secret_name:
        store[secret_name] = secret_data
    return resolve_env(container, "deductor-0", store, mounts), container, list(volumes.values())


def run_check(name, env, redis, kafka):
    args = [binary, "check", "--brokers", servers[{"plain": "kafka", "sasl": "kafka-sasl", "sasl-tls": "kafka-sasl-tls"}[kafka]],
            "--redis-url", servers[redis]]
    if kafka == "sasl-tls":
        # The CA file is a volume of the pod (extraVolumes): the stack's CA.
        args += ["--set", f"kafka.consumer.ssl.ca.location={kafka_ca}", "--set", f"kafka.producer.ssl.ca.location={kafka_ca}"]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DEDUCTOR_") and k != "RUST_LOG"}
    clean.update(env)
    try:
        out = subprocess.run(args, env=clean, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return problem(name, "deductor check did not finish within 120 s")
    text = out.stdout + out.stderr
    if out.returncode != 0:
        problem(name, f"deductor check exited {out.returncode}:\n        " + "\n        ".join(text.strip().splitlines()[-8:]))
    for secret in (ACL_PASSWORD, SASL_PASSWORD):
        if secret in text:
            problem(name, "deductor check printed a password")
    return out.returncode == 0


checked = rendered = 0
skipped = set()
for i, (redis, kafka, secret) in enumerate(itertools.product(REDIS, KAFKA, SECRETS)):
    name = f"{redis}+{kafka}+{secret}"
    values = variant_values(redis, kafka, secret, i)
    out, _ = render(name, values)
    if out.returncode != 0:
        problem(name, "helm template failed: " + out.stderr.strip()[-800:])
        continue
    rendered += 1
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    cm = [d for d in docs if d["kind"] == "ConfigMap" and "config.toml" in d.get("data", {})][0]
    cfg = tomllib.loads(cm["data"]["config.toml"])
    check_network_policy(name, docs, cfg)
    try:
        env, container, volumes = start_pod(name, docs, existing_secret(redis, kafka) if secret.startswith("existing") else None)
    except PodCannotStart as e:
        problem(name, f"the pod cannot start: {e}")
        continue
    check_secret_use(name, container, volumes, cfg, secret)
    check_transactional_ids(name, container, cfg, values)
    check_listen(name, env, cfg, values)
    check_no_mixed_releases(name, docs)
    topology = "sentinel" if redis == "sentinel" else redis
    server_kafka = {"plain": "kafka", "sasl": "kafka-sasl", "sasl-tls": "kafka-sasl-tls"}[kafka]
    if binary and topology in servers and up.get(topology) and up.get(server_kafka) and (kafka != "sasl-tls" or kafka_ca):
        if secret != "none" and not set(redis_ports(topology)) <= set(acl_nodes):
            skipped.add(f"{topology} with a password (no ACL user on the stack's nodes)")
        else:
            checked += 1
            run_check(name, env, topology, kafka)
    else:
        skipped.add(f"{redis} Redis with {kafka} Kafka (not in the running dev stack)")

# ------------------------------------------------------ chart refusals ---
REFUSALS = [
    ("a transactional_id shared by 3 pods", {"replicaCount": 3, "config": {"kafka": {"delivery": "exactly_once", "transactional_id": "deductor-tx"}}},
     "would be shared by up to 3 pods", None),
    ("a transactional_id shared by KEDA's pods", {"autoscaling": {"keda": {"enabled": True}}, "config": {"kafka": {"delivery": "exactly_once", "transactional_id": "deductor-tx"}}},
     "would be shared by up to 6 pods", None),
    ("a password in config.redis.url", {"config": {"redis": {"url": "redis://deductor:hunter2-url@redis:6379"}}}, "holds a password", "hunter2-url"),
    ("a password in a Cluster url", {"config": {"redis": {"url": "redis-cluster://:hunter2-url@redis:7000?node=r2:7001"}}}, "holds a password", "hunter2-url"),
    ("a sentinels' password without Sentinel", {"secret": {"sentinelPassword": "hunter2-sentinel"}}, "without Sentinel", "hunter2-sentinel"),
]
for label, values, expect, secret_text in REFUSALS:
    out, _ = render("refusal", values)
    if out.returncode == 0:
        problem("refusal", f"{label}: rendered, but must be refused")
    elif expect not in out.stderr:
        problem("refusal", f"{label}: refused without \"{expect}\": {out.stderr.strip()[-400:]}")
    elif secret_text and secret_text in out.stderr:
        problem("refusal", f"{label}: the message echoes the password")
# One pod may keep a transactional_id of its own.
out, _ = render("one-pod-tx", {"replicaCount": 1, "config": {"kafka": {"delivery": "exactly_once", "transactional_id": "deductor-tx"}}})
if out.returncode != 0:
    problem("one-pod-tx", "one pod with its own transactional_id is refused: " + out.stderr.strip()[-300:])

# ---------------------------------------- schema vs config/default.toml ---
# Keys of config/default.toml the chart sets itself (not in the schema's
# `config`), and why.
CHART_OWNED = {
    "kafka.group_instance_id": "staticMembership sets it per pod",
    "kafka.sasl_password_file": "secret.mountAsFiles sets it",
    "redis.password": "secret.redisPassword (a Secret, never the ConfigMap)",
    "redis.password_file": "secret.mountAsFiles sets it",
    "redis.sentinel_password": "secret.sentinelPassword (a Secret, never the ConfigMap)",
    "redis.sentinel_password_file": "secret.mountAsFiles sets it",
    "http.listen": "httpPort sets it",
    "pipeline.exit_when_drained": "a pod that exits is restarted: not for a Deployment",
}
defaults = tomllib.load(open(f"{root}/config/default.toml", "rb"))
schema = json.load(open(f"{chart}/values.schema.json"))["properties"]["config"]["properties"]


def toml_type(v):
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "array", dict: "object"}[type(v)]


def accepts(node, t):
    want = node.get("type")
    want = want if isinstance(want, list) else [want]
    return t in want or (t == "integer" and "number" in want)


for section, table in defaults.items():
    if section not in schema:
        problem("schema", f"config.{section} is in config/default.toml, not in values.schema.json")
        continue
    props = schema[section].get("properties", {})
    for key, value in table.items():
        dotted = f"{section}.{key}"
        if dotted in CHART_OWNED:
            if key in props:
                problem("schema", f"config.{dotted} is set by the chart ({CHART_OWNED[dotted]}), yet the schema accepts it")
            continue
        if key not in props:
            problem("schema", f"config.{dotted} (config/default.toml) is not in values.schema.json")
        elif isinstance(value, dict):
            if not (accepts(props[key].get("additionalProperties", {}), "string") and accepts(props[key]["additionalProperties"], "number")):
                problem("schema", f"config.{dotted}: librdkafka properties must accept strings and numbers")
        elif not accepts(props[key], toml_type(value)):
            problem("schema", f"config.{dotted} is {props[key].get('type')} in the schema, {toml_type(value)} in config/default.toml")
for section, node in schema.items():
    for key in node.get("properties", {}):
        if key not in defaults.get(section, {}):
            problem("schema", f"config.{section}.{key} is in values.schema.json, not in config/default.toml")

# ------------------------------------------------------------- cleanup ---
for node in acl_nodes:
    redis_cli(node, "ACL", "DELUSER", ACL_USER)

for p in problems:
    print(p)
for n in sorted(skipped) + notes:
    print(f"note: {n}")
print(f"chart variants: {rendered} rendered, {checked} run through `deductor check` on the dev stack, "
      f"{len(REFUSALS) + 1} refusals, schema vs config/default.toml: "
      + ("ok" if not problems else f"{len(problems)} problems"))
sys.exit(1 if problems else 0)
