#!/usr/bin/env bash
# bench/seeded.sh: an image update that only adds a layer on top (the
# spool seeded from the live generation), by this packsync and by
# PACKSYNC_OLD, one after the other: peak RSS and wall time of the first
# sync of v1, the update to v2 (one layer rewriting 1% of the files) and
# the no-op after it, and the generation each published (the same).
#
#   cargo build --release
#   bench/modes.sh --sizes 100000      # makes trees/modes/n100000-v1.oci
#   PACKSYNC_OLD=/path/to/old/packsync bench/seeded.sh 100000
#
# LINKS=1: v1 is the tree with a layer hardlinking 1% of its files (so
# the live manifest records that many groups of two), v2 one more layer
# linking the same files again: each new link is into a lower group.
# DRIFT=1: before the update, one file the update does not rewrite is
# edited in the live tree: the round's first try (the shortcut) finds it
# and the round is tried again, every layer fetched.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100000}
P=$(realpath "${PACKSYNC:-target/release/packsync}")
OLD=${PACKSYNC_OLD:-}
ROOT=${BENCH_ROOT:-/tmp/packsync-bench}
V1=$ROOT/trees/modes/n$N-v1.oci
[ -d "$V1" ] || { echo "no $V1: run bench/modes.sh --sizes $N first" >&2; exit 2; }
W=$(mktemp -d "${TMPDIR:-/tmp}/packsync-seeded.XXXXXX")
trap 'rm -rf "$W"' EXIT
if [ -n "${LINKS:-}" ]; then
    python3 bench/stack_layer.py "$V1" "$W/v1.oci" $((N / 100)) links
    V1=$W/v1.oci
    python3 bench/stack_layer.py "$V1" "$W/v2.oci" $((N / 100)) links
else
    python3 bench/stack_layer.py "$V1" "$W/v2.oci" $((N / 100))
fi
for b in "$P" ${OLD:+"$OLD"}; do
    rm -rf "$W/vol" "$W/img.oci"; mkdir "$W/vol"
    cp -al "$V1" "$W/img.oci"
    /usr/bin/time -f "$b first: %M KiB %e s" "$b" sync -q "oci-layout:$W/img.oci:bench" "$W/vol/dest"
    rm -rf "$W/img.oci"; cp -al "$W/v2.oci" "$W/img.oci"
    if [ -n "${DRIFT:-}" ]; then
        f=$(find -L "$W/vol/dest" -type f -name '*' | sort | tail -n 1)
        echo "edited in place" > "$f"
    fi
    /usr/bin/time -f "$b update: %M KiB %e s" "$b" sync -q "oci-layout:$W/img.oci:bench" "$W/vol/dest"
    /usr/bin/time -f "$b no-op: %M KiB %e s" "$b" sync -q "oci-layout:$W/img.oci:bench" "$W/vol/dest"
    echo "$b published $(basename "$(readlink "$W/vol/dest")")"
done
