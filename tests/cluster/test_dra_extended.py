"""Extended resources on DRA GPUs (docs/dra.md, "Extended resources on DRA GPUs") on the real Kubernetes components.

tessera-node gives all eight GPUs to DRA (--dra-gpus=0-7): no node offers tessera.dev/gpu through the device plugin
and Tessera's driver publishes a ResourceSlice, so tessera-scheduler's default --extended-resources-to-dra=auto
turns a pod that asks with extended resources into one with a ResourceClaim of the same meaning. The checks read
what the real components did: the template the webhook made, the claim kube-controller-manager's resourceclaim
controller made from it (owned by the pod, deleted with it), Tessera's allocation, and the limits file the real
tessera-node wrote for the real kubelet's NodePrepareResources.
"""

import os

import pytest
import yaml

import test_cluster as tc
import test_dra as td
from cluster import Cluster


@pytest.fixture(scope="module")
def c():
    with Cluster(tc.SOURCE, tc.BUILD, dra_gpus=tuple(range(8))) as cluster:
        cluster.kubectl("apply", "-f", os.path.join(tc.SOURCE, "deploy/dra/deviceclasses.yaml"))
        # What auto decides on: the node offers no tessera.dev/gpu, the driver publishes the eight GPUs.
        assert cluster.allocatable_gpu() == 0
        cluster.wait_for(lambda: [s for s in cluster.get("resourceslices")["items"]
                                  if s["spec"]["driver"] == "gpu.tessera.dev" and len(s["spec"]["devices"]) == 8],
                         "tessera-node's ResourceSlice")
        yield cluster


def gpu_pod(name, limits):
    return yaml.safe_dump({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"},
        "spec": {"restartPolicy": "Never",
                 "containers": [{"name": "main", "image": "registry.invalid/app:1",
                                 "resources": {"limits": {k: str(v) for k, v in limits.items()}}}]}})


def claim_gone(c, name):
    return c.kubectl("get", "resourceclaim", name, "-n", "default", check=False).returncode != 0


def test_a_hami_share_runs_from_a_claim_owned_by_the_pod_and_gone_with_it(c):
    # HAMi's names, as a pod written for HAMi has them: 30% of a GPU and 4096 MiB.
    c.apply(gpu_pod("ext-share", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 30, "nvidia.com/gpumem": 4096}))
    p = c.pod("default", "ext-share")
    assert p["spec"]["resourceClaims"] == [{"name": "gpu-main", "resourceClaimTemplateName": "tessera-gpu-c30-m4096"}]
    resources = p["spec"]["containers"][0]["resources"]
    assert resources["claims"] == [{"name": "gpu-main"}], resources
    assert not [k for k in {**resources.get("limits", {}), **resources.get("requests", {})}
                if k.startswith(("nvidia.com/", "tessera.dev/"))], resources
    t = c.get("resourceclaimtemplate", "tessera-gpu-c30-m4096", ns="default")
    assert t["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "tessera-scheduler", t["metadata"]
    claim, env, limits, spec_path = td.prepared(c, "ext-share")
    p = c.pod("default", "ext-share")
    # The claim controller's: owned by the pod (its controller), so the garbage collector deletes it with the pod.
    owner, = claim["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner.get("controller")) == \
        ("Pod", "ext-share", p["metadata"]["uid"], True), owner
    # Placed by Tessera (the webhook gated the pod in the same patch), and as the HAMi request meant.
    assert p["metadata"]["labels"]["tessera.dev/dra-placement"] == "placed", p["metadata"]["labels"]
    result, = claim["status"]["allocation"]["devices"]["results"]
    assert result["consumedCapacity"] == {"cores": "30", "memory": "4Gi"}, result
    uuid = td.uuids(c)[int(result["device"].split("-")[1])]
    assert env["NVIDIA_VISIBLE_DEVICES"] == uuid, env
    assert limits[uuid]["memory"] == 4096 << 20 and limits[uuid]["cores"] == 30, limits
    assert limits[uuid]["policy"] == "hard", limits
    # A second pod of the shape uses the template that is there (the one read back equals the one written).
    c.apply(gpu_pod("ext-share-2", {"tessera.dev/gpu-cores": 30, "tessera.dev/gpu-memory": 4096}))
    assert c.pod("default", "ext-share-2")["spec"]["resourceClaims"][0]["resourceClaimTemplateName"] == \
        "tessera-gpu-c30-m4096"
    tc.running(c, "ext-share-2")
    tc.delete(c, "ext-share-2")
    tc.delete(c, "ext-share")
    name = claim["metadata"]["name"]
    c.wait_for(lambda: claim_gone(c, name), "the generated claim to be deleted with its pod")
    c.wait_for(lambda: not os.path.exists(spec_path), "the claim's CDI spec to be removed")


def test_tessera_names_whole_gpus_and_a_template_that_is_not_tesseras(c):
    # Someone else's template under the name Tessera would give two whole GPUs: never used, the pod is refused.
    c.apply(td.template("tessera-gpu-x2", {"name": "gpu", "exactly": {"deviceClassName": "gpu.tessera.dev",
                                                                       "count": 1}}))
    r = c.apply(gpu_pod("ext-whole", {"tessera.dev/gpu": 2}), check=False)
    assert r.returncode != 0, r.stdout
    assert "was not made by tessera-scheduler" in r.stderr and "delete or rename it" in r.stderr, r.stderr
    assert c.pod("default", "ext-whole") is None
    # With the label but another spec (one GPU where the pod asks two): not used either.
    c.kubectl("label", "resourceclaimtemplate", "tessera-gpu-x2", "-n", "default",
              "app.kubernetes.io/managed-by=tessera-scheduler")
    r = c.apply(gpu_pod("ext-whole", {"tessera.dev/gpu": 2}), check=False)
    assert r.returncode != 0 and "asks for something else than this pod" in r.stderr, r.stderr
    c.kubectl("delete", "resourceclaimtemplate", "tessera-gpu-x2", "-n", "default")
    c.apply(gpu_pod("ext-whole", {"tessera.dev/gpu": 2}))
    claim, _, limits, _ = td.prepared(c, "ext-whole")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert len({r["device"] for r in results}) == 2, results
    assert len(limits) == 2 and all(v["cores"] == 100 and v["memory"] == 32 << 30 for v in limits.values()), limits
    tc.delete(c, "ext-whole")


def test_a_server_dry_run_creates_no_template(c):
    r = c.kubectl("apply", "--dry-run=server", "-o", "json", "-f", "-",
                  input=gpu_pod("ext-dry", {"tessera.dev/gpu-cores": 20, "tessera.dev/gpu-memory": 2048}))
    assert '"resourceClaimTemplateName": "tessera-gpu-c20-m2048"' in r.stdout, r.stdout
    assert c.kubectl("get", "resourceclaimtemplate", "tessera-gpu-c20-m2048", "-n", "default",
                     check=False).returncode != 0
