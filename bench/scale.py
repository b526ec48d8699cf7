"""Scaling of packsync's time and peak RSS with the number of entries.

Run through bench/scale.sh. For each size N it builds (once, kept between
runs) a tree of N small files, 100 to a directory, two directory levels
deep, with fixed bytes and mtimes; then times, with the page cache warm and
flushed before each run: packsync's full copy into an empty destination
(durable, as it ships), its no-op re-sync, a 1% update (a fresh 1% of the
files each round grow by a byte and get a new mtime; put back afterwards),
and the no-op after it (the live generation's files then have two links,
one in the previous generation); the same four with `rsync -a --delete`;
and the no-op floor, bench/statwalk.c walking the source and the live tree
(lstat of every entry, one thread). Peak RSS is ru_maxrss (what
`/usr/bin/time -f %M` prints). Bytes per entry are the peak RSS above that
of the same command on a 100-entry tree, divided by the entries.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
MTIME_NS = 1_700_000_000_123_456_789
PER_DIR = 100
VERSION = 1
KINDS = ("full", "noop", "update", "noop2")


def generate(path, n):
    """n files of 0-64 bytes, PER_DIR to a directory, dirs `dNNN/dNNN`."""
    tmp = path + ".tmp"
    bench.rm_rf(tmp)
    rng = random.Random(n)
    leaves = -(-n // PER_DIR)
    made = 0
    for leaf in range(leaves):
        d = os.path.join(tmp, f"d{leaf // PER_DIR:04d}", f"d{leaf % PER_DIR:03d}")
        os.makedirs(d)
        for k in range(min(PER_DIR, n - made)):
            fd = os.open(os.path.join(d, f"f{k:03d}.txt"), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, rng.randbytes(rng.randint(0, 64)))
            os.utime(fd, ns=(MTIME_NS, MTIME_NS))
            os.close(fd)
            made += 1
    for dirpath, _, _ in os.walk(tmp, topdown=False):
        os.utime(dirpath, ns=(MTIME_NS, MTIME_NS))
    os.rename(tmp, path)


def touch_one_percent(src, n, rnd):
    """Grow a fresh 1% of the files by a byte, with a new mtime; returns
    what `restore` needs to put them back."""
    rng = random.Random(n * 1000 + rnd)
    picked = rng.sample(range(n), max(1, n // 100))
    saved = []
    for i in picked:
        leaf, k = divmod(i, PER_DIR)
        p = os.path.join(src, f"d{leaf // PER_DIR:04d}", f"d{leaf % PER_DIR:03d}", f"f{k:03d}.txt")
        with open(p, "ab") as f:
            f.write(b"x")
        os.utime(p, ns=(MTIME_NS, MTIME_NS + 1000 * (rnd + 1)))
        saved.append(p)
    return saved


def restore(saved):
    """Undo `touch_one_percent`: the same bytes and mtimes as generated
    (directories keep theirs: no name was added or removed)."""
    for p in saved:
        with open(p, "rb+") as f:
            f.truncate(os.fstat(f.fileno()).st_size - 1)
        os.utime(p, ns=(MTIME_NS, MTIME_NS))


def entries_of(n):
    leaves = -(-n // PER_DIR)
    return n + leaves + -(-leaves // PER_DIR)


class Scale:
    def __init__(self, args):
        self.args = args
        self.root = os.environ.get("BENCH_ROOT", "/tmp/packsync-bench")
        self.dir = os.path.abspath(os.environ.get("BENCH_DIR", "/tmp/packsync-bench"))
        self.logs = os.path.join(self.dir, "logs")
        os.makedirs(self.logs, exist_ok=True)
        ps = os.environ.get("PACKSYNC") or os.path.join(REPO, bench.SHIPPED)
        self.packsync_orig = os.path.abspath(ps)
        snap = os.path.join(self.dir, "bin", "packsync-under-test")
        shutil.copy2(self.packsync_orig, snap)
        self.packsync = snap
        with open(snap, "rb") as f:
            self.sha = hashlib.sha256(f.read()).hexdigest()
        self.rows = []

    def tree(self, n):
        base = os.path.join(self.root, "trees", "scale")
        os.makedirs(base, exist_ok=True)
        path = os.path.join(base, f"n{n}-v{VERSION}")
        if not os.path.isdir(path):
            bench.say(f"bench: generating a tree of {n} files ...")
            generate(path, n)
        return path

    def run(self, argv, tag):
        os.sync()
        r = bench.run_cmd(argv, os.path.join(self.logs, f"scale-{tag}.log"))
        if r.rc != 0:
            sys.exit(f"bench: {' '.join(argv)} failed (exit {r.rc}); see {self.logs}/scale-{tag}.log")
        return r

    def measure(self, n):
        src = self.tree(n)
        work = os.path.join(self.root, "run", "scale")
        row = {"files": n, "entries": entries_of(n)}
        tools = ["packsync"] + ([] if self.args.no_rsync else ["rsync"])
        runs = {(t, k): [] for t in tools for k in KINDS}
        runs[("floor", "noop")] = []
        # Tools alternate and their order rotates every round: the first run
        # to grow the page cache into memory the machine has not touched yet
        # pays for it (first-touch faults cost several µs a page in a VM).
        for rnd in range(self.args.rounds):
            for tool in bench.Bench.rotate(tools, rnd):
                bench.rm_rf(work)
                os.makedirs(work)
                dest = os.path.join(work, "dest")
                if tool == "packsync":
                    argv = [self.packsync, "sync", "-q", src, dest]
                else:
                    os.mkdir(dest)
                    argv = ["rsync", "-a", "--delete", src + "/", dest + "/"]
                runs[(tool, "full")].append(self.run(argv, f"{tool}-full"))
                runs[(tool, "noop")].append(self.run(argv, f"{tool}-noop"))
                if tool == "packsync":
                    live = os.path.realpath(dest)
                    walk = [os.environ["STATWALK_BIN"], src, live]
                    runs[("floor", "noop")].append(self.run(walk, "floor-noop"))
                saved = touch_one_percent(src, n, rnd)
                try:
                    runs[(tool, "update")].append(self.run(argv, f"{tool}-update"))
                    runs[(tool, "noop2")].append(self.run(argv, f"{tool}-noop2"))
                finally:
                    restore(saved)
        bench.rm_rf(work)
        for (tool, name), rs in runs.items():
            row[f"{tool}_{name}_s"] = statistics.median(r.seconds for r in rs)
            row[f"{tool}_{name}_rss_kib"] = statistics.median(r.rss for r in rs)
            row[f"{tool}_{name}_other"] = statistics.median(r.other or 0 for r in rs)
        return row

    def go(self):
        self.base = self.measure(100)
        for n in self.args.sizes:
            bench.say(f"bench: {n} files ...")
            self.rows.append(self.measure(n))


def report(s, cmdline):
    L = [f"# packsync scaling: {datetime.datetime.now():%Y-%m-%d %H:%M}", ""]
    L.append(f"Reproduce: `{cmdline}`")
    L.append("")
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    L.append(f"Machine: {os.cpu_count()} cores, Linux {platform.release()}; filesystem: "
             f"{os.environ.get('BENCH_FS_NOTE', s.root)}; packsync: `{s.packsync_orig}`, "
             f"{bench.version([s.packsync, '--version'])}, sha256 {s.sha[:16]} (repo at "
             f"{commit}); rsync: {bench.version(['rsync', '--version'])}.")
    L.append("")
    L.append("Trees of N files of 0–64 bytes, 100 to a directory. Page cache warm, flushed")
    L.append("(`sync`) before each run; packsync durable as it ships. Seconds are medians of")
    L.append(f"{s.args.rounds} rounds, the tools alternated and their order rotated every round;")
    L.append("µs/entry is seconds per entry; RSS is peak RSS (`time -f %M`); B/entry is the")
    L.append("RSS above the same command's on a 100-file tree, per entry.")
    L.append("")
    for name, what in (("full", "Full copy into an empty destination"),
                       ("noop", "No-op re-sync (floor: bench/statwalk.c on the source and the live tree)"),
                       ("update", "1% update"),
                       ("noop2", "No-op after the update (live files with two links)")):
        tools = ["packsync"] + ([] if s.args.no_rsync else ["rsync"]) + (["floor"] if name == "noop" else [])
        L.append(f"## {what}")
        L.append("")
        hdr = "| entries |"
        sep = "| ---: |"
        for t in tools:
            hdr += f" {t} s | µs/entry | peak RSS | B/entry |"
            sep += " ---: | ---: | ---: | ---: |"
        L.append(hdr)
        L.append(sep)
        for r in s.rows:
            line = f"| {r['entries']:,} |"
            for t in tools:
                sec = r[f"{t}_{name}_s"]
                rss = r[f"{t}_{name}_rss_kib"]
                per = (rss - s.base[f"{t}_{name}_rss_kib"]) * 1024 / r["entries"]
                line += (f" {bench.fmt_s(sec)} | {sec / r['entries'] * 1e6:.1f} "
                         f"| {bench.fmt_kib(rss)} | {per:.0f} |")
            L.append(line)
        L.append("")
        L.append(f"Baseline (100 files): " + ", ".join(
            f"{t} {bench.fmt_kib(s.base[f'{t}_{name}_rss_kib'])}" for t in tools) + ".")
        L.append("")
    tools = ["packsync"] + ([] if s.args.no_rsync else ["rsync"])
    others = [r[f"{t}_{n}_other"] for r in s.rows for t in tools for n in KINDS]
    L.append(f"Other processes used a median {statistics.median(others):.0%} of the machine's "
             "CPU during these runs (this counts the kernel's writeback, journal and loop")
    L.append("threads too, which work for a durable sync while it flushes).")
    L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(prog="bench/scale.sh")
    ap.add_argument("--sizes", default="10000,100000,1000000",
                    type=lambda v: [int(x) for x in v.split(",")])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--no-rsync", action="store_true")
    ap.add_argument("--out")
    args = ap.parse_args()
    s = Scale(args)
    s.go()
    md = report(s, os.environ.get("BENCH_CMDLINE", "bench/scale.sh"))
    out = args.out or os.path.join(HERE, "results", f"{datetime.date.today():%Y-%m-%d}-scale.md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(md)
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump({"base": s.base, "rows": s.rows}, f, indent=1)
    print(md)
    bench.say(f"bench: report written to {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
