"""Deterministic benchmark trees for bench/run.sh.

Every tree is a pure function of (name, scale): the same seed gives the same
paths, bytes, modes, symlinks and mtimes on every machine. Only `realvenv` is
built by the machine's own `python3 -m venv` and `pip install`, so its bytes
follow the Python and package versions found there (the report records them);
its mtimes are still normalised.
"""

import hashlib
import os
import random
import shutil
import subprocess
import sys

GENERATOR_VERSION = 3

# Fixed timestamps (nanoseconds): sources carry sub-second mtimes so that a
# tool that drops nanoseconds shows up in the correctness check.
BASE_MTIME_NS = 1_700_000_000_123_456_789
UPDATE_MTIME_NS = 1_710_000_000_987_654_321

WORDS = (
    "action sensor rule trigger payload config schema pack register result "
    "status execution runner workflow parameters context client request "
    "response timeout retry value items key data name self return import "
    "from def class if else for in not None True False yield with as raise "
    "try except finally lambda dict list str int len range logger debug"
).split()

# Sizes of the trees. quick: smoke test in well under a minute of copying.
SCALES = {
    "quick": {
        "pack": {"packs": 8, "actions": 12, "sensors": 2, "rules": 6, "tests": 4},
        "venvlike": {"packages": 20, "modules": 30, "binaries_mib": [1, 3]},
        "tiny": {"depth": 4, "fanout": 4, "per_leaf": 20},
        "large": {"files": 4, "mib": 16},
    },
    "full": {
        "pack": {"packs": 40, "actions": 80, "sensors": 8, "rules": 30, "tests": 20},
        "venvlike": {
            "packages": 120,
            "modules": 60,
            "binaries_mib": [1, 1, 2, 3, 5, 8, 13, 20, 2, 4],
        },
        "tiny": {"depth": 6, "fanout": 4, "per_leaf": 25},
        "large": {"files": 4, "mib": 256},
    },
}

REALVENV_PACKAGES = [
    "requests==2.32.3",
    "PyYAML==6.0.2",
    "Jinja2==3.1.4",
    "six==1.16.0",
    "python-dateutil==2.9.0.post0",
]

TREE_NAMES = ["pack", "venvlike", "tiny", "large", "realvenv"]


def _rng(*parts):
    h = hashlib.sha256("/".join(str(p) for p in parts).encode()).digest()
    return random.Random(int.from_bytes(h[:8], "little"))


def _text(rng, lo, hi, py=False):
    target = rng.randint(lo, hi)
    out = []
    n = 0
    while n < target:
        k = rng.randint(3, 12)
        words = " ".join(rng.choice(WORDS) for _ in range(k))
        if py:
            indent = "    " * rng.randint(0, 2)
            line = f"{indent}{words}\n"
        else:
            line = f"{rng.choice(WORDS)}_{rng.randint(0, 999)}: {words}\n"
        out.append(line)
        n += len(line)
    return "".join(out)[:target].encode()


def _binary(rng, size):
    # One random MiB block, repeated with a per-block counter so no two
    # blocks are equal; fast enough for GiB-sized trees.
    block = bytearray(rng.randbytes(1 << 20))
    out = bytearray()
    i = 0
    while len(out) < size:
        block[0:8] = i.to_bytes(8, "little")
        out += block
        i += 1
    return bytes(out[:size])


class Writer:
    """Creates entries under a root and remembers them for fixed mtimes."""

    def __init__(self, root):
        self.root = root
        self.dirs = set()

    def _dir(self, rel):
        if rel in ("", ".") or rel in self.dirs:
            return
        self._dir(os.path.dirname(rel))
        os.mkdir(os.path.join(self.root, rel))
        self.dirs.add(rel)

    def file(self, rel, data, mode=0o644):
        self._dir(os.path.dirname(rel))
        p = os.path.join(self.root, rel)
        with open(p, "wb") as f:
            f.write(data)
        os.chmod(p, mode)

    def big_file(self, rel, rng, size, mode=0o644):
        self._dir(os.path.dirname(rel))
        p = os.path.join(self.root, rel)
        chunk = 64 << 20
        with open(p, "wb") as f:
            left = size
            while left:
                n = min(chunk, left)
                f.write(_binary(rng, n))
                left -= n
        os.chmod(p, mode)

    def symlink(self, rel, target):
        self._dir(os.path.dirname(rel))
        os.symlink(target, os.path.join(self.root, rel))


def normalise_mtimes(root):
    """Give every entry a fixed mtime; directories last, deepest first."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for n in filenames + dirnames:
            p = os.path.join(dirpath, n)
            if os.path.islink(p):
                os.utime(p, ns=(BASE_MTIME_NS, BASE_MTIME_NS), follow_symlinks=False)
            elif not os.path.isdir(p):
                os.utime(p, ns=(BASE_MTIME_NS, BASE_MTIME_NS))
        os.utime(dirpath, ns=(BASE_MTIME_NS, BASE_MTIME_NS))


def gen_pack(w, p):
    """A StackStorm-like packs directory."""
    for i in range(p["packs"]):
        name = f"pack{i:02d}"
        r = _rng("pack", name)
        base = name
        w.file(f"{base}/pack.yaml", _text(r, 300, 900))
        w.file(f"{base}/README.md", _text(r, 500, 4000))
        w.file(f"{base}/requirements.txt", _text(r, 40, 200))
        w.file(f"{base}/config.schema.yaml", _text(r, 200, 2000))
        icon = b"\x89PNG\r\n\x1a\n" + r.randbytes(r.randint(2048, 8192))
        w.file(f"{base}/icon.png", icon)
        for j in range(3):
            w.file(f"{base}/lib/{name}_util{j}.py", _text(r, 500, 6000, py=True))
        w.file(f"{base}/lib/__init__.py", b"")
        for j in range(p["actions"]):
            a = f"{base}/actions/action_{j:03d}"
            w.file(a + ".py", _text(r, 300, 5000, py=True))
            w.file(a + ".yaml", _text(r, 200, 1200))
        for j in range(max(1, p["actions"] // 10)):
            w.file(f"{base}/actions/workflows/wf_{j:02d}.yaml", _text(r, 400, 3000))
        w.file(f"{base}/actions/run.sh", _text(r, 100, 600), mode=0o755)
        for j in range(p["sensors"]):
            s = f"{base}/sensors/sensor_{j:02d}"
            w.file(s + ".py", _text(r, 800, 6000, py=True))
            w.file(s + ".yaml", _text(r, 200, 800))
        for j in range(p["rules"]):
            w.file(f"{base}/rules/rule_{j:03d}.yaml", _text(r, 200, 1500))
        for j in range(max(1, p["rules"] // 6)):
            w.file(f"{base}/aliases/alias_{j:02d}.yaml", _text(r, 100, 600))
            w.file(f"{base}/policies/policy_{j:02d}.yaml", _text(r, 100, 400))
        for j in range(p["tests"]):
            w.file(f"{base}/tests/test_action_{j:03d}.py", _text(r, 500, 5000, py=True))
        w.file(f"{base}/tests/fixtures/empty.json", b"{}\n")
        w._dir(f"{base}/etc/empty")  # an empty directory
        # symlinks: relative, into the pack, and one to a sibling pack
        w.symlink(f"{base}/actions/lib", "../lib")
        w.symlink(f"{base}/sensors/icon.png", "../icon.png")
        if i:
            w.symlink(f"{base}/shared_lib", f"../pack{i - 1:02d}/lib")
    w.symlink("default", "pack00")


def gen_venvlike(w, p):
    """A virtualenv-shaped tree: many modules, a few big extension modules."""
    r0 = _rng("venvlike")
    sp = "lib/python3.11/site-packages"
    w.file("pyvenv.cfg", b"home = /usr/bin\ninclude-system-site-packages = false\nversion = 3.11.2\n")
    w.symlink("lib64", "lib")
    w.symlink("bin/python", "python3")
    w.symlink("bin/python3", "/usr/bin/python3")  # absolute, outside the tree
    w.file("bin/activate", _text(r0, 1000, 2000))
    bins = list(p["binaries_mib"])
    for i in range(p["packages"]):
        pkg = f"pkg{i:03d}"
        r = _rng("venvlike", pkg)
        nmods = r.randint(p["modules"] // 2, p["modules"] * 3 // 2)
        subs = [""] + [f"sub{k}/" for k in range(r.randint(0, 4))]
        for sub in subs:
            w.file(f"{sp}/{pkg}/{sub}__init__.py", _text(r, 0, 400, py=True))
        for m in range(nmods):
            sub = r.choice(subs)
            src = _text(r, 200, 20000, py=True)
            w.file(f"{sp}/{pkg}/{sub}mod{m:03d}.py", src)
            if m % 2 == 0:
                pyc = b"\xa7\r\r\n" + hashlib.sha256(src).digest() * (1 + len(src) // 64)
                w.file(f"{sp}/{pkg}/{sub}__pycache__/mod{m:03d}.cpython-311.pyc", pyc[: len(src)])
        di = f"{sp}/{pkg}-1.{i % 7}.{i % 3}.dist-info"
        for meta in ("METADATA", "RECORD", "WHEEL", "top_level.txt", "INSTALLER"):
            w.file(f"{di}/{meta}", _text(r, 20, 3000))
        w.file(f"bin/{pkg}-cli", _text(r, 150, 300, py=True), mode=0o755)
        if bins and i % max(1, p["packages"] // len(p["binaries_mib"])) == 0:
            mib = bins.pop(0)
            w.big_file(f"{sp}/{pkg}/_speedups.cpython-311-x86_64-linux-gnu.so", r,
                       mib * (1 << 20) + r.randint(0, 4095), mode=0o755)


def gen_tiny(w, p):
    """Many tiny files at the bottom of a deep, narrow directory tree."""
    def rec(prefix, level):
        if level == p["depth"]:
            r = _rng("tiny", prefix)
            for k in range(p["per_leaf"]):
                w.file(f"{prefix}/f{k:03d}.txt", r.randbytes(r.randint(0, 512)))
            return
        for k in range(p["fanout"]):
            rec(f"{prefix}/d{level}{k}" if prefix else f"d{level}{k}", level + 1)
    rec("", 0)


def gen_large(w, p):
    for i in range(p["files"]):
        r = _rng("large", i)
        w.big_file(f"blob{i}.bin", r, p["mib"] << 20)


def gen_realvenv(root, log):
    py = shutil.which("python3") or sys.executable
    try:
        subprocess.run([py, "-m", "venv", root], check=True,
                       stdout=log, stderr=subprocess.STDOUT)
        subprocess.run([os.path.join(root, "bin", "pip"), "install", "--no-cache-dir",
                        "--disable-pip-version-check", "-q", *REALVENV_PACKAGES],
                       check=True, stdout=log, stderr=subprocess.STDOUT)
        freeze = subprocess.run([os.path.join(root, "bin", "pip"), "freeze"], check=True,
                                capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, OSError) as e:
        return None, str(e)
    normalise_mtimes(root)
    return freeze, None


def generate(name, scale, dest, log=sys.stderr):
    """Build tree `name` at `dest` (must not exist). Returns (info, error)."""
    os.makedirs(dest)
    info = {}
    if name == "realvenv":
        shutil.rmtree(dest)
        freeze, err = gen_realvenv(dest, log)
        if err:
            shutil.rmtree(dest, ignore_errors=True)
            return None, err
        info["pip_freeze"] = freeze.strip().splitlines()
        return info, None
    w = Writer(dest)
    {"pack": gen_pack, "venvlike": gen_venvlike, "tiny": gen_tiny,
     "large": gen_large}[name](w, SCALES[scale][name])
    normalise_mtimes(dest)
    return info, None


def census(root):
    """Counts of a tree: files, dirs (not the root), symlinks, bytes."""
    c = {"files": 0, "dirs": 0, "symlinks": 0, "other": 0, "bytes": 0}
    stack = [root]
    while stack:
        d = stack.pop()
        with os.scandir(d) as it:
            for e in it:
                if e.is_symlink():
                    c["symlinks"] += 1
                elif e.is_dir(follow_symlinks=False):
                    c["dirs"] += 1
                    stack.append(e.path)
                elif e.is_file(follow_symlinks=False):
                    c["files"] += 1
                    c["bytes"] += e.stat(follow_symlinks=False).st_size
                else:
                    c["other"] += 1
    c["entries"] = c["files"] + c["dirs"] + c["symlinks"] + c["other"]
    return c


def regular_files(root):
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for n in sorted(filenames):
            p = os.path.join(dirpath, n)
            if not os.path.islink(p) and os.path.isfile(p):
                out.append(os.path.relpath(p, root))
    return out


def pick_updates(files, fraction, rounds, seed):
    """Disjoint, deterministic sets of files to modify, one set a round."""
    k = max(1, round(len(files) * fraction))
    order = list(files)
    _rng("update", seed).shuffle(order)
    sets = []
    for i in range(rounds):
        s = order[i * k:(i + 1) * k]
        if not s:  # fewer files than rounds*k: wrap around
            s = [order[(i * k + j) % len(order)] for j in range(k)]
        sets.append(s)
    return sets


def apply_update(root, rels, round_no):
    """Modify each file: new bytes at the start (size kept for big files,
    grown a little for small ones) and a new fixed mtime."""
    mt = UPDATE_MTIME_NS + round_no * 1_000_000_000
    for rel in rels:
        p = os.path.join(root, rel)
        r = _rng("upd", rel, round_no)
        size = os.path.getsize(p)
        with open(p, "r+b") as f:
            if size > (1 << 20):
                f.write(r.randbytes(4096))
            else:
                f.write(r.randbytes(min(size, 64)))
                f.seek(0, os.SEEK_END)
                f.write(b"# updated %d\n" % round_no)
        os.utime(p, ns=(mt, mt))
    # Directories holding changed files keep their fixed mtimes.


if __name__ == "__main__":
    # python3 trees.py NAME SCALE DEST   (for generating one tree by hand)
    info, err = generate(sys.argv[1], sys.argv[2], sys.argv[3])
    if err:
        sys.exit(err)
    print(census(sys.argv[3]))
