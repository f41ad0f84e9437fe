#!/usr/bin/env python3
"""The operators' page at scale: GET /ui/data's time and size, and the page's render time in headless Chromium.

A standalone tessera-scheduler gets a cluster of NODES nodes x 8 GPUs (A100 80 GB) from a cluster file, and
pods placed through its extender verbs (filter over the chosen node, then bind, as kube-scheduler sends them) until
about half the GPUs' compute is held: shares of 10-70% and whole GPUs, in four namespaces, some high priority,
some elastic. Then, in the same run:
  - data endpoint: GET /ui/data and, as the baseline, GET /inspect (the same cluster as the scheduler's JSON of
    `tessera inspect`), REPEAT times each, alternating; the median time and the size of each, and their ratios;
  - render: the page opened in headless Chromium (chromium + chromedriver, python3-selenium); the time of its
    first render (performance.now() around building the page from the parsed data, as the page measures it), the
    fetch and parse before it, and a later refresh with one pod more (only the nodes that changed are drawn again).

  bench/page_bench.py                 # 5,000 nodes x 8 GPUs (about 2 minutes on 2 cores, most of it placing pods)
  bench/page_bench.py --quick         # 100 nodes: checks the answers only (ctest label bench)

Fails (exit 1, a FAILED line) when the data disagrees with what was placed: GPUs and nodes counted, every pod
placed drawn once per GPU it holds with its share, compute held adding up; or when the page draws another number
of GPUs than the cluster has. The full run also fails when GET /ui/data takes longer than /inspect (ratio > 1) or
the first render takes over 5 s; quick mode never judges a time. Without Chromium the render part is skipped
(quick mode) or fails (full run).
"""
import argparse
import json
import os
import random
import statistics
import sys
import time

SOURCE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(SOURCE, "tests", "browser"))
import page_harness as h  # noqa: E402

SHARES = [100, 200, 250, 300, 500, 700, 1000]  # thousandths of a GPU; 1000: a whole GPU
NAMESPACES = ["research", "inference", "batch", "dev"]


def cluster(nodes):
    return {"apiVersion": "tessera.dev/v1", "kind": "Cluster",
            "nodes": [{"name": "node", "replicas": nodes, "cpuMilli": 256000, "memoryMiB": 1048576,
                       "gpus": {"model": "A100-SXM4-80GB", "count": 8, "memoryMiB": 81920}}]}


def place_pods(s, nodes, rng):
    """Fills the cluster to about half its compute; returns {pod name: compute asked, in thousandths}."""
    target = nodes * 8 * 1000 // 2
    held = 0
    placed = {}
    k = 0
    tries = 0
    while held < target:
        tries += 1
        if tries > 20 * target // 100:
            h.fail(f"could place only {held} of {target} thousandths of GPU")
        share = rng.choice(SHARES)
        node = f"node-{rng.randrange(nodes)}"
        ns = NAMESPACES[k % len(NAMESPACES)]
        ann = {}
        if k % 7 == 0:
            ann["tessera.dev/priority"] = "high"
        if k % 5 == 0:
            ann["tessera.dev/compute-policy"] = "elastic"
        name = f"p{k}"
        p = h.pod(ns, name, f"uid-{k}", share // 10, share * 80, ann)
        if s.filter(p, [node])["NodeNames"] != [node]:
            continue  # no GPU of that node has room: kube-scheduler would name another
        s.place(p, node)
        held += share
        placed[f"{ns}/{name}"] = share
        k += 1
    return placed


def timed_get(s, path, port):
    t0 = time.perf_counter()
    body = s.get(path, port=port)
    return time.perf_counter() - t0, body


def check_data(d, nodes, placed):
    c = d["cluster"]
    if c["nodes"] != nodes or c["gpus"] != nodes * 8 or len(d["nodes"]) != nodes:
        h.fail(f"/ui/data counts {c['nodes']} nodes and {c['gpus']} GPUs, not {nodes} and {nodes * 8}")
    asked = {}
    used = 0
    for n in d["nodes"]:
        for g in n["gpus"]:
            if g[2] != sum(t[2] for t in g[6]):
                h.fail(f"{n['name']}: a GPU's compute held is not its tenants' sum")
            used += g[2]
            for t in g[6]:
                name = d["pods"][t[0]]["name"]
                asked[name] = asked.get(name, 0) + t[3]  # asked: a high-priority pod may compress others
    if asked != placed:
        missing = set(placed) - set(asked)
        h.fail(f"/ui/data draws {len(asked)} pods, {len(placed)} were placed (missing e.g. {sorted(missing)[:3]}),"
               " or a share asked differs")
    if used != c["coresUsed"]:
        h.fail(f"compute held: {c['coresUsed']} in the summary, {used} on the GPUs")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="100 nodes; check the answers, judge no time")
    ap.add_argument("--nodes", type=int, help="nodes of 8 GPUs (default 5000; 100 with --quick)")
    ap.add_argument("--repeat", type=int, default=None, help="GETs of each endpoint (default 9; 3 with --quick)")
    ap.add_argument("--scheduler", default=os.environ.get("TESSERA_SCHEDULER",
                                                           os.path.join(SOURCE, "build", "bin", "tessera-scheduler")))
    args = ap.parse_args()
    nodes = args.nodes or (100 if args.quick else 5000)
    repeat = args.repeat or (3 if args.quick else 9)
    rng = random.Random(42)

    s = h.Scheduler(args.scheduler, cluster(nodes), extra=["--policy", "tessera"])
    b = None
    try:
        t0 = time.perf_counter()
        placed = place_pods(s, nodes, rng)
        print(f"page_bench: {nodes} nodes x 8 GPUs, {len(placed)} pods placed in {time.perf_counter() - t0:.1f} s",
              flush=True)
        # A pod that fits nowhere, so that the pending list is not empty.
        s.filter(h.pod("batch", "too-big", "uid-too-big", 100, 90000), [f"node-{i}" for i in range(min(nodes, 50))])

        data_t, inspect_t = [], []
        data = inspect = b""
        for _ in range(repeat):
            t, data = timed_get(s, "/ui/data", s.page_port)
            data_t.append(t)
            t, inspect = timed_get(s, "/inspect", s.port)
            inspect_t.append(t)
        d = json.loads(data)
        check_data(d, nodes, placed)
        if not d["pending"] or d["pending"][0]["name"] != "batch/too-big":
            h.fail("the pending pod is not in /ui/data")
        dm, im = statistics.median(data_t), statistics.median(inspect_t)
        print(f"  GET /ui/data   {dm * 1000:8.1f} ms  {len(data) / 1e6:6.2f} MB   (median of {repeat})")
        print(f"  GET /inspect   {im * 1000:8.1f} ms  {len(inspect) / 1e6:6.2f} MB   (baseline, same cluster)")
        print(f"  ratio /ui/data : /inspect   time {dm / im:.2f}   size {len(data) / len(inspect):.2f}")
        failed = []
        if not args.quick and dm > im:
            failed.append(f"GET /ui/data ({dm * 1000:.1f} ms) is slower than /inspect ({im * 1000:.1f} ms)")

        why = h.browser_missing()
        if why:
            if not args.quick:
                h.fail(f"cannot measure the render: {why}")
            print(f"  render: skipped ({why})")
        else:
            b = h.Browser()
            t0 = time.perf_counter()
            b.driver.get(s.page_url)
            r = b.wait("the first render", lambda: b.driver.execute_script(
                "return window.tesseraRender.count >= 1 ? window.tesseraRender : null;"), timeout=300)
            load = time.perf_counter() - t0
            drawn = b.driver.execute_script("return document.querySelectorAll('.node .gpu').length;")
            if drawn != nodes * 8:
                h.fail(f"the page draws {drawn} GPUs, not {nodes * 8}")
            first, fetch = r["first"], r["fetch"]
            # One pod more: the next refresh draws that node again, not the others.
            node = next(n["name"] for n in d["nodes"] if any(g[2] <= 900 for g in n["gpus"]))
            s.place(h.pod("dev", "one-more", "uid-one-more", 10, 800), node)
            r = b.wait("the refresh with the new pod", lambda: b.driver.execute_script(
                "return document.querySelector('.seg[data-pod=\"dev/one-more\"]') ? window.tesseraRender : null;"),
                timeout=300)
            print(f"  render (headless Chromium): first {first:.0f} ms after fetch+parse {fetch:.0f} ms;"
                  f" page to first render {load * 1000:.0f} ms; a refresh with one pod more {r['last']:.0f} ms")
            if not args.quick and first > 5000:
                failed.append(f"the first render took {first:.0f} ms (target: 5 s)")
        for f in failed:
            print(f"FAILED: {f}")
        return 1 if failed else 0
    finally:
        if b is not None:
            b.close()
        s.close()


if __name__ == "__main__":
    sys.exit(main())
