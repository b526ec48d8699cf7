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
if [ -z "$fs_mode" ]; then
    if [ "$(id -u)" = 0 ] && command -v losetup >/dev/null && command -v mkfs.ext4 >/dev/null; then
        fs_mode=loop
    else
        fs_mode=dir
        echo "bench: not root or no losetup/mkfs.ext4: measuring on $bench_dir's own filesystem" >&2
    fi
fi
case "$fs_mode" in
dir)
    export BENCH_ROOT="$bench_dir"
    export BENCH_FS_NOTE="the work dir's own filesystem"
    ;;
loop)
    img="$bench_dir/fs.img"
    mnt="$bench_dir/fs"
    size=24G # sparse: the host holds only what is in use (trimmed after each tree)
    mkdir -p "$mnt"
    if mountpoint -q "$mnt"; then # left by an interrupted run
        dev="$(findmnt -n -o SOURCE "$mnt")"
        umount "$mnt"
        case "$dev" in /dev/loop*) losetup -d "$dev" 2>/dev/null || true ;; esac
    fi
    if [ ! -f "$img" ] || [ "$(cat "$img.size" 2>/dev/null)" != "$size" ]; then
        rm -f "$img" "$img.size"
        truncate -s "$size" "$img"
        mkfs.ext4 -q -F -E nodiscard "$img"
        echo "$size" >"$img.size"
    fi
    dev="$(losetup --direct-io=on -f --show "$img")"
    cleanup() {
        # Give the freed blocks back to the host, then detach.
        fstrim "$mnt" 2>/dev/null || true
        umount "$mnt" 2>/dev/null || umount -l "$mnt" 2>/dev/null || true
        losetup -d "$dev" 2>/dev/null || true
    }
    trap cleanup EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    mount -o nodiscard "$dev" "$mnt"
    export BENCH_ROOT="$mnt"
    host_fs="$(findmnt -n -o FSTYPE,OPTIONS -T "$bench_dir" | tr -s ' ')"
    export BENCH_FS_NOTE="a dedicated $size ext4 on a loop device (direct I/O) backed by $img on $host_fs"
    ;;
*)
    echo "bench: --fs takes loop or dir" >&2
    exit 2
    ;;
esac
export BENCH_FS_MODE="$fs_mode"

cd "$here/.."
# Not exec: the EXIT trap unmounts the loop filesystem afterwards.
python3 "$here/bench.py" "${args[@]}"
