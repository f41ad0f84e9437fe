#!/usr/bin/env bash
# The CUDA hook on a real GPU (H100/H200 with PyTorch): OOM at the limit with and without expandable segments,
# shares 10-90% alone, 30/70 side by side, elastic give-back, the overhead of an unthrottled loop, and issue
# 12's charges (tests/gpu/charge_cases.py: contexts under concurrency, modules, no NVML, pools, graph memory,
# prefetch, nvidia-smi's process list, capture beside the limiter thread).
# Run from the repository root after scripts/build:   tests/gpu/run_all.sh [seconds-per-run]
set -euo pipefail
cd "$(dirname "$0")/../.."
T=${1:-20}
RUN=build/bin/tessera
echo "== OOM at the limit"
$RUN run --gpu-memory 4GiB -- python3 tests/gpu/torch_oom.py 4GiB
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True $RUN run --gpu-memory 4GiB -- python3 tests/gpu/torch_oom.py 4GiB
echo "== shares alone (target: within 3 points)"
for c in 10 30 50 70 90; do echo -n "cores=$c "; $RUN run --gpu-cores $c -- python3 tests/gpu/torch_spin.py "$T"; done
echo "== 30/70 side by side"
$RUN run --gpu-cores 30 -- python3 tests/gpu/torch_spin.py "$T" & a=$!
$RUN run --gpu-cores 70 -- python3 tests/gpu/torch_spin.py "$T" & b=$!
wait $a $b
echo "== elastic give-back: 30% elastic alone, then a 60% hard tenant joins for the second half"
$RUN run --gpu-cores 30 --policy elastic -- python3 tests/gpu/torch_spin.py "$((2 * T))" & a=$!
sleep "$T"; $RUN run --gpu-cores 60 -- python3 tests/gpu/torch_spin.py "$((T - 2))"
wait $a
echo "== overhead of an unthrottled loop (target < 1%)"
echo -n "plain  "; python3 tests/gpu/torch_spin.py "$T"
echo -n "hooked "; $RUN run --gpu-cores 100 --gpu-memory 70GiB -- python3 tests/gpu/torch_spin.py "$T"
echo "== what is charged (tests/gpu/charge_cases.py; each prints ok)"
python3 tests/gpu/charge_cases.py contexts
$RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py modules
TESSERA_REAL_LIBNVML=/nonexistent $RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py nonvml
$RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py pool
$RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py graph
$RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py prefetch
python3 tests/gpu/charge_cases.py smi
$RUN run --gpu-cores 50 --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py capture
