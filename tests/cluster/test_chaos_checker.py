"""The chaos checker (tests/cluster/chaos.py) can fail: fed histories that break each of Tessera's guarantees
(docs/faults.md), it reports each; fed a clean history, nothing. Pure Python, no cluster (ctest `chaos_checker`);
the harness's read-only mount of the state directory is tested here too (as root).

The GPUs' figures are the harness's fake V100s (examples/fake-gpus/two-socket-8gpu.yaml: 32,768 MiB each)."""

import copy
import errno
import os
import subprocess
import threading

import pytest

import chaos
from chaos import Checker

A, B = "GPU-a", "GPU-b"
CAPACITY = {A: {"cores": 100, "memoryMiB": 32768}, B: {"cores": 100, "memoryMiB": 32768}}


def assignment(*vgpus):
    return {"containers": [{"name": "main", "vgpus": [
        {"uuid": u, "cores": c, "milliCores": int(c * 10), "memoryMiB": m} for u, c, m in vgpus]}]}


def pod(name, *vgpus, phase="Running", node="gpu-node-0", claims=()):
    return {"ns": "default", "name": name, "node": node, "phase": phase,
            "assignment": assignment(*vgpus) if vgpus else None, "claims": list(claims), "created": None}


def container(uid, limits=True, cdi=False):
    rec = {"podUID": uid, "container": "main", "env": {}, "mounts": [], "cdiDevices": []}
    if limits:
        rec["env"]["TESSERA_LIMITS_FILE"] = "/etc/tessera/limits"
        rec["mounts"].append({"container": "/etc/tessera", "host": f"/state/containers/{uid}/main", "readonly": True})
    if cdi:
        rec["cdiDevices"] = ["tessera.dev/claim=c1"]
    return rec


def record(uid, *vgpus, confirmed=True, claim=None):
    return {"podUID": uid, "container": "main", "claim": claim, "confirmed": confirmed, "deviceIDs": [],
            "vgpus": [{"uuid": u} for u, _, _ in vgpus],
            "limits": {u: {"memory": m << 20, "milli": int(c * 10)} for u, c, m in vgpus}}


def snap(t, pods, ledger=None, claims=None, records=None, containers=None, leaders=None):
    """A consistent snapshot: the ledger, records and containers follow the pods unless given."""
    if ledger is None:
        ledger = {A: {"cores": 0.0, "memoryMiB": 0, "tenants": []}, B: {"cores": 0.0, "memoryMiB": 0, "tenants": []}}
        for uid, p in pods.items():
            for v in (p["assignment"] or {"containers": []})["containers"][0]["vgpus"] if p["assignment"] else []:
                g = ledger[v["uuid"]]
                g["cores"] += v["cores"]
                g["memoryMiB"] += v["memoryMiB"]
                g["tenants"].append(uid)
    if records is None:
        records = [{"podUID": uid, "container": "main", "claim": None, "confirmed": True, "deviceIDs": [],
                    "vgpus": p["assignment"]["containers"][0]["vgpus"],
                    "limits": {v["uuid"]: {"memory": v["memoryMiB"] << 20, "milli": v["milliCores"]}
                               for v in p["assignment"]["containers"][0]["vgpus"]}}
                   for uid, p in pods.items() if p["assignment"]]
    if containers is None:
        containers = {uid: container(uid) for uid, p in pods.items() if p["phase"] == "Running"}
    dirs = {uid for uid, p in pods.items() if p["assignment"]}
    return {"t": t, "capacity": CAPACITY, "devices": {"gpu-0": A, "gpu-1": B}, "pods": pods, "ledger": ledger,
            "dirs": dirs,
            "claims": claims if claims is not None else {}, "records": records, "containers": containers,
            "leaders": leaders if leaders is not None else {"r1": True, "r2": False}}


def kinds(violations):
    return sorted({v["kind"] for v in violations})


def clean_history():
    pods = {"u1": pod("p1", (A, 60, 4096)), "u2": pod("p2", (A, 40, 4096)), "u3": pod("p3", (B, 100, 32768))}
    yield snap(0, pods)
    yield snap(10, pods)
    # p2 deleted; its share is gone everywhere by the next look.
    del pods["u2"]
    yield snap(20, pods)
    # a high-priority pod compresses p1 from 60 to 40: the annotations first; p1's limits file is rewritten
    # before p4's container is created with its own (a lag, within LIMITS_LAG_S).
    pods["u4"] = pod("p4", (A, 60, 2048), phase="Pending")
    pods["u1"] = pod("p1", (A, 40, 4096))
    s = snap(30, pods)
    s["records"] = [r for r in s["records"] if r["podUID"] == "u1"]
    s["records"][0]["limits"][A]["milli"] = 600
    yield s
    pods["u4"]["phase"] = "Running"
    yield snap(40, pods)
    yield snap(50, {}, leaders={"r1": None, "r2": True})  # r1 paused: no answer; r2 leads


def test_a_clean_history_breaks_nothing():
    c = Checker()
    for s in clean_history():
        c.observe(s)
    c.finish(60, 50, {}, {})
    assert c.violations == [] and c.checks > 20, c.violations


def test_an_over_committed_gpu_is_reported_in_each_place():
    for place in ("scheduler ledger", "pod annotations", "ResourceClaim allocations", "limits files"):
        pods = {"u1": pod("p1", (A, 60, 4096)), "u2": pod("p2", (A, 30, 4096))}
        s = snap(0, pods)
        if place == "scheduler ledger":
            s["ledger"][A]["cores"] = 110.0
        elif place == "pod annotations":
            pods["u2"]["assignment"] = assignment((A, 50, 4096))
            s["ledger"] = None  # only the annotations say it
            s["records"] = None
        elif place == "ResourceClaim allocations":
            s["claims"] = {"c1": {"name": "x", "results": [("gpu-1", 70.0, 4096), ("gpu-1", 40.0, 30000)],
                                  "reservedFor": []}}
        else:
            s["records"][1]["limits"][A]["memory"] = 30000 << 20
        c = Checker()
        got = c.observe(s)
        if place in ("pod annotations", "limits files"):
            # Written by more than one patch or file: over capacity for a moment is counted, not yet a violation...
            assert got == [] and len(c.transient) == 1, (place, got)
            later = copy.deepcopy(s)
            later["t"] = chaos.SPLIT_WRITE_S + 1
            got = c.observe(later)
            # ...and is one once it lasts.
        assert kinds(got) == ["over-committed GPU"] and place in got[0]["what"], (place, got)
        assert "p2" in got[0]["what"] or place != "pod annotations", got


def test_a_container_without_limits_is_reported():
    pods = {"u1": pod("p1", (A, 30, 4096))}
    s = snap(0, pods, containers={"u1": container("u1", limits=False)})
    assert kinds(Checker().observe(s)) == ["container without limits"]
    # A claim's container without its CDI device.
    pods = {"u2": pod("p2", claims=["c1"])}
    s = snap(0, pods, containers={"u2": container("u2", limits=False)},
             records=[record("u2", (B, 30, 4096), claim="c1")])
    assert kinds(Checker().observe(s)) == ["container without limits"]


def test_limits_that_stay_wrong_are_reported_after_the_lag():
    c = Checker()
    pods = {"u1": pod("p1", (A, 30, 4096))}
    for t in (0, chaos.LIMITS_LAG_S / 2, chaos.LIMITS_LAG_S + 1):
        s = snap(t, pods)
        s["records"][0]["limits"][A]["milli"] = 800
        got = c.observe(s)
    assert kinds(got) == ["limits differ from the assignment"], got
    assert len(c.violations) == 1


def test_a_lost_tenant_is_reported():
    c = Checker()
    pods = {"u1": pod("p1", (A, 30, 4096))}
    # The agent restarted and has no record of a running container, for longer than the bound.
    for t in (0, chaos.RECORD_LAG_S + 1):
        got = c.observe(snap(t, pods, records=[]))
    assert "tenant lost" in kinds(got), got
    # A record pod-resources never confirms.
    c = Checker()
    for t in (0, chaos.RECORD_LAG_S + 1):
        got = c.observe(snap(t, pods, records=[record("u1", (A, 30, 4096), confirmed=False)]))
    assert kinds(got) == ["tenant lost"], got


def test_a_pod_bound_twice_is_reported():
    c = Checker()
    c.observe(snap(0, {"u1": pod("p1", (A, 30, 4096))}))
    got = c.observe(snap(5, {"u1": pod("p1", (B, 30, 4096))}))
    assert kinds(got) == ["pod bound twice"], got
    # The same change, when tessera-node says it corrected a swapped allocation of that pod, is counted instead.
    c = Checker()
    c.observe(snap(0, {"u1": pod("p1", (A, 30, 4096))}))
    later = snap(5, {"u1": pod("p1", (B, 30, 4096))})
    later["swapped"] = {"u1"}
    assert c.observe(later) == [] and c.swaps == 1
    c = Checker()
    c.observe(snap(0, {"u1": pod("p1", (A, 30, 4096))}))
    got = c.observe(snap(5, {"u1": pod("p1", (A, 30, 4096), node="gpu-node-1")}))
    assert kinds(got) == ["pod bound twice"], got


def test_two_leaders_are_reported():
    got = Checker().observe(snap(0, {}, leaders={"r1": True, "r2": True}))
    assert kinds(got) == ["two leaders"], got


def test_a_leak_is_reported_after_the_bound():
    c = Checker()
    pods = {"u1": pod("p1", (A, 30, 4096))}
    held = snap(0, pods)
    c.observe(held)
    # The pod is gone from the API server; the ledger and the agent still hold it.
    for t in (1, chaos.LEAK_S + 2):
        s = copy.deepcopy(held)
        s["t"], s["pods"], s["containers"] = t, {}, {}
        got = c.observe(s)
    assert kinds(got) == ["leak"] and {v["what"].split("in the ")[1] for v in got} == {
        "scheduler ledger", "agent records", "agent's directories"}, got


def test_no_progress_and_no_reason_are_reported():
    c = Checker()
    c.observe(snap(0, {"u1": pod("p1", phase="Pending", node=None)}))
    c.observe(snap(100, {"u1": pod("p1", phase="Pending", node=None)}))
    got = c.finish(400, 100, {}, {"u1": "default/p1"})
    assert kinds(got) == ["no progress", "pending without a reason"], got
    # With its event, only the lack of progress remains.
    c = Checker()
    c.observe(snap(0, {"u1": pod("p1", phase="Pending", node=None)}))
    got = c.finish(400, 100, {"u1": ["FailedScheduling"]}, {"u1": "default/p1"})
    assert kinds(got) == ["no progress"], got


def test_the_schedule_is_the_seeds_and_covers_every_kind():
    a, b = chaos.FaultSchedule(7, 3600), chaos.FaultSchedule(7, 3600)
    assert a.faults == b.faults and a.faults != chaos.FaultSchedule(8, 3600).faults
    assert {k for _, k, _ in a.faults} == set(chaos.fault_kinds())
    assert "--seeds 7" in a.text()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting needs root (the cluster tier runs as root)")
def test_the_state_dir_goes_read_only_while_it_is_being_written(tmp_path):
    """The "state dir read-only" fault takes even while files are opened for writing in the directory all the time
    (tessera-node's state directory; CI: `mount -o remount,bind,ro` refused with EBUSY, exit 32, when a writer
    opened a file through the fresh bind first), and is undone while a file opened during it is still open."""
    d = str(tmp_path)
    with open(os.path.join(d, "busy"), "w") as f:  # there before the first mount: read during each
        f.write("x")
    stop = threading.Event()

    def write():
        while not stop.is_set():
            try:
                with open(os.path.join(d, "busy"), "w") as f:
                    f.write("x")
            except OSError:
                pass

    writer = threading.Thread(target=write)
    writer.start()
    try:
        for _ in range(20):
            chaos.mount_read_only(d)
            try:
                with pytest.raises(OSError) as e:
                    open(os.path.join(d, "new"), "w")
                assert e.value.errno == errno.EROFS
                held = open(os.path.join(d, "busy"))  # read through the read-only mount, open past the fault
            finally:
                subprocess.run(["umount", "--lazy", d], check=True)
            held.close()
    finally:
        stop.set()
        writer.join()
    with open(os.path.join(d, "new"), "w") as f:
        f.write("writable again")
