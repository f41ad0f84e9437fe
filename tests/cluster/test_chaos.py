"""Faults on the real control plane, a short run (docs/faults.md): the workload of tests/cluster/chaos.py (pods of
every form created and deleted at a steady rate) while a schedule drawn from one seed kills, pauses and restarts
the components, makes the API slow or failing for Tessera's components, makes the node agent's state directory
read-only and deletes pods while the kubelet allocates them; the checker watches Tessera's guarantees all along
and at the end. Longer runs: bench/chaos.py. A failure prints the seed: `bench/chaos.py --seeds N` replays it.

TESSERA_CHAOS_SEED and TESSERA_CHAOS_SECONDS change the seed and the length of the faults (default 1 and 120:
seed 1's schedule holds every kind of fault in 120 s, each held 0.4 times as long as bench/chaos.py holds it, with
1-3 s between one fault undone and the next)."""

import os

import chaos
import test_cluster as tc

SEED = int(os.environ.get("TESSERA_CHAOS_SEED", "1"))
SECONDS = float(os.environ.get("TESSERA_CHAOS_SECONDS", "120"))
GAP, HOLD = (1, 3), 0.4
REPLAY = f"TESSERA_CHAOS_SEED={SEED} TESSERA_CHAOS_SECONDS={SECONDS:g} pytest tests/cluster/test_chaos.py"


def test_faults_break_no_guarantee():
    proxy = chaos.ApiFaultProxy(SEED)
    with chaos.chaos_cluster(tc.SOURCE, tc.BUILD, proxy) as c:
        try:
            chaos.prepare(c, tc.SOURCE)
            run = chaos.ChaosRun(c, proxy, SEED, SECONDS, gap=GAP, hold=HOLD, replay=REPLAY)
            report = run.run()
        finally:
            proxy.close()
        print(chaos.format_report(report))
        assert report["pods created"] > 0 and report["invariant checks"] > 0, report
        # Every kind of fault was injected (the schedule's pool gives each once before any repeats).
        assert set(report["faults"]) == set(chaos.fault_kinds()), report["faults"]
        assert report["tenants killed mid-allocation (tried, killed and checked)"]["killed"] >= 1, report
        assert not report["violations"], (
            f"seed {SEED}: {len(report['violations'])} violations (replay: {REPLAY})\n" + chaos.format_report(report))
