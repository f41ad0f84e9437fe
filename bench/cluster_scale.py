#!/usr/bin/env python3
"""Scheduling throughput on a real control plane: the real kube-scheduler with Tessera's extender against the same
kube-scheduler alone, on the same 5,000 simulated nodes of 8 GPUs (kwok), with pods of the Alibaba trace's shapes.

    scripts/k8s-components --with-kwok && scripts/build
    bench/cluster_scale.py                          # 5,000 nodes, 10,000 pods (several minutes on 2 cores)
    bench/cluster_scale.py --nodes 500 --pods 1000  # a quick look

Both runs use one cluster (etcd, kube-apiserver, kube-controller-manager for service accounts, kwok keeping the
nodes Ready and marking bound pods Running). Each node has the inventory annotation tessera-node would publish
(8 V100s, examples/fake-gpus/two-socket-8gpu.yaml) and a plain extended resource `example.com/gpu: 8`.

- baseline: the cluster's default kube-scheduler alone, no admission webhook; each pod asks for its whole GPUs as
  `example.com/gpu` (a share counts as one GPU: what a cluster without GPU sharing gives it).
- tessera: Tessera's kube-scheduler (deploy/'s KubeSchedulerConfiguration) with tessera-scheduler as extender and
  its admission webhook registered as deploy/ ships it (one replica, called directly; one call per GPU pod); each
  pod asks in Tessera's names for exactly its share.

It prints pods bound per second for each, measured from the first create to the last bind, and their ratio
(goal: tessera >= 0.9x the baseline; exit 1 when it is missed). Pods are created by 16 client threads, well above
either bind rate.

No quick mode, and not run by the test suite: it needs kwok (scripts/k8s-components --with-kwok, which
scripts/test does not build), a control plane started for it and the trace in ../shared. What it checks besides
the rate, every pod bound within the hour, the cluster tier (tests/cluster, label `cluster`) checks on the real
components at small scale.
"""

import argparse
import csv
import http.client
import json
import os
import ssl
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "cluster"))
import cluster as harness  # noqa: E402

GOAL = 0.9  # tessera's rate over the baseline's
TRACE = os.path.join(SOURCE, "..", "shared", "traces", "alibaba-gpu-v2023", "openb_pod_list_default.csv")


class Api:
    """A small HTTPS client with the harness's admin certificate, one connection per thread."""

    def __init__(self, c):
        self.port = c.ports["apiserver"]
        self.ctx = ssl.create_default_context(cafile=c.path("pki", "ca.crt"))
        self.ctx.load_cert_chain(c.path("pki", "admin.crt"), c.path("pki", "admin.key"))
        self.local = threading.local()

    def call(self, method, path, body=None, content_type="application/json"):
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx)
        data = json.dumps(body).encode() if body is not None else None
        for attempt in range(5):
            try:
                conn.request(method, path, data, {"Content-Type": content_type})
                r = conn.getresponse()
                text = r.read()
                if r.status == 429 or r.status >= 500:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                return r.status, (json.loads(text) if text else None)
            except (http.client.HTTPException, OSError):
                conn = self.local.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx)
                time.sleep(0.2)
        raise RuntimeError(f"{method} {path} kept failing")


def parallel(items, fn, threads=16, what=""):
    items = list(items)
    errors = []
    lock = threading.Lock()
    index = [0]

    def worker():
        while True:
            with lock:
                if index[0] >= len(items):
                    return
                item = items[index[0]]
                index[0] += 1
            try:
                fn(item)
            except Exception as e:  # noqa: BLE001
                with lock:
                    errors.append(e)
    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise RuntimeError(f"{what}: {len(errors)} failed, first: {errors[0]}")


def inventory_template(c):
    """The inventory annotation tessera-node publishes for the fake-GPU file, read from a real tessera-node."""
    api = Api(c)
    api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "template"}})
    p = harness.Process("tessera-node-template", [
        c.tessera("tessera-node"), "--node-name=template", "--kubeconfig", c.path("admin.kubeconfig"),
        "--fake-gpus", os.path.join(SOURCE, harness.FAKE_GPUS), "--state-dir", c.path("template-state"),
        "--device-plugin-dir", c.path("template-dp"), "--pod-resources-socket", c.path("none.sock"),
        "--metrics-listen", f"127.0.0.1:{harness.free_port()}"], c.logs).start()
    try:
        def read():
            _, node = api.call("GET", "/api/v1/nodes/template")
            return node["metadata"].get("annotations", {}).get("tessera.dev/gpu-inventory")
        inventory = c.wait_for(read, "tessera-node to publish its inventory", 60)
    finally:
        p.stop()
        api.call("DELETE", "/api/v1/nodes/template")
    return inventory


def kwok_stages(c):
    """kwok's own "fast" stages (nodes Ready at once with a lease heartbeat; pods Running when bound), from the
    kwok module scripts/k8s-components built: kwok does nothing without stages."""
    kwok_dir = subprocess.run(["go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kwok"], check=True, text=True,
                              capture_output=True, cwd=os.path.join(SOURCE, "tools", "k8s", "kwok"),
                              env=dict(os.environ, GOFLAGS="-mod=readonly")).stdout.strip()
    stage = os.path.join(kwok_dir, "kustomize", "stage")
    files = ["node/fast/node-initialize.yaml", "node/heartbeat-with-lease/node-heartbeat-with-lease.yaml",
             "pod/fast/pod-ready.yaml", "pod/fast/pod-complete.yaml", "pod/fast/pod-delete.yaml"]
    path = c.path("kwok-stages.yaml")
    with open(path, "w") as out:
        for f in files:
            with open(os.path.join(stage, f)) as src:
                out.write("---\n" + src.read())
    return path


def make_nodes(c, n, inventory):
    api = Api(c)
    heartbeat = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())

    def create(i):
        name = f"kwok-node-{i}"
        inv = inventory.replace("GPU-", f"GPU-{i:05d}-")
        node = {"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"type": "kwok", "kubernetes.io/hostname": name},
                             "annotations": {"kwok.x-k8s.io/node": "fake", "tessera.dev/gpu-inventory": inv,
                                             "tessera.dev/heartbeat": heartbeat}},
                "spec": {"taints": [{"key": "kwok.x-k8s.io/node", "value": "fake", "effect": "NoSchedule"}]}}
        status, _ = api.call("POST", "/api/v1/nodes", node)
        assert status in (201, 409), status
        resources = {"cpu": "96", "memory": "768Gi", "pods": "110", "tessera.dev/gpu": "80", "example.com/gpu": "8"}
        api.call("PATCH", f"/api/v1/nodes/{name}/status",
                 {"status": {"capacity": resources, "allocatable": resources}},
                 "application/merge-patch+json")
    t = time.monotonic()
    parallel(range(n), create, what="nodes")
    print(f"  {n} nodes created in {time.monotonic() - t:.1f} s", flush=True)


def trace_shapes(count):
    shapes = []
    with open(TRACE) as f:
        for row in csv.DictReader(f):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if gpus == 0:
                continue
            shapes.append((gpus, milli, int(row["cpu_milli"]), int(row["memory_mib"])))
    return [shapes[i % len(shapes)] for i in range(count)]


def pod(name, shape, tessera):
    gpus, milli, cpu, mem = shape
    if tessera:
        limits = {"tessera.dev/gpu": str(gpus)} if milli >= 1000 else {"tessera.dev/gpu-cores": str(max(1, milli // 10))}
    else:
        limits = {"example.com/gpu": str(gpus)}
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"containers": [{"name": "main", "image": "registry.invalid/app:1",
                                     "resources": {"limits": limits,
                                                   "requests": {**limits, "cpu": f"{min(cpu, 8000)}m",
                                                                "memory": f"{min(mem, 65536)}Mi"}}}],
                     "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
                     "automountServiceAccountToken": False}}


def unbound(api):
    _, pods = api.call("GET", "/api/v1/namespaces/default/pods?fieldSelector=spec.nodeName%3D&limit=100000")
    return len(pods["items"])


def run(c, shapes, tessera, label):
    api = Api(c)
    names = [f"{label}-{i}" for i in range(len(shapes))]
    start = time.monotonic()

    def create(i):
        status, body = api.call("POST", "/api/v1/namespaces/default/pods", pod(names[i], shapes[i], tessera))
        assert status == 201, (status, body)
    creator = threading.Thread(target=parallel, args=(range(len(shapes)), create), kwargs={"what": "pods"})
    creator.start()
    last_report = 0
    while True:
        time.sleep(1)
        if creator.is_alive():
            continue
        left = unbound(api)
        elapsed = time.monotonic() - start
        if elapsed - last_report >= 10:
            print(f"  {label}: {len(shapes) - left}/{len(shapes)} bound after {elapsed:.0f} s", flush=True)
            last_report = elapsed
        if left == 0:
            break
        if elapsed > 3600:
            raise RuntimeError(f"{label}: {left} pods still unbound after an hour")
    creator.join()
    elapsed = time.monotonic() - start
    rate = len(shapes) / elapsed
    print(f"  {label}: {len(shapes)} pods bound in {elapsed:.1f} s: {rate:.0f} pods/s", flush=True)
    # Clean up for the next run.
    api.call("DELETE", "/api/v1/namespaces/default/pods?gracePeriodSeconds=0")
    c.wait_for(lambda: api.call("GET", "/api/v1/namespaces/default/pods?limit=1")[1]["items"] == [],
               "the pods to be deleted", 600, interval=2)
    return rate


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=5000)
    ap.add_argument("--pods", type=int, default=10000)
    args = ap.parse_args()
    if not os.path.exists(TRACE):
        sys.exit(f"cluster_scale: the trace is not at {TRACE} (../shared/traces/alibaba-gpu-v2023)")
    # Nodes simulated by kwok publish no heartbeat of their own; the one written at creation must stay fresh.
    c = harness.Cluster(SOURCE, os.path.join(SOURCE, "build"), scheduler_args=["--heartbeat-timeout", "36000"],
                        service_proxy=False)
    if not os.access(c.bin("kwok"), os.X_OK):
        sys.exit("cluster_scale: kwok is not built: run scripts/k8s-components --with-kwok")
    try:
        print(f"cluster_scale: {args.nodes} nodes x 8 GPUs, {args.pods} pods of the trace's shapes", flush=True)
        c.start(node=False)
        inventory = inventory_template(c)
        c._start("kwok", [c.bin("kwok"), "--kubeconfig", c.path("admin.kubeconfig"), "--config", kwok_stages(c),
                          "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                          "--server-address=", "--node-lease-duration-seconds=40"])
        make_nodes(c, args.nodes, inventory)
        c.wait_for(lambda: c.get("nodes")["items"] and all(
            any(x["type"] == "Ready" and x["status"] == "True" for x in n["status"].get("conditions", []))
            for n in c.get("nodes")["items"]), "kwok to make every node Ready", 600, interval=5)
        shapes = trace_shapes(args.pods)
        # The baseline is a cluster without Tessera: no admission webhook either.
        c.kubectl("delete", "mutatingwebhookconfiguration", "tessera-scheduler")
        base = run(c, shapes, tessera=False, label="baseline")
        c.register_webhooks()
        tess = run(c, shapes, tessera=True, label="tessera")
        print(f"\nbaseline (kube-scheduler alone): {base:.0f} pods/s")
        print(f"tessera (kube-scheduler + extender + webhook): {tess:.0f} pods/s")
        verdict = "met" if tess / base >= GOAL else "MISSED"
        print(f"ratio tessera/baseline: {tess / base:.2f} (goal >= {GOAL:.2f}: {verdict})")
    finally:
        c.stop()
    return 0 if tess / base >= GOAL else 1


if __name__ == "__main__":
    sys.exit(main())
