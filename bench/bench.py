"""Side-by-side benchmark of packsync against rsync, cp -a and a floor.

Run it through bench/run.sh, which checks the tools and builds the floor;
`bench/run.sh --help` lists the options. Everything here uses the Python
standard library only.
"""

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import trees  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
# The binary as it ships: statically linked (README "Building the static binary").
SHIPPED = "target/x86_64-unknown-linux-gnu/release/packsync"
BUILD = ("RUSTFLAGS='-C target-feature=+crt-static' "
         "cargo build --release --target x86_64-unknown-linux-gnu")

TARGETS = {
    "full_rsync": 0.70,
    "full_cp": 1.00,
    "noop_rsync": 0.30,
    "update_recipe": 0.50,
}

LABELS = {
    "packsync": "packsync",
    "packsync-nofsync": "packsync --no-fsync",
    "rsync": "rsync -a --delete",
    "cp": "cp -a",
    "cp-sync": "cp -a + sync -f",
    "floor": "floor",
    "recipe": "atomic rsync recipe",
}


def say(msg):
    print(msg, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------
# running and measuring one command


def _children(pid):
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _hwm_kib(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Sampler(threading.Thread):
    """Polls the peak RSS (VmHWM) of every process in a tree, so the sum over
    a multi-process tool (rsync runs three) can be reported. Used only in the
    untimed check runs, never in timed ones."""

    def __init__(self, pid, skip_root=False):
        super().__init__(daemon=True)
        self.root, self.skip_root = pid, skip_root
        self.peaks = {}
        self.done = threading.Event()

    def run(self):
        while not self.done.is_set():
            todo = [self.root]
            while todo:
                p = todo.pop()
                todo += _children(p)
                if p == self.root and self.skip_root:
                    continue
                v = _hwm_kib(p)
                if v is not None:
                    self.peaks[p] = max(v, self.peaks.get(p, 0))
            self.done.wait(0.003)


MEASURE = os.environ.get("MEASURE_BIN", "measure")
NCPU = os.cpu_count() or 1


class Run:
    """What one command cost: wall seconds, exit code, peak RSS (KiB) of its
    largest process, its CPU seconds, and the share of the machine that other
    processes used meanwhile."""

    def __init__(self, line, sampler):
        wall, rss, code, cpu, busy = (int(x) for x in line.split())
        self.seconds = wall / 1e9
        self.rss = rss
        self.rc = code
        self.cpu = cpu / 1e9
        self.other = (None if busy < 0 or wall == 0
                      else max(0.0, (busy - cpu) / (wall * NCPU)))
        self.sampler = sampler


def run_cmd(argv, log, sample=False, measure_file=None):
    """Run argv under bench/measure.c; output goes to `log`."""
    out = measure_file or os.path.join(os.path.dirname(log), ".measure")
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, ("$ " + shlex.join(argv) + "\n").encode())
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_DUP2, fd, 1),
        (os.POSIX_SPAWN_DUP2, fd, 2),
        (os.POSIX_SPAWN_CLOSE, fd),
    ]
    full = [MEASURE, out] + list(argv)
    pid = os.posix_spawnp(full[0], full, os.environ, file_actions=actions)
    sampler = None
    if sample:
        sampler = Sampler(pid, skip_root=True)
        sampler.start()
    _, status, _ = os.wait4(pid, 0)
    os.close(fd)
    if sampler:
        sampler.done.set()
        sampler.join()
    if os.waitstatus_to_exitcode(status) != 0:
        raise RuntimeError(f"measure failed on {shlex.join(argv)}: see {log}")
    with open(out) as f:
        return Run(f.read(), sampler)


def tail(path, n=6):
    """The last lines a command printed (the logged command lines left out)."""
    try:
        with open(path, errors="replace") as f:
            lines = [x for x in f.readlines() if not x.startswith("$ ")]
        return " | ".join(x.strip() for x in lines[-n:]) or "no output"
    except OSError:
        return ""


# --------------------------------------------------------------------------
# page cache


class Cache:
    def __init__(self):
        self.can_drop = True
        try:
            self.drop()
        except OSError as e:
            self.can_drop = False
            self.why = str(e)

    @staticmethod
    def drop():
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")

    def prepare(self, mode):
        """Before every timed run: flush dirty pages (so one tool's writeback
        is never charged to the next), and in cold mode drop the caches."""
        if mode == "cold":
            self.drop()
        else:
            os.sync()


def warm_up(root):
    """Read every file and stat every entry, so the tree is in page cache."""
    for dirpath, dirnames, filenames in os.walk(root):
        for n in filenames:
            p = os.path.join(dirpath, n)
            if not os.path.islink(p):
                try:
                    with open(p, "rb") as f:
                        while f.read(1 << 20):
                            pass
                except OSError:
                    pass


def rm_rf(path):
    if os.path.lexists(path):
        subprocess.run(["rm", "-rf", "--", path], check=True)


# --------------------------------------------------------------------------
# the benchmark


class Bench:
    def __init__(self, args):
        self.args = args
        self.scale = "quick" if args.quick else "full"
        self.rounds = args.rounds or (3 if args.quick else 5)
        self.dir = os.path.abspath(os.environ.get("BENCH_DIR", "/tmp/packsync-bench"))
        self.packsync = os.environ.get("PACKSYNC") or os.path.join(REPO, SHIPPED)
        self.packsync = os.path.abspath(self.packsync)
        self.floor = os.environ["FLOOR_BIN"]
        self.root = os.path.abspath(os.environ.get("BENCH_ROOT", self.dir))
        self.have_packsync = os.access(self.packsync, os.X_OK) and os.path.isfile(self.packsync)
        self.packsync_orig = self.packsync
        self.packsync_sha = None
        if self.have_packsync:
            # Run a private copy: a rebuild during the run must not change the
            # binary under test halfway through.
            os.makedirs(os.path.join(self.dir, "bin"), exist_ok=True)
            snap = os.path.join(self.dir, "bin", "packsync-under-test")
            shutil.copy2(self.packsync, snap)
            with open(snap, "rb") as f:
                self.packsync_sha = hashlib.sha256(f.read()).hexdigest()
            self.packsync = snap
        self.with_nofsync = self.have_packsync and not args.no_nofsync
        self.strace = not args.no_strace and shutil.which("strace") is not None
        self.cache = Cache()
        if args.cache == "both":
            self.cache_modes = ["cold", "warm"]
        else:
            self.cache_modes = [args.cache]
        if not self.cache.can_drop and "cold" in self.cache_modes:
            say(f"bench: cannot drop the page cache ({self.cache.why}); measuring warm only")
            self.cache_modes = ["warm"]
        self.tree_names = args.trees.split(",") if args.trees else list(trees.TREE_NAMES)
        for t in self.tree_names:
            if t not in trees.TREE_NAMES:
                sys.exit(f"bench: unknown tree {t!r}; known: {', '.join(trees.TREE_NAMES)}")
        self.results = []  # one dict per timed run
        self.checks = []   # correctness and memory checks
        self.straces = []  # syscall counts
        self.tree_info = {}
        self.skipped = {}
        self.failed = {}   # (tree, scenario, tool) -> message
        self.logs = os.path.join(self.dir, "logs")
        self.run_dir = os.path.join(self.root, "run")

    # ---- trees ----------------------------------------------------------

    def tree(self, name):
        base = os.path.join(self.root, "trees", self.scale)
        os.makedirs(base, exist_ok=True)
        path = os.path.join(base, name)
        stamp_path = path + ".json"
        want = {
            "generator": trees.GENERATOR_VERSION,
            "params": trees.SCALES[self.scale].get(name, trees.REALVENV_PACKAGES),
            "python": platform.python_version() if name == "realvenv" else None,
        }
        if not self.args.regen and os.path.isdir(path) and os.path.exists(stamp_path):
            with open(stamp_path) as f:
                stamp = json.load(f)
            if stamp.get("want") == want:
                return path, stamp
        rm_rf(path)
        rm_rf(stamp_path)
        say(f"bench: generating tree {name} ({self.scale}) ...")
        t0 = time.perf_counter()
        with open(os.path.join(self.logs, f"gen-{name}.log"), "w") as log:
            info, err = trees.generate(name, self.scale, path + ".tmp", log=log)
        if err:
            rm_rf(path + ".tmp")
            return None, err
        os.rename(path + ".tmp", path)
        stamp = {"want": want, "info": info, "census": trees.census(path)}
        with open(stamp_path, "w") as f:
            json.dump(stamp, f, indent=1)
        say(f"bench: tree {name}: {stamp['census']['entries']} entries in {time.perf_counter() - t0:.1f} s")
        return path, stamp

    # ---- helpers ----------------------------------------------------------

    def log(self, tree, scenario, tool):
        return os.path.join(self.logs, f"{tree}-{scenario}-{tool}.log")

    def record(self, tree, scenario, cache, tool, rnd, run, extra=None):
        r = {"tree": tree, "scenario": scenario, "cache": cache, "tool": tool,
             "round": rnd, "seconds": run.seconds, "rc": run.rc, "maxrss_kib": run.rss,
             "cpu_seconds": run.cpu, "other_load": run.other}
        if extra:
            r.update(extra)
        self.results.append(r)

    def fail(self, tree, scenario, tool, rc, log):
        msg = f"exit {rc}: {tail(log, 3)}"
        self.failed[(tree, scenario, tool)] = msg
        say(f"bench: {tool} failed on {tree}/{scenario} ({msg}); dropping it from this scenario")

    def verify(self, src, dst):
        """Lines of `rsync -a -n -i -c --delete src/ dst/`: 0 means dst holds
        exactly src (entries, types, bytes, modes, mtimes, owners, links)."""
        p = subprocess.run(["rsync", "-a", "-n", "-i", "-c", "--delete", src + "/", dst + "/"],
                           capture_output=True, text=True)
        if p.returncode != 0:
            return None, p.stderr.strip().splitlines()[-1:] or [f"rsync exit {p.returncode}"]
        lines = [line for line in p.stdout.splitlines() if line.strip()]
        return len(lines), lines[:5]

    @staticmethod
    def rotate(tools, rnd):
        k = rnd % len(tools)
        return tools[k:] + tools[:k]

    # ---- scenario 1: full copy into an empty destination ---------------------

    def full_copy_tools(self):
        tools = []
        if self.have_packsync:
            tools.append("packsync")
            if self.with_nofsync:
                tools.append("packsync-nofsync")
        return tools + ["rsync", "cp", "cp-sync", "floor"]

    def full_copy_cmd(self, tool, src, base):
        """(prepare destination, argv, the path that ends up holding the tree)"""
        rm_rf(base)
        os.makedirs(base)
        dest = os.path.join(base, "dest")
        if tool == "packsync":
            return [self.packsync, "sync", src, dest], dest
        if tool == "packsync-nofsync":
            return [self.packsync, "sync", "--no-fsync", src, dest], dest
        os.mkdir(dest)
        if tool == "rsync":
            return ["rsync", "-a", "--delete", src + "/", dest + "/"], dest
        if tool == "cp":
            return ["cp", "-a", src + "/.", dest + "/"], dest
        if tool == "cp-sync":
            # For reference: cp -a made durable like packsync (one syncfs).
            return ["sh", "-c", 'cp -a "$1"/. "$2"/ && sync -f "$2"', "cp-sync", src, dest], dest
        if tool == "floor":
            return [self.floor, src, dest], dest
        raise ValueError(tool)

    def scenario_full(self, name, src, entries):
        tools = self.full_copy_tools()
        root = os.path.join(self.run_dir, name, "full")
        # Untimed check run per tool: correctness and the RSS of every process.
        for tool in tools:
            argv, dest = self.full_copy_cmd(tool, src, os.path.join(root, tool))
            self.cache.prepare("warm")
            log = self.log(name, "full", tool)
            run = run_cmd(argv, log, sample=True)
            smp = run.sampler
            if run.rc != 0:
                self.fail(name, "full", tool, run.rc, log)
                continue
            diff, sample = (None, ["not a mirror: no metadata"]) if tool == "floor" else self.verify(src, dest)
            self.checks.append({"tree": name, "scenario": "full", "tool": tool,
                                "diff_lines": diff, "diff_sample": sample,
                                "maxrss_kib": run.rss, "rss_sum_kib": sum(smp.peaks.values()),
                                "procs": len(smp.peaks)})
            if diff:
                say(f"bench: {tool} on {name}: {diff} differences from the source, e.g. {sample[:2]}")
        # strace run per tool: syscalls per entry.
        if self.strace:
            for tool in tools:
                if (name, "full", tool) in self.failed or tool == "cp-sync":
                    continue
                argv, dest = self.full_copy_cmd(tool, src, os.path.join(root, tool))
                out = os.path.join(self.logs, f"strace-{name}-{tool}.txt")
                self.cache.prepare("warm")
                run = run_cmd(["strace", "-c", "-f", "-o", out, "--"] + argv,
                              self.log(name, "full", tool))
                total, top = parse_strace(out)
                self.straces.append({"tree": name, "tool": tool, "calls": total,
                                     "entries": entries, "rc": run.rc, "top": top})
        # Timed rounds, tools alternated, order rotated every round.
        for cache in self.cache_modes:
            if cache == "warm":
                warm_up(src)
            for rnd in range(self.rounds):
                for tool in self.rotate(tools, rnd):
                    if (name, "full", tool) in self.failed:
                        continue
                    argv, dest = self.full_copy_cmd(tool, src, os.path.join(root, tool))
                    self.cache.prepare(cache)
                    log = self.log(name, "full", tool)
                    run = run_cmd(argv, log)
                    if run.rc != 0:
                        self.fail(name, "full", tool, run.rc, log)
                        continue
                    self.record(name, "full", cache, tool, rnd, run)
        rm_rf(root)

    # ---- scenarios 2 and 3: no-op re-sync, then 1% updates --------------------

    def scenario_noop_update(self, name, src):
        base = os.path.join(self.run_dir, name)
        work = os.path.join(base, "work")  # a copy of the tree that updates modify
        rm_rf(work)
        os.makedirs(base, exist_ok=True)
        subprocess.run(["cp", "-a", src, work], check=True)

        dest = {}
        # Initial state of every destination (untimed).
        ps = []
        if self.have_packsync:
            ps.append("packsync")
            if self.with_nofsync:
                ps.append("packsync-nofsync")
        for tool in ps:
            d = os.path.join(base, tool, "dest")
            rm_rf(os.path.dirname(d))
            os.makedirs(os.path.dirname(d))
            extra = ["--no-fsync"] if tool == "packsync-nofsync" else []
            log = self.log(name, "init", tool)
            rc = run_cmd([self.packsync, "sync", *extra, work, d], log).rc
            if rc != 0:
                self.fail(name, "noop", tool, rc, log)
                self.failed[(name, "update", tool)] = "initial sync failed"
            dest[tool] = d
        rs = os.path.join(base, "rsync", "dest")
        rm_rf(os.path.dirname(rs))
        os.makedirs(rs)
        run_cmd(["rsync", "-a", "--delete", work + "/", rs + "/"], self.log(name, "init", "rsync"))
        dest["rsync"] = rs
        rdir = os.path.join(base, "recipe")
        rm_rf(rdir)
        os.makedirs(os.path.join(rdir, "gens", "0"))
        run_cmd(["rsync", "-a", "--delete", work + "/", os.path.join(rdir, "gens", "0") + "/"],
                self.log(name, "init", "recipe"))
        os.symlink("gens/0", os.path.join(rdir, "dest"))
        dest["recipe"] = os.path.join(rdir, "dest")

        # No-op re-sync.
        noop_tools = [t for t in ("packsync", "rsync") if t in dest]
        for cache in self.cache_modes:
            if cache == "warm":
                warm_up(work)
            for rnd in range(self.rounds):
                for tool in self.rotate(noop_tools, rnd):
                    if (name, "noop", tool) in self.failed:
                        continue
                    if tool == "packsync":
                        argv = [self.packsync, "sync", work, dest[tool]]
                    else:
                        argv = ["rsync", "-a", "--delete", work + "/", dest[tool] + "/"]
                    self.cache.prepare(cache)
                    log = self.log(name, "noop", tool)
                    run = run_cmd(argv, log)
                    if run.rc != 0:
                        self.fail(name, "noop", tool, run.rc, log)
                        continue
                    self.record(name, "noop", cache, tool, rnd, run)

        # 1% updates: every round modifies a fresh, disjoint 1% of the files
        # of `work`; every tool then brings its destination up to it.
        upd_tools = ps + ["recipe"]
        files = trees.regular_files(work)
        total_rounds = self.rounds * len(self.cache_modes)
        sets = trees.pick_updates(files, 0.01, total_rounds, name)
        gen = 0
        k = 0
        for cache in self.cache_modes:
            for rnd in range(self.rounds):
                trees.apply_update(work, sets[k], k)
                k += 1
                if cache == "warm":
                    warm_up(work)
                for tool in self.rotate(upd_tools, rnd):
                    if (name, "update", tool) in self.failed:
                        continue
                    log = self.log(name, "update", tool)
                    if tool == "recipe":
                        live = os.path.join(rdir, "gens", str(gen))
                        new = os.path.join(rdir, "gens", str(gen + 1))
                        script = ('rsync -a --delete --link-dest="$1" "$2"/ "$3"/ && '
                                  'ln -s "$4" "$5" && mv -T "$5" "$6"')
                        argv = ["bash", "-c", script, "recipe", live, work, new,
                                f"gens/{gen + 1}", os.path.join(rdir, ".dest.tmp"),
                                os.path.join(rdir, "dest")]
                    else:
                        extra = ["--no-fsync"] if tool == "packsync-nofsync" else []
                        argv = [self.packsync, "sync", *extra, work, dest[tool]]
                    self.cache.prepare(cache)
                    run = run_cmd(argv, log)
                    if run.rc != 0:
                        self.fail(name, "update", tool, run.rc, log)
                        continue
                    self.record(name, "update", cache, tool, rnd, run,
                                {"changed": len(sets[k - 1])})
                    if tool == "recipe":
                        gen += 1
                        # Untimed: retire generations older than the previous one.
                        for g in os.listdir(os.path.join(rdir, "gens")):
                            if int(g) < gen - 1:
                                rm_rf(os.path.join(rdir, "gens", g))
        # Final state must equal the updated source.
        for tool in upd_tools:
            for sc in ("noop", "update"):
                if (name, sc, tool) in self.failed:
                    break
            else:
                diff, sample = self.verify(work, dest[tool])
                self.checks.append({"tree": name, "scenario": "update", "tool": tool,
                                    "diff_lines": diff, "diff_sample": sample})
                if diff:
                    say(f"bench: {tool} on {name} after updates: {diff} differences, e.g. {sample[:2]}")
        if not self.args.keep:
            rm_rf(base)

    # ---- driver ------------------------------------------------------------------

    def run(self):
        os.makedirs(self.logs, exist_ok=True)
        for f in os.listdir(self.logs):
            if f.endswith((".log", ".txt")) and not f.startswith("gen-"):
                os.unlink(os.path.join(self.logs, f))
        rm_rf(self.run_dir)
        os.makedirs(self.run_dir)
        if not self.have_packsync:
            say(f"bench: packsync binary not found at {self.packsync_orig}\n"
                f"bench:   (build it with `{BUILD}`, or set PACKSYNC=/path/to/packsync);\n"
                f"bench:   benchmarking rsync, cp -a and the floor only")
        t_start = time.perf_counter()
        for name in self.tree_names:
            src, stamp = self.tree(name)
            if src is None:
                self.skipped[name] = stamp
                say(f"bench: skipping tree {name}: {stamp}")
                continue
            self.tree_info[name] = stamp
            entries = stamp["census"]["entries"]
            t0 = time.perf_counter()
            say(f"bench: {name}: full copy ...")
            self.scenario_full(name, src, entries)
            say(f"bench: {name}: no-op re-sync and 1% updates ...")
            self.scenario_noop_update(name, src)
            say(f"bench: {name}: done in {time.perf_counter() - t0:.0f} s")
            if os.environ.get("BENCH_FS_MODE") == "loop":
                # Hand the blocks freed by this tree's runs back to the host.
                subprocess.run(["fstrim", self.root], stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
        self.elapsed = time.perf_counter() - t_start
        if not self.args.keep:
            rm_rf(self.run_dir)


def parse_strace(path):
    """Total calls and the five most frequent syscalls of `strace -c` output."""
    total, rows = None, []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if not parts or parts[0].startswith(("%", "-")):
                    continue
                if parts[-1] == "total":
                    total = int(parts[3])
                elif len(parts) >= 5 and re.match(r"^[\d.]+$", parts[0]):
                    rows.append((int(parts[3]), parts[-1]))
    except (OSError, ValueError, IndexError):
        pass
    rows.sort(reverse=True)
    flush = [(c, n) for c, n in rows if n in ("fsync", "fdatasync", "syncfs", "sync", "sync_file_range")]
    return total, rows[:5] + [(c, n + "*") for c, n in flush if (c, n) not in rows[:5]]


# --------------------------------------------------------------------------
# the report


def fmt_s(x):
    if x is None:
        return "—"
    if x >= 100:
        return f"{x:.0f}"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 1:
        return f"{x:.2f}"
    return f"{x:.3f}"


def fmt_kib(k):
    if k is None:
        return "—"
    return f"{k / 1024:.1f} MiB"


def fmt_bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def version(argv):
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return (p.stdout or p.stderr).strip().splitlines()[0]
    except (OSError, IndexError, subprocess.SubprocessError):
        return "unknown"


def stats(b, tree, scenario, cache, tool):
    xs = [r["seconds"] for r in b.results if r["tree"] == tree and r["scenario"] == scenario
          and r["cache"] == cache and r["tool"] == tool]
    if not xs:
        return None
    rss = [r["maxrss_kib"] for r in b.results if r["tree"] == tree and r["scenario"] == scenario
           and r["cache"] == cache and r["tool"] == tool]
    return {"median": statistics.median(xs), "min": min(xs), "max": max(xs), "n": len(xs),
            "rss": statistics.median(rss)}


def cell(s):
    if s is None:
        return "—"
    return f"{fmt_s(s['median'])} ({fmt_s(s['min'])}–{fmt_s(s['max'])})"


def ratio(a, b):
    if a is None or b is None or b["median"] == 0:
        return None
    return a["median"] / b["median"]


def ratio_cell(r, target=None):
    if r is None:
        return "—"
    if target is None:
        return f"{r:.2f}"
    return f"{r:.2f} {'ok' if r <= target else 'MISS'}"


def report(b, cmdline):
    now = datetime.datetime.now()
    L = []
    title = "packsync benchmark" + (" (quick)" if b.args.quick else "")
    L.append(f"# {title}: {now:%Y-%m-%d %H:%M}")
    L.append("")
    L.append(f"Reproduce: `{cmdline}`")
    L.append("")
    try:
        fs = subprocess.run(["findmnt", "-n", "-o", "FSTYPE,OPTIONS", "-T", b.root],
                            capture_output=True, text=True).stdout.strip() or "?"
        fs = re.sub(r"\s+", " ", fs)
    except OSError:
        fs = "?"
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip() or "no commit"
    dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--", "src", "Cargo.toml",
                            "Cargo.lock"], capture_output=True, text=True).stdout.strip()
    if dirty:
        commit += " with uncommitted changes to src/ or Cargo files"
    L.append("| | |")
    L.append("| --- | --- |")
    L.append(f"| machine | {os.cpu_count()} cores, {mem:.0f} GiB, Linux {platform.release()} |")
    note = os.environ.get("BENCH_FS_NOTE", "")
    L.append(f"| filesystem | `{b.root}`: {fs}{'; ' + note if note else ''}; sources and "
             "destinations on this one filesystem |")
    if b.have_packsync:
        L.append(f"| packsync | `{b.packsync_orig}`: {version([b.packsync, '--version'])}, "
                 f"sha256 {b.packsync_sha[:16]} (repo at {commit}) |")
    else:
        L.append(f"| packsync | **not found** at `{b.packsync_orig}`: only the other tools were measured |")
    L.append(f"| rsync | {version(['rsync', '--version'])} |")
    L.append(f"| cp | {version(['cp', '--version'])} |")
    L.append(f"| rounds | {b.rounds} per cache mode, tools alternated, order rotated every round |")
    L.append(f"| cache | {', '.join(b.cache_modes)} (see notes) |")
    L.append(f"| wall time | {b.elapsed:.0f} s |" if b.elapsed < 120 else
             f"| wall time | {b.elapsed / 60:.1f} min |")
    loads = [r["other_load"] for r in b.results if r.get("other_load") is not None]
    if loads:
        med, mx = statistics.median(loads), max(loads)
        L.append(f"| other load | other processes used a median {med:.0%} (max {mx:.0%}) of the "
                 f"machine's CPU during the timed runs |")
    L.append("")
    if loads and med > 0.10:
        L.append(f"**The machine was busy**: other processes took a median {med:.0%} of its CPU while")
        L.append("the tools ran, so these figures are noisy. Rerun on a quiet machine before")
        L.append("drawing conclusions.")
        L.append("")

    names = [n for n in b.tree_names if n in b.tree_info]

    # ---- targets
    L.append("## Against the targets")
    L.append("")
    if not b.have_packsync:
        L.append("packsync was not measured, so no ratio can be given yet.")
        L.append("")
    L.append("Ratios of medians, packsync (durable) over the other tool; `ok` meets the target.")
    L.append("Peak RSS: packsync's largest process over rsync's largest (`time -f %M`), and in")
    L.append("brackets the sum over all processes of each.")
    L.append("")
    L.append("| tree | cache | full copy / rsync (≤0.70) | full copy / cp -a (≤1.00) "
             "| no-op / rsync (≤0.30) | 1% update / atomic recipe (≤0.50) | peak RSS / rsync (≤1.00) |")
    L.append("| --- | --- | --- | --- | --- | --- | --- |")
    for n in names:
        for c in b.cache_modes:
            p = stats(b, n, "full", c, "packsync")
            rss_cell = "—"
            rs = stats(b, n, "full", c, "rsync")
            if p and rs:
                rss_cell = ratio_cell(p["rss"] / rs["rss"], 1.0)
                ck = {x["tool"]: x for x in b.checks if x["tree"] == n and x["scenario"] == "full"}
                if ck.get("packsync", {}).get("rss_sum_kib") and ck.get("rsync", {}).get("rss_sum_kib"):
                    rss_cell += (f" ({ck['packsync']['rss_sum_kib'] / ck['rsync']['rss_sum_kib']:.2f}"
                                 " of all its processes)")
            L.append(f"| {n} | {c} "
                     f"| {ratio_cell(ratio(p, stats(b, n, 'full', c, 'rsync')), TARGETS['full_rsync'])} "
                     f"| {ratio_cell(ratio(p, stats(b, n, 'full', c, 'cp')), TARGETS['full_cp'])} "
                     f"| {ratio_cell(ratio(stats(b, n, 'noop', c, 'packsync'), stats(b, n, 'noop', c, 'rsync')), TARGETS['noop_rsync'])} "
                     f"| {ratio_cell(ratio(stats(b, n, 'update', c, 'packsync'), stats(b, n, 'update', c, 'recipe')), TARGETS['update_recipe'])} "
                     f"| {rss_cell} |")
    L.append("")

    # ---- trees
    L.append("## Trees")
    L.append("")
    L.append("| tree | what | entries | files | dirs | symlinks | bytes | other load (median / max) |")
    L.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    what = {
        "pack": "StackStorm-like packs: actions, sensors, rules, icons, symlinks",
        "venvlike": "virtualenv-shaped: many .py/.pyc, a few 1–20 MiB .so-like files",
        "tiny": "tiny files (0–512 B) at the bottom of deep directories",
        "large": "a few large files",
        "realvenv": "a real virtualenv: `python3 -m venv` + pip install",
    }
    for n in names:
        c = b.tree_info[n]["census"]
        ol = [r["other_load"] for r in b.results if r["tree"] == n and r.get("other_load") is not None]
        ol = f"{statistics.median(ol):.0%} / {max(ol):.0%}" if ol else "—"
        L.append(f"| {n} | {what[n]} | {c['entries']} | {c['files']} | {c['dirs']} "
                 f"| {c['symlinks']} | {fmt_bytes(c['bytes'])} | {ol} |")
    for n, why in b.skipped.items():
        L.append(f"| {n} | skipped: {why} | | | | | | |")
    L.append("")

    # ---- full copy
    ft = b.full_copy_tools()
    L.append("## Full copy into an empty destination")
    L.append("")
    L.append("Seconds, median (min–max). `cp -a + sync -f` is cp -a made durable the way")
    L.append("packsync is (one syncfs), for reference; the targets compare with cp -a as it ships.")
    L.append("")
    hdr = " | ".join(LABELS[t] for t in ft)
    L.append(f"| tree | cache | {hdr} | p / rsync | p / cp -a | p / (cp -a + sync) | p / floor |")
    L.append("| --- | --- |" + " ---: |" * len(ft) + " ---: | ---: | ---: | ---: |")
    for n in names:
        for c in b.cache_modes:
            s = {t: stats(b, n, "full", c, t) for t in ft}
            p = s.get("packsync")
            L.append(f"| {n} | {c} | " + " | ".join(cell(s[t]) for t in ft)
                     + f" | {ratio_cell(ratio(p, s['rsync']))} | {ratio_cell(ratio(p, s['cp']))}"
                     f" | {ratio_cell(ratio(p, s['cp-sync']))} | {ratio_cell(ratio(p, s['floor']))} |")
    L.append("")

    # ---- no-op
    L.append("## No-op re-sync (destination already up to date)")
    L.append("")
    L.append("| tree | cache | packsync | rsync -a --delete | p / rsync |")
    L.append("| --- | --- | ---: | ---: | ---: |")
    for n in names:
        for c in b.cache_modes:
            p, r = stats(b, n, "noop", c, "packsync"), stats(b, n, "noop", c, "rsync")
            L.append(f"| {n} | {c} | {cell(p)} | {cell(r)} | {ratio_cell(ratio(p, r))} |")
    L.append("")

    # ---- update
    ut = (["packsync", "packsync-nofsync"] if b.with_nofsync else
          ["packsync"] if b.have_packsync else []) + ["recipe"]
    L.append("## 1% update")
    L.append("")
    L.append("Each round modifies a fresh 1% of the regular files (at least one) of a working")
    L.append("copy of the tree; each tool then brings its destination, left by the previous")
    L.append("round, up to it.")
    L.append("")
    L.append("| tree | cache | files changed | " + " | ".join(LABELS[t] for t in ut) + " | p / recipe |")
    L.append("| --- | --- | ---: |" + " ---: |" * len(ut) + " ---: |")
    for n in names:
        for c in b.cache_modes:
            s = {t: stats(b, n, "update", c, t) for t in ut}
            ch = [r.get("changed") for r in b.results if r["tree"] == n and r["scenario"] == "update"]
            L.append(f"| {n} | {c} | {ch[0] if ch else '—'} | " + " | ".join(cell(s[t]) for t in ut)
                     + f" | {ratio_cell(ratio(s.get('packsync'), s['recipe']))} |")
    L.append("")

    # ---- memory
    L.append("## Peak RSS")
    L.append("")
    L.append("Full copy. `max`: the peak RSS of the largest process, as `/usr/bin/time -f %M` gives it")
    L.append("(median of the timed runs, cold cache if measured). `all`: the sum of the peaks of every")
    L.append("process of the tool (rsync runs three), sampled from /proc in one untimed run.")
    L.append("")
    L.append("| tree | " + " | ".join(LABELS[t] for t in ft) + " |")
    L.append("| --- |" + " ---: |" * len(ft))
    mc = b.cache_modes[0]
    for n in names:
        cells = []
        for t in ft:
            s = stats(b, n, "full", mc, t)
            ck = [x for x in b.checks if x["tree"] == n and x["scenario"] == "full" and x["tool"] == t]
            mx = fmt_kib(s["rss"]) if s else "—"
            al = fmt_kib(ck[0]["rss_sum_kib"]) if ck and ck[0].get("rss_sum_kib") else "—"
            procs = ck[0]["procs"] if ck else 0
            cells.append(f"max {mx}, all {al}" + (f" ({procs} procs)" if procs > 1 else ""))
        L.append(f"| {n} | " + " | ".join(cells) + " |")
    L.append("")

    # ---- syscalls
    if b.straces:
        L.append("## Syscalls per entry (full copy)")
        L.append("")
        L.append("`strace -c -f`, all processes and threads: total calls / entries of the tree")
        L.append("(total calls in brackets). One untimed run each, warm cache.")
        L.append("")
        traced = [t for t in ft if t != "cp-sync"]
        L.append("| tree | entries | " + " | ".join(LABELS[t] for t in traced) + " |")
        L.append("| --- | ---: |" + " ---: |" * len(traced))
        for n in names:
            row = []
            ent = b.tree_info[n]["census"]["entries"]
            for t in traced:
                st = [x for x in b.straces if x["tree"] == n and x["tool"] == t]
                row.append(f"{st[0]['calls'] / ent:.1f} ({st[0]['calls']})"
                           if st and st[0]["calls"] else "—")
            L.append(f"| {n} | {ent} | " + " | ".join(row) + " |")
        L.append("")
        L.append("Most frequent syscalls (calls), and the flushes (`*`: fsync, fdatasync, syncfs,")
        L.append("sync_file_range) where they are not among the five:")
        L.append("")
        L.append("| tree | tool | top five, flushes |")
        L.append("| --- | --- | --- |")
        for x in b.straces:
            top = ", ".join(f"{s} {c}" for c, s in x["top"])
            L.append(f"| {x['tree']} | {LABELS[x['tool']]} | {top} |")
        L.append("")

    # ---- correctness
    L.append("## Correctness check")
    L.append("")
    L.append("`rsync -a -n -i -c --delete SRC/ DEST/` after an untimed full copy, and after the")
    L.append("last update round: the number of entries that differ from the source (0 = exact")
    L.append("mirror of bytes, modes, owners, mtimes, symlinks, with nothing extra).")
    L.append("")
    L.append("| tree | scenario | tool | differing entries | example |")
    L.append("| --- | --- | --- | ---: | --- |")
    for x in b.checks:
        if x["tool"] == "floor":
            continue
        ex = "; ".join(f"`{s}`" for s in x["diff_sample"][:2]) if x["diff_lines"] != 0 else ""
        L.append(f"| {x['tree']} | {x['scenario']} | {LABELS[x['tool']]} "
                 f"| {x['diff_lines'] if x['diff_lines'] is not None else 'error'} | {ex} |")
    L.append("")

    if b.failed:
        L.append("## Failures")
        L.append("")
        for (n, sc, t), msg in b.failed.items():
            L.append(f"- {n} / {sc} / {LABELS[t]}: {msg}")
        L.append("")

    # ---- notes
    L.append("## Notes")
    L.append("")
    L.append("- Commands. packsync: `packsync sync SRC DEST` (DEST absent for a full copy; durable,")
    L.append("  as it ships), and `packsync sync --no-fsync SRC DEST` for comparison. rsync:")
    L.append("  `rsync -a --delete SRC/ DEST/`. cp: `cp -a SRC/. DEST/` into an empty DEST; for")
    L.append("  reference, `cp -a SRC/. DEST/ && sync -f DEST` (durable like packsync).")
    L.append("  Atomic rsync recipe: `rsync -a --delete --link-dest=LIVE SRC/ NEW/ && ln -s NEW TMP")
    L.append("  && mv -T TMP DEST`, timed as one `bash -c`; removing the generation before the")
    L.append("  previous one is not timed (packsync's own retirement, inside its run, is).")
    L.append("- floor (`bench/floor.c`): one thread walks the source with openat/readdir and, per")
    L.append("  entry, does only mkdirat, or open + create + read every byte + write it, or")
    L.append("  readlinkat + symlinkat. No stat, no modes, owners or times, no fsync. It bounds")
    L.append("  what a single-threaded copy can cost; a parallel tool may go below it on a")
    L.append("  multi-core machine, and it does not produce a faithful mirror.")
    L.append("- cold: `sync; echo 3 > /proc/sys/vm/drop_caches` before every timed run, so the")
    L.append("  source, the destination's metadata and the tool's binary come from disk. warm:")
    L.append("  `sync` only, with the source read once beforehand. Both modes flush the previous")
    L.append("  run's dirty pages before timing, so no tool pays for another's writeback; tools")
    L.append("  that do not fsync leave their own writeback outside the timed span.")
    L.append("- Times are wall-clock from fork to the end of `wait4` (`bench/measure.c`); peak RSS")
    L.append("  is `ru_maxrss` from the same `wait4`, the figure `/usr/bin/time -f %M` prints.")
    L.append("  \"other load\" is the machine's busy CPU time over each run (/proc/stat) less the")
    L.append("  tool's own user+sys time, as a share of all cores.")
    L.append("- Trees are generated from fixed seeds with fixed mtimes, and kept under the work")
    L.append("  dir between runs (`--regen` rebuilds them).")
    for n in names:
        info = b.tree_info[n].get("info") or {}
        if info.get("pip_freeze"):
            L.append(f"- realvenv: Python {platform.python_version()}, "
                     + ", ".join(info["pip_freeze"]) + ".")
    L.append("")
    return "\n".join(L)


def main():
    ap = argparse.ArgumentParser(prog="bench/run.sh", description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small trees, 3 rounds (smoke test)")
    ap.add_argument("--rounds", type=int, help="timed rounds per tool and cache mode (default 5, quick 3)")
    ap.add_argument("--cache", choices=["cold", "warm", "both"], default="both",
                    help="page cache before each timed run (default both)")
    ap.add_argument("--trees", help="comma-separated subset of: " + ",".join(trees.TREE_NAMES))
    ap.add_argument("--no-strace", action="store_true", help="skip the syscall counts")
    ap.add_argument("--no-nofsync", action="store_true", help="do not also time packsync --no-fsync")
    ap.add_argument("--regen", action="store_true", help="regenerate the trees")
    ap.add_argument("--keep", action="store_true", help="keep destinations under the work dir")
    ap.add_argument("--out", help="report path (default bench/results/DATE[-quick].md)")
    args = ap.parse_args()

    b = Bench(args)
    b.run()

    env = []
    for var in ("BENCH_DIR", "PACKSYNC"):
        if os.environ.get(var):
            env.append(f"{var}={shlex.quote(os.environ[var])}")
    base = os.environ.get("BENCH_CMDLINE") or " ".join(
        ["bench/run.sh"] + [shlex.quote(a) for a in sys.argv[1:]])
    cmdline = " ".join(env + [base])
    md = report(b, cmdline)
    out = args.out or os.path.join(HERE, "results", f"{datetime.date.today():%Y-%m-%d}"
                                   + ("-quick" if args.quick else "") + ".md")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(md)
    with open(os.path.splitext(out)[0] + ".json", "w") as f:
        json.dump({"results": b.results, "checks": b.checks, "straces": b.straces,
                   "trees": b.tree_info, "skipped": b.skipped,
                   "failed": {"/".join(k): v for k, v in b.failed.items()}}, f,
                  separators=(",", ":"))
    print(md)
    say(f"bench: report written to {os.path.relpath(out)}")


if __name__ == "__main__":
    main()
