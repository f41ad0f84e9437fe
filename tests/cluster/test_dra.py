"""Tessera's DRA driver (gpu.tessera.dev) on the real Kubernetes components (docs/dra.md, docs/k8s-harness.md).

tessera-node runs with --dra-gpus=6,7: those two GPUs (V100, 32 GiB) go to DRA, the other six stay with the device
plugin. Pods ask with ResourceClaimTemplates; the real kube-scheduler's DRA plugin allocates from the node's
ResourceSlice (consumable capacity: `cores` and `memory`), the real kubelet calls NodePrepareResources on the
driver's socket and asks the runtime for the container with the CDI device the driver answered. The checks read
what the real components did: the claim's allocation, cri-fake's record of CreateContainer (its CDI devices), the
CDI spec and the limits file on disk.

The last test restarts the node (kubelet and agent) on a DGX A100's GPUs for an NVLink pair, and back: it stays
last, after the test that checks the slice was never rewritten.
"""

import json
import os
import signal
import time
import urllib.request

import pytest
import yaml

import test_cluster as tc
from cluster import FAKE_GPUS, KUBELET_ROOT, NODE, Cluster, HarnessError

DRA_GPUS = (6, 7)
# tessera-scheduler's --dra-rebind-after here (30 s shipped): how long kube-scheduler may refuse to bind a pod
# whose claims Tessera placed before they are deallocated and placed again.
REBIND_AFTER = 5
# tessera-node's --dra-forgotten-claim-grace here (120 s shipped), in seconds.
FORGOTTEN_GRACE = 5


@pytest.fixture(scope="module")
def c():
    # --heartbeat-timeout: test_a_pod_admitted_while_the_device_plugin_restarts_stays_on_it stops the node agent
    # and needs its last heartbeat to count as fresh however slow this machine is. --dra-forgotten-claim-grace:
    # test_a_claim_the_kubelet_forgot_is_unprepared_by_the_node_agent cannot wait the shipped two minutes.
    with Cluster(tc.SOURCE, tc.BUILD, dra_gpus=DRA_GPUS, dra_fallback_after=5,
                 scheduler_args=[f"--dra-rebind-after={REBIND_AFTER}", "--heartbeat-timeout=600"],
                 node_args=[f"--dra-forgotten-claim-grace={FORGOTTEN_GRACE}"]) as cluster:
        cluster.kubectl("apply", "-f", os.path.join(tc.SOURCE, "deploy/dra/deviceclasses.yaml"))
        templates = [d for d in yaml.safe_load_all(open(os.path.join(tc.SOURCE, "examples/dra/claims.yaml")))
                     if d and d["kind"] == "ResourceClaimTemplate"]
        docs = [yaml.safe_dump(d) for d in templates] + [share_template("share-40", 40, "8Gi"),
                                                          share_template("too-big", 30, "64Gi")]
        cluster.apply("---\n".join(docs))
        made = {t["metadata"]["name"] for t in cluster.get("resourceclaimtemplates", ns="default")["items"]}
        assert made == {d["metadata"]["name"] for d in templates} | {"share-40", "too-big"}, made
        yield cluster


def share_template(name, cores, memory):
    return yaml.safe_dump({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.tessera.dev",
            "capacity": {"requests": {"cores": str(cores), "memory": memory}}}}]}}}})


def claim_pod(name, template, host_port=None):
    container = {"name": "main", "image": "registry.invalid/app:1", "resources": {"claims": [{"name": "gpu"}]}}
    if host_port:
        container["ports"] = [{"containerPort": 8080, "hostPort": host_port}]
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
                 "containers": [container]}})


def uuids(c):
    """GPU index -> UUID, from the node's inventory annotation."""
    inv = json.loads(c.get("node", NODE)["metadata"]["annotations"]["tessera.dev/gpu-inventory"])
    return {g["index"]: g["uuid"] for g in inv["gpus"]}


def claim_of(c, pod):
    """The ResourceClaim the pod's template made (pod.status.resourceClaimStatuses)."""
    def find():
        p = c.pod("default", pod)
        for s in (p or {}).get("status", {}).get("resourceClaimStatuses", []):
            if s.get("resourceClaimName"):
                return c.get("resourceclaim", s["resourceClaimName"], ns="default")
        return None
    return c.wait_for(find, f"the claim of pod {pod}")


def prepared(c, pod):
    """The running pod's claim, its allocation result, the CDI spec the driver wrote and the limits file in it."""
    p = tc.running(c, pod)
    claim = claim_of(c, pod)
    uid = claim["metadata"]["uid"]
    rec = c.wait_for(lambda: tc.record(c, p), f"the kubelet to create {pod}/main")
    assert rec.get("cdiDevices") == [f"tessera.dev/claim={uid}"], rec
    spec_path = c.path("cdi", f"tessera.dev-claim_{uid}.json")
    with open(spec_path) as f:
        spec = json.load(f)
    assert spec["kind"] == "tessera.dev/claim" and spec["devices"][0]["name"] == uid, spec
    edits = spec["devices"][0]["containerEdits"]
    mounts = {m["containerPath"]: m for m in edits["mounts"]}
    assert mounts["/etc/tessera"]["options"][0] == "ro", mounts
    env = dict(e.split("=", 1) for e in edits["env"])
    limits = tc.read_limits(os.path.join(mounts["/etc/tessera"]["hostPath"], "limits"))
    return claim, env, limits, spec_path


def events(c, pod, reason):
    """The messages of a pod's events of one reason."""
    out = c.kubectl("get", "events", "-n", "default", "--field-selector", f"involvedObject.name={pod}", "-o", "json")
    return [e["message"] for e in json.loads(out.stdout)["items"] if e["reason"] == reason]


def waits_for_tessera(c, pod):
    """The pod is held by tessera-scheduler's placement gate, and its events and annotation say why."""
    messages = c.wait_for(lambda: events(c, pod, "TesseraPlacementWaiting"), f"a TesseraPlacementWaiting event for {pod}")
    p = c.pod("default", pod)
    assert {"name": "tessera.dev/dra-placement"} in p["spec"]["schedulingGates"], p["spec"]
    assert p["metadata"]["labels"]["tessera.dev/dra-placement"] == "gated"
    assert "fits no node" in p["metadata"]["annotations"]["tessera.dev/dra-waiting"], p["metadata"]["annotations"]
    assert any("fits no node" in m for m in messages), messages
    return messages


def test_the_node_publishes_its_dra_gpus_and_keeps_them_from_the_device_plugin(c):
    slices = [s for s in c.get("resourceslices")["items"] if s["spec"]["driver"] == "gpu.tessera.dev"]
    assert len(slices) == 1, slices
    spec = slices[0]["spec"]
    assert spec["nodeName"] == NODE and spec["pool"]["name"] == NODE
    by_name = {d["name"]: d for d in spec["devices"]}
    assert set(by_name) == {"gpu-6", "gpu-7"}, by_name
    ids = uuids(c)
    for i in DRA_GPUS:
        d = by_name[f"gpu-{i}"]
        assert d["attributes"]["uuid"]["string"] == ids[i]
        assert d["allowMultipleAllocations"] is True
        assert d["capacity"]["cores"]["value"] == "100" and d["capacity"]["memory"]["value"] == "32Gi", d
    # The device plugin offers the other six GPUs only; the extender's inventory shows 6 and 7 as given to DRA.
    assert c.allocatable_gpu() == 60
    inv = json.loads(c.get("node", NODE)["metadata"]["annotations"]["tessera.dev/gpu-inventory"])
    given = {g["index"] for g in inv["gpus"] if g.get("healthReason") == "given to DRA (gpu.tessera.dev)"}
    assert given == set(DRA_GPUS), inv
    assert "registered with the kubelet as a DRA driver" in c.procs["tessera-node"].tail(100000)


def test_a_pod_admitted_while_the_device_plugin_restarts_stays_on_it(c):
    # The fault harness (docs/faults.md, "What the harness found"): tessera-node restarted, the kubelet's
    # allocatable showed no tessera.dev/gpu until the plugin registered again, and a 2-GPU pod admitted then was
    # turned into a claim (--extended-resources-to-dra auto) that the node's two DRA GPUs could not hold beside
    # their tenants: gated for good. The agent's inventory and heartbeat say it still serves the device plugin.
    # The agent's own registration first: right after a restart (a test that restarts it) the kubelet may
    # still refuse it ("device plugin already connected") until it has seen the old one go, and an agent the
    # kubelet never took leaves the allocatable as it was when stopped.
    agent = c.procs["tessera-node"]
    c.wait_for(lambda: 'msg="registered with the kubelet" resource=tessera.dev/gpu' in agent.since_start() or None,
               "tessera-node's device plugin to be registered with the kubelet", 90)
    agent.stop()
    try:
        c.wait_for(lambda: c.allocatable_gpu() == 0 or None,
                   "the kubelet to take tessera.dev/gpu off the node's allocatable", 90)
        c.apply(tc.pod_yaml("dp-restart", {"tessera.dev/gpu": 2}))
        pod = c.pod("default", "dp-restart")
        assert not pod["spec"].get("resourceClaims") and not pod["spec"].get("schedulingGates"), pod["spec"]
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert "tessera.dev/gpu" in limits, limits
    finally:
        c.start_node_agent()
    tc.check_started_with_assignment(c, tc.running(c, "dp-restart", timeout=120))
    tc.delete(c, "dp-restart")


def test_a_share_claim_is_prepared_with_its_limits(c):
    c.apply(claim_pod("dra-share", "gpu-share-30"))
    claim, env, limits, _ = prepared(c, "dra-share")
    result = claim["status"]["allocation"]["devices"]["results"][0]
    assert result["driver"] == "gpu.tessera.dev" and result["pool"] == NODE
    assert result["consumedCapacity"] == {"cores": "30", "memory": "8Gi"}, result
    uuid = uuids(c)[int(result["device"].split("-")[1])]
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid and env["TESSERA_LIMITS_FILE"] == "/etc/tessera/limits", env
    assert limits == {uuid: {"memory": 8192 << 20, "cores": 30, "policy": "hard", "priority": "low",
                             "tenants": limits[uuid]["tenants"], "milli": 300}}, limits
    tc.delete(c, "dra-share")


def test_claims_share_a_gpu_up_to_its_capacity_and_the_next_waits(c):
    # Two GPUs of 100%: two claims of 40% fit on each, the fifth waits.
    c.apply("---\n".join(claim_pod(f"dra-s{i}", "share-40") for i in range(5)))
    devices = {}
    running = []
    for i in range(5):
        try:
            tc.running(c, f"dra-s{i}", timeout=60 if not running or len(running) < 4 else 15)
            running.append(f"dra-s{i}")
        except Exception:
            pass
    assert len(running) == 4, running
    waiting = next(f"dra-s{i}" for i in range(5) if f"dra-s{i}" not in running)
    for pod in running:
        claim, env, limits, _ = prepared(c, pod)
        result = claim["status"]["allocation"]["devices"]["results"][0]
        devices.setdefault(result["device"], []).append(pod)
        (uuid, gpu), = limits.items()
        assert gpu["cores"] == 40 and gpu["memory"] == 8192 << 20, limits
    assert sorted(len(v) for v in devices.values()) == [2, 2], devices
    # The one that waits says why, in its events and an annotation (tessera-scheduler places these claims).
    waits_for_tessera(c, waiting)
    # One leaves: the waiting pod gets its share.
    tc.delete(c, running[0])
    prepared(c, waiting)
    tc.delete(c, *running[1:], waiting)


def test_deleting_the_pod_unprepares_the_claim(c):
    c.apply(claim_pod("dra-gone", "gpu-share-30"))
    claim, _, _, spec_path = prepared(c, "dra-gone")
    uid = claim["metadata"]["uid"]
    tc.delete(c, "dra-gone")
    c.wait_for(lambda: not os.path.exists(spec_path), "the claim's CDI spec to be removed")
    c.wait_for(lambda: not any(uid in name for name in os.listdir(c.path("tessera", "records"))),
               "the claim's record to be removed")
    c.wait_for(lambda: c.kubectl("get", "resourceclaim", claim["metadata"]["name"], check=False).returncode != 0,
               "the template's claim to be deleted with its pod")


def test_a_stale_leaders_claim_status_write_is_refused(c):
    # The claim fence (deploy/scheduler/70-leader-fence.yaml, docs/faults.md): tessera-scheduler names itself and
    # the Lease's term on a claim before it writes the claim's status, and the API server refuses that status
    # write when the Lease has moved past the term (what a leader paused between its two writes would send), or
    # names another holder. Other writers of claim status (here the admin; kube-scheduler, the kubelet and the
    # claim controller alike) are not fenced.
    c.apply(claim_pod("dra-fenced", "gpu-share-30"))
    claim, _, _, _ = prepared(c, "dra-fenced")
    name = claim["metadata"]["name"]
    lease = c.get("lease", "tessera-scheduler", ns="tessera-system")["spec"]
    holder, term = lease["holderIdentity"], lease.get("leaseTransitions", 0)
    annotations = claim["metadata"]["annotations"]
    assert (annotations["tessera.dev/leader"], annotations["tessera.dev/leader-term"]) == (holder, str(term)), \
        annotations

    def as_scheduler(*args, body):
        return c.kubectl(*args, "-f", "-", input=json.dumps(body), check=False, kubeconfig=c.scheduler_kubeconfig)

    def write_status_named(leader, in_term):
        now = c.get("resourceclaim", name, ns="default")
        now["metadata"]["annotations"].update({"tessera.dev/leader": leader, "tessera.dev/leader-term": str(in_term)})
        r = as_scheduler("replace", "-o", "json", body=now)
        assert r.returncode == 0, r.stderr  # naming is not fenced: the status write is
        return as_scheduler("replace", "--subresource=status", body=json.loads(r.stdout))
    for leader, in_term in ((holder, term - 1), ("r9", term), (holder, term + 1)):
        r = write_status_named(leader, in_term)
        assert r.returncode != 0 and "a stale leader" in r.stderr, (leader, in_term, r.stdout, r.stderr)
    assert c.kubectl("replace", "--subresource=status", "-f", "-", check=False,
                     input=json.dumps(c.get("resourceclaim", name, ns="default"))).returncode == 0
    r = write_status_named(holder, term)
    assert r.returncode == 0, r.stderr
    assert c.get("resourceclaim", name, ns="default")["status"]["allocation"] == claim["status"]["allocation"]
    tc.delete(c, "dra-fenced")


def test_a_claim_no_node_can_satisfy_says_why(c):
    c.apply(claim_pod("dra-too-big", "too-big"))  # 64 GiB of a 32 GiB GPU
    waits_for_tessera(c, "dra-too-big")
    assert c.pod("default", "dra-too-big")["status"]["phase"] == "Pending"
    tc.delete(c, "dra-too-big")


def test_device_plugin_pods_never_get_the_dra_gpus(c):
    # Whole GPUs through the device plugin: six fit (GPUs 0-5), the seventh does not, though 6 and 7 are free.
    c.apply("---\n".join(tc.pod_yaml(f"dp-{i}", {"tessera.dev/gpu": 1}) for i in range(7)))
    ids = uuids(c)
    # Created at once, the seven are bound in no set order: whichever six run, the seventh waits.
    names = [f"dp-{i}" for i in range(7)]
    runs = lambda: [n for n in names if (c.pod("default", n) or {}).get("status", {}).get("phase") == "Running"]  # noqa: E731
    started = c.wait_for(lambda: runs() if len(runs()) >= 6 else None, "six of the seven device-plugin pods to run", 120)
    placed = []
    for name in started:
        pod = c.pod("default", name)
        tc.check_started_with_assignment(c, pod)
        placed += [v["uuid"] for x in tc.assignment(pod)["containers"] for v in x["vgpus"]]
    assert len(started) == 6 and len(set(placed)) == 6, placed
    assert not set(placed) & {ids[i] for i in DRA_GPUS}, placed
    waiting, = set(names) - set(started)
    assert c.pod("default", waiting)["status"]["phase"] == "Pending"
    # And a whole-GPU claim still gets one of the DRA GPUs meanwhile.
    c.apply(claim_pod("dra-whole", "gpu-whole"))
    claim, env, limits, _ = prepared(c, "dra-whole")
    (uuid, gpu), = limits.items()
    assert uuid in {ids[i] for i in DRA_GPUS} and gpu["cores"] == 100 and gpu["memory"] == 32768 << 20, limits
    tc.delete(c, *[f"dp-{i}" for i in range(7)], "dra-whole")


def test_kubelet_and_agent_restarts_lose_nothing(c):
    c.apply(claim_pod("dra-r", "gpu-share-30"))
    claim, _, before, _ = prepared(c, "dra-r")
    registrations = lambda: c.procs["tessera-node"].since_start().count("registered with the kubelet as a DRA driver")  # noqa: E731
    before_restart = registrations()
    assert before_restart >= 1
    # The kubelet restarts: it finds the driver's registration socket again and keeps the pod's prepared claim.
    c.procs["kubelet"].stop()
    c.start_kubelet()
    c.wait_for_plugin()
    c.wait_for(lambda: registrations() > before_restart, "the restarted kubelet to register the DRA driver again")
    # The agent restarts: its records bring the claim's tenant back; the kubelet's new requests reach it.
    c.procs["tessera-node"].stop()
    c.start_node_agent()
    c.wait_for(lambda: registrations() >= 1, "the restarted driver to register with the kubelet")
    claim2, _, after, _ = prepared(c, "dra-r")
    assert claim2["metadata"]["uid"] == claim["metadata"]["uid"] and after == before, (before, after)
    c.apply(claim_pod("dra-r2", "gpu-share-30"))
    prepared(c, "dra-r2")
    tc.delete(c, "dra-r", "dra-r2")


def test_a_claim_the_kubelet_forgot_is_unprepared_by_the_node_agent(c):
    # The kubelet calls NodeUnprepareResources only for the claims its DRA checkpoint says it prepared for a pod
    # (kubernetes/kubernetes#131513 and #140212: a pod deleted while its prepare was in flight is never
    # unprepared). A kubelet that lost its checkpoint forgets the same way: stopped, its dra_manager_state removed,
    # the pod force-deleted meanwhile (its claim then deleted by the claim controller), started again. No one would
    # ever unprepare the claim, and its share of the GPU would stay held; tessera-node does it once the claim is
    # gone from the API server, no pod of it is on the node and no process of it registered, for its grace.
    c.apply(claim_pod("dra-forgot", "gpu-share-30"))
    claim, _, _, spec_path = prepared(c, "dra-forgot")
    uid, name = claim["metadata"]["uid"], claim["metadata"]["name"]
    records = lambda: [n for n in os.listdir(c.path("tessera", "records")) if uid in n]  # noqa: E731
    assert records()
    c.procs["kubelet"].stop()
    os.remove(os.path.join(KUBELET_ROOT, "dra_manager_state"))
    c.kubectl("delete", "pod", "dra-forgot", "--wait=false", "--grace-period=0", "--force", check=False)
    tc.gone(c, "dra-forgot")
    c.wait_for(lambda: c.kubectl("get", "resourceclaim", name, check=False).returncode != 0,
               "the claim controller to delete the pod's claim")
    c.start_kubelet()
    c.wait_for_plugin()
    # The sweep runs every 10 s (the slice's resync) and waits out the grace: well inside a minute.
    c.wait_for(lambda: not records() and not os.path.exists(spec_path),
               "tessera-node to unprepare the claim the kubelet forgot", 120)
    assert "unprepared a claim the kubelet forgot" in c.procs["tessera-node"].since_start()
    # Its share is free again on the node: both DRA GPUs whole are prepared (with the 30% record left, the
    # agent would refuse the whole-GPU claim on its GPU).
    c.apply("---\n".join(claim_pod(p, "gpu-whole") for p in ("dra-after-a", "dra-after-b")))
    for p in ("dra-after-a", "dra-after-b"):
        prepared(c, p)
    tc.delete(c, "dra-after-a", "dra-after-b")


def with_cdi_edits(rec, spec_path):
    """The container as a CDI-aware runtime (containerd, CRI-O) creates it: the record plus the containerEdits of
    the CDI devices the kubelet named (CDI 0.6.0: env appended, mounts added)."""
    with open(spec_path) as f:
        spec = json.load(f)
    out = dict(rec, env=dict(rec["env"]), mounts=list(rec["mounts"]))
    for device in spec["devices"]:
        if f"{spec['kind']}={device['name']}" not in rec.get("cdiDevices", []):
            continue
        edits = device["containerEdits"]
        out["env"].update(dict(e.split("=", 1) for e in edits.get("env", [])))
        out["mounts"] += [{"host": m["hostPath"], "container": m["containerPath"], "readonly": "ro" in m["options"]}
                          for m in edits.get("mounts", [])]
    return out


def test_a_running_tenant_is_held_to_its_claim(c):
    # A process of the claim's container, under the hook library the CDI spec mounts and preloads, on the fake
    # driver: it registers with the agent as the claim's tenant and runs at the claim's 30% with its 8 GiB.
    c.apply(claim_pod("dra-live", "gpu-share-30"))
    claim, env, limits, spec_path = prepared(c, "dra-live")
    pod = c.pod("default", "dra-live")
    rec = with_cdi_edits(tc.record(c, pod), spec_path)
    assert any(m["container"] == "/etc/ld.so.preload" for m in rec["mounts"]), rec["mounts"]
    device_dir = c.path("fakegpu")
    os.makedirs(device_dir, exist_ok=True)
    extra = {"LD_LIBRARY_PATH": os.path.join(tc.BUILD, "fakecuda"),
             "CUDA_VISIBLE_DEVICES": rec["env"]["NVIDIA_VISIBLE_DEVICES"],
             "FAKECUDA_UUIDS": ",".join(tc.node_gpu_uuids()), "FAKECUDA_STATE": "/run/fakecuda/node.state",
             "TESSERA_HOOK_LOG": "info"}
    argv = [os.path.join(tc.BUILD, "tests", "cuda_probe"), "dlsym", "init", "ctx", "watch", "2000000", "250"]
    tenant = tc.ContainerProcess(c, rec, argv, extra, [(device_dir, "/run/fakecuda", False)])
    try:
        tc.wait_for_windows(c, tenant, 0, "the claim's tenant to run at its 30% with 8 GiB",
                            share=lambda s: 0.2 <= s <= 0.4, memory=8192 << 20)
        c.wait_for(lambda: "registered with the node agent" in tenant.stderr(), "the tenant to register")
    finally:
        code = tenant.stop()
    assert code == 0, f"the tenant exited {code}: {tenant.stderr()[-3000:]}"
    tc.delete(c, "dra-live")


def test_topology_constraints_and_the_elastic_class(c):
    # GPUs 6 and 7 share a PCIe switch (PIX) and no NVLink (examples/fake-gpus/two-socket-8gpu.yaml): a pair
    # behind one switch is allocated both; a pair joined by NVLink exists on no node, and the pod says why.
    c.apply(claim_pod("dra-pair", "gpu-pair-pcie-switch"))
    claim, env, limits, _ = prepared(c, "dra-pair")
    ids = uuids(c)
    assert set(limits) == {ids[6], ids[7]} and all(g["cores"] == 100 for g in limits.values()), limits
    assert env["NVIDIA_VISIBLE_DEVICES"].split(",") == [ids[6], ids[7]] or \
        env["NVIDIA_VISIBLE_DEVICES"].split(",") == [ids[7], ids[6]], env
    tc.delete(c, "dra-pair")
    c.apply(claim_pod("dra-nvlink", "gpu-pair-nvlink"))
    waits_for_tessera(c, "dra-nvlink")
    tc.delete(c, "dra-nvlink")
    # The elastic class's opaque configuration reaches the limits file; the CEL selector on the model matches.
    c.apply(claim_pod("dra-elastic", "gpu-share-v100-elastic"))
    _, _, limits, _ = prepared(c, "dra-elastic")
    (uuid, gpu), = limits.items()
    assert gpu["policy"] == "elastic" and gpu["cores"] == 20 and gpu["memory"] == 4096 << 20, limits
    tc.delete(c, "dra-elastic")


def template(name, request, constraints=None):
    devices = {"requests": [request]}
    if constraints:
        devices["constraints"] = constraints
    return yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                           "metadata": {"name": name, "namespace": "default"}, "spec": {"spec": {"devices": devices}}})


def test_tessera_places_the_claim_and_lifts_the_gate(c):
    c.apply(claim_pod("dra-placed", "share-40"))
    claim, _, limits, _ = prepared(c, "dra-placed")
    p = c.pod("default", "dra-placed")
    assert p["metadata"]["labels"]["tessera.dev/dra-placement"] == "placed", p["metadata"]["labels"]
    assert not [g for g in p["spec"].get("schedulingGates", []) if g["name"] == "tessera.dev/dra-placement"]
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "dra-placed", "uid": p["metadata"]["uid"]}]
    result, = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"cores": "40", "memory": "8Gi"} and result["shareID"], result
    tc.delete(c, "dra-placed")


def test_a_claim_made_by_hand_is_deallocated_when_its_pod_is_gone(c):
    # A standalone ResourceClaim (not a template's) outlives its pod. kube-controller-manager's resourceclaim
    # controller deallocates it only when it carries kube-scheduler's finalizer (pkg/controller/resourceclaim,
    # v1.37.2), which Tessera puts on before allocating: without it the share stayed allocated, held by nobody.
    c.apply(yaml.safe_dump({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": "by-hand", "namespace": "default"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
            "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"cores": "30", "memory": "4Gi"}}}}]}}}))
    pod = yaml.safe_load(claim_pod("dra-by-hand", "unused"))
    pod["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "by-hand"}]
    c.apply(yaml.safe_dump(pod))
    tc.running(c, "dra-by-hand")
    claim = c.get("resourceclaim", "by-hand", ns="default")
    assert claim["status"].get("allocation") and claim["metadata"].get("finalizers") == [
        "resource.kubernetes.io/delete-protection"], claim
    tc.delete(c, "dra-by-hand")
    c.wait_for(lambda: not c.get("resourceclaim", "by-hand", ns="default")["status"].get("allocation"),
               "kube-controller-manager to deallocate the claim its pod no longer holds", 120)
    c.kubectl("delete", "resourceclaim", "by-hand", "-n", "default", "--wait=true", "--timeout=60s")


def test_a_first_available_claim_gets_the_first_alternative_that_fits(c):
    c.apply(template("first-available", {"name": "gpu", "firstAvailable": [
        {"name": "four", "deviceClassName": "gpu.tessera.dev", "count": 4},
        {"name": "share", "deviceClassName": "gpu.tessera.dev",
         "capacity": {"requests": {"cores": "25", "memory": "2Gi"}}}]}))
    c.apply(claim_pod("dra-first", "first-available"))
    claim, _, limits, _ = prepared(c, "dra-first")
    result, = claim["status"]["allocation"]["devices"]["results"]
    assert result["request"] == "gpu/share", result
    (uuid, gpu), = limits.items()
    assert gpu["cores"] == 25 and gpu["memory"] == 2048 << 20, limits
    tc.delete(c, "dra-first")


def test_one_quota_counts_claims_and_device_plugin_pods(c):
    # Tessera's quota (--quota-file) holds on the DRA path, and one quota counts both paths: namespace dra-quota
    # may hold 0.8 of a V100; a device-plugin pod of 30% and a claim of 40% fit, a second claim of 40% waits, and so
    # does a device-plugin pod of 20% (the extender counts the claim); the first pod gone, the claim runs.
    ns = "dra-quota"
    log = c.procs["tessera-scheduler-r1"]
    loads = log.since_start().count("GPU quotas in force")
    c.write_quotas([{"namespace": ns, "model": "V100-PCIE-32GB", "gpus": 0.8}])
    try:
        c.wait_for(lambda: log.since_start().count("GPU quotas in force") > loads, "tessera-scheduler to read the quotas")
        tc.namespace_ready(c, ns)
        share = yaml.safe_load(share_template("share-40", 40, "8Gi"))
        share["metadata"]["namespace"] = ns
        c.apply(yaml.safe_dump(share))

        def claim_pod_in(name):
            pod = yaml.safe_load(claim_pod(name, "share-40"))
            pod["metadata"]["namespace"] = ns
            return yaml.safe_dump(pod)

        c.apply(tc.pod_yaml("dp-30", {"tessera.dev/gpu-cores": 30}, ns=ns))
        tc.running(c, "dp-30", ns=ns)
        c.apply(claim_pod_in("claim-1"))
        tc.running(c, "claim-1", ns=ns, timeout=90)
        c.apply(claim_pod_in("claim-2"))
        quota = f"namespace {ns} holds 0.7 of its 0.8 V100-PCIE-32GB GPUs (quota) and the pod needs 0.4 more"
        c.wait_for(lambda: quota in c.pod(ns, "claim-2")["metadata"].get("annotations", {}).get(
            "tessera.dev/dra-waiting", ""), "claim-2 to wait on the quota", 60)
        assert any(quota in m for m in tc.events_of(c, ns, "claim-2")), tc.events_of(c, ns, "claim-2")
        c.apply(tc.pod_yaml("dp-20", {"tessera.dev/gpu-cores": 20}, ns=ns))
        c.wait_for(lambda: any(f"namespace {ns} holds 0.7 of its 0.8" in m for m in tc.events_of(c, ns, "dp-20")),
                   "dp-20's events to name the quota", 90)
        assert "nodeName" not in c.pod(ns, "dp-20")["spec"]
        tc.delete(c, "dp-20", ns=ns)
        tc.delete(c, "dp-30", ns=ns)
        tc.running(c, "claim-2", ns=ns, timeout=90)
        tc.delete(c, "claim-1", "claim-2", ns=ns)
    finally:
        c.write_quotas([])


def test_a_hundred_claims_at_once_never_put_a_gpu_over_its_capacity(c):
    # 100 pods of 3% and 512 MiB at once on the node's two DRA GPUs: 33 fit on each (99%), 34 wait.
    c.apply(template("share-3", {"name": "gpu", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"cores": "3", "memory": "512Mi"}}}}))
    c.apply("---\n".join(claim_pod(f"dra-h{i}", "share-3") for i in range(100)))

    def allocations():
        claims = [x for x in c.get("resourceclaims", ns="default")["items"]
                  if x["metadata"]["name"].startswith("dra-h") and x.get("status", {}).get("allocation")]
        return claims if len(claims) >= 66 else None
    claims = c.wait_for(allocations, "66 of the 100 claims to be allocated", 300)
    time.sleep(3)  # anything allocated beyond 66 would show by now
    claims = allocations()
    held = {}
    for x in claims:
        for r in x["status"]["allocation"]["devices"]["results"]:
            held[r["device"]] = held.get(r["device"], 0) + int(r["consumedCapacity"]["cores"])
    assert len(claims) == 66 and held == {"gpu-6": 99, "gpu-7": 99}, (len(claims), held)
    gated = [p for p in c.get("pods", ns="default")["items"] if p["metadata"]["name"].startswith("dra-h")
             and p["metadata"].get("labels", {}).get("tessera.dev/dra-placement") == "gated"]
    assert len(gated) == 34, len(gated)
    c.kubectl("delete", "pod", "-n", "default", "--wait=false", *[f"dra-h{i}" for i in range(100)])
    c.wait_for(lambda: not [p for p in c.get("pods", ns="default")["items"] if p["metadata"]["name"].startswith("dra-h")],
               "the 100 pods to be gone", 300)


def test_a_claim_tessera_cannot_read_is_left_to_kube_scheduler(c):
    # A selector outside what tessera-scheduler evaluates (a CEL function): the gate is lifted at once, with an
    # event, and kube-scheduler's own allocator places the claim.
    c.apply(template("fancy-selector", {"name": "gpu", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"cores": "10", "memory": "1Gi"}},
        "selectors": [{"cel": {"expression": 'device.attributes["gpu.tessera.dev"].model.startsWith("V100")'}}]}}))
    c.apply(claim_pod("dra-fancy", "fancy-selector"))
    prepared(c, "dra-fancy")
    p = c.pod("default", "dra-fancy")
    assert p["metadata"]["labels"]["tessera.dev/dra-placement"] == "fallback", p["metadata"]["labels"]
    messages = c.wait_for(lambda: events(c, "dra-fancy", "TesseraPlacementHandedOver"), "a hand-over event")
    assert any("outside what Tessera evaluates" in m for m in messages), messages
    tc.delete(c, "dra-fancy")


def test_tessera_scheduler_killed_mid_stream_loses_and_doubles_nothing(c):
    # Gated pods arrive; tessera-scheduler is SIGKILLed while it places them and started again: every claim is
    # allocated once, no GPU over its capacity, every pod runs.
    c.apply(template("share-3", {"name": "gpu", "exactly": {
        "deviceClassName": "gpu.tessera.dev", "capacity": {"requests": {"cores": "3", "memory": "512Mi"}}}}))
    c.apply("---\n".join(claim_pod(f"dra-k{i}", "share-3") for i in range(20)))
    c.procs["tessera-scheduler-r1"].stop(signal.SIGKILL)
    c.start_tessera_scheduler("r1")
    for i in range(20):
        tc.running(c, f"dra-k{i}", timeout=120)
    held = {}
    for x in c.get("resourceclaims", ns="default")["items"]:
        for r in (x.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", []):
            held[r["device"]] = held.get(r["device"], 0) + int(r["consumedCapacity"]["cores"])
    assert sum(held.values()) == 60 and all(v <= 100 for v in held.values()), held
    # Placed by tessera-scheduler, or (a restart slower than the Lease and tessera-node's 5 s here) handed to
    # kube-scheduler by the fallback: never both, never neither.
    assert all(c.pod("default", f"dra-k{i}")["metadata"]["labels"]["tessera.dev/dra-placement"] in ("placed", "fallback")
               for i in range(20))
    tc.delete(c, *[f"dra-k{i}" for i in range(20)])


def test_a_gated_pod_falls_back_to_kube_scheduler_when_tessera_scheduler_stays_down(c):
    # A pod that fits nowhere waits gated; tessera-scheduler goes down and stays down: past its Lease and
    # tessera-node's --dra-fallback-after (5 s here, 60 shipped), the node agent lifts the gate (label fallback,
    # an event, a metric) and kube-scheduler's allocator takes over (it finds no place either, and says so).
    # A pod created while the webhook is down is not gated at all (failurePolicy Ignore) and runs.
    c.apply(claim_pod("dra-stranded", "too-big"))
    waits_for_tessera(c, "dra-stranded")
    c.procs["tessera-scheduler-r1"].stop(signal.SIGKILL)
    try:
        c.wait_for(lambda: (c.pod("default", "dra-stranded")["metadata"]["labels"].get("tessera.dev/dra-placement")
                            == "fallback") or None, "tessera-node to hand the pod to kube-scheduler", 120)
        p = c.pod("default", "dra-stranded")
        assert not [g for g in p["spec"].get("schedulingGates", []) if g["name"] == "tessera.dev/dra-placement"]
        messages = c.wait_for(lambda: events(c, "dra-stranded", "TesseraPlacementFallback"), "a fallback event")
        assert any("tessera-scheduler is unavailable" in m for m in messages), messages
        c.wait_for(lambda: events(c, "dra-stranded", "FailedScheduling"), "kube-scheduler to try the pod", 60)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{c.ports['node-metrics']}/metrics", timeout=10).read().decode()
        assert any(line.startswith("tessera_node_dra_fallbacks_total ") and float(line.split()[1]) >= 1
                   for line in metrics.splitlines()), [l for l in metrics.splitlines() if "fallback" in l]
        c.apply(claim_pod("dra-ungated", "share-40"))
        prepared(c, "dra-ungated")
        assert "tessera.dev/dra-placement" not in c.pod("default", "dra-ungated")["metadata"].get("labels", {})
    finally:
        c.start_tessera_scheduler("r1")
    tc.delete(c, "dra-stranded", "dra-ungated")


def test_an_unchanged_slice_is_never_rewritten(c):
    # The agent compares its slice with the API server's every 10 s; the API server writes quantities in canonical
    # form (32768Mi reads back as 32Gi). Nothing changed during this module (about a minute, several resyncs,
    # one agent restart), so the pool is at its first generation and the agent never updated it.
    s = c.get("resourceslice", f"{NODE}-gpu.tessera.dev")
    assert s["spec"]["pool"]["generation"] == 1, s["spec"]["pool"]
    assert "ResourceSlice updated" not in c.procs["tessera-node"].tail(1000000)


def test_a_pod_that_cannot_bind_has_its_claim_released_and_runs_once_it_can(c):
    # kube-scheduler refuses the allocation's node for a reason Tessera does not model: the pod asks for a host
    # port another pod holds there (NodePorts). Past --dra-rebind-after the claim is deallocated, with an event,
    # and placed again away from that node: on this one-node cluster there is no other, so it stays deallocated
    # (its share free for others) and says why. Once the port is free, kube-scheduler binds the pod, its
    # allocator placing the claim on the one node there is, and the real tessera-node prepares it.
    c.apply(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "dra-port-holder", "namespace": "default"},
        "spec": {"restartPolicy": "Never", "containers": [
            {"name": "main", "image": "registry.invalid/app:1", "ports": [{"containerPort": 80, "hostPort": 18080}]}]}}))
    tc.running(c, "dra-port-holder")
    c.apply(claim_pod("dra-blocked", "share-40", host_port=18080))

    def allocation():
        return (claim_of(c, "dra-blocked").get("status") or {}).get("allocation")
    first = c.wait_for(allocation, "Tessera to allocate the blocked pod's claim")
    assert first["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [NODE], first
    assert c.pod("default", "dra-blocked")["metadata"]["labels"]["tessera.dev/dra-placement"] == "placed"
    refusals = c.wait_for(lambda: events(c, "dra-blocked", "FailedScheduling"), "kube-scheduler to refuse the pod")
    assert any("free ports" in m for m in refusals), refusals
    released = c.wait_for(lambda: events(c, "dra-blocked", "TesseraPlacementReleased"),
                          "tessera-scheduler to release the claim", 60 + REBIND_AFTER)
    assert any(f"has not bound the pod to node {NODE} for {REBIND_AFTER} s" in m and "free ports" in m
               and f"not on node {NODE}" in m for m in released), released
    c.wait_for(lambda: not allocation(), "the claim to stay deallocated")
    claim = claim_of(c, "dra-blocked")
    assert not claim["status"].get("reservedFor"), claim["status"]
    waiting = c.wait_for(lambda: events(c, "dra-blocked", "TesseraPlacementWaiting"), "a waiting event")
    assert any("where kube-scheduler would not bind it" in m for m in waiting), waiting
    assert c.pod("default", "dra-blocked")["status"]["phase"] == "Pending"
    # The port is freed: the pod binds and runs with its 40%.
    tc.delete(c, "dra-port-holder")
    claim, _, limits, _ = prepared(c, "dra-blocked")
    (uuid, gpu), = limits.items()
    assert gpu["cores"] == 40 and gpu["memory"] == 8192 << 20, limits
    assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "dra-blocked",
                                               "uid": c.pod("default", "dra-blocked")["metadata"]["uid"]}]
    assert "tessera-scheduler-r1" in c.procs and \
        "deallocated the DRA claims of a pod that cannot bind" in c.procs["tessera-scheduler-r1"].tail(100000)
    tc.delete(c, "dra-blocked")


DGX_A100 = "examples/fake-gpus/nvlink-8gpu.yaml"
DGX_DRA_GPUS = (2, 3, 4, 5)


def restart_node(c, fake_gpus, dra_gpus):
    """The node again on other GPUs, as after a drained node's hardware change and reboot: the kubelet and
    tessera-node restarted; the slice, the inventory annotation and the device plugin follow. The kubelet too: one
    that was itself restarted earlier in this module (test_kubelet_and_agent_restarts_lose_nothing) keeps the old
    device plugin's endpoint after the agent stops and refuses its next registration ("device plugin already
    connected"), which a fresh kubelet does not."""
    with open(os.path.join(tc.SOURCE, fake_gpus)) as f:
        wanted = [g["uuid"] for g in yaml.safe_load(f)["gpus"]]
    # Drained first: the kubelet has unprepared every claim (no tenant of the old GPUs is left behind).
    def drained():
        left = [n for n in os.listdir(c.path("tessera", "records")) if "_claim_" in n]
        if left:
            pods = c.kubectl("get", "pods", "-A", "-o", "wide", check=False).stdout
            raise HarnessError(f"claim records left: {left}; the pods:\n{pods}")
        return True
    c.wait_for(drained, "every claim to be unprepared", 120)
    c.procs["tessera-node"].stop()
    c.procs["kubelet"].stop()
    c.fake_gpus, c.dra_gpus = fake_gpus, list(dra_gpus)
    c.start_kubelet()
    c.start_node_agent()
    c.wait_for(lambda: sorted(uuids(c).values()) == sorted(wanted), "the inventory of the new GPUs")

    def slice_devices():
        s = c.get("resourceslice", f"{NODE}-gpu.tessera.dev")
        by_name = {d["name"]: d["attributes"]["uuid"]["string"] for d in s["spec"]["devices"]}
        return by_name if by_name == {f"gpu-{i}": wanted[i] for i in dra_gpus} else None
    c.wait_for(slice_devices, "the slice of the new DRA GPUs")


def test_an_nvlink_pair_on_a_dgx_a100(c):
    # A DGX A100 (every GPU pair NV12 through NVSwitches; 4 NUMA nodes: GPUs 0-1 on 3, 2-3 on 1, 4-5 on 7, 6-7 on
    # 5), GPUs 2-5 given to DRA: two NUMA nodes. The NVLink pair claim is allocated by Tessera and prepared by
    # tessera-node with both GPUs in the limits file.
    #
    # What the cost tree promises here: `tessera topo tests/testdata/topo/dgx-a100.txt` is one NV12 level over
    # all eight GPUs (cost 7 each). NUMA is not part of Gaia's tree (it is built from the GPU-to-GPU links only,
    # and every link is the same), so a pair within one NUMA node is not preferred and the test does not ask for
    # one. What the tree does promise: any two GPUs are a pair at the nearest level, so a second pair takes the
    # other two and a third waits; two pairs never share a GPU.
    restart_node(c, DGX_A100, DGX_DRA_GPUS)
    try:
        ids = uuids(c)
        dra_ids = {ids[i] for i in DGX_DRA_GPUS}
        slice_spec = c.get("resourceslice", f"{NODE}-gpu.tessera.dev")["spec"]
        assert {d["attributes"]["nvlinkDomain"]["int"] for d in slice_spec["devices"]} == {0}, slice_spec
        held = []
        for pod in ("dra-nv-a", "dra-nv-b"):
            c.apply(claim_pod(pod, "gpu-pair-nvlink"))
            claim, env, limits, _ = prepared(c, pod)
            p = c.pod("default", pod)
            assert p["metadata"]["labels"]["tessera.dev/dra-placement"] == "placed", p["metadata"]["labels"]
            results = claim["status"]["allocation"]["devices"]["results"]
            devices = {r["device"] for r in results}
            assert len(results) == 2 and len(devices) == 2, results
            gpus = {ids[int(d.split("-")[1])] for d in devices}
            assert gpus <= dra_ids, (gpus, dra_ids)
            assert set(limits) == gpus, limits
            assert all(g["cores"] == 100 and g["memory"] == 81920 << 20 for g in limits.values()), limits
            assert set(env["NVIDIA_VISIBLE_DEVICES"].split(",")) == gpus, env
            held.append(gpus)
        assert not held[0] & held[1] and held[0] | held[1] == dra_ids, held
        c.apply(claim_pod("dra-nv-c", "gpu-pair-nvlink"))
        waits_for_tessera(c, "dra-nv-c")
    finally:
        tc.delete(c, "dra-nv-a", "dra-nv-b", "dra-nv-c")
        restart_node(c, FAKE_GPUS, DRA_GPUS)
