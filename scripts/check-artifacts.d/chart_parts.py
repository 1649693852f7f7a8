# scripts/check-artifacts, function chart_parts(): see the comment above it there for what it checks; arguments as passed there.
import json, sys, yaml
work, dashboard, all_values, newest, oldest = sys.argv[1:6]
def docs(name):
    return [d for d in yaml.safe_load_all(open(f"{work}/{name}")) if d]
def kind(ds, k):
    return [d for d in ds if d["kind"] == k]
def selects(selector, labels):
    ok = all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())
    for e in selector.get("matchExpressions", []):
        if e["operator"] == "In":
            ok = ok and labels.get(e["key"]) in e["values"]
        else:
            raise SystemExit(f"unexpected operator {e['operator']}")
    return ok
values = yaml.safe_load(open(all_values))
bad = []
allv, old, default = docs(f"all.{newest}.yaml"), docs(f"all.{oldest}.yaml"), docs("default.yaml")

cms = [c for c in kind(allv, "ConfigMap") if "deductor.json" in c.get("data", {})]
if len(cms) != 1:
    bad.append(f"{len(cms)} dashboard ConfigMaps")
else:
    cm = cms[0]
    if cm["metadata"]["labels"].get("grafana_dashboard") != "1":
        bad.append("dashboard ConfigMap lacks the label grafana_dashboard: \"1\"")
    if cm["metadata"]["namespace"] != values["grafanaDashboard"]["namespace"]:
        bad.append("dashboard ConfigMap is not in grafanaDashboard.namespace")
    if json.loads(cm["data"]["deductor.json"]) != json.load(open(dashboard)):
        bad.append("dashboard ConfigMap does not hold dashboards/deductor.json")

workload = [d for d in allv if d["kind"] in ("Deployment", "StatefulSet")][0]
pod_labels = workload["spec"]["template"]["metadata"]["labels"]
tests = [p for p in kind(allv, "Pod") if p["metadata"].get("annotations", {}).get("helm.sh/hook") == "test"]
if len(tests) != 1:
    bad.append(f"{len(tests)} helm test pods")
else:
    t = tests[0]
    c = t["spec"]["containers"][0]
    if c.get("args") != ["check"] or c["image"] != workload["spec"]["template"]["spec"]["containers"][0]["image"]:
        bad.append(f"test pod does not run `deductor check` with the workload's image: {c.get('args')}")
    if t["spec"]["restartPolicy"] != "Never":
        bad.append("test pod restarts")
    env = {e["name"] for e in c.get("env", [])}
    wenv = {e["name"] for e in workload["spec"]["template"]["spec"]["containers"][0].get("env", [])}
    if not (wenv - {"DEDUCTOR_KAFKA_GROUP_INSTANCE_ID"}) <= env:
        bad.append(f"test pod lacks the workload's environment: {sorted(wenv - env)}")
    for other in kind(allv, "Service") + kind(allv, "PodDisruptionBudget"):
        sel = other["spec"]["selector"]
        sel = sel if "matchLabels" in sel else {"matchLabels": sel}
        if selects(sel, t["metadata"]["labels"]):
            bad.append(f"{other['kind']} {other['metadata']['name']} selects the test pod")

nps = kind(allv, "NetworkPolicy")
if len(nps) != 1:
    bad.append(f"{len(nps)} NetworkPolicies")
else:
    spec = nps[0]["spec"]
    if not selects(spec["podSelector"], pod_labels):
        bad.append("NetworkPolicy does not select the pods")
    if tests and not selects(spec["podSelector"], tests[0]["metadata"]["labels"]):
        bad.append("NetworkPolicy does not select the test pod")
    if sorted(spec["policyTypes"]) != ["Egress", "Ingress"]:
        bad.append(f"policyTypes {spec['policyTypes']}")
    port = workload["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
    ingress_ports = [p["port"] for r in spec["ingress"][:1] for p in r["ports"]]
    if ingress_ports != [port]:
        bad.append(f"ingress ports {ingress_ports}, want the metrics port {port}")
    egress = {(p["port"], p.get("protocol", "TCP")) for r in spec["egress"] for p in r.get("ports", [])}
    np = values["networkPolicy"]
    want = {(53, "UDP"), (53, "TCP")} | {(p, "TCP") for p in np["kafka"]["ports"] + np["redis"]["ports"]}
    if not want <= egress:
        bad.append(f"egress ports {sorted(egress)} lack {sorted(want - egress)}")
    cidrs = {b["ipBlock"]["cidr"] for r in spec["egress"] for b in r.get("to", []) if "ipBlock" in b}
    if not set(np["kafka"]["cidrs"]) <= cidrs:
        bad.append(f"egress CIDRs {sorted(cidrs)} lack the Kafka CIDRs")

pdb = kind(allv, "PodDisruptionBudget")[0]["spec"]
if pdb.get("unhealthyPodEvictionPolicy") != values["podDisruptionBudget"]["unhealthyPodEvictionPolicy"]:
    bad.append(f"PDB unhealthyPodEvictionPolicy {pdb.get('unhealthyPodEvictionPolicy')!r} on {newest}")
if "unhealthyPodEvictionPolicy" in kind(old, "PodDisruptionBudget")[0]["spec"]:
    bad.append(f"PDB unhealthyPodEvictionPolicy rendered for {oldest}, which lacks it")

# secret.mountAsFiles: the passwords as files of the Secret, named by the
# *_FILE variables, and never as variables themselves.
for pod in [workload["spec"]["template"]] + [{"spec": t["spec"]} for t in tests]:
    spec = pod["spec"]
    c = spec["containers"][0]
    env = {e["name"]: e for e in c.get("env", [])}
    mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
    vols = {v["name"]: v for v in spec.get("volumes", [])}
    if [n for n in env if n.endswith("_PASSWORD")]:
        bad.append(f"mountAsFiles, yet password variables: {[n for n in env if n.endswith('_PASSWORD')]}")
    # (ci/all-features-values.yaml keeps the default key names)
    for var, key in (("DEDUCTOR_REDIS_PASSWORD_FILE", "redis-password"),
                     ("DEDUCTOR_KAFKA_SASL_PASSWORD_FILE", "kafka-sasl-password")):
        path = env.get(var, {}).get("value", "")
        vol = vols.get("secrets", {}).get("secret", {})
        items = {i["key"]: i["path"] for i in vol.get("items", [])}
        if not path or path != f"{mounts.get('secrets')}/{items.get(key)}":
            bad.append(f"{var}={path!r} is not the file of key {key} of the mounted Secret ({mounts.get('secrets')}, {items})")
if kind(default, "NetworkPolicy") or [c for c in kind(default, "ConfigMap") if "deductor.json" in c.get("data", {})]:
    bad.append("default values render a NetworkPolicy or a dashboard")
if len([p for p in kind(default, "Pod")]) != 1:
    bad.append("default values render no helm test pod")
if "unhealthyPodEvictionPolicy" in kind(default, "PodDisruptionBudget")[0]["spec"]:
    bad.append("default values set unhealthyPodEvictionPolicy")
for b in bad:
    print(b)
print("dashboard ConfigMap, NetworkPolicy, helm test pod, PDB policy: " + ("ok" if not bad else f"{len(bad)} problems"))
sys.exit(1 if bad else 0)
