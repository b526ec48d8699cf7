#!/usr/bin/env bash
# How packsync's time and peak memory grow with the number of entries:
# full copy, no-op re-sync, 1% update and the no-op after it, on trees of
# 10^4, 10^5 and 10^6 small files, next to rsync -a --delete and (no-op) a
# bare stat walk of both trees (bench/statwalk.c).
#
#   bench/scale.sh [--sizes 10000,100000,1000000] [--rounds N] [--fs loop|dir]
#                  [--no-rsync] [--out FILE]
#
# Writes bench/results/<date>-scale.md (and .json). Needs what bench/run.sh
# needs (python3, rsync, gcc; root for --fs loop), and about 12 GB free in the
# work dir ($BENCH_DIR, default /tmp/packsync-bench) for 10^6 entries.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cmdline="bench/scale.sh"
for arg in "$@"; do cmdline+=" $(printf '%q' "$arg")"; done
export BENCH_CMDLINE="$cmdline"
fs_mode=""
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --fs) fs_mode="${2:-}"; shift 2 ;;
    --fs=*) fs_mode="${1#--fs=}"; shift ;;
    *) args+=("$1"); shift ;;
    esac
done

cc="$(command -v gcc || command -v cc || true)"
for tool in python3 rsync; do
    command -v "$tool" >/dev/null || { echo "bench: missing: $tool" >&2; exit 2; }
done
[ -n "$cc" ] || { echo "bench: missing: gcc" >&2; exit 2; }

bench_dir="${BENCH_DIR:-/tmp/packsync-bench}"
mkdir -p "$bench_dir/bin"
bench_dir="$(cd "$bench_dir" && pwd)"
if [ ! -x "$bench_dir/bin/measure" ] || [ "$here/measure.c" -nt "$bench_dir/bin/measure" ]; then
    "$cc" -O2 -Wall -Wextra -o "$bench_dir/bin/measure" "$here/measure.c"
fi
if [ ! -x "$bench_dir/bin/statwalk" ] || [ "$here/statwalk.c" -nt "$bench_dir/bin/statwalk" ]; then
    "$cc" -O2 -Wall -Wextra -o "$bench_dir/bin/statwalk" "$here/statwalk.c"
fi
export MEASURE_BIN="$bench_dir/bin/measure" FLOOR_BIN="$bench_dir/bin/floor"
export STATWALK_BIN="$bench_dir/bin/statwalk"

# shellcheck source=bench/fs.sh
. "$here/fs.sh"
bench_fs_setup "$fs_mode" "$bench_dir"

cd "$here/.."
python3 "$here/scale.py" "${args[@]}"
