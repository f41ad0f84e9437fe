#!/usr/bin/env python3
"""Runs back-to-back matmuls for SECONDS and prints, as JSON, the GPU time this process got as a share of wall time
(NVML's per-process SM utilisation, read by nvml_share.py from outside the hook), over the whole run and over
each half (the elastic case changes its neighbours halfway), and the matmuls per second. Used for shares
(alone and side by side) and the overhead of an unthrottled loop.

  build/bin/tessera run --gpu-cores 30 -- python3 tests/gpu/torch_spin.py 20 [--expect 30 [--within 3]]
                                           [--half first|second]

Figures are lists: [whole run, first half, second half]. With --expect (for a process alone on the GPU), exits
1 when its share (of the whole run, or of the half --half names) is more than --within points (default 3) away.
Processes side by side are judged by shares.py, from the records --out writes."""
import argparse, json, os, subprocess, sys, time
import torch

ap = argparse.ArgumentParser()
ap.add_argument("seconds", type=float, nargs="?", default=20.0)
ap.add_argument("--expect", type=float)
ap.add_argument("--within", type=float, default=3.0)
ap.add_argument("--half", choices=["first", "second"])
ap.add_argument("--out", help="also write the whole record, with its time series, to this file (for shares.py)")
args = ap.parse_args()

a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(10):
    a @ b
torch.cuda.synchronize()
env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}  # the monitor runs outside the hook
monitor = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), "nvml_share.py"),
                            str(os.getpid()), str(args.seconds)], stdout=subprocess.PIPE, text=True, env=env)
busy = [0.0, 0.0]  # event time in each half
iters = [0, 0]
series = []  # [unix time, matmuls done since the last entry], about four entries a second
last_mark, since_mark = time.time(), 0
start = time.time()
half = args.seconds / 2
while time.time() - start < args.seconds:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(8):
        a @ b
    e.record()
    e.synchronize()
    h = 0 if time.time() - start < half else 1
    busy[h] += s.elapsed_time(e) / 1000.0
    iters[h] += 8
    since_mark += 8
    if time.time() - last_mark >= 0.25:
        last_mark = time.time()
        series.append([round(last_mark, 3), since_mark])
        since_mark = 0
wall = time.time() - start
nvml = json.loads(monitor.communicate()[0])
# [whole run, first half, second half]
out = {"share_percent": nvml["sm_percent"], "device_percent": nvml["device_percent"],
       "iters_per_s": [round(sum(iters) / wall, 1), round(iters[0] / half, 1), round(iters[1] / (wall - half), 1)],
       "sm_clock_mhz": nvml["sm_clock_mhz"], "nvml_samples": nvml["samples"],
       "events_percent": round(100.0 * sum(busy) / wall, 2), "wall_s": round(wall, 2),
       "start": round(start, 3), "series": series, "device_series": nvml["device_series"]}
if args.expect is not None:
    got = out["share_percent"][{None: 0, "first": 1, "second": 2}[args.half]]
    out["expect_percent"] = args.expect
    out["ok"] = got is not None and abs(got - args.expect) <= args.within
if args.out:
    with open(args.out, "w") as f:
        json.dump(out, f)
print(json.dumps({k: v for k, v in out.items() if k not in ("series", "device_series")}), flush=True)
sys.exit(0 if out.get("ok", True) else 1)
