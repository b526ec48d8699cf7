#!/usr/bin/env bash
# bench/flush.sh: how long a sync takes to make its tree durable with one
# syncfs(2), with an fsync per file and directory, and with no flush at all,
# on ext4 on a loop device, on tmpfs, and on the filesystem holding $TMPDIR.
# The figures in the README's "Durability" section come from here.
#
#   cargo build --release --features fault-injection
#   sudo bench/flush.sh            # RUNS=9 by default; prints median, min, max
#
# Needs root (mount). The fault-injection build honours PACKSYNC_TEST_FLUSH
# (each | syncfs), which picks the flush method whatever the filesystem.
set -euo pipefail
cd "$(dirname "$0")/.."
P=${PACKSYNC:-target/release/packsync}
RUNS=${RUNS:-9}
W=$(mktemp -d "${TMPDIR:-/tmp}/packsync-flush.XXXXXX")
mkdir -p "$W/src" "$W/loop" "$W/tmpfs" "$W/host"
cleanup() { umount "$W/loop" "$W/tmpfs" 2>/dev/null || true; rm -rf "$W"; }
trap cleanup EXIT

# 2000 files of 4 KiB in 50 directories, and 4 files of 8 MiB: 40 MB.
python3 - "$W/src" <<'PY'
import os, sys
root = sys.argv[1]
for d in range(50):
    os.makedirs(f"{root}/pack{d:02}/actions", exist_ok=True)
    for f in range(40):
        with open(f"{root}/pack{d:02}/actions/a{f:02}.py", "wb") as fh:
            fh.write(os.urandom(4096))
for b in range(4):
    with open(f"{root}/blob{b}.bin", "wb") as fh:
        fh.write(os.urandom(8 << 20))
PY
truncate -s 1G "$W/ext4.img"
mkfs.ext4 -q "$W/ext4.img"
mount -o loop "$W/ext4.img" "$W/loop"
mount -t tmpfs -o size=1g packsync-flush "$W/tmpfs"

for fs in loop tmpfs host; do
  for mode in syncfs each none; do
    ts=()
    for _ in $(seq "$RUNS"); do
      rm -rf "$W/$fs/packs" "$W/$fs/.packs.packsync"
      sync
      extra=()
      [ "$mode" = none ] && extra=(--no-fsync)
      t0=$(date +%s%N)
      PACKSYNC_TEST_FLUSH=$mode "$P" sync -q "${extra[@]}" "$W/src" "$W/$fs/packs"
      t1=$(date +%s%N)
      ts+=($(( (t1 - t0) / 1000000 )))
    done
    printf '%-6s %-7s ' "$fs" "$mode"
    printf '%s\n' "${ts[@]}" | sort -n | awk '{ a[NR] = $1 } END {
      printf "median %.3f s (min %.3f, max %.3f)\n", a[int((NR + 1) / 2)] / 1000, a[1] / 1000, a[NR] / 1000 }'
  done
done
