#!/usr/bin/env bash
# The README's first command on a fresh machine, timed: two fresh Debian 12 roots (mmdebstrap) with what a
# machine of this kind has before anyone touches it (gcc, g++, make, cmake, ninja, GoogleTest, Python with pytest,
# git), a clean copy of the commit (git archive HEAD) in each, and in one the first command as it is, in the other
# as it was (the baseline, measured in the same run):
#   now:      scripts/setup --cli && scripts/build cli && build-cli/bin/tessera simulate
#   before:   scripts/setup && scripts/build default tessera && build/bin/tessera simulate
# Each phase's wall time is printed, then the ratio of the totals. The packages come from Debian's mirror over
# the network, as on a fresh machine; the builds use no compiler cache.
#   bench/first_run.sh            both, fresh roots in a temporary directory (removed afterwards)
#   bench/first_run.sh --keep     keep the roots (printed) for a look
# Needs root, mmdebstrap (apt-get install mmdebstrap) and the network to deb.debian.org; takes 10-20 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
keep=false
[[ "${1:-}" == "--keep" ]] && keep=true
if [[ $(id -u) -ne 0 ]]; then
  echo "first_run: needs root (it builds chroots and installs packages in them)" >&2
  exit 2
fi
if ! command -v mmdebstrap >/dev/null; then
  echo "first_run: needs mmdebstrap: apt-get install mmdebstrap" >&2
  exit 2
fi

work=$(mktemp -d /tmp/tessera-first-run.XXXXXX)
mounted=()
cleanup() {
  for m in "${mounted[@]}"; do umount -l "$m" 2>/dev/null || true; done
  if ! $keep; then rm -rf "$work"; else echo "first_run: roots kept in $work"; fi
}
trap cleanup EXIT

echo "first_run: a fresh Debian 12 root (mmdebstrap)"
mmdebstrap --quiet --variant=apt \
  --include=build-essential,cmake,ninja-build,googletest,python3,python3-pytest,git,ca-certificates \
  bookworm "$work/base" \
  "deb http://deb.debian.org/debian bookworm main" \
  "deb http://deb.debian.org/debian bookworm-updates main" \
  "deb http://deb.debian.org/debian-security bookworm-security main"
# A fresh machine has its package lists already; so does the root (mmdebstrap fetched them).

run_variant() {
  local name=$1 setup=$2 build=$3 sim=$4
  local root="$work/$name"
  cp -a "$work/base" "$root"
  mkdir -p "$root/src"
  git archive HEAD | tar -x -C "$root/src"
  cp /etc/resolv.conf "$root/etc/resolv.conf"
  # This machine's certificate authorities and pip settings (its network may pass through a proxy of its own):
  # what a machine of this kind has.
  cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
  [[ -f /etc/pip.conf ]] && cp /etc/pip.conf "$root/etc/pip.conf"
  for d in proc sys dev; do
    mount --rbind "/$d" "$root/$d"
    mounted+=("$root/$d")
  done
  # One phase in the root, timed; its output goes to $work/<variant>-<phase>.log.
  phase() {
    chroot "$root" bash -c "cd /src && $2" >"$work/$name-$1.log" 2>&1 && return 0
    echo "first_run: $name: $1 failed; see $work/$name-$1.log" >&2
    keep=true
    return 1
  }
  local t0 t1 t2 t3
  t0=$(date +%s.%N)
  phase setup "$setup"
  t1=$(date +%s.%N)
  phase build "$build"
  t2=$(date +%s.%N)
  phase simulate "$sim"
  t3=$(date +%s.%N)
  for d in dev sys proc; do umount -l "$root/$d"; done
  mounted=()
  awk -v n="$name" -v a="$t0" -v b="$t1" -v c="$t2" -v d="$t3" 'BEGIN {
    printf "%-7s setup %6.1f s   build %6.1f s   simulate %5.1f s   total %6.1f s\n", n, b - a, c - b, d - c, d - a }'
  awk -v a="$t0" -v d="$t3" 'BEGIN { print d - a }' >"$work/$name.total"
}

run_variant before "./scripts/setup" "./scripts/build default tessera" "./build/bin/tessera simulate"
run_variant now "./scripts/setup --cli" "./scripts/build cli" "./build-cli/bin/tessera simulate"
awk -v now="$(cat "$work/now.total")" -v before="$(cat "$work/before.total")" -v load="$(cut -d' ' -f1-3 /proc/loadavg)" \
  'BEGIN { printf "first command, now / before: %.2f (load average at the end: %s)\n", now / before, load }'
