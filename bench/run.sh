#!/usr/bin/env bash
# Side-by-side benchmark: packsync against rsync -a --delete, cp -a, the
# atomic rsync recipe and a floor, on generated trees.
#
#   bench/run.sh [--quick] [--fs loop|dir] [--rounds N] [--cache cold|warm|both]
#                [--trees a,b] [--no-strace] [--no-nofsync] [--regen] [--keep]
#                [--out FILE]
#
# Environment:
#   PACKSYNC   packsync binary (default: target/release/packsync of this repo);
#              when it is missing, only the other tools are measured
#   BENCH_DIR  work dir for trees, destinations and logs (default
#              /tmp/packsync-bench)
#
# --fs loop (the default when run as root): trees and destinations live on a
#   dedicated ext4 made in $BENCH_DIR/fs.img, loop-mounted with direct I/O at
#   $BENCH_DIR/fs and unmounted at exit. --fs dir: on $BENCH_DIR's own
#   filesystem (use it to measure NFS or another volume).
#
# Needs: python3 (3.9+), rsync, GNU cp, gcc or cc, strace (optional); root for
# the cold-cache runs (drop_caches) and --fs loop. See BENCHMARKS.md.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

cmdline="bench/run.sh"
for arg in "$@"; do
    if [[ "$arg" =~ ^[A-Za-z0-9_./,=:+-]+$ ]]; then cmdline+=" $arg"; else cmdline+=" $(printf '%q' "$arg")"; fi
done
export BENCH_CMDLINE="$cmdline"
fs_mode=""
for arg in "$@"; do
    case "$arg" in
    -h | --help)
        sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//'
        echo
        exec python3 "$here/bench.py" --help
        ;;
    esac
done
args=()
while [ $# -gt 0 ]; do
    case "$1" in
    --fs) fs_mode="${2:-}"; shift 2 ;;
    --fs=*) fs_mode="${1#--fs=}"; shift ;;
    *) args+=("$1"); shift ;;
    esac
done

missing=()
for tool in python3 rsync cp; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
cc="$(command -v gcc || command -v cc || true)"
[ -n "$cc" ] || missing+=("gcc")
if [ "${#missing[@]}" -gt 0 ]; then
    echo "bench: missing: ${missing[*]} (Debian: apt-get install -y ${missing[*]})" >&2
    exit 2
fi
if ! command -v strace >/dev/null; then
    echo "bench: strace not found: syscall counts are skipped (apt-get install -y strace)" >&2
    args+=(--no-strace)
fi

bench_dir="${BENCH_DIR:-/tmp/packsync-bench}"
mkdir -p "$bench_dir/bin"
bench_dir="$(cd "$bench_dir" && pwd)"
for prog in floor measure; do
    if [ ! -x "$bench_dir/bin/$prog" ] || [ "$here/$prog.c" -nt "$bench_dir/bin/$prog" ]; then
        "$cc" -O2 -Wall -Wextra -o "$bench_dir/bin/$prog" "$here/$prog.c"
    fi
done
export FLOOR_BIN="$bench_dir/bin/floor" MEASURE_BIN="$bench_dir/bin/measure"

# The filesystem under test.
# shellcheck source=bench/fs.sh
. "$here/fs.sh"
bench_fs_setup "$fs_mode" "$bench_dir"

cd "$here/.."
# Not exec: the EXIT trap unmounts the loop filesystem afterwards.
python3 "$here/bench.py" "${args[@]}"
