#!/usr/bin/env python3
"""Under `tessera run --gpu-memory LIMIT`: allocate 64 MiB tensors until torch.cuda.OutOfMemoryError and check
the container got close to LIMIT but never past it. Run with and without
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (VMM path). Prints one JSON line.
  build/bin/tessera run --gpu-memory 4GiB -- python3 tests/gpu/torch_oom.py 4GiB"""
import json, sys
import torch

def parse(s):
    units = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30}
    for u, m in units.items():
        if s.endswith(u):
            return int(float(s[: -len(u)]) * m)
    return int(s)

limit = parse(sys.argv[1])
free, total = torch.cuda.mem_get_info()
held, got = [], 0
try:
    while True:
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
        got += 64 << 20
except torch.cuda.OutOfMemoryError:
    oom = True
reserved = torch.cuda.memory_reserved()
ok = total == limit and reserved <= limit and got >= limit - (1 << 30)
print(json.dumps({"limit": limit, "reported_total": total, "allocated": got, "reserved": reserved, "oom": oom, "ok": ok}))
sys.exit(0 if ok else 1)
