#!/usr/bin/env python3
"""The hostile-tenant tier: a tenant attacks the real tessera-node, and nothing of it reaches anyone else.

What runs, all real processes on this machine (no GPU, no API server):
  - tessera-node on a fake-GPU file with --fake-api (a pods file: two pods bound to the same GPU, as the scheduler
    would leave them), its device plugin driven by tests/metrics/demo_kubelet.cc (the kubelet's Allocate over
    real gRPC), its metrics and health on loopback;
  - the victim: tests/hook/cuda_probe under the real libtessera-cuda.so on the fake CUDA driver, registered with
    the agent, holding 512 MiB of its 2 GiB;
  - the attacker: tests/hostile/hostile_tenant (and cuda_probe under the hook), as an unprivileged user (nobody)
    in its pod's cgroup (so the agent takes it for that container, as it would a container's process), with
    what a container holds: its region directory, its limits file (the agent's, root-owned), the socket.

Each attack (docs/security.md, "What a tenant can do") is followed by the same checks: tessera-node is the same
process and answers /healthz; its metrics still parse and say what the victim holds; the victim's and the
attacker's limits files are byte for byte what the agent wrote; the victim's region is untouched; and a new
victim process still registers and is held to its 2 GiB. At the end the attacker, with a fresh region, gets no
more than its own 1 GiB.

  hostile_tenants.py --source SRC --build BUILD

Exit 0 when every check held, 1 with what failed, 77 (ctest's skip) when not run as root (the tenants must be
put in cgroups and made unprivileged).
"""
import argparse
import json
import os
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

NODE = "t4-box"
NOBODY = 65534
VICTIM = ("victim", "00000000-0000-4000-8000-00000000000a", "a1a1a1a1a1a1a1a1a1a1", 40, 2048)
ATTACKER = ("attacker", "00000000-0000-4000-8000-00000000000b", "b2b2b2b2b2b2b2b2b2b2", 30, 1024)
MIB = 1 << 20


class Failure(Exception):
    pass


def check(cond, message):
    if not cond:
        raise Failure(message)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, timeout=10):
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(url, timeout=timeout) as r:
        return r.status, r.read().decode()


def wait_for(what, fn, timeout=60):
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        try:
            v = fn()
            if v:
                return v
        except OSError as e:
            last = e
        time.sleep(0.1)
    raise Failure(f"timed out waiting for {what} ({last})")


def cgroup_dir(uid, cid):
    for base in ("/sys/fs/cgroup/pids", "/sys/fs/cgroup"):  # cgroup v1's pids hierarchy, or v2
        if os.path.exists(os.path.join(base, "cgroup.procs")):
            return os.path.join(base, "kubepods", "besteffort", f"pod{uid}", cid)
    raise Failure("no cgroup hierarchy to put a tenant in (/sys/fs/cgroup/pids or v2)")


class Tier:
    def __init__(self, source, build):
        self.src, self.build = source, build
        self.tmp = tempfile.mkdtemp(prefix="tessera-hostile-")
        os.chmod(self.tmp, 0o755)
        self.procs, self.cgroups = [], []
        fake = yaml.safe_load(open(os.path.join(source, "examples/fake-gpus/pcie-4gpu.yaml")))
        self.gpus = [g["uuid"] for g in fake["gpus"]]
        self.files = {}
        # The fake driver's "device": one timeline shared by every container's processes, as a GPU is.
        self.fakegpu = os.path.join(self.tmp, "fakegpu")
        os.makedirs(self.fakegpu)
        os.chmod(self.fakegpu, 0o1777)

    def bin(self, *parts):
        path = os.path.join(self.build, *parts)
        check(os.path.exists(path), f"{path} is missing: build it first (scripts/build)")
        return path

    def start(self, argv, **kw):
        p = subprocess.Popen(argv, **kw)
        self.procs.append(p)
        return p

    def close(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                if p.stdin:
                    try:
                        p.stdin.close()
                    except OSError:
                        pass
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        for cg in self.cgroups:
            path = cg
            for _ in range(3):  # the container's, the pod's, besteffort's: once empty
                try:
                    os.rmdir(path)
                except OSError:
                    break
                path = os.path.dirname(path)
        shutil.rmtree(self.tmp, ignore_errors=True)

    # --- the node ---------------------------------------------------------------------------------------

    def node(self):
        pods, allocations = [], []
        for slot, (name, uid, cid, cores, mib) in enumerate([VICTIM, ATTACKER]):
            assignment = {"version": 1, "node": NODE, "containers": [{"name": "main", "vgpus": [
                {"uuid": self.gpus[0], "index": 0, "cores": cores, "memoryMiB": mib}]}]}
            stamp = f"2026-01-01T00:00:0{slot}Z"
            pods.append({
                "metadata": {"name": name, "namespace": "default", "uid": uid, "creationTimestamp": stamp,
                             "annotations": {"tessera.dev/assignment": json.dumps(assignment),
                                             "tessera.dev/assigned-at": stamp, "tessera.dev/phase": "bound"}},
                "spec": {"nodeName": NODE, "containers": [{"name": "main", "image": "x", "resources": {"limits": {
                    "tessera.dev/gpu": "1", "tessera.dev/gpu-cores": str(cores),
                    "tessera.dev/gpu-memory": str(mib)}}}]},
                "status": {"phase": "Running",
                           "containerStatuses": [{"name": "main", "containerID": f"containerd://{cid}"}]}})
            allocations.append(f"default/{name}/main={self.gpus[0]}::{slot}")
        api_file = os.path.join(self.tmp, "api.json")
        with open(api_file, "w") as f:
            json.dump({"pods": pods}, f)
        plugin_dir = os.path.join(self.tmp, "device-plugins")
        pod_resources = os.path.join(self.tmp, "pod-resources", "kubelet.sock")
        os.makedirs(os.path.dirname(pod_resources))
        self.kubelet = self.start([self.bin("tests", "metrics_demo_kubelet"), plugin_dir, pod_resources, *allocations],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        wait_for("the fake kubelet's socket", lambda: os.path.exists(os.path.join(plugin_dir, "kubelet.sock")))
        self.port = free_port()
        self.state = os.path.join(self.tmp, "state")
        self.agent_log = open(os.path.join(self.tmp, "tessera-node.log"), "w")
        self.agent = self.start([self.bin("bin", "tessera-node"), "--node-name", NODE, "--fake-api", api_file,
                                 "--fake-gpus", os.path.join(self.src, "examples/fake-gpus/pcie-4gpu.yaml"),
                                 "--device-plugin-dir", plugin_dir, "--pod-resources-socket", pod_resources,
                                 "--state-dir", self.state, "--metrics-listen", f"127.0.0.1:{self.port}"],
                                stdout=self.agent_log, stderr=subprocess.STDOUT)
        for line in self.kubelet.stdout:
            words = line.split()
            if words[0] == "ready":
                break
            self.files[words[1].split("/")[1]] = {"limits": words[2], "region": words[3]}
        check(len(self.files) == 2, "the fake kubelet did not allocate both containers")
        self.socket = os.path.join(self.state, "sock", "agent.sock")
        self.base = f"http://127.0.0.1:{self.port}"
        wait_for("tessera-node's metrics", lambda: "tessera_node_tenants" in http(self.base + "/metrics")[1])
        # Each limits file settles once the agent has counted both containers on the GPU (tenants=2, a new
        # generation); from then on nothing changes them but the scheduler, which is not here.
        wait_for("both limits files to count two tenants",
                 lambda: all("tenants=2" in open(f["limits"]).read() for f in self.files.values()))
        time.sleep(3)  # a resync pass (2 s) after that, which must write nothing more
        self.limits_bytes = {n: open(f["limits"], "rb").read() for n, f in self.files.items()}

    # --- tenants ------------------------------------------------------------------------------------------

    def env(self, who, hooked):
        f = self.files[who[0]]
        env = {"PATH": "/usr/bin:/bin", "TESSERA_LIMITS_FILE": f["limits"], "TESSERA_REGION": f["region"],
               "TESSERA_AGENT_SOCKET": self.socket, "HOSTILE_GPU": self.gpus[0]}
        if hooked:
            env.update({"LD_PRELOAD": self.bin("lib", "libtessera-cuda.so"),
                        "LD_LIBRARY_PATH": os.path.join(self.build, "fakecuda"),
                        "FAKECUDA_UUIDS": self.gpus[0], "FAKECUDA_MEMORY": "15GiB",
                        "FAKECUDA_STATE": os.path.join(self.fakegpu, "node.state"),
                        "CUDA_VISIBLE_DEVICES": self.gpus[0], "TESSERA_HOOK_LOG": "info"})
        return env

    def run_in(self, who, argv, hooked=False, background=False, timeout=120):
        """Runs argv as nobody in `who`'s container cgroup."""
        cg = cgroup_dir(who[1], who[2])
        os.makedirs(cg, exist_ok=True)
        if cg not in self.cgroups:
            self.cgroups.append(cg)
        env = self.env(who, hooked)
        script = (f"echo $$ > {cg}/cgroup.procs && exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups "
                  "-- env -i " + " ".join(f"'{k}={v}'" for k, v in sorted(env.items())) + " " +
                  " ".join(f"'{a}'" for a in argv))
        err = open(os.path.join(self.tmp, f"{who[0]}-{len(self.procs)}.err"), "w+")
        p = subprocess.Popen(["sh", "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
                             text=True)
        p.err = err
        if background:
            self.procs.append(p)
            return p
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise Failure(f"{argv} did not finish in {timeout} s")
        err.seek(0)
        return p.returncode, out, err.read()

    def hostile(self, *args, background=False):
        argv = [self.bin("tests", "hostile_tenant"), *args]
        if background:
            p = self.run_in(ATTACKER, argv, background=True)
            first = p.stdout.readline().strip()
            check(first, f"hostile_tenant {args[0]} printed nothing (see {p.err.name})")
            return p, first
        rc, out, err = self.run_in(ATTACKER, argv)
        check(rc == 0, f"hostile_tenant {' '.join(args)} could not carry out its attack: {err}")
        return out.strip()

    def probe(self, who, *ops, background=False):
        argv = [self.bin("tests", "cuda_probe"), "dlsym", "init", "ctx", *ops]
        if background:
            return self.run_in(who, argv, hooked=True, background=True)
        return self.run_in(who, argv, hooked=True)

    def start_victim(self):
        self.victim = self.probe(VICTIM, "alloc", str(512 * MIB), "ready", background=True)
        lines = [self.victim.stdout.readline().strip() for _ in range(4)]
        check(lines == ["init 0", "ctx 0", f"alloc 0 {512 * MIB}", "ready"],
              f"the victim started with {lines}: {open(self.victim.err.name).read()[-2000:]}")
        wait_for("the victim to register", lambda: "registered with the node agent" in open(self.victim.err.name).read())
        check(self.victim_region_limit() == 2048 * MIB, "the victim's region does not hold its limit")

    def victim_region_limit(self):
        """The memory limit in the victim's region (docs/hook-abi.md's offsets): what its processes enforce."""
        with open(self.files["victim"]["region"], "rb") as f:
            head = f.read(16384)
        magic, = struct.unpack_from("<Q", head, 0)
        count, = struct.unpack_from("<I", head, 136)
        check(magic == 0x314E4F4947455254 and 1 <= count <= 16, "the victim's region is no longer a region")
        for i in range(count):
            entry = 512 + 512 * i
            if head[entry + 64:entry + 128].split(b"\0")[0].decode() == self.gpus[0]:
                return struct.unpack_from("<Q", head, entry + 128)[0]
        raise Failure("the victim's region has no entry for its GPU")

    # --- the checks after every attack ---------------------------------------------------------------------

    def metrics(self):
        status, text = http(self.base + "/metrics")
        check(status == 200, f"/metrics answered {status}")
        samples = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            m = re.fullmatch(r'([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?:[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*",?)*\})? (\S+)',
                             line)
            check(m is not None, f"tessera-node's /metrics has a malformed line: {line!r}")
            samples[m.group(1) + (m.group(2) or "")] = float(m.group(3))
        return samples

    def used(self, samples, pod):
        for k, v in samples.items():
            if k.startswith("tessera_container_memory_used_bytes{") and f'pod="{pod}"' in k:
                return v
        raise Failure(f"no tessera_container_memory_used_bytes for {pod}")

    def unreadable(self):
        return self.metrics().get("tessera_regions_unreadable_total", 0)

    def agent_holds(self, after):
        check(self.agent.poll() is None, f"tessera-node died after {after} (exit {self.agent.returncode}); "
                                         f"its log: {open(self.agent_log.name).read()[-3000:]}")
        status, body = wait_for("/healthz", lambda: http(self.base + "/healthz"), timeout=30)
        check(status == 200, f"/healthz answered {status} after {after}")
        samples = self.metrics()
        check(samples.get('tessera_node_tenants{Hostname="t4-box"}') == 2, f"the agent lost a tenant after {after}")
        # What the victim holds: its 512 MiB and its context (the fake driver's footprint), within its 2 GiB.
        used = self.used(samples, "victim")
        check(512 * MIB <= used <= 2048 * MIB, f"the victim's use reads {used} after {after}")
        for name, data in self.limits_bytes.items():
            check(open(self.files[name]["limits"], "rb").read() == data, f"{name}'s limits file changed after {after}")
        check(self.victim_region_limit() == 2048 * MIB, f"the victim's region lost its limit after {after}")
        check(self.victim.poll() is None, f"the victim died after {after}")
        # A new process of the victim's container registers and is held to the container's 2 GiB (512 MiB held):
        # 1 GiB fits, a second 1 GiB does not.
        rc, out, err = self.probe(VICTIM, "alloc", str(1024 * MIB), "alloc", str(1024 * MIB))
        lines = out.split("\n")
        check(lines[2] == f"alloc 0 {1024 * MIB}" and lines[3].startswith("alloc 2 "),
              f"a new victim process after {after}: {out!r} {err[-2000:]}")
        check("registered with the node agent" in err, f"a new victim process did not register after {after}: "
                                                       f"{err[-2000:]}")
        print(f"ok: {after}", flush=True)

    # --- the attacks -----------------------------------------------------------------------------------------

    def attacks(self):
        region = self.files["attacker"]["region"]
        outside = os.path.join(self.tmp, "outside")
        with open(outside, "wb") as f:
            f.write(b"\0" * 4096)
        os.chmod(outside, 0o600)

        # 1. Robust-list pointers planted in every lock, dead pids in every slot, then registrations hung up
        #    (the agent used to lock the region to reclaim their slots: a write where the tenant chose).
        self.hostile("plant", region)
        out = self.hostile("hangup", self.socket, "50")
        check(out == "hangup 50 of 50 registered", out)
        time.sleep(1)  # the agent's reaction to the hang-ups, if it had one, is done by now
        self.agent_holds("planted locks and 50 hang-ups")
        samples = self.metrics()
        check(self.used(samples, "attacker") <= 15360 * MIB, "the attacker's use reads above its GPU")

        # 2. Every lock taken and never released.
        holder, first = self.hostile("hold", region + ".held", background=True)
        check(first == f"hold {1 + 16}", first)
        os.replace(region + ".held", region)
        self.hostile("hangup", self.socket, "20")
        self.agent_holds("a region whose locks are held forever")
        holder.stdin.close()
        holder.wait(30)

        # 3. Shrunk, swapped, forged: each is refused by the reader and counted.
        for attack in [("truncate", region), ("swap", region, "fifo"), ("swap", region, "link", outside),
                       ("swap", region, "dir"), ("swap", region, "sparse", str(1 << 40)), ("lying", region)]:
            if attack[0] != "truncate":
                subprocess.run(["rm", "-rf", region], check=True)
            before = self.unreadable()
            self.hostile(*attack)
            after = self.unreadable()
            what = " ".join([attack[0], *attack[2:3]])
            check(after > before, f"{what}: the agent did not refuse the region")
            self.agent_holds(f"the region: {what}")
        check(open(outside, "rb").read() == b"\0" * 4096, "the file a link pointed to was changed")
        subprocess.run(["rm", "-rf", region], check=True)

        # 4. Registrations that lie or never finish.
        out = self.hostile("hello", self.socket, "others", self.gpus[1])
        check(out.startswith("hello others answered: TESSERA 1 ERR") and self.gpus[1] in out, out)
        out = self.hostile("hello", self.socket, "garbage")
        check(out.startswith("hello garbage answered: TESSERA 1 ERR") or out.endswith("(closed)"), out)
        out = self.hostile("hello", self.socket, "long")
        check("ERR" in out or out.endswith("(closed)"), out)
        silent = [self.hostile("hello", self.socket, "silent", background=True)[0] for _ in range(100)]
        self.agent_holds("100 connections that never say HELLO")
        for p in silent:
            p.stdin.close()
        for p in silent:
            p.wait(30)

        # 5. A fork bomb of registrations: the container's processes are capped, the agent and others are not.
        bomb, first = self.hostile("forkbomb", self.socket, "1100", background=True)
        m = re.fullmatch(r"forkbomb (\d+) processes: (\d+) registered, (\d+) refused", first)
        check(m is not None, first)
        check(int(m.group(2)) <= 1024, f"more processes registered than a container may have: {first}")
        self.agent_holds(f"a fork bomb of registrations ({first})")
        bomb.stdin.close()
        bomb.wait(60)

        # 6. Its own limits file.
        out = self.hostile("write", self.files["attacker"]["limits"])
        check(out.startswith("write refused"), f"the tenant could write its limits file: {out}")
        self.agent_holds("a write to its own limits file")

        # 7. Slow clients on the agent's metrics port (reachable from pods): 40 connections that send a request
        #    head a byte at a time and never finish it, held while the checks scrape and probe /healthz.
        slow = []
        for _ in range(40):
            c = socket.create_connection(("127.0.0.1", self.port), timeout=10)
            c.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
            slow.append(c)
        for c in slow:
            try:
                c.sendall(b"X")
            except OSError:
                pass  # the server has already given up on it: that is the point
        self.agent_holds("40 slow clients on the metrics port")
        for c in slow:
            c.close()

        # 8. And after all that, with a fresh region, the attacker gets no more than its own 1 GiB.
        rc, out, err = self.probe(ATTACKER, "fill", str(64 * MIB))
        m = re.search(r"fill \S+ (\d+)", out)
        check(m is not None, f"the attacker's fill: {out!r} {err[-2000:]}")
        check(int(m.group(1)) <= 1024 * MIB, f"the attacker got {int(m.group(1)) // MIB} MiB of its 1024")
        print(f"ok: the attacker, with a fresh region, got {int(m.group(1)) // MIB} MiB of its 1024 MiB", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", required=True)
    ap.add_argument("--build", required=True)
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("SKIP: the hostile-tenant tier puts tenants in cgroups and runs them as nobody: run it as root")
        return 77
    tier = Tier(os.path.abspath(args.source), os.path.abspath(args.build))
    try:
        tier.node()
        tier.start_victim()
        tier.attacks()
        tier.agent_holds("every attack")
    except Failure as e:
        print(f"FAIL: {e}", file=sys.stderr)
        log = os.path.join(tier.tmp, "tessera-node.log")
        if os.path.exists(log):
            print("tessera-node's log (last lines):\n" + open(log).read()[-4000:], file=sys.stderr)
        return 1
    finally:
        tier.close()
    print("hostile-tenant tier: every check held")
    return 0


if __name__ == "__main__":
    sys.exit(main())
