#!/usr/bin/env python3
"""Runs back-to-back matmuls for SECONDS and prints the GPU time this process got (from CUDA events) as a
share of wall time, as JSON. Used for shares (alone and side by side) and the overhead of an unthrottled loop.
  build/bin/tessera run --gpu-cores 30 -- python3 tests/gpu/torch_spin.py 20"""
import json, sys, time
import torch

seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 20.0
a = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
b = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
for _ in range(10):
    a @ b
torch.cuda.synchronize()
busy, iters = 0.0, 0
start = time.time()
while time.time() - start < seconds:
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(8):
        a @ b
    e.record()
    e.synchronize()
    busy += s.elapsed_time(e) / 1000.0
    iters += 8
wall = time.time() - start
print(json.dumps({"share_percent": 100.0 * busy / wall, "iters_per_s": iters / wall, "wall_s": wall}))
