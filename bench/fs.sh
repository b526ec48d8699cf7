# Sourced by bench/run.sh and bench/scale.sh: sets up the filesystem the
# benchmarks run on and exports BENCH_ROOT, BENCH_FS_NOTE and BENCH_FS_MODE.
#
#   bench_fs_setup MODE BENCH_DIR     MODE: loop, dir, or empty for the default
#
# loop (the default as root): a dedicated ext4 made in BENCH_DIR/fs.img,
#   loop-mounted with direct I/O and without online discard at BENCH_DIR/fs,
#   trimmed and unmounted at exit. The machine's own root filesystem may be
#   mounted with `discard` and shared with other work; this one is not.
#   BENCH_FS_SIZE (default 24G) and BENCH_MKFS_OPTS (default "-i 4096")
#   change the image: 3x10^6 entries fit with
#   BENCH_MKFS_OPTS="-i 2048 -I 256 -O inline_data" (small files in their inodes).
# dir: BENCH_DIR's own filesystem (to measure NFS or another volume).

bench_fs_setup() {
    local mode="$1" dir="$2"
    if [ -z "$mode" ]; then
        if [ "$(id -u)" = 0 ] && command -v losetup >/dev/null && command -v mkfs.ext4 >/dev/null; then
            mode=loop
        else
            mode=dir
            echo "bench: not root or no losetup/mkfs.ext4: measuring on $dir's own filesystem" >&2
        fi
    fi
    case "$mode" in
    dir)
        export BENCH_ROOT="$dir"
        export BENCH_FS_NOTE="the work dir's own filesystem"
        ;;
    loop)
        # Sparse: the host holds only what is in use.
        local img="$dir/fs.img" size="${BENCH_FS_SIZE:-24G}"
        # One inode per 4 KiB: bench/scale.sh copies a tree of 10^6 files.
        local mkfs_opts="${BENCH_MKFS_OPTS:--i 4096}"
        bench_mnt="$dir/fs"
        mkdir -p "$bench_mnt"
        if mountpoint -q "$bench_mnt"; then # left by an interrupted run
            local old
            old="$(findmnt -n -o SOURCE "$bench_mnt")"
            umount "$bench_mnt"
            case "$old" in /dev/loop*) losetup -d "$old" 2>/dev/null || true ;; esac
        fi
        if [ ! -f "$img" ] || [ "$(cat "$img.size" 2>/dev/null)" != "$size $mkfs_opts" ]; then
            rm -f "$img" "$img.size"
            truncate -s "$size" "$img"
            # shellcheck disable=SC2086
            mkfs.ext4 -q -F -E nodiscard $mkfs_opts "$img"
            echo "$size $mkfs_opts" >"$img.size"
        fi
        bench_dev="$(losetup --direct-io=on -f --show "$img")"
        trap bench_fs_cleanup EXIT
        trap 'exit 130' INT
        trap 'exit 143' TERM
        mount -o nodiscard "$bench_dev" "$bench_mnt"
        export BENCH_ROOT="$bench_mnt"
        local host_fs
        host_fs="$(findmnt -n -o FSTYPE,OPTIONS -T "$dir" | tr -s ' ')"
        export BENCH_FS_NOTE="a dedicated $size ext4 (mkfs.ext4 $mkfs_opts) on a loop device (direct I/O) backed by $img on $host_fs"
        ;;
    *)
        echo "bench: --fs takes loop or dir" >&2
        exit 2
        ;;
    esac
    export BENCH_FS_MODE="$mode"
}

bench_fs_cleanup() {
    # Give the freed blocks back to the host, then detach.
    fstrim "$bench_mnt" 2>/dev/null || true
    umount "$bench_mnt" 2>/dev/null || umount -l "$bench_mnt" 2>/dev/null || true
    losetup -d "$bench_dev" 2>/dev/null || true
}
