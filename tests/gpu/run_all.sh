#!/usr/bin/env bash
# The CUDA hook on a real GPU (H100/H200 with PyTorch): OOM at the limit with and without expandable segments,
# the overhead of an unthrottled loop and of one launch (nvcc), shares 10-90% alone, 30/60 and 10/90 side by
# side, elastic growth and give-back, and issue 12's charges (tests/gpu/charge_cases.py: contexts under
# concurrency, modules, no NVML, pools, graph memory, prefetch, NVML's process list, capture beside the limiter
# thread). docs/isolation.md ("On a real GPU") has the figures an H100 gave.
#
# Run from the repository root after scripts/build:   tests/gpu/run_all.sh [seconds-per-run]
# Every step runs even when an earlier one fails; each prints one JSON line, a failed one "FAILED: <step>", and
# the script exits 1 when any failed. TESSERA names another tessera binary (default build/bin/tessera).
set -uo pipefail
cd "$(dirname "$0")/../.."
T=${1:-20}
RUN=${TESSERA:-build/bin/tessera}
failed=()
step() {  # step NAME COMMAND...: runs it, records a failure
  local name=$1
  shift
  echo "-- $name"
  "$@" || { echo "FAILED: $name"; failed+=("$name"); return 1; }
}

echo "== OOM at the limit"
step oom $RUN run --gpu-memory 4GiB -- python3 tests/gpu/torch_oom.py 4GiB
step oom-expandable env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  $RUN run --gpu-memory 4GiB -- python3 tests/gpu/torch_oom.py 4GiB

echo "== the reference: an unhooked loop alone; then the same under the hook at 100%"
W=$(mktemp -d)
python3 tests/gpu/torch_spin.py "$T" --out "$W/plain.json" && echo "plain  $(cat "$W/plain.json" | head -c 160)"
hooked=$($RUN run --gpu-cores 100 --gpu-memory 70GiB -- python3 tests/gpu/torch_spin.py "$T") && echo "hooked $hooked"
# Reported, not judged: two 10 s loops differ by about +-2% run to run on an H100 (clocks), more than the
# hook's cost; the launch cost below measures that cost directly.
python3 -c 'import json,sys; p=json.load(open(sys.argv[1]))["iters_per_s"][0]; h=json.loads(sys.argv[2])["iters_per_s"][0]; print(json.dumps({"plain_per_s": p, "hooked_per_s": h, "overhead_percent": round(100*(p-h)/p,2)}))' "$W/plain.json" "$hooked"

echo "== launch cost: an empty kernel through the runtime, unhooked, hooked at 100% and paced at 99%, 5 runs each"
if nvcc -O2 -o "$W/launch_bench" tests/gpu/launch_bench.cu; then
  for i in 1 2 3 4 5; do
    "$W/launch_bench" 200000 >> "$W/plain.ns"
    $RUN run --gpu-cores 100 -- "$W/launch_bench" 200000 >> "$W/hooked.ns"
    $RUN run --gpu-cores 99 -- "$W/launch_bench" 200000 >> "$W/paced.ns"
  done
  python3 -c 'import json,statistics as s,sys; p,h,q=(s.median(map(float,open(f))) for f in sys.argv[1:]); print(json.dumps({"plain_ns": p, "hooked_ns": h, "paced_ns": q, "added_ns": round(h-p,1), "added_paced_ns": round(q-p,1)}))' "$W/plain.ns" "$W/hooked.ns" "$W/paced.ns"
else
  echo "no nvcc: launch cost not measured"
fi

echo "== shares alone (within 3 points)"
for c in 10 30 50 70 90; do
  step "cores=$c" $RUN run --gpu-cores $c -- python3 tests/gpu/torch_spin.py "$T" --expect $c
done

echo "== 30/60 side by side (within 3 points each)"
$RUN run --gpu-cores 30 -- python3 tests/gpu/torch_spin.py "$T" --out "$W/30.json" & a=$!
$RUN run --gpu-cores 60 -- python3 tests/gpu/torch_spin.py "$T" --out "$W/60.json" & b=$!
wait $a $b
step "side by side 30/60" python3 tests/gpu/shares.py --reference "$W/plain.json" "$W/30.json:30" "$W/60.json:60"

echo "== 10/90 side by side: 100% subscribed (within 3 points each)"
$RUN run --gpu-cores 10 -- python3 tests/gpu/torch_spin.py "$T" --out "$W/10.json" & a=$!
$RUN run --gpu-cores 90 -- python3 tests/gpu/torch_spin.py "$T" --out "$W/90.json" & b=$!
wait $a $b
step "side by side 10/90" python3 tests/gpu/shares.py --reference "$W/plain.json" "$W/10.json:10" "$W/90.json:90"

echo "== elastic 30%: alone it grows to its 90% ceiling, beside a hard 60% tenant it gives back to 30"
# The elastic tenant runs 3T; the hard one starts after its first half (1.5T, plus start-up) and runs T.
$RUN run --gpu-cores 30 --policy elastic -- python3 tests/gpu/torch_spin.py "$((3 * T))" --out "$W/elastic.json" & a=$!
sleep "$((3 * T / 2 + 5))"
$RUN run --gpu-cores 60 -- python3 tests/gpu/torch_spin.py "$T" --out "$W/hard.json"
wait $a
step "elastic: alone (first half)" python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(json.dumps({"alone_percent": r["share_percent"][1]})); sys.exit(0 if r["share_percent"][1] >= 85 else 1)' "$W/elastic.json"
step "elastic: beside the hard 60" python3 tests/gpu/shares.py --reference "$W/plain.json" "$W/elastic.json:30" "$W/hard.json:60"

echo "== what is charged (tests/gpu/charge_cases.py)"
step contexts python3 tests/gpu/charge_cases.py contexts
step modules $RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py modules
step nonvml env TESSERA_REAL_LIBNVML=/nonexistent $RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py nonvml
step pool $RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py pool
step graph $RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py graph
step prefetch $RUN run --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py prefetch
step smi python3 tests/gpu/charge_cases.py smi
step capture $RUN run --gpu-cores 50 --gpu-memory 8GiB -- python3 tests/gpu/charge_cases.py capture

if ((${#failed[@]})); then
  printf 'FAILED: %s\n' "${failed[@]}"
  exit 1
fi
echo "all steps passed"
