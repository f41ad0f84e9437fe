"""Faults on the real control plane (docs/faults.md): a workload of GPU pods of every form, a fault schedule drawn
from a seed, a proxy that makes the API slow or failing for Tessera's components, and a checker of Tessera's
guarantees over the whole history. Used by tests/cluster/test_chaos.py (a short run in the cluster tier) and
bench/chaos.py (long runs, a report per seed).

    proxy = ApiFaultProxy()
    with Cluster(src, build, dra_gpus=(7,), api_front=proxy.front) as c:
        run = ChaosRun(c, proxy, seed=42, minutes=2)
        report = run.run()          # prints the schedule first, each fault as it happens
        assert not report["violations"], report

Everything here observes the cluster the way an operator could: the API server (directly, with the harness's
admin certificate, never through the fault proxy), tessera-scheduler's /inspect and /readyz, the node agent's
state directory and cri-fake's record of what the kubelet asked the runtime to create.

The Checker is pure: it takes snapshots (dicts, below) and returns what they violate, so that
tests/cluster/test_chaos_checker.py can feed it broken histories without a cluster.
"""

import contextlib
import ctypes
import http.client
import json
import os
import random
import socket
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request

import yaml

# ---------------------------------------------------------------------------------------------------------------
# Bounds (docs/faults.md states them as the guarantees' bounds; measured, with margin, on a loaded 2-core machine).

# 1: the pods' annotations and the agent's limits files are written by more than one patch or file when the agent
# corrects a swapped allocation (docs/node-agent.md, "Swapped allocations") or a compression is applied: a GPU may
# show over its capacity there for this long (each such moment is counted in the report); longer is a violation.
# The scheduler's ledger and the claims' allocations get no such allowance.
SPLIT_WRITE_S = 15
# 2: a running container's limits file may differ from its pod's assignment this long (a compression or
# give-back being written) before it is a violation. A container created without limits at all is one at once.
LIMITS_LAG_S = 60
# 3: a running pod's container may go without the agent's record, or the record without pod-resources'
# confirmation, this long (the agent's reconciliation with the kubelet after a restart of either).
RECORD_LAG_S = 90
# 4: a deleted pod's share may stay in the scheduler's ledger, the agent's records and a claim's reservations
# this long.
LEAK_S = 90
# 5: after the last fault, every pod that fits runs within this.
PROGRESS_S = 240
# A pod pending this long must have an event that says why: a Warning, or one of these (kube-scheduler's for a
# pod it tried or that is gated; tessera-scheduler's for a pod whose claims it places and that fits no node yet,
# docs/dra.md "Placement by Tessera").
PENDING_EVENT_S = 30
SAYS_WHY = ("FailedScheduling", "SchedulingGated", "TesseraPlacementWaiting")
# After each fault is undone, the control plane is expected back (healthy) within this; longer is a violation.
RECOVERY_S = 240
# A step of the tenant kill (a process of a running container filling its GPU memory, or starting to churn).
TENANT_STEP_S = 30

EPS = 1e-6


# ---------------------------------------------------------------------------------------------------------------
# The checker

class Checker:
    """Tessera's guarantees (docs/faults.md) over a history of snapshots. `observe(snapshot)` returns the
    violations that snapshot shows (also kept in `violations`); `finish(...)` adds those only the end can show.

    A snapshot is a dict:
      t:          seconds (monotonic)
      capacity:   {gpu uuid: {"cores": 100, "memoryMiB": n}}         (the node's inventory)
      devices:    {DRA device name: gpu uuid}
      pods:       {pod uid: {"ns", "name", "node", "phase", "assignment" (parsed or None), "claims": [claim uid],
                             "created": t}}                           (pods the API server holds, listed first)
      ledger:     {gpu uuid: {"cores", "memoryMiB", "tenants": [pod uid]}} or None (the leader's /inspect)
      claims:     {claim uid: {"name", "results": [(device, cores, memoryMiB)], "reservedFor": [pod uid]}}
      records:    [{"podUID", "container", "claim" (uid or None), "vgpus": [{"uuid", ...}], "confirmed",
                    "deviceIDs", "limits": {uuid: {"memory": bytes, "milli": n}} or None}]  (the agent's state)
      containers: {pod uid: the newest cri-fake CreateContainer record of its container "main"}
      leaders:    {replica: True (its /readyz says it leads) / False / None (no answer)}
      swapped:    {pod uid} tessera-node has said were in a swapped allocation it corrected (its log), so far
      dirs:       {pod uid} with a directory under the agent's containers/ or regions/ that no record uses (a record
                  that came to a pod in a swap keeps directories named after the pod it was made for)
    Any part may be missing (None) when it could not be read (a component down): then it is not checked.
    """

    def __init__(self):
        self.violations = []
        self.checks = 0
        self._seen = {}            # pod uid -> {"name", "first", "running", "gone", "node", "gpus", "pending_since"}
        self._mismatch_since = {}  # (kind, key) -> t first seen
        self._leaks = {}           # (place, pod uid) -> t the pod was seen gone, while still held there
        self.freed_after = {}      # place -> longest seen seconds from a pod's deletion to its share freed there
        self._reported = set()
        self.transient = []        # over-capacity moments shorter than SPLIT_WRITE_S: (t, place, GPU, what)
        self.swaps = 0             # pods whose GPUs changed in an allocation swap tessera-node corrected

    # -- helpers --
    def _violate(self, t, kind, what, key=None):
        key = (kind, key if key is not None else what)
        if key in self._reported:
            return None
        self._reported.add(key)
        v = {"t": t, "kind": kind, "what": what}
        self.violations.append(v)
        return v

    def _persisting(self, t, kind, key, bound, bad):
        """True once `bad` has held at every observation for longer than `bound`."""
        k = (kind, key)
        if not bad:
            self._mismatch_since.pop(k, None)
            return False
        since = self._mismatch_since.setdefault(k, t)
        return t - since > bound

    def observe(self, snap):
        before = len(self.violations)
        t = snap["t"]
        self._overcommit(snap)
        self._limits(snap)
        self._tenants(snap)
        self._history(snap)
        self._leaks_check(snap)
        self._leaders(snap)
        return self.violations[before:]

    # -- 1: no GPU over its capacity, in any place --
    def _overcommit(self, snap):
        t, cap = snap["t"], snap.get("capacity") or {}
        sums, who = {}, {}

        def add(place, uuid, cores, mem, name):
            s = sums.setdefault(place, {}).setdefault(uuid, [0.0, 0])
            s[0] += cores
            s[1] += mem
            who.setdefault((place, uuid), []).append(f"{name} {cores:g}%/{mem}")
        pods = snap.get("pods")
        live = {u for u, p in (pods or {}).items() if p.get("phase") not in ("Succeeded", "Failed")}
        name = lambda uid: pods[uid]["name"] if pods and uid in pods else uid  # noqa: E731
        if snap.get("ledger") is not None:
            for uuid, g in snap["ledger"].items():
                add("scheduler ledger", uuid, g["cores"], g["memoryMiB"], f"{len(g['tenants'])} tenants")
        if pods is not None:
            for uid in live:
                for ctr in (pods[uid].get("assignment") or {}).get("containers", []):
                    for v in ctr["vgpus"]:
                        writer = pods[uid].get("writer")
                        add("pod annotations", v["uuid"], v["cores"], v["memoryMiB"],
                            name(uid) + (f" (scheduler {writer})" if writer else ""))
        if snap.get("claims") is not None:
            for c in snap["claims"].values():
                for device, cores, mem in c["results"]:
                    uuid = (snap.get("devices") or {}).get(device, device)
                    add("ResourceClaim allocations", uuid, cores, mem, c["name"])
        if snap.get("records") is not None and pods is not None:
            for r in snap["records"]:
                if r.get("claim") or r["podUID"] not in live or not r.get("limits"):
                    continue
                for uuid, lim in r["limits"].items():
                    add("limits files", uuid, lim["milli"] / 10.0, lim["memory"] >> 20, name(r["podUID"]))
        for place, gpus in sums.items():
            split = place in ("pod annotations", "limits files")
            for uuid, (cores, mem) in gpus.items():
                self.checks += 1
                c = cap.get(uuid)
                if c is None:
                    continue
                over = cores > c["cores"] + EPS or mem > c["memoryMiB"]
                what = (f"{place}: GPU {uuid} holds {cores:g}% and {mem} MiB of {c['cores']}% and "
                        f"{c['memoryMiB']} MiB ({', '.join(sorted(who[(place, uuid)]))})")
                if split:
                    if over:
                        self.transient.append((t, place, uuid, what))
                    if not self._persisting(t, "over", (place, uuid), SPLIT_WRITE_S, over):
                        continue
                    what += f", for over {SPLIT_WRITE_S} s"
                elif not over:
                    continue
                self._violate(t, "over-committed GPU", what, key=(place, uuid))

    # -- 2: every started container with a GPU runs under limits equal to its assignment --
    def _limits(self, snap):
        t, pods, containers = snap["t"], snap.get("pods"), snap.get("containers")
        if pods is None or containers is None:
            return
        records = {(r["podUID"], r["container"]): r for r in (snap.get("records") or [])}
        for uid, p in pods.items():
            rec = containers.get(uid)
            if rec is None or p.get("phase") != "Running":
                continue
            self.checks += 1
            if p.get("claims"):
                if not rec.get("cdiDevices"):
                    self._violate(t, "container without limits",
                                  f"{p['ns']}/{p['name']} has a claim but its container was created without a CDI "
                                  "device", key=uid)
                continue
            a = p.get("assignment")
            if not a:
                continue
            env, mounts = rec.get("env") or {}, {m["container"]: m for m in rec.get("mounts") or []}
            if "TESSERA_LIMITS_FILE" not in env or "/etc/tessera" not in mounts:
                self._violate(t, "container without limits",
                              f"{p['ns']}/{p['name']} was created without a limits file (env "
                              f"TESSERA_LIMITS_FILE {'set' if 'TESSERA_LIMITS_FILE' in env else 'missing'}, "
                              f"/etc/tessera {'mounted' if '/etc/tessera' in mounts else 'not mounted'})", key=uid)
                continue
            want = {v["uuid"]: v for c in a["containers"] if c["name"] == "main" for v in c["vgpus"]}
            r = records.get((uid, "main"))
            got = (r or {}).get("limits")
            if snap.get("records") is None:
                continue
            bad = got is None or set(got) != set(want) or any(
                got[u]["memory"] != want[u]["memoryMiB"] << 20 or got[u]["milli"] != want[u]["milliCores"]
                for u in want)
            if self._persisting(t, "limits", uid, LIMITS_LAG_S, bad):
                self._violate(t, "limits differ from the assignment",
                              f"{p['ns']}/{p['name']}: limits {got} against the assignment {want} for over "
                              f"{LIMITS_LAG_S} s", key=uid)

    # -- 3: no tenant lost: the agent knows every running container, and pod-resources agrees --
    def _tenants(self, snap):
        t, pods, records = snap["t"], snap.get("pods"), snap.get("records")
        if pods is None or records is None or snap.get("containers") is None:
            return
        by_key = {(r["podUID"], r["container"]): r for r in records}
        claim_records = {r["claim"] for r in records if r.get("claim")}
        for uid, p in pods.items():
            if p.get("phase") != "Running" or uid not in snap["containers"]:
                continue
            self.checks += 1
            if p.get("claims"):
                missing = [c for c in p["claims"] if c not in claim_records]
                if self._persisting(t, "claim record", uid, RECORD_LAG_S, bool(missing)):
                    self._violate(t, "tenant lost", f"{p['ns']}/{p['name']} runs but the agent has no record of "
                                  f"its prepared claim(s) {missing}", key=uid)
                continue
            if not p.get("assignment"):
                continue
            r = by_key.get((uid, "main"))
            bad = r is None or not r.get("confirmed")
            if self._persisting(t, "record", uid, RECORD_LAG_S, bad):
                why = "no record in the agent's state" if r is None else \
                    "a record the kubelet's pod-resources never confirmed"
                self._violate(t, "tenant lost", f"{p['ns']}/{p['name']} runs with {why} for over {RECORD_LAG_S} s",
                              key=uid)

    # -- 6 (pods): no pod bound twice; and the timeline progress and leaks use --
    def _history(self, snap):
        t, pods = snap["t"], snap.get("pods")
        if pods is None:
            return
        for uid, p in pods.items():
            s = self._seen.setdefault(uid, {"name": f"{p['ns']}/{p['name']}", "first": p.get("created") or t,
                                            "running": None, "gone": None, "node": None, "gpus": None,
                                            "pending_since": None})
            self.checks += 1
            if p.get("node"):
                if s["node"] and s["node"] != p["node"]:
                    self._violate(t, "pod bound twice", f"{s['name']} bound to {s['node']}, then to {p['node']}",
                                  key=uid)
                s["node"] = p["node"]
            a = p.get("assignment")
            if a:
                gpus = sorted(v["uuid"] for c in a["containers"] for v in c["vgpus"])
                if s["gpus"] is not None and s["gpus"] != gpus and s["node"]:
                    if uid in (snap.get("swapped") or ()):
                        self.swaps += 1  # the agent made the annotation follow what the kubelet started
                    else:
                        self._violate(t, "pod bound twice",
                                      f"{s['name']} placed on GPUs {s['gpus']}, then on {gpus}", key=uid)
                if s["node"] or s["gpus"] is None:
                    s["gpus"] = gpus
            if p.get("phase") == "Running" and s["running"] is None:
                s["running"] = t
        for uid, s in self._seen.items():
            if uid not in pods and s["gone"] is None:
                s["gone"] = t

    # -- 4: a deleted pod's share is free everywhere within LEAK_S --
    def _leaks_check(self, snap):
        t = snap["t"]
        held = {}
        if snap.get("ledger") is not None:
            held["scheduler ledger"] = {u for g in snap["ledger"].values() for u in g["tenants"]}
        if snap.get("records") is not None:
            held["agent records"] = {r["podUID"] for r in snap["records"] if not r.get("claim")}
        if snap.get("dirs") is not None:
            held["agent's directories"] = set(snap["dirs"])
        if snap.get("claims") is not None:
            held["claim reservations"] = {u for c in snap["claims"].values() for u in c["reservedFor"]}
        for place, uids in held.items():
            self.checks += 1
            for key in [k for k in self._leaks if k[0] == place and k[1] not in uids]:
                gone = self._seen[key[1]]["gone"]
                self.freed_after[place] = max(self.freed_after.get(place, 0.0), t - gone)
                del self._leaks[key]
            for uid in uids:
                s = self._seen.get(uid)
                if not s or s["gone"] is None:
                    continue
                self._leaks.setdefault((place, uid), s["gone"])
                if t - s["gone"] > LEAK_S:
                    self._violate(t, "leak", f"{s['name']} was deleted {t - s['gone']:.0f} s ago and is still held "
                                  f"in the {place}", key=(place, uid))

    # -- 6 (leaders): never two replicas acting as leader at once --
    def _leaders(self, snap):
        leaders = snap.get("leaders")
        if not leaders:
            return
        self.checks += 1
        acting = sorted(r for r, v in leaders.items() if v)
        if len(acting) > 1:
            self._violate(snap["t"], "two leaders", f"replicas {acting} both answer /readyz as the leader",
                          key=tuple(acting) + (round(snap["t"]),))

    # -- 5: at the end --
    def finish(self, t, last_fault_end, events, pending_left):
        """`events`: {pod uid: [reasons]}; `pending_left`: {pod uid: name} of pods that never ran by the end."""
        for uid, s in self._seen.items():
            waited_until = s["running"] if s["running"] is not None else (s["gone"] if s["gone"] is not None else t)
            waited = waited_until - s["first"]
            if waited > PENDING_EVENT_S and not events.get(uid):
                self._violate(t, "pending without a reason",
                              f"{s['name']} waited {waited:.0f} s to run with no event saying why", key=uid)
        for uid, name in pending_left.items():
            self._violate(t, "no progress", f"{name} never ran, {t - last_fault_end:.0f} s after the last fault",
                          key=uid)
        return self.violations

    def longest_wait(self, after=None):
        """The longest a pod waited from creation to running (pods created after `after`, if given)."""
        waits = [s["running"] - s["first"] for s in self._seen.values()
                 if s["running"] is not None and (after is None or s["first"] >= after)]
        return max(waits, default=0.0)


# ---------------------------------------------------------------------------------------------------------------
# The API fault proxy

class ApiFaultProxy:
    """An HTTPS proxy in front of kube-apiserver for Tessera's components (Cluster(api_front=proxy.front)): it
    serves the API server's own certificate, reads each request, and either forwards it (a new upstream
    connection per request, `Connection: close` both ways) or does what `mode` says:
      "slow":  waits 0.5-3 s before forwarding;
      "fail":  answers half the requests 429 (Retry-After: 1) or 500, with a Status body as the API server's;
      "gone":  answers every watch with the API server's 410 Expired ERROR event (a compacted resourceVersion),
               and lists are forwarded;
      "drop":  closes a third of the connections, half before forwarding and half after (a write that happened
               whose answer is lost), and cuts watches after 1-5 s.
    """

    def __init__(self, seed=0):
        self.mode = None
        self.rng = random.Random(seed)
        self.counts = {}
        self.port = None
        self._stop = threading.Event()
        self._counts_lock = threading.Lock()

    def front(self, cluster):
        self.upstream = cluster.ports["apiserver"]
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(cluster.path("pki", "apiserver.crt"), cluster.path("pki", "apiserver.key"))
        self.server_ctx.set_alpn_protocols(["http/1.1"])
        self.client_ctx = ssl.create_default_context(cafile=cluster.path("pki", "ca.crt"))
        self.client_ctx.set_alpn_protocols(["http/1.1"])
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.5)
        self.port = self._server.getsockname()[1]
        from cluster import serve_connections
        threading.Thread(target=serve_connections, args=(self._server, self._stop, self._serve), daemon=True).start()
        return self.port

    def close(self):
        self._stop.set()
        with contextlib.suppress(Exception):
            self._server.close()

    def _count(self, what):
        with self._counts_lock:
            self.counts[what] = self.counts.get(what, 0) + 1

    @staticmethod
    def _read_head(sock):
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = sock.recv(65536)
            if not chunk:
                return None, b""
            data += chunk
            if len(data) > 1 << 20:
                return None, b""
        head, rest = data.split(b"\r\n\r\n", 1)
        return head, rest

    def _answer(self, conn, code, reason, message, retry_after=None):
        body = json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                           "message": message, "reason": reason, "code": code}).encode()
        text = {429: "Too Many Requests", 500: "Internal Server Error"}[code]
        extra = f"Retry-After: {retry_after}\r\n" if retry_after else ""
        conn.sendall(f"HTTP/1.1 {code} {text}\r\nContent-Type: application/json\r\n{extra}"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)

    def _serve(self, raw):
        conn = None
        try:
            raw.settimeout(30)
            conn = self.server_ctx.wrap_socket(raw, server_side=True)
            head, rest = self._read_head(conn)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, target = lines[0].split(" ")[:2]
            headers = [h for h in lines[1:] if h and not h.lower().startswith(("connection:", "keep-alive:"))]
            length = 0
            for h in headers:
                if h.lower().startswith("content-length:"):
                    length = int(h.split(":", 1)[1])
            body = rest
            while len(body) < length:
                chunk = conn.recv(65536)
                if not chunk:
                    return
                body += chunk
            watch = "watch=true" in target or "watch=1" in target
            mode = self.mode
            cut_after = None
            if mode == "slow":
                self._count("delayed")
                time.sleep(self.rng.uniform(0.5, 3.0))
            elif mode == "fail" and self.rng.random() < 0.5:
                if self.rng.random() < 0.5:
                    self._count("429")
                    self._answer(conn, 429, "TooManyRequests", "the fault proxy: too many requests", retry_after=1)
                else:
                    self._count("500")
                    self._answer(conn, 500, "InternalError", "the fault proxy: an internal error")
                return
            elif mode == "gone" and watch and method == "GET":
                self._count("410")
                event = json.dumps({"type": "ERROR", "object": {
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "too old resource version (the fault proxy)", "reason": "Expired", "code": 410}})
                payload = (event + "\n").encode()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
                             b"Connection: close\r\n\r\n" + f"{len(payload):x}\r\n".encode() + payload +
                             b"\r\n0\r\n\r\n")
                return
            elif mode == "drop":
                if watch:
                    cut_after = self.rng.uniform(1, 5)
                if self.rng.random() < 1 / 3:
                    if self.rng.random() < 0.5:
                        self._count("dropped before")
                        return
                    cut_after = 0.0  # forwarded, the answer lost
            up = self.client_ctx.wrap_socket(socket.create_connection(("127.0.0.1", self.upstream), timeout=10),
                                             server_hostname="127.0.0.1")
            up.settimeout(None if watch else 120)
            up.sendall((f"{method} {target} HTTP/1.1\r\n" + "\r\n".join(headers) +
                        "\r\nConnection: close\r\n\r\n").encode("latin-1") + body)
            if cut_after == 0.0:
                self._count("dropped after")
                with contextlib.suppress(OSError):
                    up.recv(65536)
                up.close()
                return
            self._count("watch" if watch else "forwarded")
            deadline = time.monotonic() + cut_after if cut_after else None
            if watch:
                up.settimeout(1.0)  # to look at the mode between reads
            while True:
                try:
                    data = up.recv(65536)
                except socket.timeout:
                    data = None
                if data == b"":
                    break
                if data:
                    conn.sendall(data)
                if watch:
                    # A watch opened before the fault is cut when it comes ("gone": the client's next watch gets
                    # the 410; "drop": after 1-5 s), as a restarted API server or a load balancer would.
                    if self.mode == "gone" or (self.mode == "drop" and deadline is None):
                        deadline = min(deadline or 1e18, time.monotonic() + (
                            0 if self.mode == "gone" else self.rng.uniform(1, 5)))
                    if deadline is not None and time.monotonic() >= deadline:
                        self._count("watch cut")
                        break
            up.close()
        except (OSError, ssl.SSLError, ValueError):
            pass
        finally:
            with contextlib.suppress(OSError):
                (conn or raw).close()


# ---------------------------------------------------------------------------------------------------------------
# Reading the cluster

class Api:
    """The API server, directly (never through the fault proxy), as the harness's admin."""

    def __init__(self, cluster):
        self.base = f"https://127.0.0.1:{cluster.ports['apiserver']}"
        self.ctx = ssl.create_default_context(cafile=cluster.path("pki", "ca.crt"))
        self.ctx.load_cert_chain(cluster.path("pki", "admin.crt"), cluster.path("pki", "admin.key"))

    def call(self, method, path, body=None, timeout=20):
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, context=self.ctx, timeout=timeout) as r:
                status, text = r.status, r.read()
            try:
                return status, json.loads(text or b"{}")
            except ValueError:  # /readyz answers "ok"
                return status, {}
        except urllib.error.HTTPError as e:
            try:
                return e.code, json.loads(e.read() or b"{}")
            except (ValueError, OSError):
                return e.code, {}
        except (OSError, ValueError, http.client.HTTPException):  # down, paused, restarting: no answer
            return None, {}

    def get(self, path, timeout=20):
        code, obj = self.call("GET", path, timeout=timeout)
        return obj if code == 200 else None


def http_get(url, timeout=2):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, b""
    except Exception:
        return None, b""


def read_limits(path):
    """The limits file (docs/hook-abi.md): per GPU line, memory in bytes and the share in thousandths."""
    out = {}
    with open(path) as f:
        for line in f:
            words = line.split()
            if words and words[0] == "gpu":
                kv = dict(w.split("=", 1) for w in words[1:] if "=" in w)
                out[kv["uuid"]] = {"memory": int(kv["memory"]), "milli": int(kv.get("cores-milli", 0)) or
                                   int(kv["cores"]) * 10}
    return out


def quantity_mib(q):
    q = str(q)
    for suffix, mult in (("Gi", 1024), ("Mi", 1), ("Ki", 1 / 1024)):
        if q.endswith(suffix):
            return int(float(q[:-len(suffix)]) * mult)
    return int(q) >> 20


class Observer:
    """Takes a snapshot of the cluster for the Checker."""

    def __init__(self, cluster, api, replicas=("r1", "r2")):
        self.c, self.api, self.replicas = cluster, api, replicas
        self.capacity, self.devices = None, {}
        self._containers_off = 0
        self._newest = {}  # pod uid -> newest "main" CreateContainer record
        self._agent_log_off = 0
        self.swapped = set()

    def _inventory(self):
        node = self.api.get(f"/api/v1/nodes/{NODE}")
        inv = json.loads(((node or {}).get("metadata", {}).get("annotations") or {}).get(
            "tessera.dev/gpu-inventory", "null") or "null")
        if inv:
            self.capacity = {g["uuid"]: {"cores": 100, "memoryMiB": g["memoryMiB"]} for g in inv["gpus"]}
            self.devices = {f"gpu-{g['index']}": g["uuid"] for g in inv["gpus"]}

    def _read_containers(self):
        path = self.c.path("containers.jsonl")
        try:
            with open(path) as f:
                f.seek(self._containers_off)
                text = f.read()
        except FileNotFoundError:
            return
        end = text.rfind("\n") + 1
        self._containers_off += len(text[:end].encode())
        for line in text[:end].splitlines():
            if line.strip():
                r = json.loads(line)
                if r.get("container") == "main":
                    self._newest[r["podUID"]] = r

    def _read_agent_log(self):
        """The pods tessera-node says it corrected a swapped allocation for (docs/node-agent.md)."""
        try:
            with open(self.c.procs["tessera-node"].log_path, "rb") as f:
                f.seek(self._agent_log_off)
                data = f.read()
        except (OSError, KeyError):
            return
        end = data.rfind(b"\n") + 1
        self._agent_log_off += end
        for line in data[:end].decode(errors="replace").splitlines():
            if "allocation swapped between pods" in line:
                for word in line.split():
                    if word.startswith(("from=", "to=")):
                        self.swapped.add(word.split("=", 1)[1].split("/")[0])

    def snapshot(self):
        if self.capacity is None:
            self._inventory()
        snap = {"t": time.monotonic(), "capacity": self.capacity, "devices": self.devices}
        pods = self.api.get("/api/v1/namespaces/default/pods", timeout=15)
        if pods is not None:
            snap["pods"] = {}
            for p in pods["items"]:
                meta, ann = p["metadata"], p["metadata"].get("annotations") or {}
                a = None
                with contextlib.suppress(ValueError, KeyError):
                    a = json.loads(ann["tessera.dev/assignment"])
                claims = [s["resourceClaimName"] for s in p.get("status", {}).get("resourceClaimStatuses", [])
                          if s.get("resourceClaimName")]
                snap["pods"][meta["uid"]] = {
                    "ns": meta["namespace"], "name": meta["name"], "node": p["spec"].get("nodeName"),
                    "phase": p.get("status", {}).get("phase"), "assignment": a, "claim_names": claims,
                    # Who last wrote its assignment (a bind or a share rewrite names the replica and its term;
                    # tessera-node's rewrites of a swap do not): a violation's report says it.
                    "writer": "/".join(ann[k] for k in ("tessera.dev/leader", "tessera.dev/leader-term") if k in ann),
                    "claims": [], "created": None, "state": pod_state(p)}
        code, body = http_get(self.c.extender_url() + "/inspect", timeout=5)
        if code == 200:
            snap["ledger"] = {}
            for n in json.loads(body)["nodes"]:
                for g in n["gpus"]:
                    snap["ledger"][g["uuid"]] = {"cores": g["coresUsed"], "memoryMiB": g["memoryUsedMiB"],
                                                 "tenants": [x["podUID"] for x in g["tenants"]]}
        claims = self.api.get("/apis/resource.k8s.io/v1/namespaces/default/resourceclaims", timeout=15)
        if claims is not None:
            snap["claims"] = {}
            by_name = {}
            for x in claims["items"]:
                results = []
                for r in (x.get("status", {}).get("allocation") or {}).get("devices", {}).get("results", []):
                    cc = r.get("consumedCapacity") or {}
                    results.append((r["device"], float(cc.get("cores", 100)), quantity_mib(cc.get("memory", "0"))))
                snap["claims"][x["metadata"]["uid"]] = {
                    "name": x["metadata"]["name"], "results": results,
                    "reservedFor": [r["uid"] for r in x.get("status", {}).get("reservedFor", [])]}
                by_name[x["metadata"]["name"]] = x["metadata"]["uid"]
            for p in (snap.get("pods") or {}).values():
                p["claims"] = [by_name.get(n, n) for n in p["claim_names"]]
        self._read_agent_log()
        snap["swapped"] = set(self.swapped)
        snap["records"] = self._records()
        snap["dirs"] = self._dirs(snap["records"])
        self._read_containers()
        snap["containers"] = dict(self._newest)
        snap["leaders"] = {r: self._leads(r) for r in self.replicas if f"tessera-scheduler-{r}" in self.c.procs}
        return snap

    def _leads(self, replica):
        if not self.c.procs[f"tessera-scheduler-{replica}"].alive():
            return False
        code, _ = http_get(self.c.extender_url(replica) + "/readyz", timeout=1)
        return None if code is None else code == 200

    def _dirs(self, records):
        out = set()
        for top in ("containers", "regions"):
            with contextlib.suppress(OSError):
                out.update(os.listdir(self.c.path("tessera", top)))
        for r in records or []:
            out -= {os.path.basename(os.path.dirname(d)) for d in r["dirs"]}
        return out

    def _records(self):
        d = self.c.path("tessera", "records")
        out = []
        try:
            names = os.listdir(d)
        except OSError:
            return None
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                with open(os.path.join(d, name)) as f:
                    r = json.load(f)
            except (OSError, ValueError):
                continue  # removed or being replaced
            limits = None
            with contextlib.suppress(OSError, ValueError, KeyError):
                limits = read_limits(os.path.join(r["dir"], "limits"))
            out.append({"podUID": r["podUID"], "container": r["container"], "dirs": [r["dir"], r["regionDir"]],
                        "claim": (r.get("claim") or {}).get("uid"), "vgpus": r["vgpus"],
                        "confirmed": r.get("confirmed"), "deviceIDs": r.get("deviceIDs"), "limits": limits})
        return out


# ---------------------------------------------------------------------------------------------------------------
# The workload

NODE = "gpu-node-0"
DRA_TEMPLATE = "chaos-share"

# name, limits, annotations, uses a claim
FORMS = [
    ("share", {"tessera.dev/gpu-cores": 30, "tessera.dev/gpu-memory": 4096}, {"tessera.dev/priority": "low"}),
    ("share-small", {"tessera.dev/gpu-cores": 20, "tessera.dev/gpu-memory": 2048}, None),
    ("whole", {"tessera.dev/gpu": 1}, None),
    ("multi", {"tessera.dev/gpu": 2}, None),
    ("elastic", {"tessera.dev/gpu-cores": 10}, {"tessera.dev/compute-policy": "elastic"}),
    ("high", {"tessera.dev/gpu-cores": 50, "tessera.dev/gpu-memory": 2048}, {"tessera.dev/priority": "high"}),
    ("dra", None, None),
    ("hami", {"nvidia.com/gpu": 1, "nvidia.com/gpucores": 20, "nvidia.com/gpumem": 3000}, None),
    ("gpushare", {"aliyun.com/gpu-mem": 4}, None),
    ("gpu-manager", {"tencent.com/vcuda-core": 20, "tencent.com/vcuda-memory": 8}, None),
]


def dra_template():
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": DRA_TEMPLATE, "namespace": "default"},
            "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {
                "deviceClassName": "gpu.tessera.dev",
                "capacity": {"requests": {"cores": "30", "memory": "4Gi"}}}}]}}}}


def yaml_dump(obj):
    return yaml.safe_dump(obj)


def pod_object(name, form):
    kind, limits, annotations = form
    container = {"name": "main", "image": "registry.invalid/app:1"}
    spec = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [container]}
    if kind == "dra":
        container["resources"] = {"claims": [{"name": "gpu"}]}
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": DRA_TEMPLATE}]
    else:
        container["resources"] = {"limits": {k: str(v) for k, v in limits.items()}}
    meta = {"name": name, "namespace": "default", "labels": {"chaos": "1", "form": kind}}
    if annotations:
        meta["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


class Workload:
    """Creates pods of every form at a steady rate, each deleted a random while after it runs; some are deleted
    the moment they are bound (while the kubelet may be calling Allocate for them). Creation refused (the webhook
    down, failurePolicy: Fail) is tried again later, as a controller would."""

    def __init__(self, api, rng, max_live=12, lifetime=(8, 30)):
        self.api, self.rng, self.max_live, self.lifetime = api, rng, max_live, lifetime
        self.seq = 0
        self.live = {}  # name -> {"form", "created", "running", "delete_at", "doomed"}
        self.created = self.deleted = self.refused = self.deleted_in_allocate = 0
        self.creating = True
        self.doom_next = False
        self.by_form = {}

    def step(self, snap):
        now = time.monotonic()
        pods = {p["name"]: p for p in (snap.get("pods") or {}).values()}
        if snap.get("pods") is not None:
            for name in [n for n in self.live if n not in pods and self.live[n]["asked_delete"]]:
                del self.live[name]
        for name, w in list(self.live.items()):
            p = pods.get(name)
            if p is None or w["asked_delete"]:
                continue
            if w["doomed"] and p.get("node"):
                self._delete(name, doomed=True)
            elif p.get("phase") == "Running":
                if w["running"] is None:
                    w["running"] = now
                    w["delete_at"] = now + self.rng.uniform(*self.lifetime)
                if now >= w["delete_at"]:
                    self._delete(name)
            elif p.get("phase") in ("Failed", "Succeeded"):
                self._delete(name)
        if self.creating:
            for _ in range(2):
                if len(self.live) >= self.max_live:
                    break
                self._create(now)

    def _create(self, now):
        form = self.rng.choice(FORMS)
        self.seq += 1
        name = f"ch-{self.seq}-{form[0]}"
        code, _ = self.api.call("POST", "/api/v1/namespaces/default/pods", pod_object(name, form))
        if code not in (200, 201):
            self.refused += 1
            return
        self.created += 1
        self.by_form[form[0]] = self.by_form.get(form[0], 0) + 1
        doomed = self.doom_next
        self.doom_next = False
        self.live[name] = {"form": form[0], "created": now, "running": None, "delete_at": None, "doomed": doomed,
                           "asked_delete": False}

    def _delete(self, name, doomed=False):
        code, _ = self.api.call("DELETE", f"/api/v1/namespaces/default/pods/{name}",
                                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
        if code in (200, 202, 404):
            self.live[name]["asked_delete"] = True
            self.deleted += 1
            if doomed:
                self.deleted_in_allocate += 1


# ---------------------------------------------------------------------------------------------------------------
# The fault schedule

COMPONENTS = ["etcd", "kube-apiserver", "kube-scheduler-tessera", "tessera-scheduler-r1", "tessera-scheduler-r2",
              "tessera-node", "kubelet", "cri-fake"]
API_MODES = ["slow", "fail", "gone", "drop"]


# tessera-scheduler's Lease: 15 s (src/k8s/leader_election.h's default, which tessera-scheduler keeps). The
# leader paused past it: the standby takes the Lease meanwhile, and the old leader, resumed, must not act.
LEASE_S = 15
PAST_LEASE = "pause the leading tessera-scheduler past its lease"


# A tenant's process under the hook, SIGKILLed while it allocates and frees GPU memory (docs/faults.md).
TENANT_KILL = "kill a tenant mid-allocation"


def fault_kinds():
    kinds = [f"kill {c}" for c in COMPONENTS] + [f"pause {c}" for c in COMPONENTS] + [PAST_LEASE]
    kinds += [f"api {m}" for m in API_MODES] + ["state dir read-only", "delete in Allocate", TENANT_KILL]
    return kinds


class FaultSchedule:
    """Faults drawn from random.Random(seed), one at a time: (start offset s, kind, held s). Every kind appears
    once, in a random order, before any repeats, so a short run covers them all."""

    def __init__(self, seed, seconds, gap=(3, 8), hold=1.0):
        """`gap`: seconds between one fault undone (and the cluster healthy again) and the next; `hold`: a factor
        on how long each fault is held (the short run of the cluster tier holds them shorter)."""
        rng = random.Random(seed)
        self.seed, self.seconds, self.faults = seed, seconds, []
        t, pool = 0.0, []
        while True:
            if not pool:
                pool = fault_kinds()
                rng.shuffle(pool)
            kind = pool.pop()
            if kind == PAST_LEASE:
                held = rng.uniform(LEASE_S + 5, LEASE_S + 10) / hold  # never held shorter
            elif kind == TENANT_KILL:
                held = 0  # its own steps take the time they take
            elif kind.startswith("kill"):
                held = rng.uniform(0, 3)
            elif kind.startswith("pause"):
                held = rng.uniform(2, 12)
            elif kind.startswith("api"):
                held = rng.uniform(5, 20)
            elif kind == "state dir read-only":
                held = rng.uniform(5, 20)
            else:
                held = 0
            held *= hold
            t += rng.uniform(*gap)
            if t + held > seconds:
                break
            self.faults.append((round(t, 1), kind, round(held, 1)))
            t += held

    def text(self, replay=None):
        replay = replay or f"bench/chaos.py --seeds {self.seed} --minutes {self.seconds / 60:g}"
        lines = [f"fault schedule, seed {self.seed} (replay: {replay}):"]
        lines += [f"  +{t:6.1f} s  {kind}" + (f" for {held} s" if held else "") for t, kind, held in self.faults]
        return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------------
# A directory made read-only in place (the "state dir read-only" fault).

_SYS_OPEN_TREE, _SYS_MOVE_MOUNT, _SYS_MOUNT_SETATTR = 428, 429, 442  # one number on every architecture but alpha
_AT_FDCWD, _AT_EMPTY_PATH, _AT_RECURSIVE = -100, 0x1000, 0x8000
_OPEN_TREE_CLONE, _OPEN_TREE_CLOEXEC = 1, 0o2000000
_MOVE_MOUNT_F_EMPTY_PATH, _MOUNT_ATTR_RDONLY = 0x4, 0x1


def mount_read_only(d):
    """Mounts a read-only bind of `d` over `d` (undone by `umount d`).

    `mount --bind` then `mount -o remount,bind,ro` is two steps, and the remount fails with EBUSY when a process
    opened a file for writing through the new bind between them (tessera-node writes its state directory all the
    time: CI saw exit 32). The kernel's new mount API has no such window: the clone is made read-only while
    detached, where nothing can open through it, and only then attached. Where that API is refused (ENOSYS,
    EPERM from a seccomp filter), the two steps are tried again until a remount finds no writer."""
    if _mount_read_only_detached(d):
        return
    deadline = time.monotonic() + 30
    while True:
        subprocess.run(["mount", "--bind", d, d], check=True)
        r = subprocess.run(["mount", "-o", "remount,bind,ro", d], capture_output=True, text=True)
        if r.returncode == 0:
            return
        subprocess.run(["umount", "--lazy", d], check=False)
        if time.monotonic() > deadline:
            raise RuntimeError(f"cannot remount {d} read-only for 30 s (a writer each time?): {r.stderr.strip()}")
        time.sleep(0.2)


def _mount_read_only_detached(d):
    """open_tree(2) a clone of `d`'s mount, mount_setattr(2) it read-only, move_mount(2) it onto `d`; False where
    the kernel or a seccomp filter refuses any of the three (nothing mounted then)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    path = os.fsencode(d)
    fd = libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, path, _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC)
    if fd < 0:
        return False
    try:
        attr = (ctypes.c_uint64 * 4)(_MOUNT_ATTR_RDONLY, 0, 0, 0)  # struct mount_attr: set, clr, propagation, userns
        return (libc.syscall(_SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH | _AT_RECURSIVE, attr, ctypes.sizeof(attr))
                == 0 and libc.syscall(_SYS_MOVE_MOUNT, fd, b"", _AT_FDCWD, path, _MOVE_MOUNT_F_EMPTY_PATH) == 0)
    finally:
        os.close(fd)  # a clone never attached goes with its last descriptor


# ---------------------------------------------------------------------------------------------------------------
# A run

def pod_state(pod):
    """Where a pod stands, in a line: phase, node, Tessera's phase, gates, PodScheduled, containers waiting."""
    spec, status = pod.get("spec", {}), pod.get("status", {})
    ann = pod["metadata"].get("annotations") or {}
    parts = [f"phase {status.get('phase')}", f"node {spec.get('nodeName') or '-'}",
             f"tessera.dev/phase {ann.get('tessera.dev/phase', '-')}"]
    if spec.get("schedulingGates"):
        parts.append("gates " + ",".join(g.get("name", "") for g in spec["schedulingGates"]))
    for c in status.get("conditions", []):
        if c.get("type") == "PodScheduled":
            parts.append(f"PodScheduled {c.get('status')} {c.get('reason', '')} {c.get('message', '')[:160]}".strip())
    waiting = [cs["state"]["waiting"].get("reason", "") for cs in status.get("containerStatuses", [])
               if "waiting" in cs.get("state", {})]
    if waiting:
        parts.append("waiting " + ",".join(waiting))
    if status.get("reason"):
        parts.append(f"reason {status['reason']}")
    return "; ".join(parts)


def chaos_cluster(source, build, proxy):
    """The harness's cluster with GPU 7 given to DRA and Tessera's components behind the fault proxy; `prepare`
    it once started."""
    from cluster import Cluster
    return Cluster(source, build, dra_gpus=(7,), api_front=proxy.front)


def prepare(c, source):
    """The DRA device classes, the workload's claim template, a second tessera-scheduler replica (standby)."""
    c.kubectl("apply", "-f", os.path.join(source, "deploy/dra/deviceclasses.yaml"))
    c.apply(yaml_dump(dra_template()))
    c.start_tessera_scheduler("r2")


class ChaosRun:
    """One run: the schedule printed, then a loop (its own thread) that snapshots the cluster every second, feeds
    the Checker and drives the Workload, while this thread injects each fault, undoes it and measures how long the
    cluster takes to be healthy again; after the last, no new pods, the drain, the final checks. `run()` returns
    the report (format_report prints it). Faults that start processes run on the calling thread: the harness's
    children die with the thread that started them (PR_SET_PDEATHSIG)."""

    def __init__(self, cluster, proxy, seed, seconds, log=print, max_live=12, gap=(3, 8), hold=1.0, replay=None):
        self.c, self.proxy, self.seed, self.seconds, self.log = cluster, proxy, seed, seconds, log
        self.replay = replay
        self.api = Api(cluster)
        self.schedule = FaultSchedule(seed, seconds, gap, hold)
        self.checker = Checker()
        self.observer = Observer(cluster, self.api)
        self.workload = Workload(self.api, random.Random(seed + 1), max_live=max_live)
        self.recovery = {}
        self.injected = {}
        self.exited = {}  # component -> times it exited on its own and was started again
        self.unrecovered = []
        self.rng = random.Random(seed + 2)  # the tenant kills' draws (which pod, when)
        self.tenant_kills = {"tried": 0, "killed": 0}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.snapshots = 0
        self.t0 = None

    # -- the loop that observes, checks and drives the workload --
    def _loop(self):
        while not self._stop.is_set():
            try:
                snap = self.observer.snapshot()
                with self._lock:
                    for v in self.checker.observe(snap):
                        self.log(f"  VIOLATION +{v['t'] - self.t0:.1f} s {v['kind']}: {v['what']}")
                    self.snapshots += 1
                self.workload.step(snap)
            except Exception as e:  # a component down mid-read: the next snapshot tries again
                self.log(f"  (observer: {type(e).__name__}: {e})")
            self._stop.wait(1.0)

    # -- health, for recovery times --
    def healthy(self, registrations_before=None):
        """Every component back: each process running; kube-apiserver ready; the kubelet's /healthz; the node
        Ready and advertising every slot; tessera-node's /healthz and its device plugin registered with the
        running kubelet (again, after tessera-node restarted: more registrations than `registrations_before`);
        a tessera-scheduler replica leading and ready behind the Service's stand-in."""
        c = self.c
        if not all(p.alive() for p in c.procs.values()):
            return False
        code, _ = self.api.call("GET", "/readyz", timeout=5)
        if code != 200:
            return False
        if http_get(f"http://127.0.0.1:{c.ports['kubelet-healthz']}/healthz")[0] != 200 or \
                http_get(f"http://127.0.0.1:{c.ports['node-metrics']}/healthz")[0] != 200:
            return False
        registrations = c.plugin_registrations()
        if registrations < 1 or (registrations_before is not None and registrations <= registrations_before):
            return False
        node = self.api.get(f"/api/v1/nodes/{NODE}", timeout=5)
        if node is None:
            return False
        ready = any(x["type"] == "Ready" and x["status"] == "True" for x in node["status"].get("conditions", []))
        expected = (8 - len(c.dra_gpus)) * 10
        alloc = int(node["status"].get("allocatable", {}).get("tessera.dev/gpu", "0"))
        leader = c.extender_proxy.ready_port
        return ready and alloc == expected and leader is not None and \
            http_get(f"http://127.0.0.1:{leader}/readyz")[0] == 200

    def supervise(self):
        """Starts again any component that exited on its own, as its static pod, Deployment or systemd unit would
        (kube-scheduler exits when it loses its leader lease: a 10 s pause of kube-apiserver does that). Runs on
        the calling thread, which must be the one that injects faults (the children die with their thread)."""
        for name, p in self.c.procs.items():
            if p.proc is not None and not p.alive():
                self.exited[name] = self.exited.get(name, 0) + 1
                self.log(f"+{time.monotonic() - self.t0:6.1f} s  {name} exited on its own "
                         f"({p.proc.returncode}); started again")
                self.c.restart(name)

    def _inject(self, kind, held):
        c = self.c
        verb, _, what = kind.partition(" ")
        if kind == TENANT_KILL:
            self._kill_tenant()
        elif verb == "kill":
            c.kill(what)
            time.sleep(held)
            c.restart(what)
        elif kind == PAST_LEASE:
            leader = [n for n in c.procs if n.startswith("tessera-scheduler-") and
                      c.ports.get(n) == c.extender_proxy.ready_port]
            if not leader:
                return
            c.pause(leader[0])
            try:
                time.sleep(held)
            finally:
                c.resume(leader[0])
        elif verb == "pause":
            c.pause(what)
            try:
                time.sleep(held)
            finally:
                c.resume(what)
        elif verb == "api":
            self.proxy.mode = what
            try:
                time.sleep(held)
            finally:
                self.proxy.mode = None
        elif kind == "state dir read-only":
            d = c.path("tessera")
            mount_read_only(d)
            try:
                time.sleep(held)
            finally:
                subprocess.run(["umount", "--lazy", d], check=False)
        elif kind == "delete in Allocate":
            self.workload.doom_next = True

    # -- a tenant killed mid-allocation --
    def _tenant(self, record, argv):
        """A process of `record`'s container, as its runtime would run it (cluster.ContainerProcess): cuda_probe
        under the hook the agent mounted and preloaded, on the fake driver presenting this node's GPUs."""
        from cluster import ContainerProcess
        c = self.c
        device_dir = c.path("fakegpu")
        os.makedirs(device_dir, exist_ok=True)
        with open(os.path.join(c.src, c.fake_gpus)) as f:
            uuids = [g["uuid"] for g in yaml.safe_load(f)["gpus"]]
        env = {"LD_LIBRARY_PATH": os.path.join(c.build, "fakecuda"),
               "CUDA_VISIBLE_DEVICES": record["env"]["NVIDIA_VISIBLE_DEVICES"],
               "FAKECUDA_UUIDS": ",".join(uuids), "FAKECUDA_STATE": "/run/fakecuda/node.state"}
        return ContainerProcess(c, record, [os.path.join(c.build, "tests", "cuda_probe"), "dlsym", "init", "ctx",
                                            *argv], env, [(device_dir, "/run/fakecuda", False)])

    def _fill(self, record):
        """How much GPU memory a fresh process of the container gets, allocating 16 MiB at a time until the hook
        refuses; None when it could not tell (the pod deleted meanwhile, its files gone)."""
        p = self._tenant(record, ["fill", str(16 << 20)])
        try:
            p.proc.wait(TENANT_STEP_S)
        except subprocess.TimeoutExpired:
            pass
        p.stop(5)
        for line in p.lines:
            w = line.split()
            if w[:1] == ["fill"] and len(w) == 3 and w[1] == "2":  # CUDA_ERROR_OUT_OF_MEMORY: the limit
                return int(w[2])
        return None

    def _kill_tenant(self):
        """A running pod's container gets a process that allocates and frees GPU memory of every kind through the
        hook (cuda_probe's churn), SIGKILLed at a random moment of it, most likely inside an allocation; then a
        second process of the same container fills the memory. It must get what a process got before the kill:
        the dead process's charges are gone from the container's region (guarantee 4), and tessera-node, whose
        registration socket the tenant used, stays up (the recovery check)."""
        self.tenant_kills["tried"] += 1
        deadline = time.monotonic() + TENANT_STEP_S
        while True:
            newest = dict(self.observer._newest)  # the observer's loop reads cri-fake's records every second
            live = dict(self.workload.live)
            running = {p["metadata"]["uid"]: p["metadata"]["name"]
                       for p in (self.api.get("/api/v1/namespaces/default/pods") or {}).get("items", [])
                       if p.get("status", {}).get("phase") == "Running" and p["metadata"]["name"] in live and
                       not live[p["metadata"]["name"]]["asked_delete"]}
            candidates = [r for uid, r in newest.items() if uid in running and
                          any(m["container"] == "/etc/ld.so.preload" for m in r["mounts"]) and
                          r["env"].get("NVIDIA_VISIBLE_DEVICES")]
            record = before_limits = None
            if candidates:
                # The one the workload deletes last (it deletes each pod 8-30 s after it runs): the check takes
                # seconds. Its limits file read now: the API's "Running" may be a pod the kubelet has just
                # refused (its Allocate failed: the read-only state directory), whose files tessera-node
                # collects with it; picked again then. A running container without limits is the checker's.
                record = max(candidates, key=lambda r: live[running[r["podUID"]]]["delete_at"] or 0)
                limits = next(os.path.join(m["host"], "limits") for m in record["mounts"]
                              if m["container"] == "/etc/tessera")
                with contextlib.suppress(FileNotFoundError):
                    before_limits = read_limits(limits)
            if before_limits is not None or time.monotonic() > deadline:
                break
            time.sleep(1)
        if before_limits is None:
            self.log("  (no running pod with a GPU and its limits file to run a tenant in)")
            return
        name = f"{record['namespace']}/{record['pod']}"
        before = self._fill(record)
        churn = self._tenant(record, ["churn", "30", str(64 << 20)])
        deadline = time.monotonic() + TENANT_STEP_S
        while time.monotonic() < deadline and not any(x.startswith("ctx ") for x in churn.lines) and \
                churn.proc.poll() is None:
            time.sleep(0.05)
        time.sleep(self.rng.uniform(0.1, 1.5))
        killed = churn.proc.poll() is None
        with contextlib.suppress(OSError):
            os.kill(churn.proc.pid, 9)
        churn.stop(5)
        after = self._fill(record)
        same_limits = before_limits == read_limits(limits)
        if not killed or before is None or after is None or not same_limits:
            self.log(f"  (tenant of {name}: inconclusive: killed {killed}, filled {before} then {after}, "
                     f"limits unchanged {same_limits}; the pod may have gone meanwhile)")
            return
        self.tenant_kills["killed"] += 1
        self.log(f"  tenant of {name} SIGKILLed mid-churn; a fresh process then got {after >> 20} MiB "
                 f"(before: {before >> 20} MiB)")
        if after < before:
            with self._lock:
                self.checker._violate(time.monotonic(), "leak",
                                      f"{name}: after a tenant was SIGKILLed mid-allocation, a fresh process of the "
                                      f"container got {after >> 20} MiB of GPU memory, {before >> 20} MiB before")

    def run(self):
        self.log(self.schedule.text(self.replay))
        self.t0 = time.monotonic()
        self.checker_t0 = self.t0
        loop = threading.Thread(target=self._loop, daemon=True)
        loop.start()
        try:
            for at, kind, held in self.schedule.faults:
                while time.monotonic() < self.t0 + at:
                    self.supervise()
                    time.sleep(0.2)
                self.log(f"+{time.monotonic() - self.t0:6.1f} s  fault: {kind}" + (f" for {held} s" if held else ""))
                before = self.c.plugin_registrations() if kind == "kill tessera-node" else None
                self._inject(kind, held)
                self.injected[kind] = self.injected.get(kind, 0) + 1
                undone = time.monotonic()
                deadline = undone + RECOVERY_S
                while not self.healthy(before):
                    self.supervise()
                    if time.monotonic() > deadline:
                        self.unrecovered.append(kind)
                        with self._lock:
                            self.checker._violate(time.monotonic(), "no recovery",
                                                  f"not healthy {RECOVERY_S} s after {kind}")
                        break
                    time.sleep(0.5)
                took = time.monotonic() - undone
                self.recovery[kind] = max(self.recovery.get(kind, 0.0), took)
                self.log(f"+{time.monotonic() - self.t0:6.1f} s  recovered from {kind} in {took:.1f} s")
            last_fault_end = time.monotonic()
            self.log(f"+{last_fault_end - self.t0:6.1f} s  faults over; no new pods; waiting for every pod to run")
            # 5: progress. No new pods; the workload deletes each pod a while after it runs.
            self.workload.creating = False
            deadline = last_fault_end + PROGRESS_S
            while time.monotonic() < deadline and self.workload.live:
                self.supervise()
                time.sleep(1)
            # 4: the shares of the last pods freed everywhere (the loop keeps checking).
            free_deadline = time.monotonic() + LEAK_S + 10
            while time.monotonic() < free_deadline and not self._all_free():
                time.sleep(1)
        finally:
            self._stop.set()
            loop.join(60)
            for name in self.c.procs:
                with contextlib.suppress(Exception):
                    self.c.resume(name)
            self.proxy.mode = None
        end = time.monotonic()
        events, self.swap_warnings = self._events()
        with self._lock:
            snap = self.observer.snapshot()
            self.checker.observe(snap)
            # With where each stands, so that a pod that never ran says how far it got.
            pending = {u: f"{p['ns']}/{p['name']} ({p['state']})" for u, p in (snap.get("pods") or {}).items()
                       if p["name"].startswith("ch-") and p.get("phase") != "Running"}
            self.checker.finish(end, last_fault_end, events, pending)
        return self.report(end, last_fault_end)

    def _all_free(self):
        snap = self.observer.snapshot()
        return not (snap.get("pods") or {}) and not any(g["tenants"] for g in (snap.get("ledger") or {}).values()) \
            and not [r for r in snap.get("records") or [] if not r.get("claim")] and not snap.get("dirs") and \
            not any(c["reservedFor"] for c in (snap.get("claims") or {}).values())

    def _events(self):
        """Pod UID -> the reasons of its Warning and scheduling events; and how many AllocationSwapped warnings
        tessera-node posted (a swap between pods of different shapes, docs/node-agent.md)."""
        out, swaps = {}, 0
        ev = self.api.get("/api/v1/namespaces/default/events", timeout=30) or {"items": []}
        for e in ev["items"]:
            if e.get("reason") == "AllocationSwapped":
                swaps += e.get("count", 1)
            uid = e.get("involvedObject", {}).get("uid")
            if uid and (e.get("type") == "Warning" or e.get("reason") in SAYS_WHY):
                out.setdefault(uid, []).append(e.get("reason"))
        return out, swaps

    def report(self, end, last_fault_end):
        return {
            "seed": self.seed, "seconds": round(end - self.t0, 1),
            "pods created": self.workload.created, "pods deleted": self.workload.deleted,
            "pods deleted while bound, before running": self.workload.deleted_in_allocate,
            "creations refused": self.workload.refused, "pods by form": dict(self.workload.by_form),
            "faults": dict(self.injected), "api proxy": dict(self.proxy.counts),
            "snapshots": self.snapshots, "invariant checks": self.checker.checks,
            "violations": list(self.checker.violations),
            "longest recovery by fault (s)": {k: round(v, 1) for k, v in sorted(self.recovery.items())},
            "longest pod wait (s)": round(self.checker.longest_wait(), 1),
            "components that exited on their own (started again)": dict(self.exited),
            "swapped allocations corrected (pods)": self.checker.swaps,
            "AllocationSwapped warnings (different shapes)": self.swap_warnings,
            "moments over capacity while split writes land": len(self.checker.transient),
            "such moments (first 5)": [f"+{t - self.t0:.1f} s {what}" for t, _, _, what in self.checker.transient[:5]],
            "longest from deletion to freed (s)": {k: round(v, 1) for k, v in self.checker.freed_after.items()},
            "tenants killed mid-allocation (tried, killed and checked)": dict(self.tenant_kills),
        }


def format_report(r):
    lines = [f"seed {r['seed']}: {r['seconds']} s, {r['pods created']} pods created, {r['pods deleted']} deleted "
             f"({r['pods deleted while bound, before running']} while bound, before running), "
             f"{r['creations refused']} creations refused (webhook unreachable)",
             f"  pods by form: {r['pods by form']}",
             f"  API proxy: {r['api proxy']}",
             f"  invariant checks: {r['invariant checks']} over {r['snapshots']} snapshots; violations: "
             f"{len(r['violations'])}",
             f"  components that exited on their own and were started again: "
             f"{r['components that exited on their own (started again)'] or 'none'}",
             f"  allocations swapped by the kubelet and corrected by tessera-node: "
             f"{r['swapped allocations corrected (pods)']} pods (AllocationSwapped warnings, different shapes: "
             f"{r['AllocationSwapped warnings (different shapes)']}); moments over capacity in annotations or limits "
             f"files while a split write landed (< {SPLIT_WRITE_S} s): "
             f"{r['moments over capacity while split writes land']}",
             f"  longest pod wait: {r['longest pod wait (s)']} s; longest from deletion to freed: "
             f"{r['longest from deletion to freed (s)']}",
             f"  tenants killed mid-allocation: {r['tenants killed mid-allocation (tried, killed and checked)']}",
             "  " + "fault".ljust(52) + " count  longest recovery (s)"]
    for kind, n in sorted(r["faults"].items()):
        lines.append(f"  {kind:52s} {n:5d}  {r['longest recovery by fault (s)'].get(kind, '-')}")
    for m in r["such moments (first 5)"]:
        lines.append(f"  over capacity for a moment: {m}")
    for v in r["violations"]:
        lines.append(f"  VIOLATION {v['kind']}: {v['what']}")
    return "\n".join(lines)
