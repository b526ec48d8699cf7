#!/usr/bin/env bash
# Soak benchmark of `sync --every` (BENCHMARKS.md, "The sync loop over many
# rounds"): one loop at the fastest period (10ms) over a small tree, the
# source changed every CHANGE_EVERY rounds so that some rounds stage and
# publish, and the loop's RSS and open descriptors between rounds (its own
# /metrics gauges) at rounds 100 and ROUNDS. Not a timed test: it prints what it measured.
#
#   bench/soak.sh [ROUNDS] [CHANGE_EVERY]      (defaults: 10000 500)
#
# Needs curl; uses target/release/packsync (built if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-10000}
change_every=${2:-500}
bin=${PACKSYNC:-target/release/packsync}
[ -x "$bin" ] || cargo build --release --quiet
work=$(mktemp -d /tmp/packsync-soak.XXXXXX)
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
mkdir -p "$work/src/d" "$work/vol"
for i in $(seq 1 200); do echo "file $i" > "$work/src/d/f$i"; done
port=$(( 20000 + RANDOM % 20000 ))
"$bin" sync --every 10ms --grace 0 --keep 1 --no-fsync --quiet \
    --http-bind "127.0.0.1:$port" "$work/src" "$work/vol/tree" 2>"$work/err" &
pid=$!

# Rounds so far: the sum of packsync_syncs_total over its results.
count() {
    curl -sf "http://127.0.0.1:$port/metrics" 2>/dev/null |
        awk '/^packsync_syncs_total/ {n += $2} END {print n + 0}'
}
# RSS in KiB and open descriptors of the loop between rounds, as the loop
# itself reads them after a round's memory is freed (the idle gauges of
# /metrics): a look from outside could catch a round midway.
sample() {
    curl -sf "http://127.0.0.1:$port/metrics" | awk '
        /^packsync_idle_resident_memory_bytes/ {rss = $2 / 1024}
        /^packsync_idle_open_fds/ {fds = $2}
        END {printf "%d %d\n", rss, fds}'
}

start=$(date +%s)
# The first change comes early, so that by round 100 every path of a round
# (scan, stage, commit, retire) has run once: growth after that is a leak,
# not the first use of a thread's stack or of the allocator's arenas.
next_change=20
next_sample=1000
at100=""
while :; do
    n=$(count)
    kill -0 "$pid" || { echo "the loop died:"; cat "$work/err"; exit 1; }
    if [ -z "$at100" ] && [ "$n" -ge 100 ]; then
        at100="$n $(sample)"
        echo "round $at100 (RSS KiB, fds)"
    fi
    if [ "$n" -ge "$next_sample" ]; then
        echo "round $n $(sample) (RSS KiB, fds)"
        next_sample=$(( next_sample + 1000 ))
    fi
    if [ "$n" -ge "$next_change" ]; then
        echo "round $n $(date +%s%N)" > "$work/src/changing"
        next_change=$(( next_change < change_every ? change_every : next_change + change_every ))
    fi
    [ "$n" -ge "$rounds" ] && break
    sleep 0.2
done
atN="$n $(sample)"
secs=$(( $(date +%s) - start ))
metrics=$(curl -sf "http://127.0.0.1:$port/metrics")
read -r r1 rss1 fd1 <<<"$at100"
read -r r2 rss2 fd2 <<<"$atN"
echo "rounds: $(grep '^packsync_syncs_total' <<<"$metrics" | tr '\n' ' ')"
echo "at round $r1: RSS ${rss1} KiB, ${fd1} fds"
echo "at round $r2: RSS ${rss2} KiB, ${fd2} fds"
echo "growth: $(( rss2 - rss1 )) KiB, $(( fd2 - fd1 )) fds; ${secs}s"
echo "errors logged: $(grep -c 'error' "$work/err" || true)"
