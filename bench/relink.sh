#!/usr/bin/env bash
# bench/relink.sh: the repair of a live tree whose hardlinks drifted from
# its manifest (two of its files joined into one inode by hand), by this
# packsync and by PACKSYNC_OLD, one after the other on the same tree: peak
# RSS and wall time of the repair, the generation each published (the
# same), and rsync -a --delete of the same source beside it.
#
#   cargo build --release
#   bench/modes.sh --sizes 100000      # makes trees/modes/n100000-v1
#   PACKSYNC_OLD=/path/to/old/packsync bench/relink.sh 100000
#
# The tree is copied, and two of its files given the same bytes and
# mtime, so that once joined only their inode tells them apart. A second
# sync under a new label gives every live file a second link (the
# previous generation's), as after any update. STRACE=1: the repair's
# system calls (`strace -c -f`), their total and per entry, instead of
# its time.
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-100000}
P=$(realpath "${PACKSYNC:-target/release/packsync}")
OLD=${PACKSYNC_OLD:-}
ROOT=${BENCH_ROOT:-/tmp/packsync-bench}
SRC=$ROOT/trees/modes/n$N-v1
[ -d "$SRC" ] || { echo "no $SRC: run bench/modes.sh --sizes $N first" >&2; exit 2; }
W=$(mktemp -d "${TMPDIR:-/tmp}/packsync-relink.XXXXXX")
trap 'rm -rf "$W"' EXIT
cp -a "$SRC" "$W/src"
# The first and the last file by path: the same bytes and mtime.
mapfile -t PAIR < <(cd "$W/src" && find . -type f | sort | sed -n '1p;$p')
python3 - "$W/src" "${PAIR[@]}" <<'PY'
import os, sys
root, paths = sys.argv[1], sys.argv[2:]
for p in paths:
    full = os.path.join(root, p)
    d = os.path.dirname(full)
    st = os.stat(d)
    with open(full, "wb") as f:
        f.write(b"joined by hand\n")
    os.utime(full, ns=(1_700_000_000 * 10**9, 1_700_000_000 * 10**9))
    os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
PY
join() {  # $1: the live tree; the second path made a name of the first
    python3 - "$1" "${PAIR[@]}" <<'PY'
import os, sys
live, a, b = sys.argv[1], sys.argv[2], sys.argv[3]
d = os.path.dirname(os.path.join(live, b))
st = os.stat(d)
os.unlink(os.path.join(live, b))
os.link(os.path.join(live, a), os.path.join(live, b))
os.utime(d, ns=(st.st_atime_ns, st.st_mtime_ns))
PY
}
for b in "$P" ${OLD:+"$OLD"}; do
    rm -rf "$W/vol"; mkdir "$W/vol"
    "$b" sync -q "$W/src" "$W/vol/dest"
    "$b" sync -q --label 2.0.0 "$W/src" "$W/vol/dest"
    join "$(readlink -f "$W/vol/dest")"
    if [ -n "${STRACE:-}" ]; then
        strace -c -f -o "$W/strace" "$b" sync -q --label 2.0.0 "$W/src" "$W/vol/dest" 2>/dev/null
        calls=$(awk '$NF == "total" {print $(NF-2)}' "$W/strace")
        entries=$(find "$W/src" -mindepth 1 | wc -l)
        echo "$b repair: $calls calls, $(python3 -c "print(round($calls / $entries, 1))") an entry ($entries entries)"
    else
        /usr/bin/time -f "$b repair: %M KiB %e s" "$b" sync -q --label 2.0.0 "$W/src" "$W/vol/dest"
    fi
    "$b" verify "$W/vol/dest" >/dev/null
    echo "$b published $(basename "$(readlink "$W/vol/dest")")"
done
rm -rf "$W/vol"; mkdir "$W/vol"
rsync -a --delete "$W/src/" "$W/vol/rsync/"
join "$W/vol/rsync"
/usr/bin/time -f "rsync -a --delete onto the same drifted tree (it sees no change): %M KiB %e s" rsync -a --delete "$W/src/" "$W/vol/rsync/"
