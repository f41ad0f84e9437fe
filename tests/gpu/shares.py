#!/usr/bin/env python3
"""Shares of tenants running side by side, from their torch_spin.py records, over the time all of them ran.

A tenant's share is the GPU time its kernels took: the matmuls it did in the window times the GPU time of one
matmul, which the reference record gives (an unhooked torch_spin.py alone on the GPU, where NVML's per-process
figure is exact: its share divided by its matmuls per second). Tenants side by side keep the GPU saturated, so
they run at the reference's clocks. NVML's per-process figure cannot be used side by side: time-sliced
processes are each counted while the other runs too (30/60 read 73 and 39 on an H100). Neither can the
device's busy time split by work: the switches between the tenants' contexts count as busy (30/60 side by side
read 100% busy where the kernels took 89%); the device figure is printed to show that overhead.

  shares.py --reference PLAIN [--within 3] FILE:EXPECT FILE:EXPECT...

Prints one JSON line with each tenant's share and exits 1 when one is more than --within points (default 3)
from its expectation."""
import argparse
import json
import sys

ap = argparse.ArgumentParser()
ap.add_argument("--reference", required=True, help="torch_spin.py --out record of an unhooked run alone")
ap.add_argument("--within", type=float, default=3.0)
ap.add_argument("tenants", nargs="+")
args = ap.parse_args()


def load(path):
    return json.loads(open(path).read().strip().splitlines()[-1])


ref = load(args.reference)
matmul_s = ref["share_percent"][0] / 100.0 / ref["iters_per_s"][0]  # GPU seconds per matmul
runs = []
for t in args.tenants:
    path, expect = t.rsplit(":", 1)
    runs.append((path, float(expect), load(path)))
# The window every tenant ran in, less a second at each end (start-up and the last partial entries).
lo = max(r["series"][0][0] for _, _, r in runs) + 1
hi = min(r["series"][-1][0] for _, _, r in runs) - 1
if hi - lo < 2:
    print(json.dumps({"ok": False, "error": "the tenants overlapped for %.1f s only" % (hi - lo + 2)}))
    sys.exit(1)
device = [v for _, _, r in runs for t, v in r["device_series"] if lo <= t <= hi]
out = {"window_s": round(hi - lo, 1), "matmul_us": round(matmul_s * 1e6, 1),
       "device_busy_percent": round(sum(device) / len(device), 2) if device else None, "tenants": []}
ok = True
for path, expect, r in runs:
    done = sum(n for t, n in r["series"] if lo < t <= hi)
    share = round(100.0 * done * matmul_s / (hi - lo), 2)
    good = abs(share - expect) <= args.within
    ok = ok and good
    out["tenants"].append({"file": path, "share_percent": share, "expect_percent": expect, "ok": good})
out["ok"] = ok
print(json.dumps(out))
sys.exit(0 if ok else 1)
