#!/usr/bin/env bash
# How the one-shot sync's thread count weighs, cold: full copy, no-op, 1%
# update and the no-op after it on a bench/scale.sh tree, the page cache
# dropped before every run (with --warm only flushed, as bench/scale.sh
# does), for each thread count given (RAYON_NUM_THREADS), alternated,
# ROUNDS times. The median seconds and peak RSS of each.
#
#   bench/threads.sh [--files N] [--rounds R] [--warm] [--dest-root DIR] THREADS...
#
# e.g. bench/threads.sh --files 100000 --rounds 5 16 8
# The tree is the one bench/scale.sh builds (kept in its work dir, on the
# loop-mounted ext4 of bench/fs.sh); DEST goes there too, or under
# --dest-root (a network mount: NETFS_MNT_A of ../shared/netfs-rig.sh).
# A GlusterFS rig volume answers each request 1 ms late after
#   gluster volume set netfsrig delay-gen.enable stat,lookup,create,link,mkdir,open,write,setattr,readdirp,rename,fsync,flush
#   gluster volume set netfsrig delay-gen.delay-percentage 100
#   gluster volume set netfsrig delay-gen.delay-duration 1000
# (`gluster volume reset netfsrig delay-gen.enable` and the others undo it).
# Needs root (drop_caches, the loop mount), python3 and gcc.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
files=100000 rounds=3 dest_root="" warm=0 threads=()
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --files) files="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --warm) warm=1; shift ;;
    --dest-root) dest_root="$2"; shift 2 ;;
    *) threads+=("$1"); shift ;;
    esac
done
[ ${#threads[@]} -gt 0 ] || { echo "bench: name one thread count or more" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "bench: needs root (drop_caches, the loop mount)" >&2; exit 2; }

bench_dir="${BENCH_DIR:-/tmp/packsync-bench}"
mkdir -p "$bench_dir"
bench_dir="$(cd "$bench_dir" && pwd)"
. "$here/fs.sh"
bench_fs_setup "" "$bench_dir"
export BENCH_DIR="$bench_dir" BENCH_FILES="$files" BENCH_ROUNDS="$rounds" BENCH_WARM="$warm"
export BENCH_DEST_ROOT="${dest_root:-$BENCH_ROOT/run}" BENCH_THREADS="${threads[*]}"
cd "$here/.."
python3 - <<'EOF'
import os, statistics, subprocess, sys, shutil
sys.path.insert(0, "bench")
import bench, scale

n = int(os.environ["BENCH_FILES"])
rounds = int(os.environ["BENCH_ROUNDS"])
threads = os.environ["BENCH_THREADS"].split()
warm = os.environ["BENCH_WARM"] == "1"
ps = os.path.abspath(os.environ.get("PACKSYNC") or bench.SHIPPED)
src = os.path.join(os.environ["BENCH_ROOT"], "trees", "scale", f"n{n}-v{scale.VERSION}")
if not os.path.isdir(src):
    bench.say(f"bench: generating a tree of {n} files ...")
    scale.generate(src, n)
work = os.path.join(os.environ["BENCH_DEST_ROOT"], "threads")
got = {}
for rnd in range(rounds):
    for t in bench.Bench.rotate(threads, rnd):
        bench.rm_rf(work)
        os.makedirs(work)
        argv = [ps, "sync", "-q", src, os.path.join(work, "dest")]
        env = dict(os.environ, RAYON_NUM_THREADS=t)

        def run(kind):
            os.sync()
            if not warm:
                with open("/proc/sys/vm/drop_caches", "w") as f:
                    f.write("3\n")
            r = subprocess.run(["/usr/bin/time", "-f", "%e %M"] + argv, env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
            if r.returncode != 0:
                sys.exit(f"bench: {' '.join(argv)} failed: {r.stderr.strip()}")
            sec, kib = r.stderr.split()[-2:]
            got.setdefault((t, kind), []).append((float(sec), int(kib)))

        run("full")
        run("noop")
        saved = scale.touch_one_percent(src, n, rnd)
        try:
            run("update")
            run("noop2")
        finally:
            scale.restore(saved)
bench.rm_rf(work)
cache = "flushed (warm)" if warm else "dropped"
print(f"{n} files, DEST under {work}, caches {cache} before each run, medians of {rounds}:")
print("| threads | full copy | no-op | 1% update | no-op after it |")
print("| ---: | --- | --- | --- | --- |")
for t in threads:
    cells = []
    for kind in scale.KINDS:
        rs = got[(t, kind)]
        cells.append(f"{statistics.median(s for s, _ in rs):.2f} s, "
                     f"{statistics.median(k for _, k in rs):,} KiB")
    print(f"| {t} | " + " | ".join(cells) + " |")
EOF
