#!/usr/bin/env bash
# bench/first-peaks.sh: the peak RSS and wall time of an archive's and an
# image's first sync (each into a fresh DEST, `sync` before each), by each
# packsync binary named, taking turns, and of `rsync -a --delete` of the
# same tree, round after round: the figures of BENCHMARKS.md's
# "Archives and images under rsync's peak".
#
#   bench/modes.sh --sizes 1000000 --rounds 1   # makes trees/modes/n1000000-v1{.tar.gz,.oci}
#   bench/first-peaks.sh 1000000 1 /path/new/packsync /path/old/packsync
#
# Prints one line a run: N, round, binary, what, peak RSS in KiB, seconds.
set -euo pipefail
N=${1:?files}
ROUNDS=${2:?rounds}
shift 2
[ $# -gt 0 ] || { echo "name at least one packsync binary" >&2; exit 2; }
ROOT=${BENCH_ROOT:-/tmp/packsync-bench}
T=$ROOT/trees/modes/n$N-v1
for f in "$T" "$T.tar.gz" "$T.oci"; do
    [ -e "$f" ] || { echo "no $f: run bench/modes.sh --sizes $N first" >&2; exit 2; }
done
W=$(mktemp -d "$ROOT/first-peaks.XXXXXX")
trap 'rm -rf "$W"' EXIT
run() { # label what command...
    local label="$1" what="$2"
    shift 2
    rm -rf "$W/d"
    mkdir -p "$W/d"
    sync
    if ! /usr/bin/time -f "%M %e" -o "$W/t" "$@" >/dev/null; then
        echo "$label $what failed" >&2
        exit 1
    fi
    echo "n=$N r=$r $label $what $(cat "$W/t")"
}
bins=("$@")
for r in $(seq "$ROUNDS"); do
    # Each round the first binary goes last: none always runs first.
    for k in "${!bins[@]}"; do
        b=${bins[$(((k + r - 1) % ${#bins[@]}))]}
        run "$b" tgz "$b" sync -q "$T.tar.gz" "$W/d/dest"
        run "$b" image "$b" sync -q "oci-layout:$T.oci:bench" "$W/d/dest"
    done
    run rsync dir rsync -a --delete "$T/" "$W/d/dest/"
done
