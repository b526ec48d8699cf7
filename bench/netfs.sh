#!/usr/bin/env bash
# Updates on a network volume, side by side: wall seconds, CPU seconds and
# peak RSS of two packsync binaries (PACKSYNC, PACKSYNC_OLD) syncing one
# local tree into DIR, a directory on the volume (the netfs rig's mount:
# `eval "$(NETFS_RIG_BACKEND=sshfs ../shared/netfs-rig.sh env)"`, then
# `--on "$NETFS_MNT_A/bench"`), with rsync beside them:
#   first       `sync SRC DEST` into nothing
#   no-op       `sync SRC DEST` again
#   dry 1%      `sync --dry-run --itemize SRC2 DEST`, SRC2 the tree with
#               every 100th file rewritten
#   1%          `sync SRC2 DEST`
#   no-op 2     `sync SRC2 DEST` again
# rsync: `rsync -a --delete` of SRC then SRC2 onto a copy, the same rows.
# The generations both binaries publish are compared (the same names).
#
#   PACKSYNC=/path PACKSYNC_OLD=/path bench/netfs.sh --on DIR [--files N] [--out FILE]
#
# --files: the tree's size (default 20000), bench/scale.py's generate.
# The manifest's `hardlinks` line (0 on sshfs) is printed with the results.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
files=20000 out="" on=""
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --files) files="$2"; shift 2 ;;
    --on) on="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -n "$on" ] || { echo "bench: --on DIR is required (a directory on the volume)" >&2; exit 2; }
command -v rsync >/dev/null || { echo "bench: missing: rsync" >&2; exit 2; }
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
bench_setup netfs "$files"
tree2="$work/v2"
cp -a "$tree" "$tree2"
find "$tree2" -type f | sort | awk 'NR % 100 == 0' | while read -r f; do
    echo "changed" >>"$f"
done
mkdir -p "$on"
rm -rf "${on:?}"/netfs-bench
vol="$on/netfs-bench"
mkdir -p "$vol"

for who in new old; do
    d="$vol/$who"
    bench_note "first" "$who" "$(bench_run "$who" sync -q --mkpath "$tree" "$d/d")"
    bench_note "no-op" "$who" "$(bench_run "$who" sync -q "$tree" "$d/d")"
    bench_note "dry 1%" "$who" "$(bench_run "$who" sync -q --dry-run --itemize "$tree2" "$d/d")"
    bench_note "1%" "$who" "$(bench_run "$who" sync -q "$tree2" "$d/d")"
    bench_note "no-op 2" "$who" "$(bench_run "$who" sync -q "$tree2" "$d/d")"
done
# Generation names but their unique suffixes (`<digest>-<8 hex>`, a twin's).
names() { ls "$1/.d.packsync/meta" | grep '\.manifest$' | sed 's/-[0-9a-f]\{8\}\././' | sort | tr '\n' ' '; }
a=$(names "$vol/new")
b=$(names "$vol/old")
[ "$a" = "$b" ] || { echo "bench: the two binaries published other generations: $a / $b" >&2; exit 1; }
hardlinks=$(grep -h '^hardlinks' "$vol"/new/.d.packsync/meta/*.manifest | sort -u | tr '\n' ' ')
r="$vol/rsync"
mkdir -p "$r"
bench_note "first" rsync "$(bench_run rsync -a --delete "$tree/" "$r/")"
bench_note "no-op" rsync "$(bench_run rsync -a --delete "$tree/" "$r/")"
bench_note "1%" rsync "$(bench_run rsync -a --delete "$tree2/" "$r/")"
bench_note "no-op 2" rsync "$(bench_run rsync -a --delete "$tree2/" "$r/")"

report() {
    echo "# Updates on a network volume: $files files, $(date -u +%Y-%m-%d)"
    echo
    echo "\`PACKSYNC=$PACKSYNC PACKSYNC_OLD=$PACKSYNC_OLD bench/netfs.sh --on $on --files $files\`"
    echo "(new: $(sha256sum "$PACKSYNC" | cut -c1-12), old: $(sha256sum "$PACKSYNC_OLD" | cut -c1-12)); one run each."
    echo "Volume: $(findmnt -n -o FSTYPE,SOURCE -T "$on" | tr -s ' '); its manifests say: $hardlinks"
    echo "Both published the same generations. rsync: the rows it does."
    echo
    bench_table
}
if [ -n "$out" ]; then report | tee "$out"; else report; fi
rm -rf "$work" "$vol"
