#!/usr/bin/env bash
# `--xattrs` and `--set-mtime` side by side: wall seconds, CPU seconds and
# peak RSS of two packsync binaries (PACKSYNC, PACKSYNC_OLD), run back to
# back on one tree, for a first sync, a no-op, a `--dry-run --itemize` of a
# 1% update and that update, under each flag; the generations both publish
# are compared at the end (they must be the same names).
#
#   PACKSYNC=/path PACKSYNC_OLD=/path bench/flags.sh [--files N] [--out FILE]
#
# --files: the tree's size (default 100000): bench/scale.py's generate, as
#   bench/modes.sh makes them (kept in $BENCH_DIR/trees/modes), copied, with
#   a user.k attribute on every 10th file (changed on every 1000th before
#   the update, with the 1% of contents).
# Page cache warm, `sync` before every run, on $BENCH_DIR's filesystem
# (default /tmp/packsync-bench). Peak RSS is `ru_maxrss` (bench/measure.c).
# Needs python3, gcc or cc, and a filesystem that keeps user.* attributes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
files=100000 out=""
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --files) files="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
bench_setup flags "$files"
cp -a "$tree" "$work/src"
# every 10th file an attribute; the update: 1% of contents, every 1000th attribute
cat >"$work/mod.py" <<'EOF'
import os, sys
root, what = sys.argv[1], sys.argv[2]
n = 0
for d, ds, fs in sorted(os.walk(root)):
    ds.sort()
    for f in sorted(fs):
        n += 1
        p = os.path.join(d, f)
        if what == "init" and n % 10 == 0:
            os.setxattr(p, "user.k", b"v%d" % n)
        if what == "update" and n % 1000 == 0:
            os.setxattr(p, "user.k", b"w%d" % n)
        if what == "update" and n % 100 == 7:
            b = open(p, "rb").read()
            open(p, "wb").write(bytes(reversed(b)) if len(set(b)) > 1 else b"Z" * len(b))
EOF
python3 "$work/mod.py" "$work/src" init
src_copy="$work/src.orig"
cp -a "$work/src" "$src_copy"

lines=()
for flag in "--xattrs" "--set-mtime 1700000000"; do
    rm -rf "$work/src" "$work/v-new" "$work/v-old"
    cp -a "$src_copy" "$work/src"
    mkdir "$work/v-new" "$work/v-old"
    for step in first no-op dry-run update; do
        [ "$step" = dry-run ] && python3 "$work/mod.py" "$work/src" update
        extra=()
        [ "$step" = dry-run ] && extra=(--dry-run --itemize)
        for who in new old; do
            # shellcheck disable=SC2086
            r=$(bench_run "$who" sync -q $flag "${extra[@]}" "$work/src" "$work/v-$who/d")
            lines+=("$flag|$step|$who|$r")
            echo "bench: $flag $step $who: $r" >&2
        done
    done
    a=$(ls "$work/v-new/.d.packsync/meta" | sort | tr '\n' ' ')
    b=$(ls "$work/v-old/.d.packsync/meta" | sort | tr '\n' ' ')
    [ "$a" = "$b" ] || { echo "bench: $flag: the two binaries published other generations: $a / $b" >&2; exit 1; }
done

report() {
    echo "# \`--xattrs\` and \`--set-mtime\`: $files files, $(date -u +%Y-%m-%d)"
    echo
    echo "\`PACKSYNC=$PACKSYNC PACKSYNC_OLD=$PACKSYNC_OLD bench/flags.sh --files $files\`"
    echo "(new: $(sha256sum "$PACKSYNC" | cut -c1-12), old: $(sha256sum "$PACKSYNC_OLD" | cut -c1-12)); one run each, page cache warm."
    echo "Both published the same generations."
    echo
    echo "| flag | step | new s | old s | new CPU s | old CPU s | new RSS KiB | old RSS KiB |"
    echo "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"
    local i
    for ((i = 0; i < ${#lines[@]}; i += 2)); do
        IFS='|' read -r flag step _ rn <<<"${lines[$i]}"
        IFS='|' read -r _ _ _ ro <<<"${lines[$((i + 1))]}"
        read -r sn cn mn <<<"$rn"
        read -r so co mo <<<"$ro"
        echo "| \`$flag\` | $step | $sn | $so | $cn | $co | $mn | $mo |"
    done
}
if [ -n "$out" ]; then report | tee "$out"; else report; fi
