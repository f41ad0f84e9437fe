#!/usr/bin/env python3
"""GPU left unallocated on the DRA path against the device-plugin path, on a real control plane: the same pods of the
Alibaba trace's shapes, arriving in the same order, placed by Tessera's extender (extended resources), by
kube-scheduler's own DRA allocator (ResourceClaims against tessera-node's ResourceSlices), and by tessera-scheduler
deciding the claims (docs/dra.md, "Placement by Tessera").

    scripts/k8s-components --with-kwok && scripts/build
    bench/dra_quality.py                    # 50 nodes x 8 GPUs (a few minutes on 2 cores)
    bench/dra_quality.py --nodes 200 --seeds 42-46

One cluster (etcd, kube-apiserver, kube-controller-manager, kwok keeping the nodes Ready and bound pods Running).
Each node has what tessera-node publishes for examples/fake-gpus/two-socket-8gpu.yaml (8 V100s of 32 GiB), both
read from a real tessera-node: the inventory annotation, and the ResourceSlice it publishes with --dra-gpus=all.

- device plugin: Tessera's kube-scheduler (deploy/'s KubeSchedulerConfiguration) with tessera-scheduler as
  extender and its admission webhook; a share asks `tessera.dev/gpu-cores` and `tessera.dev/gpu-memory`, whole
  GPUs `tessera.dev/gpu`.
- DRA: the cluster's default kube-scheduler; each pod has a claim from a ResourceClaimTemplate of its shape: a share
  asks `capacity.requests` {cores, memory}, whole GPUs `count` with no capacity (class gpu.tessera.dev).
  The claims ask for a DeviceClass of the same devices that Tessera does not place (gpu-kube.bench.tessera.dev),
  so that kube-scheduler's allocator decides them.
- DRA, Tessera: the same claims of class gpu.tessera.dev: the webhook gates the pods and tessera-scheduler
  allocates the claims (its ties between equal nodes drawn from --seed, so a run repeats); a pod that fits nowhere
  waits gated with the tessera.dev/dra-waiting annotation, which counts as unschedulable here.
- DRA, packing profile (--packing): the same pods under a kube-scheduler profile whose NodeResourcesFit scores
  nodes by MostAllocated (examples/dra/kube-scheduler-packing.yaml): nodes fill up before new ones are started,
  which a configuration can do without Tessera's extender.

A share of g thousandths asks g/10 percent of the compute and g/1000 of the GPU's memory on both paths; CPU and
memory as the trace says. Pods are drawn from the trace's GPU pods (seeded) until they ask for all the cluster's
GPUs, and created in that order in batches of 10, each batch settled (every pod bound or unschedulable) before the
next, so both paths see the same arrivals. It prints, for each path, the GPU left unallocated in % of the
cluster's, the pods that found no place, and the difference.

Not run by the test suite: it needs kwok (scripts/k8s-components --with-kwok) and the trace in ../shared. The
behaviour it relies on (a claim allocated, prepared and enforced; device-plugin pods never on DRA GPUs) is tested in
tests/cluster/test_dra.py.
"""

import argparse
import csv
import json
import os
import random
import statistics
import sys
import time

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "cluster"))
import cluster as harness  # noqa: E402
import cluster_scale as scale  # noqa: E402

GPUS_PER_NODE = 8
PATHS = ("device-plugin", "dra", "dra-tessera")
KUBE_CLASS = "gpu-kube.bench.tessera.dev"
GPU_MEMORY_MIB = 32768


def slice_template(c):
    """The ResourceSlice a real tessera-node publishes with --dra-gpus=all for the fake-GPU file."""
    api = scale.Api(c)
    api.call("POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "template"}})
    p = harness.Process("tessera-node-dra-template", [
        c.tessera("tessera-node"), "--node-name=template", "--kubeconfig", c.path("admin.kubeconfig"),
        "--fake-gpus", os.path.join(SOURCE, harness.FAKE_GPUS), "--state-dir", c.path("dra-template-state"),
        "--device-plugin-dir", c.path("dra-template-dp"), "--pod-resources-socket", c.path("none.sock"),
        "--dra-gpus=all", "--kubelet-plugins-dir", c.path("dra-template-plugins"),
        "--kubelet-registry-dir", c.path("dra-template-registry"), "--cdi-dir", c.path("dra-template-cdi"),
        "--metrics-listen", f"127.0.0.1:{harness.free_port()}"], c.logs).start()
    try:
        def read():
            status, s = api.call("GET", "/apis/resource.k8s.io/v1/resourceslices/template-gpu.tessera.dev")
            return s if status == 200 else None
        template = c.wait_for(read, "tessera-node to publish its ResourceSlice", 60)
    finally:
        p.stop()
        api.call("DELETE", "/apis/resource.k8s.io/v1/resourceslices/template-gpu.tessera.dev")
        api.call("DELETE", "/api/v1/nodes/template")
    return template


def make_slices(c, n, template):
    api = scale.Api(c)

    def create(i):
        name = f"kwok-node-{i}"
        s = json.loads(json.dumps(template).replace("GPU-", f"GPU-{i:05d}-"))
        s["metadata"] = {"name": f"{name}-gpu.tessera.dev"}
        s["spec"]["nodeName"] = name
        s["spec"]["pool"] = {"name": name, "generation": 1, "resourceSliceCount": 1}
        status, body = api.call("POST", "/apis/resource.k8s.io/v1/resourceslices", s)
        assert status in (201, 409), (status, body)
    scale.parallel(range(n), create, what="slices")


def draw(capacity_milli, seed):
    """GPU pods of the trace (shape: gpus, milli per GPU, cpu milli, memory MiB), drawn with replacement in a seeded
    order until they ask for the cluster's GPUs."""
    shapes = []
    with open(scale.TRACE) as f:
        for row in csv.DictReader(f):
            gpus, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if gpus == 0 or milli == 0:
                continue
            shapes.append((gpus, milli if gpus == 1 else 1000, int(row["cpu_milli"]), int(row["memory_mib"])))
    rng = random.Random(seed)
    out, asked = [], 0
    while asked < capacity_milli:
        s = rng.choice(shapes)
        out.append(s)
        asked += s[0] * s[1]
    return out


def gpu_milli(shape):
    return shape[0] * shape[1]


def share_memory_mib(milli):
    return max(1, milli * GPU_MEMORY_MIB // 1000)


def template_name(shape, path):
    gpus, milli = shape[0], shape[1]
    prefix = "tessera-" if path == "dra-tessera" else ""
    return f"{prefix}whole-{gpus}" if milli >= 1000 else f"{prefix}share-{milli}"


def claim_templates(shapes):
    out = []
    for (gpus, milli), path in [(k, p) for k in sorted({(s[0], s[1]) for s in shapes}) for p in ("dra", "dra-tessera")]:
        exactly = {"deviceClassName": "gpu.tessera.dev" if path == "dra-tessera" else KUBE_CLASS}
        if milli >= 1000:
            exactly["count"] = gpus
        else:
            exactly["capacity"] = {"requests": {"cores": str(max(1, -(-milli // 10))),
                                                "memory": f"{share_memory_mib(milli)}Mi"}}
        out.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
                    "metadata": {"name": template_name((gpus, milli), path), "namespace": "default"},
                    "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}}})
    return out


def start_packing_scheduler(c):
    """A kube-scheduler with examples/dra/kube-scheduler-packing.yaml's profile (schedulerName dra-packing)."""
    with open(os.path.join(SOURCE, "examples", "dra", "kube-scheduler-packing.yaml")) as f:
        config = yaml.safe_load(f)
    config["clientConnection"] = {"kubeconfig": c.path("admin.kubeconfig")}
    config["leaderElection"] = {"leaderElect": False}
    path = c.path("kube-scheduler-packing.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(config, f)
    c._start("kube-scheduler-packing", [c.bin("kube-scheduler"), "--config", path, "--bind-address", "127.0.0.1",
                                        "--secure-port", str(harness.free_port()), "-v", "0"])


def pod(name, shape, path):
    gpus, milli, cpu, mem = shape
    spec = {"containers": [{"name": "main", "image": "registry.invalid/app:1",
                            "resources": {"requests": {"cpu": f"{min(cpu, 96000)}m", "memory": f"{min(mem, 786432)}Mi"}}}],
            "tolerations": [{"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}],
            "automountServiceAccountToken": False}
    if path.startswith("dra"):
        if path == "dra-packing":
            spec["schedulerName"] = "dra-packing"
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template_name(shape, path)}]
        spec["containers"][0]["resources"]["claims"] = [{"name": "gpu"}]
    else:
        limits = {"tessera.dev/gpu": str(gpus)} if milli >= 1000 else {
            "tessera.dev/gpu-cores": str(max(1, -(-milli // 10))), "tessera.dev/gpu-memory": str(share_memory_mib(milli))}
        spec["containers"][0]["resources"]["limits"] = limits
        spec["containers"][0]["resources"]["requests"].update(limits)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": "default"}, "spec": spec}


def settled(p):
    if p["spec"].get("nodeName"):
        return "bound"
    if "tessera.dev/dra-waiting" in p["metadata"].get("annotations", {}):
        return "unschedulable"  # tessera-scheduler found no place: it waits gated, and says why
    for cond in p.get("status", {}).get("conditions", []):
        if cond["type"] == "PodScheduled" and cond["status"] == "False" and cond.get("reason") == "Unschedulable":
            return "unschedulable"
    return None


def replay(c, shapes, path, batch=10):
    api = scale.Api(c)
    names = [f"{path}-{i}" for i in range(len(shapes))]
    state = {}
    start = time.monotonic()
    for first in range(0, len(shapes), batch):
        idx = list(range(first, min(first + batch, len(shapes))))

        def create(i):
            status, body = api.call("POST", "/api/v1/namespaces/default/pods", pod(names[i], shapes[i], path))
            assert status == 201, (status, body)
        scale.parallel(idx, create, threads=len(idx), what="pods")

        def all_settled():
            _, pods = api.call("GET", "/api/v1/namespaces/default/pods?limit=100000")
            for p in pods["items"]:
                state[p["metadata"]["name"]] = settled(p)
            return all(state.get(names[i]) for i in idx)
        c.wait_for(all_settled, f"{path}: pods {idx[0]}-{idx[-1]} to be bound or unschedulable", 600, interval=0.2)
        if first // batch % 20 == 0:
            print(f"  {path}: {idx[-1] + 1}/{len(shapes)} pods after {time.monotonic() - start:.0f} s", flush=True)
    placing = time.monotonic() - start
    # A pod unschedulable at its arrival may still be bound later, when the queue retries it: count what holds now.
    time.sleep(5)
    _, pods = api.call("GET", "/api/v1/namespaces/default/pods?limit=100000")
    bound = {p["metadata"]["name"] for p in pods["items"] if p["spec"].get("nodeName")}
    allocated = sum(gpu_milli(s) for n, s in zip(names, shapes) if n in bound)
    api.call("DELETE", "/api/v1/namespaces/default/pods?gracePeriodSeconds=0")
    c.wait_for(lambda: api.call("GET", "/api/v1/namespaces/default/pods?limit=1")[1]["items"] == [],
               "the pods to be deleted", 600, interval=2)
    c.wait_for(lambda: api.call("GET", "/apis/resource.k8s.io/v1/namespaces/default/resourceclaims?limit=1")[1]["items"] == [],
               "the claims to be deleted", 600, interval=2)
    return allocated, len(shapes) - len(bound), placing, len(bound)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n")[-1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--seeds", default="42", help="a seed or a range, e.g. 42-44 (one replay per seed and path)")
    ap.add_argument("--packing", action="store_true", help="also the DRA path under the packing profile")
    args = ap.parse_args()
    paths = PATHS + (("dra-packing",) if args.packing else ())
    if not os.path.exists(scale.TRACE):
        sys.exit(f"dra_quality: the trace is not at {scale.TRACE} (../shared/traces/alibaba-gpu-v2023)")
    c = harness.Cluster(SOURCE, os.path.join(SOURCE, "build"),
                        scheduler_args=["--heartbeat-timeout", "36000", "--seed", "1"], service_proxy=False)
    if not os.access(c.bin("kwok"), os.X_OK):
        sys.exit("dra_quality: kwok is not built: run scripts/k8s-components --with-kwok")
    capacity = args.nodes * GPUS_PER_NODE * 1000
    lo, _, hi = args.seeds.partition("-")
    seeds = list(range(int(lo), int(hi or lo) + 1))
    workloads = {seed: draw(capacity, seed) for seed in seeds}
    print(f"dra_quality: {args.nodes} nodes x {GPUS_PER_NODE} GPUs, pods of the trace's shapes until they ask for "
          f"all the GPUs, seeds {args.seeds}", flush=True)
    try:
        c.start(node=False)
        inventory = scale.inventory_template(c)
        dra_slice = slice_template(c)
        c._start("kwok", [c.bin("kwok"), "--kubeconfig", c.path("admin.kubeconfig"), "--config", scale.kwok_stages(c),
                          "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
                          "--server-address=", "--node-lease-duration-seconds=40"])
        scale.make_nodes(c, args.nodes, inventory)
        make_slices(c, args.nodes, dra_slice)
        c.kubectl("apply", "-f", os.path.join(SOURCE, "deploy", "dra", "deviceclasses.yaml"))
        c.apply(yaml.safe_dump({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": KUBE_CLASS},
                                "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.tessera.dev"'}}]}}))
        templates = claim_templates([s for w in workloads.values() for s in w])
        c.apply("---\n".join(yaml.safe_dump(t) for t in templates))
        if args.packing:
            start_packing_scheduler(c)
        made = c.get("resourceclaimtemplates", ns="default")["items"]
        assert len(made) == len(templates), f"{len(made)} claim templates made of {len(templates)}"
        c.wait_for(lambda: c.get("nodes")["items"] and all(
            any(x["type"] == "Ready" and x["status"] == "True" for x in n["status"].get("conditions", []))
            for n in c.get("nodes")["items"]), "kwok to make every node Ready", 600, interval=5)
        results = {}
        for seed, shapes in workloads.items():
            print(f"seed {seed}: {len(shapes)} pods asking {sum(map(gpu_milli, shapes)) / 1000:.1f} GPUs", flush=True)
            for path in paths:
                allocated, failed, seconds, bound = replay(c, shapes, path)
                results[seed, path] = (100.0 * (capacity - allocated) / capacity, failed, bound / seconds)
                print(f"  {path}: {results[seed, path][0]:.2f}% of the GPUs unallocated, {failed} pods found no "
                      f"place ({seconds:.0f} s, {bound / seconds:.1f} pods bound/s)", flush=True)
    finally:
        c.stop()
    print(f"\nGPU unallocated at 100% arrived, {args.nodes} nodes x {GPUS_PER_NODE} GPUs (pods unplaced; pods bound/s):")
    print("| seed | " + " | ".join(paths) + " | Tessera DRA - device plugin | Tessera DRA - kube-scheduler DRA |")
    print("|---|" + "---:|" * (len(paths) + 2))
    for seed in seeds:
        r = {p: results[seed, p] for p in paths}
        cells = [f"{r[p][0]:.2f}% ({r[p][1]}; {r[p][2]:.1f}/s)" for p in paths]
        print(f"| {seed} | " + " | ".join(cells) + f" | {r['dra-tessera'][0] - r['device-plugin'][0]:+.2f} | "
              f"{r['dra-tessera'][0] - r['dra'][0]:+.2f} |")
    mean = {p: statistics.mean(results[s, p][0] for s in seeds) for p in paths}
    spread = {p: (statistics.stdev(results[s, p][0] for s in seeds) if len(seeds) > 1 else 0.0) for p in paths}
    rate = {p: statistics.mean(results[s, p][2] for s in seeds) for p in paths}
    print("| mean ± sd | " + " | ".join(f"{mean[p]:.2f}% ± {spread[p]:.2f} ({rate[p]:.1f}/s)" for p in paths) +
          f" | {mean['dra-tessera'] - mean['device-plugin']:+.2f} | {mean['dra-tessera'] - mean['dra']:+.2f} |")
    print(f"pods bound per second, Tessera DRA / kube-scheduler DRA: {rate['dra-tessera'] / rate['dra']:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
