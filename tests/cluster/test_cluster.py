"""Tessera on a real Kubernetes control plane and kubelet (tests/k8s/cluster.py, docs/k8s-harness.md).

Every scenario goes the way a user's pod goes: `kubectl apply`, the API server calls the admission webhook, the
real kube-scheduler calls the extender and lets it bind, the real kubelet admits the pod, calls the device plugin's
Allocate and asks the container runtime to create the container with what Allocate returned. The checks read
what the real components did: the pod as the API server holds it, the container as the kubelet asked the runtime
to create it (cri-fake's record), the limits file on disk.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest
import yaml

from cluster import FAKE_GPUS, NODE, RENAMED_HAMI_MEMORY_PERCENT, Cluster, ContainerProcess, free_port

SOURCE = os.environ.get("TESSERA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("TESSERA_BINARY_DIR", os.path.join(SOURCE, "build"))


@pytest.fixture(scope="module")
def c():
    with Cluster(SOURCE, BUILD) as cluster:
        yield cluster


def pod_yaml(name, limits, annotations=None, scheduler=None, ns="default"):
    spec = {"restartPolicy": "Never",
            "containers": [{"name": "main", "image": "registry.invalid/app:1",
                            "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]}
    if scheduler:
        spec["schedulerName"] = scheduler
    meta = {"name": name, "namespace": ns}
    if annotations:
        meta["annotations"] = annotations
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec})


def running(c, name, ns="default", timeout=60):
    def check():
        p = c.pod(ns, name)
        return p if p and p["status"].get("phase") == "Running" else None
    return c.wait_for(check, f"pod {ns}/{name} to run", timeout)


def gone(c, name, ns="default", timeout=60):
    c.wait_for(lambda: c.pod(ns, name) is None, f"pod {ns}/{name} to be gone", timeout)


def delete(c, *names, ns="default"):
    c.kubectl("delete", "pod", *names, "-n", ns, "--wait=false", "--grace-period=0", "--force", check=False)
    for n in names:
        gone(c, n, ns)


def assignment(pod):
    return json.loads(pod["metadata"]["annotations"]["tessera.dev/assignment"])


def read_limits(path):
    """The hook libraries' limits file (docs/hook-abi.md): one `gpu key=value...` line per vGPU."""
    gpus = {}
    with open(path) as f:
        for line in f:
            words = line.split()
            if words and words[0] == "gpu":
                kv = dict(w.split("=", 1) for w in words[1:])
                gpus[kv["uuid"]] = {"memory": int(kv["memory"]), "cores": int(kv["cores"]), "policy": kv["policy"],
                                    "priority": kv["priority"], "tenants": int(kv.get("tenants", 0)),
                                    "milli": int(kv.get("cores-milli", 0))}
    return gpus


def record(c, pod, container="main"):
    """The newest CreateContainer the kubelet sent for this container."""
    uid = pod["metadata"]["uid"]
    recs = [r for r in c.container_records() if r["podUID"] == uid and r["container"] == container]
    return recs[-1] if recs else None


def check_started_with_assignment(c, pod, container="main", timeout=30):
    """The container the runtime was asked to create carries what Allocate returned for this pod's assignment,
    and its limits file equals the assignment. When the kubelet started the pods of one shape in another order
    than the agent matched them, the agent's reconciliation with pod-resources rewrites the assignments to tell
    the truth (docs/node-agent.md): wait for that."""
    ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    deadline = time.monotonic() + timeout
    while True:
        try:
            return _started_with_assignment(c, c.pod(ns, name), container)
        except AssertionError as e:
            if time.monotonic() > deadline:
                raise AssertionError(f"{ns}/{name}: {e}\n{agent_story(c, c.pod(ns, name))}\n=== {ns}/{name}: {e}") from e
            time.sleep(0.5)


def agent_story(c, pod):
    """What tessera-node said about this pod and about swaps, with the pod's annotations: what a failed check
    needs to tell an agent bug from a harness one."""
    uid, name = pod["metadata"]["uid"], pod["metadata"]["name"]
    log = c.procs["tessera-node"].tail(100000).splitlines()
    mine = [line for line in log if uid in line or f"/{name}" in line or "swapped" in line]
    annotations = {k: v for k, v in pod["metadata"].get("annotations", {}).items() if k.startswith("tessera.dev/")}
    return (f"--- {name}'s tessera.dev annotations: {json.dumps(annotations)}\n"
            f"--- tessera-node lines about it or about swaps ({len(mine)}, last 40):\n" + "\n".join(mine[-40:]))


def _started_with_assignment(c, pod, container):
    a = assignment(pod)
    mine = [x for x in a["containers"] if x["name"] == container]
    assert mine, f"the assignment of {pod['metadata']['name']} has no container {container}: {a}"
    vgpus = mine[0]["vgpus"]
    rec = c.wait_for(lambda: record(c, pod, container), f"the kubelet to create {pod['metadata']['name']}/{container}")
    assert rec["env"].get("NVIDIA_VISIBLE_DEVICES") == ",".join(v["uuid"] for v in vgpus), (rec["env"], vgpus)
    assert rec["env"].get("TESSERA_LIMITS_FILE") == "/etc/tessera/limits", rec["env"]
    mounts = {m["container"]: m for m in rec["mounts"]}
    assert "/etc/tessera" in mounts and mounts["/etc/tessera"]["readonly"], rec["mounts"]
    assert "/var/lib/tessera/region" in mounts, rec["mounts"]
    host_dir = mounts["/etc/tessera"]["host"]
    # <container>, or <container>.<n> when a swapped record holds that one (docs/node-agent.md).
    assert host_dir.startswith(c.path("tessera", "containers")), host_dir
    assert re.fullmatch(re.escape(container) + r"(\.[0-9]+)?", os.path.basename(host_dir)), host_dir
    limits = read_limits(os.path.join(host_dir, "limits"))
    assert set(limits) == {v["uuid"] for v in vgpus}, (limits, vgpus)
    for v in vgpus:
        got = limits[v["uuid"]]
        assert got["memory"] == v["memoryMiB"] << 20, (got, v)
        # The share in the ledger's thousandths, unrounded; whole percent rounded down beside it for older hooks.
        assert got["milli"] == v["milliCores"] == round(v["cores"] * 10), (got, v)
        assert got["cores"] == max(1, v["milliCores"] // 10), (got, v)
    # The kubelet's pod-resources API agrees: the agent marks its record confirmed once the real kubelet reports
    # these devices for this very container (docs/node-agent.md).
    path = c.path("tessera", "records", f"{pod['metadata']['uid']}_{container}.json")
    assert os.path.exists(path), f"no agent record {path}"
    with open(path) as f:
        saved = json.load(f)
    assert saved["confirmed"], f"pod-resources has not confirmed {path}: {saved}"
    assert len(saved["deviceIDs"]) == len(vgpus), saved
    return rec, vgpus


def committed(c):
    """Cores and memory committed per GPU, summed over the assignments of every pod not finished."""
    per_gpu = {}
    for p in json.loads(c.kubectl("get", "pods", "-A", "-o", "json").stdout)["items"]:
        ann = p["metadata"].get("annotations", {})
        if "tessera.dev/assignment" not in ann or p["status"].get("phase") in ("Succeeded", "Failed"):
            continue
        for ctr in json.loads(ann["tessera.dev/assignment"])["containers"]:
            for v in ctr["vgpus"]:
                g = per_gpu.setdefault(v["uuid"], [0.0, 0])
                g[0] += v["cores"]
                g[1] += v["memoryMiB"]
    return per_gpu


def assert_not_oversubscribed(c):
    inventory = json.loads(c.get("node", NODE)["metadata"]["annotations"]["tessera.dev/gpu-inventory"])
    memory = {g["uuid"]: g["memoryMiB"] for g in inventory["gpus"]}
    for uuid, (cores, mem) in committed(c).items():
        assert cores <= 100.0 + 1e-6, f"GPU {uuid} has {cores}% committed"
        assert mem <= memory[uuid], f"GPU {uuid} has {mem} MiB committed of {memory[uuid]}"


# ---------------------------------------------------------------------------------------------------------------
# Every request form of docs/requests.md, and the other systems' names (defect 1: a share without tessera.dev/gpu
# was bound but never reached Allocate).

FORMS = [
    # name, limits, annotations, expected vGPUs as (cores, memoryMiB or None)
    ("share", {"tessera.dev/gpu-cores": 30, "tessera.dev/gpu-memory": 4096}, None, [(30, 4096)]),
    ("share-with-gpu", {"tessera.dev/gpu": 1, "tessera.dev/gpu-cores": 30, "tessera.dev/gpu-memory": 4096}, None,
     [(30, 4096)]),
    ("two-vgpus", {"tessera.dev/gpu": 2, "tessera.dev/gpu-cores": 20, "tessera.dev/gpu-memory": 2048}, None,
     [(20, 2048), (20, 2048)]),
    ("memory-only", {"tessera.dev/gpu-memory": 8192}, None, [(None, 8192)]),
    ("cores-only", {"tessera.dev/gpu-cores": 25}, None, [(25, None)]),
    ("memory-percent", {"tessera.dev/gpu-memory-percentage": 50}, None, [(50, None)]),
    ("whole", {"tessera.dev/gpu": 2}, None, [(100, None), (100, None)]),
    ("two-and-a-half", {"tessera.dev/gpu-cores": 250}, None, [(100, None), (100, None), (50, None)]),
    ("model", {"tessera.dev/gpu-cores": 10}, {"tessera.dev/gpu-model": "V100-PCIE-32GB"}, [(10, None)]),
    ("uuid", {"tessera.dev/gpu-cores": 10}, {"tessera.dev/gpu-uuid": "GPU-923a7369-94e3-4f91-9a61-dbe22e44158b"},
     [(10, None)]),
    ("elastic", {"tessera.dev/gpu-cores": 10}, {"tessera.dev/compute-policy": "elastic"}, [(10, None)]),
    ("numa", {"tessera.dev/gpu": 2, "tessera.dev/gpu-cores": 10}, {"tessera.dev/numa-bind": "true"},
     [(10, None), (10, None)]),
    ("hami", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 20, "nvidia.com/gpumem": 3000}, None, [(20, 3000)]),
    ("gpushare", {"aliyun.com/gpu-mem": 4}, None, [(None, 4096)]),
    # ACK's multi-GPU share: the memory split evenly over aliyun.com/gpu-count GPUs.
    ("gpushare-count", {"aliyun.com/gpu-mem": 8}, {"aliyun.com/gpu-count": "2"}, [(None, 4096), (None, 4096)]),
    # A HAMi chart that renamed resourceMemPercentage (the harness's tessera-scheduler is told the name).
    ("hami-renamed", {"nvidia.com/gpu": 1, RENAMED_HAMI_MEMORY_PERCENT: 50}, None, [(50, None)]),
    ("gpu-manager", {"tencent.com/vcuda-core": 20, "tencent.com/vcuda-memory": 8}, None, [(20, 2048)]),
    ("volcano", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 20, "volcano.sh/vgpu-memory": 1024}, None,
     [(20, 1024)]),
]


@pytest.mark.parametrize("name,limits,annotations,expected", FORMS, ids=[f[0] for f in FORMS])
def test_request_form_reaches_allocate(c, name, limits, annotations, expected):
    pod_name = f"form-{name}"
    c.apply(pod_yaml(pod_name, limits, annotations))
    pod = running(c, pod_name)
    assert pod["spec"]["schedulerName"] == "tessera-scheduler"
    assert pod["spec"]["nodeName"] == NODE
    ann = pod["metadata"]["annotations"]
    # The kubelet's device manager allocated tessera.dev/gpu for it: the container asks for it.
    ctr = pod["spec"]["containers"][0]["resources"]
    assert int(ctr["limits"]["tessera.dev/gpu"]) == len(expected), ctr
    assert ctr["limits"] == ctr["requests"], ctr
    c.wait_for(lambda: c.pod("default", pod_name)["metadata"]["annotations"].get("tessera.dev/phase") == "allocated",
               "the node agent to mark the pod allocated")
    rec, vgpus = check_started_with_assignment(c, pod)
    assert len(vgpus) == len(expected)
    inventory = {g["uuid"]: g for g in json.loads(c.get("node", NODE)["metadata"]["annotations"]
                                                  ["tessera.dev/gpu-inventory"])["gpus"]}
    for v, (cores, memory) in zip(sorted(vgpus, key=lambda v: -v["cores"]), sorted(expected, key=lambda e: -(e[0] or 0))):
        if cores is not None:
            assert abs(v["cores"] - cores) < 0.11, (v, cores)
        if memory is not None:
            assert v["memoryMiB"] == memory, (v, memory)
        if annotations and "tessera.dev/gpu-model" in annotations:
            assert inventory[v["uuid"]]["model"] == annotations["tessera.dev/gpu-model"]
        if annotations and "tessera.dev/gpu-uuid" in annotations:
            assert v["uuid"] == annotations["tessera.dev/gpu-uuid"]
    if annotations and annotations.get("tessera.dev/numa-bind") == "true":
        a = assignment(pod)["containers"][0]
        assert "numaNode" in a and rec["env"].get("TESSERA_NUMA_NODE") == str(a["numaNode"]), (a, rec["env"])
        assert len({inventory[v["uuid"]]["numa"] for v in vgpus}) == 1
    if "tessera.dev/gpu" not in limits and any(k.startswith("tessera.dev/") for k in limits):
        assert ann.get("tessera.dev/gpu-added") == "main", ann
    assert_not_oversubscribed(c)
    delete(c, pod_name)


# ---------------------------------------------------------------------------------------------------------------
# Migration that keeps HAMi's meaning (docs/migration.md), through the real API server, scheduler and kubelet.

def test_hami_pod_keeps_its_meaning(c):
    # No gpucores (HAMi: no core limit), task priority 0 (high), a GPU type by a word in any case, NUMA binding,
    # and a per-pod policy Tessera cannot honour (a warning kubectl prints).
    manifest = yaml.safe_load(pod_yaml("hami-meaning", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 3000,
                                                        "nvidia.com/priority": 0},
                                       {"nvidia.com/use-gputype": "v100", "nvidia.com/numa-bind": "true",
                                        "hami.io/gpu-scheduler-policy": "spread"}))
    r = c.apply(yaml.safe_dump(manifest))
    assert "hami.io/gpu-scheduler-policy=spread is ignored" in r.stderr, r.stderr
    assert "compute-policy: elastic" in r.stderr, r.stderr
    pod = running(c, "hami-meaning")
    ann = pod["metadata"]["annotations"]
    assert ann.get("tessera.dev/compute-policy") == "elastic", ann
    assert ann.get("tessera.dev/priority") == "high", ann
    limits = pod["spec"]["containers"][0]["resources"]["limits"]
    # (The API server writes quantities in canonical form: 3000 is "3k".)
    assert "nvidia.com/priority" not in limits and limits.get("tessera.dev/gpu-memory") in ("3000", "3k"), limits
    rec, vgpus = check_started_with_assignment(c, pod)
    got = read_limits(next(os.path.join(m["host"], "limits") for m in rec["mounts"] if m["container"] == "/etc/tessera"))
    assert [(g["policy"], g["priority"]) for g in got.values()] == [("elastic", "high")], got
    assert "numaNode" in assignment(pod)["containers"][0]
    delete(c, "hami-meaning")


def test_gpu_manager_share_keeps_its_meaning(c):
    # gpu-manager limits utilization only with tencent.com/vcuda-core-limit: without it the share is elastic.
    c.apply(pod_yaml("gm-soft", {"tencent.com/vcuda-core": 20, "tencent.com/vcuda-memory": 8}))
    c.apply(pod_yaml("gm-hard", {"tencent.com/vcuda-core": 20, "tencent.com/vcuda-memory": 8},
                     {"tencent.com/vcuda-core-limit": "20"}))
    r = c.apply(pod_yaml("mig", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 10}, {"nvidia.com/vgpu-mode": "mig"}))
    assert "MIG" in r.stderr, r.stderr
    for name, policy in (("gm-soft", "elastic"), ("gm-hard", "hard"), ("mig", "hard")):
        rec, _ = check_started_with_assignment(c, running(c, name))
        got = read_limits(next(os.path.join(m["host"], "limits") for m in rec["mounts"]
                               if m["container"] == "/etc/tessera"))
        assert [g["policy"] for g in got.values()] == [policy], (name, got)
    delete(c, "gm-soft", "gm-hard", "mig")


# ---------------------------------------------------------------------------------------------------------------
# Native sidecars (init containers with restartPolicy: Always) hold a GPU share for the pod's life.

def test_sidecar_gets_its_share(c):
    manifest = yaml.safe_load(pod_yaml("with-sidecar", {"cpu": "100m"}))
    manifest["spec"]["initContainers"] = [{
        "name": "gpu-proxy", "image": "registry.invalid/proxy:1", "restartPolicy": "Always",
        "resources": {"limits": {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 20, "nvidia.com/gpumem": 2048}}}]
    c.apply(yaml.safe_dump(manifest))
    pod = running(c, "with-sidecar")
    side = pod["spec"]["initContainers"][0]["resources"]["limits"]
    assert side.get("tessera.dev/gpu") == "1" and "nvidia.com/gpu" not in side, side
    assert [x["name"] for x in assignment(pod)["containers"]] == ["gpu-proxy"]
    rec, vgpus = check_started_with_assignment(c, pod, container="gpu-proxy")
    assert len(vgpus) == 1 and abs(vgpus[0]["cores"] - 20) < 0.11 and vgpus[0]["memoryMiB"] == 2048, vgpus
    assert_not_oversubscribed(c)
    delete(c, "with-sidecar")


# ---------------------------------------------------------------------------------------------------------------
# Quotas on a cluster (docs/scheduler.md, "Quotas"): Kubernetes' ResourceQuota over Tessera's names where the API
# server can count them, Tessera's per-namespace, per-model quota in the extender where it cannot.

def namespace_ready(c, ns):
    c.kubectl("create", "namespace", ns)
    # The ServiceAccount admission refuses pods until the namespace's default account exists.
    c.wait_for(lambda: c.kubectl("get", "serviceaccount", "default", "-n", ns, check=False).returncode == 0,
               f"namespace {ns}'s default service account")


def events_of(c, ns, name):
    r = c.kubectl("get", "events", "-n", ns, "--field-selector", f"involvedObject.name={name}", "-o", "json")
    return [e.get("message", "") for e in json.loads(r.stdout)["items"]]


def test_gpu_quotas_hold_on_the_cluster(c):
    # ResourceQuota over requests.tessera.dev/gpu-memory: the API server counts translated pods too (the webhook
    # rewrites HAMi's names before the quota admission runs), and refuses the one that goes over.
    namespace_ready(c, "quota-a")
    c.apply(yaml.safe_dump({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "gpu", "namespace": "quota-a"},
                            "spec": {"hard": {"requests.tessera.dev/gpu-memory": "6000"}}}))
    c.wait_for(lambda: c.get("resourcequota", "gpu", "quota-a").get("status", {}).get("hard"),
               "the quota controller to take the ResourceQuota")
    c.apply(pod_yaml("qa-1", {"tessera.dev/gpu-cores": 10, "tessera.dev/gpu-memory": 4000}, ns="quota-a"))
    running(c, "qa-1", ns="quota-a")
    r = c.apply(pod_yaml("qa-2", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 4000}, ns="quota-a"), check=False)
    assert r.returncode != 0 and "exceeded quota" in r.stderr and "requests.tessera.dev/gpu-memory" in r.stderr, r.stderr

    # Tessera's quota: namespace quota-b may hold half a V100's share. What Kubernetes cannot count (a model,
    # compute given in proportion to memory) the extender does, and the pod's events say why it waits.
    log = c.procs["tessera-scheduler-r1"]
    loads = log.since_start().count("GPU quotas in force")
    c.write_quotas([{"namespace": "quota-b", "model": "V100-PCIE-32GB", "gpus": 0.5}])
    c.wait_for(lambda: log.since_start().count("GPU quotas in force") > loads, "tessera-scheduler to read the quotas")
    namespace_ready(c, "quota-b")
    c.apply(pod_yaml("qb-1", {"tessera.dev/gpu-cores": 40}, ns="quota-b"))
    running(c, "qb-1", ns="quota-b")
    c.apply(pod_yaml("qb-2", {"tessera.dev/gpu-memory": 8192}, ns="quota-b"))  # 8 GiB of 32: 25% of a V100
    c.wait_for(lambda: any("namespace quota-b holds 0.4 of its 0.5 V100-PCIE-32GB GPUs (quota)" in m
                           for m in events_of(c, "quota-b", "qb-2")), "qb-2's events to name the quota", 60)
    assert "nodeName" not in c.pod("quota-b", "qb-2")["spec"]
    # The first one leaves: the second fits within the quota now.
    delete(c, "qb-1", ns="quota-b")
    running(c, "qb-2", ns="quota-b", timeout=90)
    # A quota file that no longer parses is refused; the quota in force stays (and is logged).
    c.write_quotas([{"namespace": "quota-b", "gpus": "lots"}])
    c.wait_for(lambda: "the quota file changed and cannot be read" in log.since_start(), "the refusal to be logged")
    delete(c, "qb-2", ns="quota-b")
    delete(c, "qa-1", ns="quota-a")
    c.write_quotas([])


# ---------------------------------------------------------------------------------------------------------------
# Defect 4: pods for other schedulers keep what they were written with.

def test_pod_of_another_scheduler_is_left_untouched(c):
    limits = {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 30, "volcano.sh/vgpu-memory": 2048}
    c.apply(pod_yaml("volcano-pod", limits, scheduler="volcano"))
    pod = c.pod("default", "volcano-pod")
    assert pod["spec"]["schedulerName"] == "volcano"
    assert set(pod["spec"]["containers"][0]["resources"]["limits"]) == set(limits)
    assert "tessera.dev/gpu-added" not in pod["metadata"].get("annotations", {})
    time.sleep(2)  # no scheduler named volcano runs here: nothing may place it, nothing may rewrite it
    pod = c.pod("default", "volcano-pod")
    assert "nodeName" not in pod["spec"] and "tessera.dev/assignment" not in pod["metadata"].get("annotations", {})
    delete(c, "volcano-pod")


def test_refused_request_says_what_to_change(c):
    r = c.apply(pod_yaml("bad", {"tessera.dev/gpu-cores": 150, "tessera.dev/gpu": 2}), check=False)
    assert r.returncode != 0
    assert "cores are per vGPU" in r.stderr, r.stderr


def webhook_calls(c):
    """Every answer tessera-scheduler's webhook has given (tessera_scheduler_webhook_decisions_total)."""
    with urllib.request.urlopen(c.extender_url() + "/metrics", timeout=10) as r:
        text = r.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("tessera_scheduler_webhook_decisions_total{"))


def with_init_container(text, limits):
    pod = yaml.safe_load(text)
    pod["spec"]["initContainers"] = [{"name": "init", "image": "registry.invalid/app:1",
                                      "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]
    pod["spec"]["containers"][0]["resources"] = {}
    return yaml.safe_dump(pod)


# The registration as shipped (deploy/scheduler/50-webhooks.yaml): one webhook call per GPU pod, none for any
# other pod, and failurePolicy Fail: while the webhook is down, a GPU pod is refused (it used to be created
# untranslated and unvalidated under Ignore) and every other pod is still created.
def test_webhook_sees_only_gpu_pods_and_fails_closed(c):
    before = webhook_calls(c)
    c.apply(pod_yaml("plain", {"cpu": "100m"}))
    assert webhook_calls(c) == before, "a pod asking for no GPU reached the webhook"
    delete(c, "plain")
    # A refused GPU pod: one call (the mutating webhook's), the parser's message.
    r = c.apply(pod_yaml("bad-once", {"tessera.dev/gpu-cores": 0}), check=False)
    assert r.returncode != 0 and "tessera: pod default/bad-once" in r.stderr, r.stderr
    assert webhook_calls(c) == before + 1
    gpu_pods = {
        "tessera": pod_yaml("down-tessera", {"tessera.dev/gpu-cores": 30}),
        "typo": pod_yaml("down-typo", {"tessera.dev/gpu-memroy": "1Gi"}),
        "hami": pod_yaml("down-hami", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}),
        "hami-renamed": pod_yaml("down-renamed", {RENAMED_HAMI_MEMORY_PERCENT: 50}),
        "gpushare": pod_yaml("down-gpushare", {"aliyun.com/gpu-mem": 2}),
        "gpu-manager": pod_yaml("down-gpu-manager", {"tencent.com/vcuda-core": 30, "tencent.com/vcuda-memory": 4}),
        "volcano": pod_yaml("down-volcano", {"volcano.sh/vgpu-number": 1, "volcano.sh/vgpu-cores": 30}),
        "init": with_init_container(pod_yaml("down-init", {}), {"tessera.dev/gpu-cores": 30}),
        "annotation": pod_yaml("down-annotation", {"cpu": "100m"}, annotations={"tessera.dev/gpu-memory": "8Gi"}),
    }
    c.register_webhooks(port=free_port())  # nothing listens there: the webhook is down
    try:
        for what, text in gpu_pods.items():
            r = c.apply(text, check=False)
            assert r.returncode != 0, f"{what}: a GPU pod was created while the webhook was down"
            assert "failed calling webhook" in r.stderr, (what, r.stderr)
        c.apply(pod_yaml("plain-down", {"cpu": "100m"}))  # not a GPU pod: created without the webhook
        assert c.pod("default", "plain-down") is not None
        delete(c, "plain-down")
    finally:
        c.register_webhooks()
    # Up again: a GPU pod is translated as before.
    c.apply(pod_yaml("up-again", {"nvidia.com/gpu": 1, "nvidia.com/gpumem": 1000}))
    pod = c.pod("default", "up-again")
    assert pod["spec"]["schedulerName"] == "tessera-scheduler"
    assert "tessera.dev/gpu-memory" in pod["spec"]["containers"][0]["resources"]["limits"]
    delete(c, "up-again")


# ---------------------------------------------------------------------------------------------------------------
# Delete frees the share; many pods of one shape at once.

def test_delete_frees_the_share_for_the_next_pod(c):
    # Eight whole GPUs take the node; a ninth waits until one leaves.
    c.apply(pod_yaml("all-gpus", {"tessera.dev/gpu": 8}))
    running(c, "all-gpus")
    c.apply(pod_yaml("waiting", {"tessera.dev/gpu-cores": 50}))
    time.sleep(3)
    assert c.pod("default", "waiting")["status"]["phase"] == "Pending"
    delete(c, "all-gpus")
    pod = running(c, "waiting", timeout=90)
    check_started_with_assignment(c, pod)
    delete(c, "waiting")


def test_fifty_pods_of_one_shape_all_start_with_their_own_records(c):
    text = "---\n".join(pod_yaml(f"many-{i}", {"tessera.dev/gpu-cores": 10, "tessera.dev/gpu-memory": 1024})
                        for i in range(50))
    c.apply(text)
    pods = [running(c, f"many-{i}", timeout=180) for i in range(50)]
    dirs = set()
    for p in pods:
        rec, _ = check_started_with_assignment(c, p)
        dirs.add(next(m["host"] for m in rec["mounts"] if m["container"] == "/etc/tessera"))
    assert len(dirs) == 50
    assert_not_oversubscribed(c)
    delete(c, *[f"many-{i}" for i in range(50)])


# ---------------------------------------------------------------------------------------------------------------
# Priorities: a high-priority pod compresses low-priority tenants (SharedGPU) and the share comes back.

def test_high_priority_compresses_and_gives_back(c):
    # Memory cannot be compressed, so both ask for little of it; compute is what the high-priority pod takes.
    c.apply(pod_yaml("whole-7", {"tessera.dev/gpu": 7}))
    running(c, "whole-7")
    c.apply(pod_yaml("low", {"tessera.dev/gpu-cores": 80, "tessera.dev/gpu-memory": 4096},
                     {"tessera.dev/priority": "low"}))
    low = running(c, "low")
    uuid = assignment(low)["containers"][0]["vgpus"][0]["uuid"]
    check_started_with_assignment(c, low)
    limits_file = next(os.path.join(m["host"], "limits") for m in record(c, low)["mounts"]
                       if m["container"] == "/etc/tessera")
    c.apply(pod_yaml("high", {"tessera.dev/gpu-cores": 60, "tessera.dev/gpu-memory": 4096},
                     {"tessera.dev/priority": "high"}))
    high = running(c, "high", timeout=90)
    assert assignment(high)["containers"][0]["vgpus"][0]["uuid"] == uuid

    def compressed():
        v = assignment(c.pod("default", "low"))["containers"][0]["vgpus"][0]
        return v if v.get("requestedCores") == 80 and v["cores"] <= 40 + 1e-6 else None
    c.wait_for(compressed, "the low-priority share to be compressed")
    # Rewritten by the leader in its term; a rewrite of the share in another term, or by another replica, is
    # refused (tessera-share-fence, deploy/scheduler/70-leader-fence.yaml): what a leader paused past its Lease
    # between its check and its write would send.
    lease = c.get("lease", "tessera-scheduler", ns="tessera-system")["spec"]
    holder, term = lease["holderIdentity"], lease.get("leaseTransitions", 0)
    annotations = c.pod("default", "low")["metadata"]["annotations"]
    assert (annotations["tessera.dev/leader"], annotations["tessera.dev/leader-term"]) == (holder, str(term))
    stale = assignment(c.pod("default", "low"))
    stale["containers"][0]["vgpus"][0]["cores"] = 80
    for leader, in_term in ((holder, term - 1), ("r9", term)):
        patch = {"metadata": {"annotations": {"tessera.dev/assignment": json.dumps(stale),
                                              "tessera.dev/leader": leader, "tessera.dev/leader-term": str(in_term)}}}
        r = c.kubectl("patch", "pod", "low", "--type=merge", "-p", json.dumps(patch), check=False,
                      kubeconfig=c.scheduler_kubeconfig)
        assert r.returncode != 0 and "a stale leader" in r.stderr, (leader, in_term, r.stdout, r.stderr)
    assert compressed()
    # The running container's limits follow (the node agent rewrites its limits file; the hooks reload it).
    c.wait_for(lambda: read_limits(limits_file)[uuid]["cores"] == 40, "the low pod's limits file to say 40%")
    # And that it shares its GPU now (tenants=, which lets an elastic tenant alone grow): 2, then 1 again.
    c.wait_for(lambda: read_limits(limits_file)[uuid]["tenants"] == 2, "the low pod's limits file to say tenants=2")
    assert_not_oversubscribed(c)
    delete(c, "high")
    c.wait_for(lambda: abs(assignment(c.pod("default", "low"))["containers"][0]["vgpus"][0]["cores"] - 80) < 0.11,
               "the share to be given back", 60)
    c.wait_for(lambda: read_limits(limits_file)[uuid]["cores"] == 80, "the low pod's limits file to say 80% again")
    c.wait_for(lambda: read_limits(limits_file)[uuid]["tenants"] == 1, "the low pod's limits file to say tenants=1",
               60)
    delete(c, "low", "whole-7")


# ---------------------------------------------------------------------------------------------------------------
# Live limits followed into a running tenant: the harness runs the container the kubelet asked for (as its runtime
# would: cluster.ContainerProcess), a real program under the hook library the agent mounted and preloaded. The
# CUDA tenant runs on the fake driver (one simulated GPU timeline per node), the OpenCL one on PoCL (the CPU as the
# device: it has no UUID, so the hook finds it by its place in the container's list, docs/hook-abi.md).

def node_gpu_uuids():
    with open(os.path.join(SOURCE, FAKE_GPUS)) as f:
        return [g["uuid"] for g in yaml.safe_load(f)["gpus"]]


def start_tenant(c, pod, kind):
    rec, _ = check_started_with_assignment(c, pod)
    assert any(m["container"] == "/etc/ld.so.preload" for m in rec["mounts"]), rec["mounts"]
    if kind == "cuda":
        # What the NVIDIA container toolkit would add: the driver library and the container's GPUs, here the
        # fake driver presenting this node's GPUs (one shared timeline, its "device node" bound in).
        device_dir = c.path("fakegpu")
        os.makedirs(device_dir, exist_ok=True)
        env = {"LD_LIBRARY_PATH": os.path.join(BUILD, "fakecuda"),
               "CUDA_VISIBLE_DEVICES": rec["env"]["NVIDIA_VISIBLE_DEVICES"],
               "FAKECUDA_UUIDS": ",".join(node_gpu_uuids()), "FAKECUDA_STATE": "/run/fakecuda/node.state"}
        mounts = [(device_dir, "/run/fakecuda", False)]
        argv = [os.path.join(BUILD, "tests", "cuda_probe"), "dlsym", "init", "ctx", "watch", "2000000", "250"]
    else:
        env, mounts = {}, []
        argv = [os.path.join(BUILD, "tests", "cl_tenant"), "spin", "3600", "--kernel-ms", "4", "--window-ms", "250",
                "--until-stdin-closes", "--live"]
    env["TESSERA_HOOK_LOG"] = "info"
    return ContainerProcess(c, rec, argv, env, mounts)


def windows(tenant):
    """(share, memory limit in force) per window the tenant reported, oldest first."""
    out = []
    for line in list(tenant.lines):
        w = line.split()
        if w[:1] == ["watch"]:
            out.append((float(w[1]), int(w[2])))
        elif w[:1] == ["live"]:
            kv = dict(x.split("=", 1) for x in w[1:])
            out.append((float(kv["share"]), int(kv["mem"])))
    return out


def wait_for_windows(c, tenant, after, what, share=None, memory=None, timeout=90):
    """Three windows in a row, all reported after the first `after`, whose mean share satisfies `share` (a
    predicate) and whose memory limit equals `memory`. Returns the index where the next check may start."""
    def check():
        ws = windows(tenant)
        for i in range(after, len(ws) - 2):
            three = ws[i:i + 3]
            mean = sum(x[0] for x in three) / 3
            if (share is None or share(mean)) and (memory is None or all(x[1] == memory for x in three)):
                print(f"{what}: windows {i}-{i + 2}, mean share {mean:.3f}, memory {three[0][1] >> 20} MiB")
                return i + 3
        if tenant.proc.poll() is not None:
            raise AssertionError(f"the tenant ended ({tenant.proc.returncode}): {tenant.stderr()}")
        return None
    try:
        return c.wait_for(check, what, timeout)
    except Exception as e:
        raise AssertionError(f"{e}\nthe tenant's last windows: {windows(tenant)[-12:]}\n"
                             f"its stderr: {tenant.stderr()[-3000:]}") from e


@pytest.mark.parametrize("kind", ["cuda", "opencl"])
def test_live_limits_reach_a_running_tenant(c, kind):
    mib = 1 << 20
    c.apply(pod_yaml(f"live-whole-{kind}", {"tessera.dev/gpu": 7}))
    running(c, f"live-whole-{kind}")
    low_name = f"live-low-{kind}"
    c.apply(pod_yaml(low_name, {"tessera.dev/gpu-cores": 80, "tessera.dev/gpu-memory": 4096},
                     {"tessera.dev/priority": "low"}))
    low = running(c, low_name)
    uuid = assignment(low)["containers"][0]["vgpus"][0]["uuid"]
    limits_file = next(os.path.join(m["host"], "limits") for m in record(c, low)["mounts"]
                       if m["container"] == "/etc/tessera")
    tenant = start_tenant(c, low, kind)
    try:
        # It runs under what it was given: 4 GiB, about 80% of the device.
        at = wait_for_windows(c, tenant, 0, "the tenant to run at its 80% with 4 GiB",
                              share=lambda s: s >= 0.6, memory=4096 * mib)
        # The agent counts the process as the container's (its cgroup names the pod).
        c.wait_for(lambda: "registered with the node agent" in tenant.stderr(), "the tenant to register")

        # A resize: the assignment rewritten on the same GPU with more memory, as the scheduler writes it.
        a = assignment(c.pod("default", low_name))
        a["containers"][0]["vgpus"][0]["memoryMiB"] = 6144
        c.kubectl("annotate", "--overwrite", "pod", low_name, f"tessera.dev/assignment={json.dumps(a)}")
        c.wait_for(lambda: read_limits(limits_file)[uuid]["memory"] == 6144 * mib, "the limits file to say 6 GiB")
        at = wait_for_windows(c, tenant, at, "the running tenant's memory limit to become 6 GiB",
                              memory=6144 * mib)

        # A compression: a high-priority pod takes 60 of the GPU, the running tenant drops to 40%.
        c.apply(pod_yaml(f"live-high-{kind}", {"tessera.dev/gpu-cores": 60, "tessera.dev/gpu-memory": 4096},
                         {"tessera.dev/priority": "high"}))
        high = running(c, f"live-high-{kind}", timeout=90)
        assert assignment(high)["containers"][0]["vgpus"][0]["uuid"] == uuid
        c.wait_for(lambda: read_limits(limits_file)[uuid]["cores"] == 40, "the limits file to say 40%")
        at = len(windows(tenant)) + 1  # from the window after the one the rewrite fell in
        at = wait_for_windows(c, tenant, at, "the running tenant's share to drop to its 40%",
                              share=lambda s: s <= 0.5, memory=6144 * mib)
        assert_not_oversubscribed(c)

        # The high-priority pod leaves: the share comes back, and the tenant takes it.
        delete(c, f"live-high-{kind}")
        c.wait_for(lambda: read_limits(limits_file)[uuid]["cores"] == 80, "the limits file to say 80% again", 60)
        at = len(windows(tenant)) + 1
        wait_for_windows(c, tenant, at, "the running tenant's share to come back to 80%", share=lambda s: s >= 0.6)
        assert "read limits generation" in tenant.stderr(), tenant.stderr()
    finally:
        code = tenant.stop()
    assert code == 0, f"the tenant exited {code}: {tenant.stderr()[-3000:]}"
    delete(c, low_name, f"live-whole-{kind}")


# ---------------------------------------------------------------------------------------------------------------
# Restarts: nothing oversubscribed, nothing lost.

def test_restarts_lose_nothing(c):
    c.apply("---\n".join(pod_yaml(f"r-{i}", {"tessera.dev/gpu-cores": 30}) for i in range(6)))
    for i in range(6):
        running(c, f"r-{i}")
    # The kubelet restarts: it re-registers the device plugin and keeps the running pods.
    c.procs["kubelet"].stop()
    c.start_kubelet()
    c.wait_for_plugin()  # tessera.dev/gpu advertised again by the new kubelet
    # tessera-node restarts: it reloads its records and registers again.
    c.procs["tessera-node"].stop()
    c.start_node_agent()
    # tessera-scheduler restarts in the middle of a stream of new pods.
    c.apply("---\n".join(pod_yaml(f"s-{i}", {"tessera.dev/gpu-cores": 30}) for i in range(6)))
    c.procs["tessera-scheduler-r1"].stop(signal.SIGKILL)
    c.start_tessera_scheduler("r1")
    for i in range(6):
        pod = running(c, f"s-{i}", timeout=120)
        check_started_with_assignment(c, pod)
    for i in range(6):
        check_started_with_assignment(c, c.pod("default", f"r-{i}"))
    assert_not_oversubscribed(c)
    delete(c, *[f"r-{i}" for i in range(6)], *[f"s-{i}" for i in range(6)])


# ---------------------------------------------------------------------------------------------------------------
# Defect 6: a second tessera-scheduler on a port in use exits with a clear error; the first keeps answering.

def test_second_scheduler_on_a_used_port_exits(c):
    port = c.ports["tessera-scheduler-r1"]
    r = subprocess.run([c.tessera("tessera-scheduler"), "--kubeconfig", c.scheduler_kubeconfig,
                        "--listen", f"127.0.0.1:{port}"], capture_output=True, text=True, timeout=30)
    assert r.returncode != 0
    assert "in use" in r.stderr, r.stderr
    import urllib.request
    with urllib.request.urlopen(c.extender_url("r1") + "/healthz", timeout=5) as resp:
        assert resp.status == 200


# ---------------------------------------------------------------------------------------------------------------
# Defect 2: the node DaemonSet as shipped. The real DaemonSet controller places its pod on the labelled node and
# the real kubelet sets up its host paths and asks the runtime for its containers. cri-fake runs nothing, so the
# init container never finishes; what the kubelet asked for is checked against deploy/Dockerfile's image.

def dockerfile_copies():
    """deploy/Dockerfile's COPY lines: source -> destination, and its USER."""
    copies, user = {}, None
    with open(os.path.join(SOURCE, "deploy", "Dockerfile")) as f:
        for line in f:
            words = line.split()
            if words[:1] == ["COPY"]:
                copies[words[1].rstrip("/")] = words[2].rstrip("/")
            if words[:1] == ["USER"]:
                user = words[1]
    return copies, user


def test_node_daemonset_as_shipped(c):
    copies, image_user = dockerfile_copies()
    c.kubectl("label", "node", NODE, "tessera.dev/gpu-node=true")
    try:
        def init_record():
            pods = c.get("pods", ns="kube-system")["items"]
            mine = [p for p in pods if p["metadata"].get("labels", {}).get("app.kubernetes.io/name") == "tessera-node"]
            return record(c, mine[0], "install-hooks") if mine else None
        rec = c.wait_for(init_record, "the kubelet to create the DaemonSet pod's init container", 90)
        ds = [d for d in yaml.safe_load_all(open(os.path.join(SOURCE, "deploy/node/daemonset.yaml")))
              if d and d["kind"] == "DaemonSet"][0]
        images = {x["image"] for x in ds["spec"]["template"]["spec"]["initContainers"] +
                  ds["spec"]["template"]["spec"]["containers"]}
        assert images == {rec["image"]}, images
        # The image's default user cannot write the host's root-owned directories.
        assert image_user not in (None, "0", "root") and rec["runAsUser"] == 0, (image_user, rec.get("runAsUser"))
        script = " ".join(rec["command"])
        assert copies["build/lib"] + "/libtessera-" in script, (copies, script)
        assert "mkdir -p /var/lib/tessera/lib" in script, script
        assert any(m["container"] == "/var/lib/tessera" and m["host"] == "/var/lib/tessera" for m in rec["mounts"])
        main = ds["spec"]["template"]["spec"]["containers"][0]
        assert main["command"][0].startswith(copies["build/bin"] + "/"), (main["command"], copies)
        assert main["securityContext"].get("runAsUser") == 0
    finally:
        c.kubectl("label", "node", NODE, "tessera.dev/gpu-node-")


# ---------------------------------------------------------------------------------------------------------------
# Defect 3 and the manifests: the real Helm lints and renders the chart, which installs all three parts; every
# manifest under deploy/ and the rendered chart are accepted by the real API server (removed or deprecated APIs,
# unknown fields and invalid values are refused there).

def helm(c, *args):
    r = subprocess.run([c.bin("helm"), *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_chart_lints_renders_and_installs_every_part(c):
    chart = os.path.join(SOURCE, "deploy", "helm", "tessera")
    helm(c, "lint", "--strict", chart)
    rendered = helm(c, "template", "tessera", chart, "-n", "tessera-system", "--set", "webhook.caBundle=Cg==")
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    kinds = {(d["kind"], d["metadata"]["name"]) for d in docs}
    for part in [("Deployment", "tessera-scheduler"), ("Deployment", "tessera-kube-scheduler"),
                 ("DaemonSet", "tessera-node"), ("MutatingWebhookConfiguration", "tessera-scheduler")]:
        assert part in kinds, f"the chart renders no {part}"
    # One webhook call per pod: no validating webhook; the chart's registration is the plain manifest's.
    assert not [d for d in docs if d["kind"] == "ValidatingWebhookConfiguration"]
    # The operators' page is off by default.
    assert not [a for d in docs if d["kind"] == "Deployment" for ctr in d["spec"]["template"]["spec"]["containers"]
                for a in ctr.get("args", []) if a.startswith("--ui")]
    charted_hooks = [d for d in docs if d["kind"] == "MutatingWebhookConfiguration"][0]["webhooks"]
    plain_hooks = [d for d in yaml.safe_load_all(open(os.path.join(SOURCE, "deploy/scheduler/50-webhooks.yaml")))
                   if d][0]["webhooks"]
    assert [w["name"] for w in charted_hooks] == [w["name"] for w in plain_hooks]
    for charted_hook, plain_hook in zip(charted_hooks, plain_hooks):
        for key in ("failurePolicy", "matchConditions", "rules", "sideEffects", "reinvocationPolicy"):
            assert charted_hook[key] == plain_hook[key], (plain_hook["name"], key)
    r = c.kubectl("apply", "--dry-run=server", "-f", "-", input=rendered, check=False)
    assert r.returncode == 0, r.stderr
    # The Grafana dashboard, for Grafana's sidecar (docs/metrics.md); no PodMonitor by default.
    dashboards = [d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "tessera-grafana-dashboard"]
    assert len(dashboards) == 1 and dashboards[0]["metadata"]["labels"]["grafana_dashboard"] == "1", dashboards
    assert json.loads(dashboards[0]["data"]["tessera-gpu-sharing.json"])["uid"] == "tessera-gpu-sharing"
    assert not [d for d in docs if d["kind"] == "PodMonitor"]
    # With the switch on: PodMonitors (monitoring.coreos.com/v1) that select the agent's and the scheduler's pods
    # by their labels and scrape a port those pods name. The harness' API server has no Prometheus Operator CRDs,
    # so these render only; everything else is applied (server-side dry run) as before.
    rendered = helm(c, "template", "tessera", chart, "-n", "tessera-system", "--set", "webhook.caBundle=Cg==",
                    "--set", "monitoring.podMonitor.enabled=true", "--set", "monitoring.podMonitor.labels.release=kps",
                    "--set", "scheduler.gpuMetrics=false", "--set", "scheduler.ui=true")
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    monitors = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PodMonitor"}
    assert set(monitors) == {"tessera-node", "tessera-scheduler"}, monitors
    workloads = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("DaemonSet", "Deployment")}
    for name, m in monitors.items():
        assert m["apiVersion"] == "monitoring.coreos.com/v1" and m["metadata"]["labels"]["release"] == "kps"
        pod = workloads[name]["spec"]["template"]
        assert m["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items(), (name, m)
        ports = {p["name"] for ctr in pod["spec"]["containers"] for p in ctr.get("ports", [])}
        endpoint = m["spec"]["podMetricsEndpoints"][0]
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics" and endpoint["honorLabels"] is True
    scheduler_args = workloads["tessera-scheduler"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--no-gpu-metrics" in scheduler_args
    # The operators' page, switched on: the pod's loopback only (docs/page.md), reached with port-forward.
    assert scheduler_args[scheduler_args.index("--ui-listen") + 1] == "127.0.0.1:9404", scheduler_args
    rest = "---\n".join(yaml.safe_dump(d) for d in docs if d["kind"] != "PodMonitor")
    r = c.kubectl("apply", "--dry-run=server", "-f", "-", input=rest, check=False)
    assert r.returncode == 0, r.stderr
    docs = [d for d in yaml.safe_load_all(helm(c, "template", "tessera", chart, "-n", "tessera-system", "--set",
                                                "webhook.caBundle=Cg==")) if d]
    # The chart's node agent is the plain manifest's, value for value.
    plain = [d for d in yaml.safe_load_all(open(os.path.join(SOURCE, "deploy/node/daemonset.yaml")))
             if d and d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
    charted = [d for d in docs if d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]
    for key in ("initContainers", "containers", "volumes", "hostPID", "nodeSelector"):
        p, h = plain[key], charted[key]
        if key.endswith("ontainers"):
            for a, b in zip(p, h):
                for field in ("command", "securityContext", "volumeMounts", "image"):
                    assert a.get(field) == b.get(field), (key, field, a.get(field), b.get(field))
        else:
            assert p == h, (key, p, h)
    # The chart's DeviceClasses are deploy/dra's, spec for spec.
    plain = {d["metadata"]["name"]: d["spec"] for d in
             yaml.safe_load_all(open(os.path.join(SOURCE, "deploy/dra/deviceclasses.yaml"))) if d}
    charted = {d["metadata"]["name"]: d["spec"] for d in docs if d["kind"] == "DeviceClass"}
    assert plain == charted and len(plain) == 2, (plain, charted)
    # With GPUs given to DRA, the agent's DRA flags come from the values, and the binary takes them.
    docs = [d for d in yaml.safe_load_all(helm(c, "template", "tessera", chart, "-n", "tessera-system", "--set",
                                                "webhook.caBundle=Cg==", "--set", "node.dra.gpus=6\\,7", "--set",
                                                "node.dra.forgottenClaimGraceSeconds=30")) if d]
    command = [d for d in docs if d["kind"] == "DaemonSet"][0]["spec"]["template"]["spec"]["containers"][0]["command"]
    assert "--dra-gpus=6,7" in command and "--dra-forgotten-claim-grace=30" in command, command
    usage = subprocess.run([c.tessera("tessera-node"), "--help"], capture_output=True, text=True, timeout=30).stdout
    assert all(a.split("=")[0] in usage for a in command[1:] if a.startswith("--")), (command, usage)


def test_every_manifest_passes_server_side_dry_run(c):
    deploy = os.path.join(SOURCE, "deploy")
    files = []
    for root, _, names in os.walk(deploy):
        if os.sep + "helm" in root or os.sep + "tls" in root:
            continue
        files += [os.path.join(root, n) for n in sorted(names) if n.endswith(".yaml") and n != "kustomization.yaml"]
    assert files
    for f in files:
        r = c.kubectl("apply", "--dry-run=server", "-f", f, check=False)
        assert r.returncode == 0, f"{f}: {r.stderr}"
    # The kustomization the docs use renders the same manifests.
    r = c.kubectl("apply", "--dry-run=server", "-k", deploy, check=False)
    assert r.returncode == 0, r.stderr
    # What gen-webhook-tls.sh writes (the Secret, the caBundle filled in) as install.md applies it.
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(deploy, "scheduler"), os.path.join(tmp, "scheduler"),
                        ignore=shutil.ignore_patterns("tls"))
        subprocess.run([os.path.join(tmp, "scheduler", "gen-webhook-tls.sh")], check=True, capture_output=True)
        for f in ("tls/webhook-tls-secret.yaml", "50-webhooks.yaml"):
            r = c.kubectl("apply", "--dry-run=server", "-f", os.path.join(tmp, "scheduler", f), check=False)
            assert r.returncode == 0, f"{f}: {r.stderr}"


# ---------------------------------------------------------------------------------------------------------------
# Two tessera-scheduler replicas: the leader dies in the middle of a stream of pods; the standby takes the Lease,
# the Service (its stand-in) sends the calls to it, and every pod is placed once, nothing oversubscribed.

def test_leader_failover_loses_nothing(c):
    c.start_tessera_scheduler("r2")
    time.sleep(1)
    assert c.extender_proxy.ready_port == c.ports["tessera-scheduler-r1"], "r1 should lead"
    c.apply("---\n".join(pod_yaml(f"f-{i}", {"tessera.dev/gpu-cores": 40, "tessera.dev/gpu-memory": 2048})
                         for i in range(8)))
    c.procs["tessera-scheduler-r1"].stop(signal.SIGKILL)
    c.wait_for(lambda: c.extender_proxy.ready_port == c.ports["tessera-scheduler-r2"],
               "the standby to take the Lease and be ready", 60)
    # GPU pods created while no replica is ready are refused (failurePolicy: Fail, docs/install.md; a controller
    # retries), so the next ones come once the standby leads; those of the first batch that were not bound yet
    # are its to bind.
    c.apply("---\n".join(pod_yaml(f"g-{i}", {"tessera.dev/gpu-cores": 40, "tessera.dev/gpu-memory": 2048})
                         for i in range(8)))
    for name in [f"f-{i}" for i in range(8)] + [f"g-{i}" for i in range(8)]:
        check_started_with_assignment(c, running(c, name, timeout=120))
    assert_not_oversubscribed(c)
    # Each bind carried the replica that made it and the Lease's term it led in. r1's term is over: the API server
    # refuses a bind in it (deploy/scheduler/70-leader-fence.yaml), which is what r1 paused past its Lease between
    # its leadership check and its write would send; and a bind in the current term by anyone but its holder.
    lease = json.loads(c.kubectl("get", "lease", "-n", "tessera-system", "tessera-scheduler", "-o", "json").stdout)
    term = lease["spec"].get("leaseTransitions", 0)
    assert lease["spec"]["holderIdentity"] == "r2" and term >= 1, lease["spec"]
    for i in range(8):
        a = c.pod("default", f"g-{i}")["metadata"]["annotations"]
        assert (a.get("tessera.dev/leader"), a.get("tessera.dev/leader-term")) == ("r2", str(term)), a
    c.apply(pod_yaml("fenced", {}, scheduler="no-such-scheduler"))

    def bind(leader, in_term):
        body = {"apiVersion": "v1", "kind": "Binding",
                "metadata": {"name": "fenced", "namespace": "default",
                             "annotations": {"tessera.dev/leader": leader, "tessera.dev/leader-term": str(in_term)}},
                "target": {"apiVersion": "v1", "kind": "Node", "name": NODE}}
        return c.kubectl("create", "--raw", "/api/v1/namespaces/default/pods/fenced/binding", "-f", "-",
                         input=json.dumps(body), check=False)
    for leader, in_term in (("r1", term - 1), ("r1", term), ("r2", term + 1)):
        r = bind(leader, in_term)
        assert r.returncode != 0 and "a stale leader" in r.stderr, (leader, in_term, r.stdout, r.stderr)
    assert not c.pod("default", "fenced")["spec"].get("nodeName")
    r = bind("r2", term)
    assert r.returncode == 0, r.stderr
    running(c, "fenced")
    delete(c, *[f"f-{i}" for i in range(8)], *[f"g-{i}" for i in range(8)], "fenced")
