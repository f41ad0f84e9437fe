"""Tessera beside Kueue on the real Kubernetes components (docs/install.md "With Kueue", docs/k8s-harness.md).

Kueue's controller manager (sigs.k8s.io/kueue, built by scripts/k8s-components, its CRDs and webhook
configurations from the same module) runs with its pod integration: a pod labelled kueue.x-k8s.io/queue-name is
created with Kueue's scheduling gate, Kueue makes a Workload of it and removes the gate once the pod fits its
ClusterQueue's quota. Both Kueue's webhook and Tessera's mutate the pod at creation; the Workload is made from
the pod as stored, after both, so it counts Tessera's names whatever order they ran in. Both orders are run
here, and the API server's audit log shows the order each time.

What Kueue counts is what the pod's containers ask in their resources: tessera.dev/gpu (vGPUs), and the
per-container values of tessera.dev/gpu-cores and gpu-memory as written or as Tessera's webhook translated them
(HAMi's nvidia.com/gpucores and gpumem, gpushare's aliyun.com/gpu-mem in GiB). The scenarios below are
single-vGPU containers, where that is the GPU share the pod takes. With DRA (Kueue's DynamicResourceAllocation
feature gate, alpha in v0.17), Kueue counts devices per DeviceClass (deviceClassMappings), not the capacity a
claim asks of a shared device: the last test shows what that covers for gpu.tessera.dev.
"""

import json
import os
import tempfile

import pytest
import yaml

import test_cluster as tc
from cluster import Cluster

QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
FLAVOR = "tessera-gpu"
DRA_GPUS = (6, 7)
# Kueue's name for devices of Tessera's DeviceClass (its Configuration's resources.deviceClassMappings).
DRA_RESOURCE = "tessera.dev/dra-gpus"
# The ClusterQueue's nominal quotas: 4 vGPUs, 100% of one GPU's compute, 16 GiB.
QUOTA = {"tessera.dev/gpu": 4, "tessera.dev/gpu-cores": 100, "tessera.dev/gpu-memory": 16384}
# One pod in each system's names, with what Kueue must count for it after Tessera's webhook translated it
# (docs/requests.md): HAMi's gpumem and gpushare's gpu-mem become tessera.dev/gpu-memory (gpushare counts GiB,
# so 4 is 4096 MiB), the webhook adds tessera.dev/gpu: 1 to each. gpushare's pod gives no cores: its compute is
# in proportion to its memory on the GPU it gets, which the quota cannot know at admission, so Kueue counts none.
PODS = {
    "tessera": ({"tessera.dev/gpu-cores": 30, "tessera.dev/gpu-memory": 4096},
                {"tessera.dev/gpu": "1", "tessera.dev/gpu-cores": "30", "tessera.dev/gpu-memory": "4096"}),
    "hami": ({"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4096},
             {"tessera.dev/gpu": "1", "tessera.dev/gpu-cores": "30", "tessera.dev/gpu-memory": "4096"}),
    "gpushare": ({"aliyun.com/gpu-mem": 4},
                 {"tessera.dev/gpu": "1", "tessera.dev/gpu-memory": "4096"}),
}
# 30 + 30 + 50 = 110% of the 100% quota: this one waits until one of the first two leaves.
OVER = ({"tessera.dev/gpu-cores": 50, "tessera.dev/gpu-memory": 2048},
        {"tessera.dev/gpu": "1", "tessera.dev/gpu-cores": "50", "tessera.dev/gpu-memory": "2048"})
TESSERA_WEBHOOK_CONFIG = "tessera-scheduler"  # deploy/scheduler/50-webhooks.yaml
# The API server calls mutating webhook configurations in the order of their names. Kueue's config/default names
# its own kueue-mutating-webhook-configuration, before Tessera's; a cluster may name it otherwise.
ORDERS = {"kueue-first": "kueue-mutating-webhook-configuration",
          "tessera-first": "zz-kueue-mutating-webhook-configuration"}

AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "Metadata", "verbs": ["create"], "resources": [{"group": "", "resources": ["pods"]}]},
                          {"level": "None"}]}


@pytest.fixture(scope="module")
def c():
    with tempfile.TemporaryDirectory(prefix="tessera-kueue-audit-") as audit:
        policy = os.path.join(audit, "policy.yaml")
        with open(policy, "w") as f:
            yaml.safe_dump(AUDIT_POLICY, f)
        args = ["--audit-policy-file", policy, "--audit-log-path", os.path.join(audit, "audit.log"),
                "--audit-log-mode", "blocking"]
        with Cluster(tc.SOURCE, tc.BUILD, dra_gpus=DRA_GPUS, apiserver_args=args) as cluster:
            cluster.audit_log = os.path.join(audit, "audit.log")
            cluster.kubectl("apply", "-f", os.path.join(tc.SOURCE, "deploy/dra/deviceclasses.yaml"))
            cluster.start_kueue(
                feature_gates=["DynamicResourceAllocation=true"],
                resources={"deviceClassMappings": [{"name": DRA_RESOURCE, "deviceClassNames": ["gpu.tessera.dev"]}]})
            yield cluster


def register_kueue(c, order):
    """Kueue's webhook configurations, the mutating one under the name that puts it where `order` says."""
    for name in ORDERS.values():
        c.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found", check=False)
    c.register_kueue_webhooks(mutating_name=ORDERS[order])
    names = sorted(w["metadata"]["name"] for w in c.get("mutatingwebhookconfigurations")["items"])
    assert (names.index(ORDERS[order]) < names.index(TESSERA_WEBHOOK_CONFIG)) == (order == "kueue-first"), names


def install_md_queue(ns):
    """docs/install.md's queue example ("7. With Kueue", its first yaml block), for namespace `ns` instead of
    team-a: the page shows what is tested."""
    with open(os.path.join(tc.SOURCE, "docs", "install.md")) as f:
        text = f.read()
    section = text[text.index("\n## 7. With Kueue\n"):]
    block = section[section.index("```yaml\n") + len("```yaml\n"):]
    docs = [d for d in yaml.safe_load_all(block[:block.index("\n```")]) if d]
    assert [d["kind"] for d in docs] == ["ResourceFlavor", "ClusterQueue", "LocalQueue"], docs
    (cq,) = [d for d in docs if d["kind"] == "ClusterQueue"]
    (flavor,) = cq["spec"]["resourceGroups"][0]["flavors"]
    assert flavor["name"] == FLAVOR and {r["name"]: int(r["nominalQuota"]) for r in flavor["resources"]} == QUOTA, cq
    return yaml.safe_dump_all(docs).replace("team-a", ns)


def queue_docs(ns, quota):
    """The flavor, a ClusterQueue with these nominal quotas in it, and its LocalQueue in `ns`."""
    return yaml.safe_dump_all([
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ResourceFlavor", "metadata": {"name": FLAVOR}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue", "metadata": {"name": ns},
         "spec": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": ns}},
                  "resourceGroups": [{"coveredResources": list(quota), "flavors": [
                      {"name": FLAVOR, "resources": [{"name": r, "nominalQuota": str(q)} for r, q in quota.items()]}]}]}},
        {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue", "metadata": {"name": "gpus", "namespace": ns},
         "spec": {"clusterQueue": ns}}])


def queue_setup(c, ns, queue):
    """The namespace, then its queue objects (yaml), and waits for the ClusterQueue to be active."""
    c.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
    c.apply(queue)
    c.wait_for(lambda: any(x["type"] == "Active" and x["status"] == "True"
                           for x in c.get("clusterqueue", ns).get("status", {}).get("conditions", [])),
               f"ClusterQueue {ns} to be active")
    # The pods need the namespace's default service account (the API server's ServiceAccount admission).
    c.wait_for(lambda: c.kubectl("get", "sa", "default", "-n", ns, check=False).returncode == 0,
               f"the default service account in {ns}")


def queued_pod(name, ns, limits):
    doc = yaml.safe_load(tc.pod_yaml(name, limits, ns=ns))
    doc["metadata"]["labels"] = {QUEUE_LABEL: "gpus"}
    return yaml.safe_dump(doc)


def find_workload(c, ns, pod_name):
    """The Workload Kueue made for a pod (its owner reference names the pod), or None."""
    uid = c.pod(ns, pod_name)["metadata"]["uid"]
    for w in c.get("workloads.kueue.x-k8s.io", ns=ns)["items"]:
        if any(o["uid"] == uid for o in w["metadata"].get("ownerReferences", [])):
            return w
    return None


def waiting_for_quota(c, ns, pod_name):
    """The pod's Workload once Kueue says it does not fit the quota (QuotaReserved False, "insufficient unused
    quota for <resource> in flavor <flavor>")."""
    def check():
        w = find_workload(c, ns, pod_name)
        cond = condition(w, "QuotaReserved")
        return w if cond and cond["status"] == "False" and "insufficient unused quota" in cond["message"] else None
    return c.wait_for(check, f"{ns}/{pod_name}'s Workload to wait for quota", 90)


def condition(w, kind):
    return next((x for x in (w or {}).get("status", {}).get("conditions", []) if x["type"] == kind), None)


def admitted(c, ns, pod_name, timeout=90):
    def check():
        w = find_workload(c, ns, pod_name)
        cond = condition(w, "Admitted")
        return w if cond and cond["status"] == "True" else None
    return c.wait_for(check, f"Kueue to admit {ns}/{pod_name}", timeout)


def usage(w):
    """What Kueue charged the ClusterQueue for a Workload: its pod set's resourceUsage."""
    (ps,) = w["status"]["admission"]["podSetAssignments"]
    assert ps["flavors"] == {r: FLAVOR for r in ps["resourceUsage"]}, ps
    return ps["resourceUsage"]


def quantity(text):
    """A whole-number Kubernetes quantity ("12288", "12Ki", "2k") as an int."""
    for suffix, factor in (("Ki", 1 << 10), ("Mi", 1 << 20), ("Gi", 1 << 30), ("k", 1000), ("M", 10**6)):
        if text.endswith(suffix):
            return int(text[:-len(suffix)]) * factor
    return int(text)


def queue_usage(c, cq):
    """What the ClusterQueue's status says its admitted Workloads use, resource by resource (zeros left out)."""
    flavors = c.get("clusterqueue", cq)["status"].get("flavorsUsage", [])
    totals = {r["name"]: quantity(r["total"]) for f in flavors if f["name"] == FLAVOR for r in f["resources"]}
    return {k: v for k, v in totals.items() if v}


def webhook_order(c, ns, pod_name):
    """The mutating webhook configurations the API server called for the pod's create, in order, from the audit
    log's mutation.webhook.admission.k8s.io/round_<r>_index_<i> annotations."""
    calls = []
    with open(c.audit_log) as f:
        for line in f:
            e = json.loads(line)
            ref = e.get("objectRef", {})
            if ref.get("namespace") != ns or ref.get("name") != pod_name or e.get("verb") != "create" or \
                    ref.get("subresource"):
                continue
            for k, v in (e.get("annotations") or {}).items():
                if k.startswith("mutation.webhook.admission.k8s.io/round_"):
                    r, i = k.rsplit("/", 1)[1].removeprefix("round_").split("_index_")
                    calls.append((int(r), int(i), json.loads(v)["configuration"]))
    return [name for _, _, name in sorted(calls)]


@pytest.mark.parametrize("order", list(ORDERS))
def test_cluster_queue_caps_gpu_shares_in_every_system_names(c, order):
    register_kueue(c, order)
    ns = f"team-{order}"
    queue_setup(c, ns, install_md_queue(ns))
    for name, (limits, _) in PODS.items():
        c.apply(queued_pod(name, ns, limits))
    for name, (_, counted) in PODS.items():
        w = admitted(c, ns, name)
        # Kueue counted Tessera's names: its webhook's translation, whichever webhook ran first.
        assert usage(w) == counted, (name, usage(w))
        pod = c.pod(ns, name)
        assert pod["metadata"]["labels"].get("kueue.x-k8s.io/managed") == "true", pod["metadata"]
        assert pod["spec"]["schedulerName"] == "tessera-scheduler", pod["spec"]
        calls = webhook_order(c, ns, name)
        first, second = (ORDERS[order], TESSERA_WEBHOOK_CONFIG)[::1 if order == "kueue-first" else -1]
        assert calls == [first, second], (name, calls)
    c.wait_for(lambda: queue_usage(c, ns) == {"tessera.dev/gpu": 3, "tessera.dev/gpu-cores": 60,
                                              "tessera.dev/gpu-memory": 12288},
               f"ClusterQueue {ns} to count the three pods")
    # Admitted, the pods go to Tessera's kube-scheduler and run under tessera-node with their assignment.
    for name in PODS:
        tc.check_started_with_assignment(c, tc.running(c, name, ns))

    # Over the quota: Kueue keeps the pod gated and its Workload says which resource is short.
    c.apply(queued_pod("over", ns, OVER[0]))
    w = waiting_for_quota(c, ns, "over")
    message = condition(w, "QuotaReserved")["message"]
    assert "tessera.dev/gpu-cores" in message and FLAVOR in message, message
    assert "tessera.dev/gpu-memory" not in message, message
    pod = c.pod(ns, "over")
    assert {"name": "kueue.x-k8s.io/admission"} in pod["spec"].get("schedulingGates", []), pod["spec"]
    assert pod["status"]["phase"] == "Pending" and "tessera.dev/assignment" not in pod["metadata"].get(
        "annotations", {}), pod

    # The HAMi pod leaves: 30 + 50 fits, Kueue admits the waiting pod and it runs.
    tc.delete(c, "hami", ns=ns)
    w = admitted(c, ns, "over")
    assert usage(w) == OVER[1], usage(w)
    tc.check_started_with_assignment(c, tc.running(c, "over", ns))
    c.wait_for(lambda: queue_usage(c, ns) == {"tessera.dev/gpu": 3, "tessera.dev/gpu-cores": 80,
                                              "tessera.dev/gpu-memory": 10240},
               f"ClusterQueue {ns} to count tessera, gpushare and over")
    tc.delete(c, *[n for n in PODS if n != "hami"], "over", ns=ns)


def claim_template(ns, name, cores, memory):
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.tessera.dev",
                "capacity": {"requests": {"cores": str(cores), "memory": memory}}}}]}}}}


def claim_pod(ns, name, template):
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": ns, "labels": {QUEUE_LABEL: "gpus"}},
        "spec": {"restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                 "containers": [{"name": "main", "image": "registry.invalid/app:1",
                                 "resources": {"claims": [{"name": "gpu"}]}}]}})


def test_dra_claims_count_as_devices_not_shares(c):
    """Kueue v0.17's DRA support counts a claim's devices of a mapped DeviceClass (allocationMode ExactCount),
    not the capacity it asks of a shared device: two 30% claims of gpu.tessera.dev are two devices to Kueue, so a
    quota of 2 stops the third claim although the three would fit on one GPU."""
    register_kueue(c, "kueue-first")
    ns = "team-dra"
    queue_setup(c, ns, queue_docs(ns, {DRA_RESOURCE: 2}))
    c.apply(yaml.safe_dump(claim_template(ns, "share-30", 30, "4Gi")))
    for name in ("dra-a", "dra-b"):
        c.apply(claim_pod(ns, name, "share-30"))
    for name in ("dra-a", "dra-b"):
        w = admitted(c, ns, name)
        assert usage(w) == {DRA_RESOURCE: "1"}, usage(w)
        tc.running(c, name, ns)
    c.apply(claim_pod(ns, "dra-c", "share-30"))
    w = waiting_for_quota(c, ns, "dra-c")
    assert DRA_RESOURCE in condition(w, "QuotaReserved")["message"], condition(w, "QuotaReserved")
    assert c.pod(ns, "dra-c")["status"]["phase"] == "Pending"
    tc.delete(c, "dra-a", ns=ns)
    admitted(c, ns, "dra-c")
    tc.running(c, "dra-c", ns)
    tc.delete(c, "dra-b", "dra-c", ns=ns)
