#!/usr/bin/env python3
"""Runs Tessera's two binaries on this machine with a small workload and scrapes their /metrics.

What runs, all real processes on loopback (no GPU, no API server):
  - tessera-scheduler in its standalone mode, on a cluster file made from examples/fake-gpus/pcie-4gpu.yaml (the
    same GPUs, UUIDs and all). Pods are placed through its extender verbs (filter, bind) as kube-scheduler calls
    them, and AdmissionReviews go to its webhook over HTTPS (a certificate made with openssl for the run).
  - tessera-node on the fake-GPU file, with --fake-api: a pods file holding what the scheduler decided (read back
    from its /inspect). tests/metrics/demo_kubelet.cc plays the kubelet: its device plugin registers, and each
    container's Allocate is called over real gRPC.
  - For some containers, tests/hook/cuda_probe under libtessera-cuda.so on the fake CUDA driver (build/fakecuda)
    with the container's limits file and shared region: it allocates device memory and launches kernels, so the
    region shows the memory it holds and the compute it used, as a real container's would.

Then it scrapes both /metrics twice, a few seconds apart with traffic between (OUT/node.0.prom, OUT/scheduler.0.prom,
then OUT/node.prom, OUT/scheduler.prom; OUT/scrapes.json says when; OUT/inspect.json is the scheduler's view), and
with --check pipes each scrape to `promtool check metrics`, failing on any complaint.

  scrape.py --source SRC --build BUILD --out DIR [--check]

Used by ctest (metrics_promtool: --check; the scrapes then feed dashboard_check) and by tools/dashboard-render to
draw docs/dashboard.svg.
"""
import argparse
import base64
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

import yaml

NODE = "t4-box"
# name, namespace, cores per vGPU (percent), memory per vGPU (MiB), vGPUs, what the probe does (None: idle)
# probe: (bytes to allocate, kernel nanoseconds) or None
PODS = [
    ("train-resnet", "research", 60, 8192, 1, (6 << 30, 200000)),
    ("serve-bert", "inference", 30, 4096, 1, (3 << 30, 200000)),
    ("notebook-ana", "research", 20, 2048, 1, (512 << 20, None)),
    ("batch-etl", "batch", 50, 6144, 2, None),
    ("serve-small", "inference", 10, 1024, 1, None),
]


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, context=None, timeout=10):
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    # Loopback only: never through an HTTP proxy the environment may name.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context))
    with opener.open(req, timeout=timeout) as r:
        return r.read().decode()


def wait_for(what, check, timeout=30):
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.1)
    fail(f"timed out waiting for {what}")


def pod_object(name, ns, cores, memory, vgpus, uid=None):
    limits = {"tessera.dev/gpu": str(vgpus), "tessera.dev/gpu-cores": str(cores),
              "tessera.dev/gpu-memory": str(memory)}
    meta = {"name": name, "namespace": ns}
    if uid:
        meta["uid"] = uid
    return {"metadata": meta,
            "spec": {"containers": [{"name": "main", "image": "x", "resources": {"limits": limits}}]}}


def review(obj, uid):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": uid, "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "operation": "CREATE", "object": obj}}


class Run:
    def __init__(self, source, build, out):
        self.src, self.build, self.out = source, build, out
        self.tmp = tempfile.mkdtemp(prefix="tessera-metrics-")
        self.procs = []

    def bin(self, *parts):
        path = os.path.join(self.build, *parts)
        if not os.path.exists(path):
            fail(f"{path} is missing: build it first (cmake --build build)")
        return path

    def start(self, argv, **kw):
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                if p.stdin:
                    p.stdin.close()
                p.terminate()
                try:
                    p.wait(10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def scheduler(self):
        fake = yaml.safe_load(open(os.path.join(self.src, "examples/fake-gpus/pcie-4gpu.yaml")))
        self.gpus = fake["gpus"]
        cluster = {"apiVersion": "tessera.dev/v1", "kind": "Cluster",
                   "nodes": [{"name": NODE,
                              "gpus": [{"model": g["model"], "memoryMiB": g["memoryMiB"], "uuid": g["uuid"]}
                                       for g in self.gpus],
                              "topology": fake["topology"]}]}
        cluster_file = os.path.join(self.tmp, "cluster.yaml")
        with open(cluster_file, "w") as f:
            yaml.safe_dump(cluster, f)
        cert, key = os.path.join(self.tmp, "webhook.crt"), os.path.join(self.tmp, "webhook.key")
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                        "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", key, "-out", cert],
                       check=True, capture_output=True)
        self.sched_port, hook_port = free_port(), free_port()
        self.start([self.bin("bin", "tessera-scheduler"), "--cluster-file", cluster_file,
                    "--listen", f"127.0.0.1:{self.sched_port}", "--webhook-listen", f"127.0.0.1:{hook_port}",
                    "--tls-cert", cert, "--tls-key", key], stdout=subprocess.DEVNULL)
        base = f"http://127.0.0.1:{self.sched_port}"
        wait_for("tessera-scheduler", lambda: http(base + "/healthz") == "ok\n")
        # The pods, placed as kube-scheduler would: filter, then bind.
        for i, (name, ns, cores, memory, vgpus, _) in enumerate(PODS):
            pod = pod_object(name, ns, cores, memory, vgpus, uid=f"uid-{i}")
            r = json.loads(http(base + "/scheduler/filter", {"Pod": pod, "NodeNames": [NODE]}))
            if r.get("NodeNames") != [NODE]:
                fail(f"filter of {name}: {r}")
            r = json.loads(http(base + "/scheduler/bind", {"PodName": name, "PodNamespace": ns,
                                                           "PodUID": f"uid-{i}", "Node": NODE}))
            if r.get("Error"):
                fail(f"bind of {name}: {r['Error']}")
        # The webhook: a HAMi pod rewritten (patched), a pod without GPUs (allowed), one valid and one impossible
        # request (validate), and a body that is no AdmissionReview (error).
        ctx = self.ctx = ssl.create_default_context(cafile=cert)
        hook = self.hook = f"https://127.0.0.1:{hook_port}"
        hami = {"metadata": {"name": "hami", "namespace": "default"},
                "spec": {"containers": [{"name": "main", "image": "x", "resources": {
                    "limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30", "nvidia.com/gpumem": "3000"}}}]}}
        self.hami = hami
        cpu = {"metadata": {"name": "cpu", "namespace": "default"},
               "spec": {"containers": [{"name": "main", "image": "x"}]}}
        for path, obj in [("/mutate", hami), ("/mutate", hami), ("/mutate", cpu), ("/validate", hami),
                          ("/validate", pod_object("zero", "default", 0, 1024, 1))]:
            http(hook + path, review(obj, "r"), context=ctx)
        try:
            http(hook + "/mutate", b"{", context=ctx)
        except urllib.error.HTTPError as e:
            if e.code != 400:
                raise
        self.inspect = json.loads(http(base + "/inspect"))
        with open(os.path.join(self.out, "inspect.json"), "w") as f:
            json.dump(self.inspect, f, indent=1)

    def node(self):
        # What the scheduler decided, as the pods' annotations carry it to the node.
        by_pod = {}
        for n in self.inspect["nodes"]:
            for g in n["gpus"]:
                for t in g["tenants"]:
                    by_pod.setdefault(t["podUID"], []).append(
                        {"uuid": g["uuid"], "index": g["index"], "cores": t["cores"], "memoryMiB": t["memoryMiB"]})
        pods, allocations = [], []
        slot = {}
        for i, (name, ns, cores, memory, vgpus, _) in enumerate(PODS):
            placed = sorted(by_pod.get(f"uid-{i}", []), key=lambda v: v["index"])
            if len(placed) != vgpus:
                fail(f"{name}: the scheduler placed {len(placed)} vGPUs, not {vgpus}")
            assignment = {"version": 1, "node": NODE, "containers": [{"name": "main", "vgpus": placed}]}
            stamp = f"2026-01-01T00:00:0{i}Z"
            obj = pod_object(name, ns, cores, memory, vgpus, uid=f"uid-{i}")
            obj["metadata"].update({"creationTimestamp": stamp, "annotations": {
                "tessera.dev/assignment": json.dumps(assignment), "tessera.dev/assigned-at": stamp,
                "tessera.dev/phase": "bound"}})
            obj["spec"]["nodeName"] = NODE
            obj["status"] = {"phase": "Pending"}
            pods.append(obj)
            devices = []
            for v in placed:
                devices.append(f"{v['uuid']}::{slot.get(v['uuid'], 0)}")
                slot[v["uuid"]] = slot.get(v["uuid"], 0) + 1
            allocations.append(f"{ns}/{name}/main=" + ",".join(devices))
        api_file = os.path.join(self.tmp, "api.json")
        with open(api_file, "w") as f:
            json.dump({"pods": pods}, f)
        plugin_dir = os.path.join(self.tmp, "device-plugins")
        pod_resources = os.path.join(self.tmp, "pod-resources", "kubelet.sock")
        os.makedirs(os.path.dirname(pod_resources))
        kubelet = self.start([self.bin("tests", "metrics_demo_kubelet"), plugin_dir, pod_resources, *allocations],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        wait_for("the fake kubelet's socket", lambda: os.path.exists(os.path.join(plugin_dir, "kubelet.sock")))
        self.node_port = free_port()
        self.start([self.bin("bin", "tessera-node"), "--node-name", NODE, "--fake-api", api_file,
                    "--fake-gpus", os.path.join(self.src, "examples/fake-gpus/pcie-4gpu.yaml"),
                    "--device-plugin-dir", plugin_dir, "--pod-resources-socket", pod_resources,
                    "--state-dir", os.path.join(self.tmp, "state"),
                    "--metrics-listen", f"127.0.0.1:{self.node_port}"])
        files = {}
        for line in kubelet.stdout:
            words = line.split()
            if words[0] == "ready":
                break
            files[words[1]] = (words[2], words[3])
        if kubelet.poll() is not None or len(files) != len(PODS):
            fail("the fake kubelet did not allocate every container (see its message above)")
        # The limits files are the agent's; each region is made by the container's first hooked process.
        wait_for("every limits file", lambda: all(os.path.exists(lim) for lim, _ in files.values()))
        # The tenants that work: a real process under the hook on the fake driver, in the container's limits.
        hook_lib = self.bin("lib", "libtessera-cuda.so")
        for name, ns, cores, memory, vgpus, probe in PODS:
            if probe is None:
                continue
            limits, region = files[f"{ns}/{name}/main"]
            uuids = [v["uuid"] for v in json.loads(
                [p for p in pods if p["metadata"]["name"] == name][0]["metadata"]["annotations"]
                ["tessera.dev/assignment"])["containers"][0]["vgpus"]]
            env = dict(os.environ, LD_PRELOAD=hook_lib, LD_LIBRARY_PATH=os.path.join(self.build, "fakecuda"),
                       FAKECUDA_UUIDS=",".join(uuids), FAKECUDA_MEMORY="15GiB",
                       FAKECUDA_STATE=os.path.join(self.tmp, f"fakecuda-{name}.state"),
                       TESSERA_LIMITS_FILE=limits, TESSERA_REGION=region)
            env.pop("TESSERA_AGENT_SOCKET", None)
            ops = ["dlsym", "init", "ctx", "alloc", str(probe[0])]
            ops += ["watch", str(probe[1]), "500"] if probe[1] else ["ready"]
            p = self.start([self.bin("tests", "cuda_probe"), *ops], env=env, stdin=subprocess.PIPE,
                           stdout=subprocess.PIPE, text=True)
            first = p.stdout.readline().split()
            if first[:2] != ["init", "0"]:
                fail(f"cuda_probe for {name}: {first}")
        base = f"http://127.0.0.1:{self.node_port}"
        wait_for("tessera-node's metrics", lambda: "tessera_node_tenants" in http(base + "/metrics"))
        # The probes that launch kernels have run a few of the hook's steps when the used share shows.
        wait_for("the tenants' compute in the regions",
                 lambda: sum(1 for line in http(base + "/metrics").splitlines()
                             if line.startswith("tessera_container_cores_used_percent{") and
                             float(line.rsplit(" ", 1)[1]) > 0) >= 2, timeout=60)
        time.sleep(2)

    def scrape_set(self, suffix):
        out = {}
        for name, port in [("scheduler", self.sched_port), ("node", self.node_port)]:
            text = http(f"http://127.0.0.1:{port}/metrics")
            out[name + suffix] = os.path.join(self.out, f"{name}{suffix}.prom")
            with open(out[name + suffix], "w") as f:
                f.write(text)
        return out

    def scrape(self):
        """Two scrapes of each binary a few seconds apart (a rate needs two), with traffic between them: the
        extender asked about a pod again and the webhook answering. scrapes.json says when each was taken."""
        first = time.time()
        files = self.scrape_set(".0")
        base = f"http://127.0.0.1:{self.sched_port}"
        for i in range(20):
            http(base + "/scheduler/filter", {"Pod": pod_object(f"probe-{i}", "default", 40, 4096, 1, uid=f"p{i}"),
                                              "NodeNames": [NODE]})
            for path, obj in [("/mutate", self.hami), ("/validate", self.hami)]:
                http(self.hook + path, review(obj, "r"), context=self.ctx)
        time.sleep(5)
        second = time.time()
        files.update(self.scrape_set(""))
        with open(os.path.join(self.out, "scrapes.json"), "w") as f:
            json.dump({"first": {"time": first, "files": ["node.0.prom", "scheduler.0.prom"]},
                       "second": {"time": second, "files": ["node.prom", "scheduler.prom"]}}, f, indent=1)
        return files


def promtool_check(files):
    promtool = shutil.which("promtool")
    if promtool is None:
        fail("promtool is not installed: run scripts/setup (it installs Debian's prometheus package, which "
             "ships promtool 2.42), then rerun this test")
    version = subprocess.run([promtool, "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(version)
    bad = False
    for name, path in files.items():
        with open(path) as f:
            r = subprocess.run([promtool, "check", "metrics"], stdin=f, capture_output=True, text=True)
        complaints = (r.stdout + r.stderr).strip()
        if r.returncode != 0 or complaints:
            print(f"promtool check metrics on {name} ({path}): exit {r.returncode}\n{complaints}", file=sys.stderr)
            bad = True
        else:
            families = sum(1 for line in open(path) if line.startswith("# TYPE "))
            print(f"{name}: promtool check metrics clean ({families} families)")
    if bad:
        fail("promtool complained (above)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--check", action="store_true", help="pipe each scrape to promtool check metrics")
    args = ap.parse_args()
    if args.check and shutil.which("promtool") is None:
        promtool_check({})  # fails with what to do, before anything runs
    os.makedirs(args.out, exist_ok=True)
    run = Run(os.path.abspath(args.source), os.path.abspath(args.build), os.path.abspath(args.out))
    try:
        run.scheduler()
        run.node()
        files = run.scrape()
    finally:
        run.close()
    for name, path in files.items():
        print(f"scraped {name}: {path}")
    if args.check:
        promtool_check(files)


if __name__ == "__main__":
    main()
