"""deploy/'s ValidatingAdmissionPolicy on the real kube-apiserver (docs/security.md, "Node and pod annotations").

Only tessera-scheduler and tessera-node may write the annotations that decide a GPU share: tessera-node obeys
tessera.dev/assignment and queues Allocate by tessera.dev/phase and tessera.dev/assigned-at. Here an ordinary user,
alice (impersonated with `kubectl --as`, with RBAC that lets her create, patch, bind and delete pods and create
Deployments), forges them on create, by patch, through a binding and through a Deployment's pod template, and is
refused with the policy's message; the scheduler's and the node agent's service accounts (impersonated the same
way) write them as they do in a cluster, and are let through.

The control plane only (etcd, kube-apiserver, kube-controller-manager for the Deployment): no kubelet, so this
file does not take the kubelet lock. The chart's copy of the policy (the same CEL, the release's namespace in
the service accounts) is rendered and applied by the real Helm at the end.
"""

import json
import os
import subprocess

import pytest
import yaml

from cluster import Cluster

SOURCE = os.environ.get("TESSERA_SOURCE_DIR", os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..")))
BUILD = os.environ.get("TESSERA_BINARY_DIR", os.path.join(SOURCE, "build"))
POLICY = os.path.join(SOURCE, "deploy", "scheduler", "60-annotation-policy.yaml")
FENCE = os.path.join(SOURCE, "deploy", "scheduler", "70-leader-fence.yaml")

SCHEDULER = "system:serviceaccount:tessera-system:tessera-scheduler"
NODE_AGENT = "system:serviceaccount:kube-system:tessera-node"
ASSIGNMENT = json.dumps({"version": 1, "node": "gpu-node-0", "containers": [
    {"name": "main", "vgpus": [{"uuid": "GPU-0", "index": 0, "cores": 100, "memoryMiB": 15360}]}]})
REFUSED = "may be written only by tessera-scheduler and tessera-node"
FROZEN = "cannot change once the pod exists"

ALICE_RBAC = """
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: pod-editor}
rules:
- apiGroups: [""]
  resources: ["pods", "pods/status", "pods/binding", "bindings"]
  verbs: ["get", "list", "create", "update", "patch", "delete"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "create"]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: alice-pod-editor}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: pod-editor}
subjects:
- {apiGroup: rbac.authorization.k8s.io, kind: User, name: alice}
"""


@pytest.fixture(scope="module")
def c():
    cluster = Cluster(SOURCE, BUILD)
    try:
        cluster._make_pki()
        cluster.start_etcd()
        cluster.start_apiserver()
        cluster.start_controller_manager()
        # The service accounts and their RBAC as shipped, then the policy as shipped.
        for f in ("deploy/scheduler/00-namespace.yaml", "deploy/scheduler/10-rbac.yaml", "deploy/node/daemonset.yaml"):
            cluster.kubectl("apply", "-f", os.path.join(SOURCE, f))
        cluster.apply(ALICE_RBAC)
        cluster.kubectl("apply", "-f", POLICY)
        # The API server compiles a new policy and starts enforcing it within a moment.
        cluster.wait_for(lambda: REFUSED in create("probe", {"tessera.dev/phase": "bound"}, cluster).stderr,
                         "the policy to be enforced")
        yield cluster
    finally:
        cluster.stop()
        if not cluster.keep:
            subprocess.run(["rm", "-rf", cluster.work], check=False)


def pod(name, annotations=None, labels=None):
    meta = {"name": name, "namespace": "default"}
    if annotations:
        meta["annotations"] = annotations
    if labels:
        meta["labels"] = labels
    return yaml.safe_dump({"apiVersion": "v1", "kind": "Pod", "metadata": meta,
                           "spec": {"containers": [{"name": "main", "image": "registry.invalid/app:1"}]}})


def create(name, annotations, c, user="alice", labels=None):
    return c.kubectl("--as", user, "create", "-f", "-", input=pod(name, annotations, labels), check=False)


def patch(c, name, annotations=None, user="alice", labels=None):
    meta = {}
    if annotations is not None:
        meta["annotations"] = annotations
    if labels is not None:
        meta["labels"] = labels
    return c.kubectl("--as", user, "patch", "pod", name, "-n", "default", "--type", "merge",
                     "-p", json.dumps({"metadata": meta}), check=False)


def annotations(c, name):
    return c.pod("default", name)["metadata"].get("annotations", {})


@pytest.mark.parametrize("key,value", [("tessera.dev/assignment", ASSIGNMENT),
                                       ("tessera.dev/phase", "bound"),
                                       ("tessera.dev/assigned-at", "2001-01-01T00:00:00Z")])
def test_a_user_cannot_create_a_pod_with_a_decision(c, key, value):
    r = create("forged-" + key.split("/")[1], {key: value}, c)
    assert r.returncode != 0 and REFUSED in r.stderr and key in r.stderr, r.stderr
    assert c.pod("default", "forged-" + key.split("/")[1]) is None


def test_a_user_cannot_patch_a_decision_onto_their_pod(c):
    r = create("mine", {"tessera.dev/priority": "low"}, c, labels={"aliyun.com/gpu-count": "1"})
    assert r.returncode == 0, r.stderr  # the request's own annotations are free on create
    for key, value in [("tessera.dev/assignment", ASSIGNMENT), ("tessera.dev/phase", "allocated"),
                       ("tessera.dev/assigned-at", "2001-01-01T00:00:00Z")]:
        r = patch(c, "mine", {key: value})
        assert r.returncode != 0 and REFUSED in r.stderr and key in r.stderr, (key, r.stderr)
    # Nor change what the pod was placed by, once it exists.
    r = patch(c, "mine", {"tessera.dev/priority": "high"})
    assert r.returncode != 0 and FROZEN in r.stderr and "tessera.dev/priority" in r.stderr, r.stderr
    r = patch(c, "mine", {"tessera.dev/compute-policy": "elastic"})
    assert r.returncode != 0 and FROZEN in r.stderr, r.stderr
    r = patch(c, "mine", labels={"aliyun.com/gpu-count": "4"})
    assert r.returncode != 0 and FROZEN in r.stderr and "label aliyun.com/gpu-count" in r.stderr, r.stderr
    # Anything else stays the user's.
    r = patch(c, "mine", {"example.com/owner": "alice"})
    assert r.returncode == 0, r.stderr
    assert "tessera.dev/assignment" not in annotations(c, "mine")


def test_a_user_cannot_bind_with_a_decision(c):
    assert create("unbound", None, c).returncode == 0
    binding = json.dumps({"apiVersion": "v1", "kind": "Binding",
                          "metadata": {"name": "unbound", "namespace": "default",
                                       "annotations": {"tessera.dev/assignment": ASSIGNMENT}},
                          "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-0"}})
    path = os.path.join(c.work, "binding.json")
    with open(path, "w") as f:
        f.write(binding)
    # Both ways to bind: the pods/binding subresource and the legacy bindings resource.
    r = c.kubectl("--as", "alice", "create", "--raw", "/api/v1/namespaces/default/pods/unbound/binding",
                  "-f", path, check=False)
    assert r.returncode != 0 and REFUSED in r.stderr, r.stderr
    r = c.kubectl("--as", "alice", "create", "--validate=false", "-f", path, check=False)
    assert r.returncode != 0 and REFUSED in r.stderr, r.stderr
    assert not c.pod("default", "unbound")["spec"].get("nodeName")


def test_a_pod_template_cannot_carry_a_decision(c):
    deployment = yaml.safe_dump({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "templated", "namespace": "default"},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "templated"}},
                 "template": {"metadata": {"labels": {"app": "templated"},
                                           "annotations": {"tessera.dev/assignment": ASSIGNMENT}},
                              "spec": {"containers": [{"name": "main", "image": "registry.invalid/app:1"}]}}}})
    assert c.kubectl("--as", "alice", "create", "-f", "-", input=deployment, check=False).returncode == 0

    def refused():
        rs = c.get("replicasets", ns="default")["items"]
        conds = [cd for r in rs for cd in r.get("status", {}).get("conditions", [])]
        return any(cd["type"] == "ReplicaFailure" and REFUSED in cd.get("message", "") for cd in conds)

    c.wait_for(refused, "the ReplicaSet controller's create to be refused", 90)
    pods = c.kubectl("get", "pods", "-n", "default", "-l", "app=templated", "-o", "name").stdout.split()
    assert pods == [], pods


def test_the_scheduler_and_the_node_agent_write_them(c):
    assert create("placed", None, c).returncode == 0
    # The extender's bind carries the three annotations (src/scheduler/api_backend.cc).
    binding = os.path.join(c.work, "bind-placed.json")
    with open(binding, "w") as f:
        json.dump({"apiVersion": "v1", "kind": "Binding",
                   "metadata": {"name": "placed", "namespace": "default",
                                "annotations": {"tessera.dev/assignment": ASSIGNMENT, "tessera.dev/phase": "bound",
                                                "tessera.dev/assigned-at": "2026-11-26T10:00:00.000Z"}},
                   "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-node-0"}}, f)
    r = c.kubectl("--as", SCHEDULER, "create", "--raw", "/api/v1/namespaces/default/pods/placed/binding",
                  "-f", binding, check=False)
    assert r.returncode == 0, r.stderr
    assert annotations(c, "placed")["tessera.dev/phase"] == "bound"
    # The scheduler rewrites a compressed pod's assignment (a merge patch).
    compressed = ASSIGNMENT.replace('"cores": 100', '"cores": 40, "requestedCores": 100')
    r = patch(c, "placed", {"tessera.dev/assignment": compressed}, user=SCHEDULER)
    assert r.returncode == 0, r.stderr
    # The node agent reports the phase and the assignment as applied (its pods patch).
    r = patch(c, "placed", {"tessera.dev/phase": "allocated", "tessera.dev/assignment": ASSIGNMENT}, user=NODE_AGENT)
    assert r.returncode == 0, r.stderr
    got = annotations(c, "placed")
    assert got["tessera.dev/phase"] == "allocated" and got["tessera.dev/assignment"] == ASSIGNMENT
    # alice still cannot, on the same pod.
    r = patch(c, "placed", {"tessera.dev/phase": "bound"})
    assert r.returncode != 0 and REFUSED in r.stderr, r.stderr
    # Deleting a pod that carries them is anyone's right.
    assert c.kubectl("--as", "alice", "delete", "pod", "placed", "-n", "default", "--wait=false",
                     check=False).returncode == 0


def test_the_charts_policy_names_the_releases_service_accounts(c):
    chart = os.path.join(SOURCE, "deploy", "helm", "tessera")
    helm = os.path.join(c.k8s_bin, "helm")
    rendered = subprocess.run([helm, "template", "gpu", chart, "-n", "gpu-sharing", "--set", "webhook.caBundle=Cg=="],
                              capture_output=True, text=True, check=True).stdout
    docs = [d for d in yaml.safe_load_all(rendered) if d and d["kind"].startswith("ValidatingAdmissionPolicy") and
            d["metadata"]["name"] == "tessera-annotations"]
    assert {d["kind"] for d in docs} == {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"}, docs
    policy = next(d for d in docs if d["kind"] == "ValidatingAdmissionPolicy")
    shipped = next(d for d in yaml.safe_load_all(open(POLICY)) if d["kind"] == "ValidatingAdmissionPolicy")
    condition = policy["spec"]["matchConditions"][0]["expression"]
    assert "system:serviceaccount:gpu-sharing:tessera-scheduler" in condition, condition
    assert "system:serviceaccount:gpu-sharing:tessera-node" in condition, condition
    # The same rules as the plain manifest, but for the release's service accounts.
    assert policy["spec"]["variables"] == shipped["spec"]["variables"]
    assert policy["spec"]["validations"] == shipped["spec"]["validations"]
    assert policy["spec"]["matchConstraints"] == shipped["spec"]["matchConstraints"]
    r = c.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs), check=False)
    assert r.returncode == 0, r.stderr
    off = subprocess.run([helm, "template", "gpu", chart, "-n", "gpu-sharing", "--set", "webhook.caBundle=Cg==",
                          "--set", "annotationPolicy.enabled=false"], capture_output=True, text=True, check=True).stdout
    assert "name: tessera-annotations" not in off and "name: tessera-leader-fence" in off


def test_the_charts_leader_fence_is_the_shipped_one(c):
    """The chart's copy of the leader fences (templates/leader-fence.yaml: binds, claims' status writes, pods'
    shares) is the manifest the cluster tier applies and tests (deploy/scheduler/70-leader-fence.yaml), but for the
    release's namespace: the Lease's, and tessera-scheduler's service account's."""
    chart = os.path.join(SOURCE, "deploy", "helm", "tessera")
    helm = os.path.join(c.k8s_bin, "helm")
    rendered = subprocess.run([helm, "template", "gpu", chart, "-n", "gpu-sharing", "--set", "webhook.caBundle=Cg=="],
                              capture_output=True, text=True, check=True).stdout
    names = {"tessera-leader-fence", "tessera-claim-fence", "tessera-share-fence"}
    docs = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(rendered) if d and
            d["kind"].startswith("ValidatingAdmissionPolicy") and d["metadata"]["name"] in names}
    # The shipped file in the release's namespace.
    with open(FENCE) as f:
        text = f.read().replace("serviceaccount:tessera-system:", "serviceaccount:gpu-sharing:")
    shipped = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}
    kinds = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
    assert set(docs) == set(shipped) == {(k, n) for k in kinds for n in names}, docs
    for name in names:
        assert docs[("ValidatingAdmissionPolicy", name)]["spec"] == shipped[("ValidatingAdmissionPolicy", name)]["spec"]
        binding = docs[("ValidatingAdmissionPolicyBinding", name)]["spec"]
        shipped_binding = shipped[("ValidatingAdmissionPolicyBinding", name)]["spec"]
        assert binding["paramRef"]["namespace"] == "gpu-sharing", binding
        shipped_binding["paramRef"]["namespace"] = "gpu-sharing"
        assert binding == shipped_binding
    r = c.kubectl("apply", "--dry-run=server", "-f", "-", input=yaml.safe_dump_all(docs.values()), check=False)
    assert r.returncode == 0, r.stderr
    off = subprocess.run([helm, "template", "gpu", chart, "-n", "gpu-sharing", "--set", "webhook.caBundle=Cg==",
                          "--set", "leaderFence.enabled=false"], capture_output=True, text=True, check=True).stdout
    assert not {f"name: {n}" for n in names if f"name: {n}" in off}, off
    assert "name: tessera-annotations" in off
