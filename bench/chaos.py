#!/usr/bin/env python3
"""Faults on the real control plane, long runs (docs/faults.md): for each seed, a cluster of the cluster tier
(tests/cluster/cluster.py: real etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubelet with
cri-fake, tessera-node, two tessera-scheduler replicas), the workload and fault schedule of tests/cluster/chaos.py
for the minutes asked, then the drain: no new pods, every pod must run and be deleted, every share freed.

    scripts/k8s-components && scripts/build default tessera-node tessera-scheduler tessera
    flock /tmp/tessera-cluster.lock bench/chaos.py --seeds 1-3 --minutes 10
    flock /tmp/tessera-cluster.lock bench/chaos.py --seeds 17              # replay the seed a failure printed

It prints the fault schedule before each run and each fault as it happens, then per seed: pods created and
deleted, faults injected by kind with the longest time the cluster took to be healthy again after each, the
invariant checks made and every violation, the longest a pod waited; then one table over all seeds (--markdown:
as docs/faults.md shows it). Exit 1 when any guarantee was violated; a seed with violations keeps its
cluster's logs and etcd data (the path is printed), and a pod that never ran is named with where it stood.
Not run by the test suite (the cluster tier's test_chaos.py is its short run); needs root (the kubelet, the
read-only bind mount), and runs one at a time per machine (the kubelet's paths are fixed): hold
/tmp/tessera-cluster.lock.
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(SOURCE, "tests", "cluster"))
import chaos  # noqa: E402


def seeds(text):
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def one(seed, minutes, build, log):
    proxy = chaos.ApiFaultProxy(seed)
    with chaos.chaos_cluster(SOURCE, build, proxy) as c:
        try:
            chaos.prepare(c, SOURCE)
            report = chaos.ChaosRun(c, proxy, seed, minutes * 60, log=log).run()
        finally:
            proxy.close()
        if report["violations"]:
            c.keep = True  # the components' logs and etcd's data, to find the violations' causes
            log(f"seed {seed}: violations; the cluster's logs and data are kept in {c.work}")
        return report


def table(reports):
    faults, recovery = {}, {}
    for r in reports:
        for k, n in r["faults"].items():
            faults[k] = faults.get(k, 0) + n
        for k, s in r["longest recovery by fault (s)"].items():
            recovery[k] = max(recovery.get(k, 0.0), s)
    lines = ["| fault | injected | longest recovery (s) |", "|---|---:|---:|"]
    for k in sorted(faults):
        lines.append(f"| {k} | {faults[k]} | {recovery.get(k, '-')} |")
    total = lambda key: sum(r[key] for r in reports)  # noqa: E731
    counts = {}
    for r in reports:
        for k, n in r["components that exited on their own (started again)"].items():
            counts[k] = counts.get(k, 0) + n
    exited = ", ".join(f"{k} {n}" for k, n in sorted(counts.items()))
    freed = {}
    for r in reports:
        for k, s in r["longest from deletion to freed (s)"].items():
            freed[k] = max(freed.get(k, 0.0), s)
    lines += ["", "| | |", "|---|---:|",
              f"| seeds | {', '.join(str(r['seed']) for r in reports)} |",
              f"| length (s, faults and drain) | {sum(r['seconds'] for r in reports):.0f} |",
              f"| pods created / deleted | {total('pods created')} / {total('pods deleted')} |",
              f"| of them deleted while bound, before running | "
              f"{total('pods deleted while bound, before running')} |",
              f"| creations refused (webhook unreachable; retried) | {total('creations refused')} |",
              f"| invariant checks | {total('invariant checks')} |",
              f"| components that exited on their own, started again (as their Deployment would) | "
              f"{exited or 'none'} |",
              f"| pods whose allocation the kubelet swapped, corrected by tessera-node | "
              f"{total('swapped allocations corrected (pods)')} |",
              f"| of them between pods of different shapes (AllocationSwapped warnings) | "
              f"{total('AllocationSwapped warnings (different shapes)')} |",
              f"| moments a GPU showed over capacity in annotations or limits files while a split write landed "
              f"(< {chaos.SPLIT_WRITE_S} s, not violations) | {total('moments over capacity while split writes land')} |",
              f"| violations | {sum(len(r['violations']) for r in reports)} |",
              f"| longest pod wait, creation to running (s) | {max(r['longest pod wait (s)'] for r in reports)} |",
              f"| tenant processes SIGKILLed mid-allocation, checked (a fresh process of the container got as "
              f"much GPU memory as before) | {sum(r.get('tenants killed mid-allocation (tried, killed and checked)', {}).get('killed', 0) for r in reports)} |",
              f"| longest from deletion to freed (s) | "
              f"{', '.join(f'{k} {v}' for k, v in sorted(freed.items()))} |"]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1", help="seeds, e.g. 1-3 or 4,9 (default 1)")
    ap.add_argument("--minutes", type=float, default=10, help="minutes of faults per seed (default 10)")
    ap.add_argument("--build", default=os.environ.get("TESSERA_BINARY_DIR", os.path.join(SOURCE, "build")),
                    help="the build directory with bin/tessera-node and bin/tessera-scheduler (default build/)")
    ap.add_argument("--json", help="also write the reports to this file")
    ap.add_argument("--markdown", action="store_true", help="print the table as docs/faults.md shows it")
    args = ap.parse_args()
    if args.minutes <= 0:
        ap.error("--minutes must be above 0")
    try:
        chosen = seeds(args.seeds)
    except ValueError:
        ap.error(f"--seeds {args.seeds!r}: give numbers, ranges or both, e.g. 1-3,7")
    reports = []
    for seed in chosen:
        r = one(seed, args.minutes, args.build, lambda line: print(line, flush=True))
        reports.append(r)
        if args.json:  # after each seed, so a later failure keeps the earlier reports
            with open(args.json, "w") as f:
                json.dump(reports, f, indent=1)
        print(chaos.format_report(r), flush=True)
    print(table(reports) if args.markdown else "\n".join(chaos.format_report(r) for r in reports))
    bad = sum(len(r["violations"]) for r in reports)
    if bad:
        print(f"{bad} violations; replay one seed with: bench/chaos.py --seeds N --minutes {args.minutes:g}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
