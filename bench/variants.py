#!/usr/bin/env python3
"""Tessera against FGD on variants of the Alibaba trace that no policy was tuned on.

bench/quality.py measures the shared traces as they are; a policy could be fitted to them. This script derives
new clusters and workloads from the default trace, each changing one thing an operator's cluster may differ in,
and compares `tessera` with `fgd` (the baseline, measured in the same run) on each:

  all-nodes       the trace's full node list, CPU-only nodes included
  half-cluster    every other GPU node
  cpu-light       every pod's CPU and memory halved
  cpu-heavy       every pod's CPU and memory x1.5
  host-poor       every node's CPU and memory halved
  odd-shares      every GPU share drawn anew, uniform in 50-950 thousandths
  more-whole      a third of the shares turned into one whole GPU
  big-pods        a tenth of the 1-GPU pods turned into 4-GPU pods with 4x the CPU and memory

and, added after the policy's last change and run once without tuning anything to them (held out):

  host-rich       every node's CPU and memory doubled
  memory-heavy    every pod's memory doubled, its CPU as it was
  more-cpu-pods   every pod without GPU twice
  split-nodes     every 8-GPU node split into two 4-GPU nodes, each with half its CPU and memory
  constrained     a fifth of the GPU pods limited to one or two GPU models drawn from the cluster's

Prints, per variant, unallocated GPU % at 100% arrived (mean of the seeds) for both and the ratio fgd/tessera
(above 1: tessera leaves less unallocated), and exits non-zero when tessera loses on any variant.

    ./scripts/build && bench/variants.py [--traces DIR] [--seeds 42-46] [--only cpu-heavy,odd-shares]

Needs ../shared/traces/alibaba-gpu-v2023 (or --traces). Takes about 3 minutes on 2 cores.
"""
import argparse
import csv
import io
import json
import os
import random
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESSERA = os.path.join(ROOT, "build", "bin", "tessera")


def read(path):
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return rows


def write(path, rows):
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=list(rows[0].keys()), lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    with open(path, "w") as f:
        f.write(out.getvalue())


def scaled(rows, factor, fields):
    out = []
    for r in rows:
        r = dict(r)
        for f in fields:
            r[f] = str(max(1, int(int(r[f]) * factor)))
        out.append(r)
    return out


def variants(traces):
    """Yields (name, nodes rows, pods rows); randomness is seeded, so the variants are the same every run."""
    gpu_nodes = read(os.path.join(traces, "openb_node_list_gpu_node.csv"))
    all_nodes = read(os.path.join(traces, "openb_node_list_all_node.csv"))
    pods = read(os.path.join(traces, "openb_pod_list_default.csv"))
    rng = random.Random(2023)

    yield "all-nodes", all_nodes, pods
    yield "half-cluster", gpu_nodes[::2], pods
    yield "cpu-light", gpu_nodes, scaled(pods, 0.5, ["cpu_milli", "memory_mib"])
    yield "cpu-heavy", gpu_nodes, scaled(pods, 1.5, ["cpu_milli", "memory_mib"])
    yield "host-poor", scaled(gpu_nodes, 0.5, ["cpu_milli", "memory_mib"]), pods

    odd = []
    for p in pods:
        p = dict(p)
        if int(p["num_gpu"]) == 1 and int(p["gpu_milli"]) < 1000:
            p["gpu_milli"] = str(rng.randint(50, 950))
        odd.append(p)
    yield "odd-shares", gpu_nodes, odd

    whole = []
    for p in pods:
        p = dict(p)
        if int(p["num_gpu"]) == 1 and int(p["gpu_milli"]) < 1000 and rng.random() < 1 / 3:
            p["gpu_milli"] = "1000"
        whole.append(p)
    yield "more-whole", gpu_nodes, whole

    big = []
    for p in pods:
        p = dict(p)
        if int(p["num_gpu"]) == 1 and int(p["gpu_milli"]) == 1000 and rng.random() < 0.1:
            p["num_gpu"] = "4"
            p["cpu_milli"] = str(4 * int(p["cpu_milli"]))
            p["memory_mib"] = str(4 * int(p["memory_mib"]))
        big.append(p)
    yield "big-pods", gpu_nodes, big

    # Held out.
    yield "host-rich", scaled(gpu_nodes, 2, ["cpu_milli", "memory_mib"]), pods
    yield "memory-heavy", gpu_nodes, scaled(pods, 2, ["memory_mib"])
    yield "more-cpu-pods", gpu_nodes, pods + [dict(p, name=p["name"] + "-again") for p in pods
                                              if int(p["num_gpu"]) == 0]
    split = []
    for n in gpu_nodes:
        if int(n["gpu"]) != 8:
            split.append(n)
            continue
        for half in ("a", "b"):
            split.append(dict(n, sn=n["sn"] + half, gpu="4", cpu_milli=str(int(n["cpu_milli"]) // 2),
                              memory_mib=str(int(n["memory_mib"]) // 2)))
    yield "split-nodes", split, pods
    models = sorted({n["model"] for n in gpu_nodes})
    constrained = []
    for p in pods:
        p = dict(p)
        if int(p["num_gpu"]) > 0 and not p["gpu_spec"] and rng.random() < 0.2:
            p["gpu_spec"] = "|".join(sorted(rng.sample(models, rng.choice([1, 2]))))
        constrained.append(p)
    yield "constrained", gpu_nodes, constrained


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--traces", default=os.path.join(ROOT, "..", "shared", "traces", "alibaba-gpu-v2023"))
    ap.add_argument("--seeds", default="42-46")
    ap.add_argument("--only", default="", help="comma-separated variants (default: all)")
    args = ap.parse_args()
    if not os.path.exists(TESSERA):
        sys.exit(f"{TESSERA} is missing: run ./scripts/build first")
    if not os.path.isdir(args.traces):
        sys.exit(f"{args.traces} is missing: give the trace folder with --traces")

    wanted = set(filter(None, args.only.split(",")))
    print("| variant | GPUs | tessera @100% | fgd @100% | fgd/tessera |")
    print("|---|---:|---:|---:|---:|")
    lost = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, nodes, pods in variants(args.traces):
            if wanted and name not in wanted:
                continue
            print(f"{name} ...", file=sys.stderr, flush=True)
            nodes_csv, pods_csv = os.path.join(tmp, "nodes.csv"), os.path.join(tmp, "pods.csv")
            write(nodes_csv, nodes)
            write(pods_csv, pods)
            out = subprocess.run([TESSERA, "simulate", "--nodes", nodes_csv, "--pods", pods_csv, "--policies",
                                  "tessera,fgd", "--seeds", args.seeds, "--json"],
                                 check=True, capture_output=True, text=True).stdout
            result = json.loads(out)["policies"]
            t, f = result["tessera"]["unallocated_pct_at_100"], result["fgd"]["unallocated_pct_at_100"]
            gpus = sum(int(n["gpu"]) for n in nodes)
            print(f"| {name} | {gpus} | {t:.2f} | {f:.2f} | {f / t if t > 0 else float('inf'):.2f} |", flush=True)
            if not t < f:
                lost.append(name)
    print(f"\ntessera below fgd on every variant (seeds {args.seeds}): {'yes' if not lost else 'NO: ' + ', '.join(lost)}")
    return 1 if lost else 0


if __name__ == "__main__":
    sys.exit(main())
