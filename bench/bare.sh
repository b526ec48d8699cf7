#!/usr/bin/env bash
# A live tree with no manifest to read, side by side: wall seconds, CPU
# seconds and peak RSS of two packsync binaries (PACKSYNC, PACKSYNC_OLD)
# on one tree, with rsync and cp -a beside them:
#   take over   DEST a `cp -a` copy of the tree: `sync SRC DEST` (rsync:
#               `rsync -a --delete SRC/ DEST/` onto such a copy)
#   take over --checksum
#               the same with `--checksum` (rsync: `rsync -ac --delete`)
#   lost, dry   the live generation's manifest removed: `sync --dry-run --itemize`
#   lost        then `sync` (the same tree: it converges on the live
#               generation's name, checking that generation first)
#   first       `sync` into nothing (cp: `cp -a SRC DEST`)
# The generations both binaries publish are compared (the same names).
#
#   PACKSYNC=/path PACKSYNC_OLD=/path bench/bare.sh [--files N] [--out FILE]
#
# --files: the tree's size (default 100000), bench/scale.py's generate, as
#   bench/modes.sh makes them. Page cache warm, `sync` before every run, on
#   $BENCH_DIR's filesystem (default /tmp/packsync-bench). Peak RSS is
#   `ru_maxrss` (bench/measure.c): rsync's is its largest process.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
files=100000 out=""
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --files) files="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
command -v rsync >/dev/null || { echo "bench: missing: rsync" >&2; exit 2; }
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
bench_setup bare "$files"

for who in new old; do
    v="$work/v-$who"
    mkdir -p "$v"
    cp -a "$tree" "$v/d"
    bench_note "take over" "$who" "$(bench_run "$who" sync -q "$tree" "$v/d")"
    cp -a "$tree" "$v/c"
    bench_note "take over --checksum" "$who" "$(bench_run "$who" sync -q --checksum "$tree" "$v/c")"
    gen="$(basename "$(readlink -f "$v/d")")"
    rm "$v/.d.packsync/meta/$gen.manifest"
    bench_note "lost, dry" "$who" "$(bench_run "$who" sync -q --dry-run --itemize "$tree" "$v/d")"
    bench_note "lost" "$who" "$(bench_run "$who" sync -q "$tree" "$v/d")"
    bench_note "first" "$who" "$(bench_run "$who" sync -q "$tree" "$v/f")"
done
# Generation names but their unique suffixes (`<digest>-<8 hex>`, a twin's).
names() { (ls "$1/.d.packsync/meta" && ls "$1/.f.packsync/meta") | sed 's/-[0-9a-f]\{8\}\././' | sort | tr '\n' ' '; }
a=$(names "$work/v-new")
b=$(names "$work/v-old")
[ "$a" = "$b" ] || { echo "bench: the two binaries published other generations: $a / $b" >&2; exit 1; }
mkdir -p "$work/r"
cp -a "$tree" "$work/r/d"
bench_note "take over" rsync "$(bench_run rsync -a --delete "$tree/" "$work/r/d/")"
cp -a "$tree" "$work/r/c"
bench_note "take over --checksum" rsync "$(bench_run rsync -ac --delete "$tree/" "$work/r/c/")"
bench_note "first" cp "$(bench_run cp -a "$tree" "$work/r/f")"

report() {
    echo "# A live tree without a manifest: $files files, $(date -u +%Y-%m-%d)"
    echo
    echo "\`PACKSYNC=$PACKSYNC PACKSYNC_OLD=$PACKSYNC_OLD bench/bare.sh --files $files\`"
    echo "(new: $(sha256sum "$PACKSYNC" | cut -c1-12), old: $(sha256sum "$PACKSYNC_OLD" | cut -c1-12)); one run each, page cache warm."
    echo "Both published the same generations. rsync and cp -a: the rows they do."
    echo
    bench_table
}
if [ -n "$out" ]; then report | tee "$out"; else report; fi
rm -rf "$work"
