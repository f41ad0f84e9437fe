#!/usr/bin/env bash
# The fuzz targets for longer than CI runs them: each for SECONDS (default 300), one after another, from the
# seeds in fuzz/corpus/ plus what earlier runs found (build-fuzz/corpus/, kept between runs). Prints one line
# per target: executions, executions per second, corpus growth, and any finding (left in
# build-fuzz/findings/<target>/; turn each into a regression test, then add the input to fuzz/corpus/).
#   bench/fuzz.sh              every target, 300 s each
#   bench/fuzz.sh 3600 inventory extender_args
set -uo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-300}"
shift || true
mkdir -p build-fuzz
scripts/build fuzz >build-fuzz/build.log 2>&1 || { cat build-fuzz/build.log >&2; exit 1; }
targets=("$@")
if [[ ${#targets[@]} -eq 0 ]]; then
  for bin in build-fuzz/fuzz/*_fuzz; do targets+=("$(basename "$bin" _fuzz)"); done
fi
printf '%-20s %12s %10s %8s  %s\n' target executions exec/s corpus finding
failed=0
for t in "${targets[@]}"; do
  work="build-fuzz/corpus/$t"
  findings="build-fuzz/findings/$t"
  log="build-fuzz/findings/$t.bench.log"
  mkdir -p "$work" "$findings"
  ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    "build-fuzz/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=1048576 \
    -print_final_stats=1 -artifact_prefix="$findings/" "$work" "fuzz/corpus/$t" >"$log" 2>&1
  rc=$?
  execs=$(grep -m1 'stat::number_of_executed_units' "$log" | awk '{print $2}')
  rate=$(grep -m1 'stat::average_exec_per_sec' "$log" | awk '{print $2}')
  corpus=$(find "$work" -type f | wc -l)
  finding="none"
  if [[ $rc -ne 0 ]]; then
    finding=$(grep -m1 -E 'SUMMARY|runtime error|ERROR: libFuzzer' "$log" | cut -c1-100)
    failed=1
  fi
  printf '%-20s %12s %10s %8s  %s\n' "$t" "${execs:-?}" "${rate:-?}" "$corpus" "$finding"
done
exit $failed
