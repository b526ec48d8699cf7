#!/usr/bin/env bash
# Every sync mode side by side: wall seconds and peak RSS of packsync's
# directory first sync, no-op, --checksum no-op, --dry-run --itemize of a 1%
# update and the 1% update itself; of the same tree as a .tar.gz (first sync
# and no-op) and as a one-layer OCI layout (first sync and no-op); next to
# rsync -a --delete (first sync and no-op) and cp -a (first copy). At the
# smallest size, syscalls per entry (strace -c -f) of packsync's directory
# first sync, no-op and 1% update.
#
#   PACKSYNC=/path [PACKSYNC_OLD=/path] bench/modes.sh [--sizes 100000,1000000]
#       [--rounds 3[,1]] [--all-modes-upto N] [--fs dir|loop] [--no-strace] [--out FILE]
#
# --sizes: files in the tree (default 100000); trees as bench/scale.sh makes
#   them (bench/scale.py's generate: files of 0-64 bytes, 100 to a
#   directory), kept with their .tar.gz and OCI layout in
#   $BENCH_DIR/trees/modes between runs.
# --rounds: one count for every size, or one per size (default 3).
# --all-modes-upto N: larger sizes run the first-sync modes only (default:
#   the smallest size).
# --fs dir (default): on $BENCH_DIR's filesystem (default /tmp/packsync-bench);
#   --fs loop: a dedicated loop-mounted ext4 (bench/fs.sh, root only).
# PACKSYNC (default the static build, else target/release/packsync) and
# PACKSYNC_OLD are copied first and run back to back in every mode, their
# order swapped every round. Page cache warm, `sync` before every run.
# Writes bench/results/<date>-modes.md (and a .tsv of every run).
# Needs python3, rsync, GNU tar, cp, gcc or cc; strace for the syscalls.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
quote() { if [[ "$1" =~ ^[A-Za-z0-9_./,=:+-]+$ ]]; then echo "$1"; else printf '%q\n' "$1"; fi; }
cmdline=""
for var in BENCH_DIR PACKSYNC PACKSYNC_OLD; do
    if [ -n "${!var:-}" ]; then cmdline+="$var=$(quote "${!var}") "; fi
done
cmdline+="bench/modes.sh"
for arg in "$@"; do cmdline+=" $(quote "$arg")"; done

sizes=100000 rounds=3 upto="" fs_mode=dir use_strace=1 out=""
while [ $# -gt 0 ]; do
    case "$1" in
    -h | --help) sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --sizes) sizes="$2"; shift 2 ;;
    --rounds) rounds="$2"; shift 2 ;;
    --all-modes-upto) upto="$2"; shift 2 ;;
    --fs) fs_mode="$2"; shift 2 ;;
    --no-strace) use_strace=0; shift ;;
    --out) out="$2"; shift 2 ;;
    *) echo "bench: unknown argument: $1 (see --help)" >&2; exit 2 ;;
    esac
done
IFS=, read -r -a size_list <<<"$sizes"
IFS=, read -r -a round_list <<<"$rounds"
smallest=$(printf '%s\n' "${size_list[@]}" | sort -n | head -1)
upto="${upto:-$smallest}"

missing=()
for tool in python3 rsync tar cp; do
    command -v "$tool" >/dev/null || missing+=("$tool")
done
cc="$(command -v gcc || command -v cc || true)"
[ -n "$cc" ] || missing+=(gcc)
if [ "${#missing[@]}" -gt 0 ]; then
    echo "bench: missing: ${missing[*]}" >&2
    exit 2
fi
if [ "$use_strace" = 1 ] && ! command -v strace >/dev/null; then
    echo "bench: strace not found: syscall counts are skipped" >&2
    use_strace=0
fi

bench_dir="${BENCH_DIR:-/tmp/packsync-bench}"
mkdir -p "$bench_dir/bin" "$bench_dir/logs"
bench_dir="$(cd "$bench_dir" && pwd)"
# shellcheck source=bench/lib.sh
. "$here/lib.sh"
bench_measure_bin "$cc"
MEASURE_BIN="$bench_dir/bin/measure"

# The binaries under test, copied so that a rebuild during the run does not
# change them halfway.
shipped="$repo/target/x86_64-unknown-linux-gnu/release/packsync"
[ -x "$shipped" ] || shipped="$repo/target/release/packsync"
origs=("$(realpath "${PACKSYNC:-$shipped}")")
[ -n "${PACKSYNC_OLD:-}" ] && origs+=("$(realpath "$PACKSYNC_OLD")")
bins=()
for i in "${!origs[@]}"; do
    [ -x "${origs[$i]}" ] || { echo "bench: not an executable: ${origs[$i]}" >&2; exit 2; }
    cp "${origs[$i]}" "$bench_dir/bin/modes-packsync-$i"
    bins+=("$bench_dir/bin/modes-packsync-$i")
done

# shellcheck source=bench/fs.sh
. "$here/fs.sh"
bench_fs_setup "$fs_mode" "$bench_dir"
root="$BENCH_ROOT"
work="$root/run/modes"
logs="$bench_dir/logs/modes"
rm -rf "$work" "$logs"
mkdir -p "$work" "$logs" "$root/trees/modes"
tsv="$logs/runs.tsv"
touched="$work/touched"

# The Python part: trees (bench/scale.py), the OCI layout, the report.
IFS= read -r -d '' PY <<'EOF' || true
import gzip, hashlib, json, os, platform, sys, tarfile
sys.path.insert(0, os.environ["BENCH_HERE"])
import scale  # noqa: E402
cmd, args = sys.argv[1], sys.argv[2:]

class Hashing:
    """Passes writes through, hashing them."""
    def __init__(self, f):
        self.f, self.h = f, hashlib.sha256()
    def write(self, b):
        self.h.update(b)
        return self.f.write(b)
    def flush(self):
        pass

def put(lay, data):
    d = hashlib.sha256(data).hexdigest()
    with open(os.path.join(lay, "blobs", "sha256", d), "wb") as f:
        f.write(data)
    return {"digest": "sha256:" + d, "size": len(data)}

def oci(src, lay, tag):
    """One gzip layer of the tree (pax, names without ./, in walk order
    sorted by name), its diff_id in the config, tagged TAG."""
    os.makedirs(os.path.join(lay, "blobs", "sha256"))
    part = os.path.join(lay, "layer.part")
    with open(part, "wb") as raw:
        outer = Hashing(raw)
        gz = gzip.GzipFile(filename="", fileobj=outer, mode="wb", compresslevel=6, mtime=0)
        inner = Hashing(gz)
        with tarfile.open(fileobj=inner, mode="w|", format=tarfile.PAX_FORMAT) as t:
            for dirpath, dirnames, filenames in os.walk(src):
                dirnames.sort()
                rel = os.path.relpath(dirpath, src)
                if rel != ".":
                    t.add(dirpath, arcname=rel, recursive=False)
                for name in sorted(filenames):
                    t.add(os.path.join(dirpath, name),
                          arcname=name if rel == "." else rel + "/" + name, recursive=False)
        gz.close()
        size = raw.tell()
    digest = outer.h.hexdigest()
    os.rename(part, os.path.join(lay, "blobs", "sha256", digest))
    arch = {"x86_64": "amd64", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
    cfg = put(lay, json.dumps({"architecture": arch, "os": "linux", "rootfs": {
        "type": "layers", "diff_ids": ["sha256:" + inner.h.hexdigest()]}}).encode())
    cfg["mediaType"] = "application/vnd.oci.image.config.v1+json"
    layer = {"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
             "digest": "sha256:" + digest, "size": size}
    m = put(lay, json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                             "config": cfg, "layers": [layer]}).encode())
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    m["annotations"] = {"org.opencontainers.image.ref.name": tag}
    with open(os.path.join(lay, "index.json"), "w") as f:
        json.dump({"schemaVersion": 2, "manifests": [m]}, f)
    with open(os.path.join(lay, "oci-layout"), "w") as f:
        f.write('{"imageLayoutVersion": "1.0.0"}')

if cmd == "generate":
    scale.generate(args[0], int(args[1]))
elif cmd == "entries":
    print(scale.entries_of(int(args[0])))
elif cmd == "touch":
    saved = scale.touch_one_percent(args[0], int(args[1]), int(args[2]))
    with open(args[3], "w") as f:
        f.write("\n".join(saved) + "\n")
elif cmd == "restore":
    with open(args[0]) as f:
        scale.restore([line for line in f.read().split("\n") if line])
    os.unlink(args[0])
elif cmd == "oci":
    oci(*args)
elif cmd == "report":
    import datetime, statistics, subprocess
    import bench
    env = os.environ
    tsv, out = args
    sizes = [int(x) for x in env["MODES_SIZES"].split()]
    rounds = dict(zip(sizes, (int(x) for x in env["MODES_ROUNDS"].split())))
    upto = int(env["MODES_UPTO"])
    origs = env["MODES_ORIGS"].split("\n")
    snaps = env["MODES_BINS"].split("\n")
    labels = ["packsync"] if len(snaps) == 1 else ["PACKSYNC", "PACKSYNC_OLD"]
    runs = {}
    for line in open(tsv):
        n, tool, mode, rnd, wall, rss, rc, cpu, busy = line.split("\t")
        runs.setdefault((int(n), tool, mode), []).append((int(wall) / 1e9, int(rss), int(cpu), int(busy)))
    ncpu = os.cpu_count() or 1
    other = [max(0.0, (b - c) / (w * 1e9 * ncpu)) for rs in runs.values() for w, _, c, b in rs if b >= 0 and w > 0]

    def med(key, i):
        rs = runs.get(key)
        return statistics.median(r[i] for r in rs) if rs else None

    def secs(key):
        rs = runs.get(key)
        if not rs:
            return "—"
        xs = [r[0] for r in rs]
        s = bench.fmt_s(statistics.median(xs))
        return s if len(xs) == 1 else f"{s} ({bench.fmt_s(min(xs))}–{bench.fmt_s(max(xs))})"

    def ratio(a, b):
        if a is None or not b:
            return "—"
        r = a / b
        return f"**{r:.2f}**" if r > 1.5 else f"{r:.2f}"

    MODES = [
        ("dir-first", "directory, first sync", "sync -q SRC DEST (DEST absent)"),
        ("dir-noop", "directory, no-op", "sync -q SRC DEST (again)"),
        ("dir-checksum", "directory, --checksum no-op", "sync -q --checksum SRC DEST"),
        ("dir-dryrun", "directory, --dry-run --itemize of a 1% update", "sync --dry-run --itemize SRC DEST >/dev/null"),
        ("dir-update", "directory, 1% update", "sync -q SRC DEST"),
        ("tar-first", "archive, first sync", "sync -q SRC.tar.gz DEST2 (DEST2 absent)"),
        ("tar-noop", "archive, no-op", "sync -q SRC.tar.gz DEST2 (again)"),
        ("oci-first", "image, first sync", "sync -q oci-layout:LAYOUT:bench DEST3 (DEST3 absent)"),
        ("oci-noop", "image, no-op", "sync -q oci-layout:LAYOUT:bench DEST3 (again)"),
    ]
    OTHERS = [
        ("rsync", "rsync-first", "rsync, first sync", "rsync -a --delete SRC/ D/ (D empty)"),
        ("rsync", "rsync-noop", "rsync, no-op", "rsync -a --delete SRC/ D/ (again)"),
        ("cp", "cp-first", "cp -a, first copy", "cp -a SRC/. D/ (D empty)"),
    ]
    L = [f"# packsync: every mode's time and peak RSS, {datetime.datetime.now():%Y-%m-%d %H:%M}", ""]
    L.append(f"Reproduce: `{env['MODES_CMDLINE']}`")
    L.append("")
    commit = subprocess.run(["git", "-C", os.path.dirname(env["BENCH_HERE"]), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    L.append("| | |")
    L.append("| --- | --- |")
    for lab, orig, snap in zip(labels, origs, snaps):
        with open(snap, "rb") as f:
            sha = hashlib.sha256(f.read()).hexdigest()
        L.append(f"| {lab} | `{orig}`, {bench.version([snap, '--version'])}, sha256 `{sha}` |")
    L.append(f"| repo | {commit} |")
    L.append(f"| machine | {ncpu} cores, Linux {platform.release()} |")
    L.append(f"| filesystem | {env.get('BENCH_FS_NOTE', '')} ({env['BENCH_ROOT']}) |")
    L.append(f"| rsync, tar, cp | {bench.version(['rsync', '--version'])}; {bench.version(['tar', '--version'])}; "
             f"{bench.version(['cp', '--version'])} |")
    if other:
        L.append(f"| other load | other processes used a median {statistics.median(other):.0%} "
                 f"(max {max(other):.0%}) of the machine's CPU during the runs |")
    L.append(f"| wall time | {int(env['MODES_ELAPSED']) / 60:.1f} min |")
    L.append("")
    L.append("Trees of N files of 0–64 bytes, 100 to a directory (`bench/scale.py`'s `generate`);")
    L.append("the archive: `tar -C SRC --format=pax -czf SRC.tar.gz .`; the image: one gzip layer of")
    L.append("the same tree (pax) in an OCI layout. Page cache warm, `sync` before every run;")
    L.append("packsync durable, as it ships. Seconds: median (min–max) of the rounds; peak RSS:")
    L.append("`ru_maxrss` (`bench/measure.c`, what `/usr/bin/time -f %M` prints: the largest")
    L.append("process, for rsync the largest of its three), median, KiB. × dir first: over the")
    L.append("same binary's directory first sync; × rsync: over rsync's first sync's largest")
    L.append("process; above 1.5 in bold. Syscalls per entry: `strace -c -f`, every thread, one")
    L.append("untimed run, calls over the entries (files and directories).")
    if len(snaps) > 1:
        L.append("The two binaries ran each mode back to back, their order swapped every round;")
        L.append("rsync and cp -a were measured once a round (under the first binary's columns).")
    L.append("")
    for n in sizes:
        ent = scale.entries_of(n)
        L.append(f"## {n:,} files ({ent:,} entries), {rounds[n]} round{'s' if rounds[n] > 1 else ''}"
                 + ("" if n <= upto else ", first-sync modes only"))
        L.append("")
        hdr, sep = "| mode |", "| --- |"
        for lab in labels:
            hdr += f" {lab} s | peak RSS KiB | × dir first | × rsync | syscalls/entry |"
            sep += " ---: | ---: | ---: | ---: | ---: |"
        L.append(hdr + " command |")
        L.append(sep + " --- |")
        rs_rsync = med((n, "rsync", "rsync-first"), 1)
        for mode, what, how in MODES:
            if not any((n, f"p{i}", mode) in runs for i in range(len(snaps))):
                continue
            line = f"| {what} |"
            for i in range(len(snaps)):
                key = (n, f"p{i}", mode)
                rss = med(key, 1)
                sc = "—"
                st = os.path.join(env["MODES_LOGS"], f"strace-{n}-p{i}-{mode}.txt")
                if os.path.exists(st):
                    total, _ = bench.parse_strace(st)
                    if total:
                        sc = f"{total / ent:.1f}"
                line += (f" {secs(key)} | {'—' if rss is None else f'{rss:,.0f}'} "
                         f"| {ratio(rss, med((n, f'p{i}', 'dir-first'), 1))} | {ratio(rss, rs_rsync)} | {sc} |")
            L.append(line + f" `{how}` |")
        for tool, mode, what, how in OTHERS:
            key = (n, tool, mode)
            if key not in runs:
                continue
            rss = med(key, 1)
            line = (f"| {what} | {secs(key)} | {rss:,.0f} | {ratio(rss, med((n, 'p0', 'dir-first'), 1))} "
                    f"| {ratio(rss, rs_rsync)} | — |")
            line += " | | | | |" * (len(snaps) - 1)
            L.append(line + f" `{how}` |")
        L.append("")
    md = "\n".join(L)
    with open(out, "w") as f:
        f.write(md)
    print(md)
EOF
export BENCH_HERE="$here"
py() { python3 -c "$PY" "$@"; }

# A tree that was being updated when a run was cut short is put back.
on_exit() {
    if [ -f "$touched" ]; then py restore "$touched"; fi
    if [ "$BENCH_FS_MODE" = loop ]; then bench_fs_cleanup; fi
}
trap on_exit EXIT

say() { echo "bench: $*" >&2; }
fail() { say "$*"; exit 1; }

# m N TOOL MODE ROUND STDOUT CMD...: one run under bench/measure.c, recorded
# in the .tsv; its output goes to its log (STDOUT: where stdout goes).
m() {
    local n="$1" tool="$2" mode="$3" rnd="$4" stdout="$5" wall rss rc cpu busy
    shift 5
    local log="$logs/$n-$tool-$mode.log"
    if [ "$stdout" = log ]; then stdout="$log"; fi
    printf '$ %s\n' "$*" >>"$log"
    sync
    "$MEASURE_BIN" "$work/.measure" "$@" </dev/null >>"$stdout" 2>>"$log"
    read -r wall rss rc cpu busy <"$work/.measure"
    [ "$rc" = 0 ] || fail "$tool $mode failed (exit $rc); see $log"
    printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$n" "$tool" "$mode" "$rnd" "$wall" "$rss" "$rc" "$cpu" "$busy" >>"$tsv"
    say "$(printf '%8d %-6s %-13s round %d: %7.3f s, %6d KiB' "$n" "$tool" "$mode" "$rnd" \
        "$(awk -v w="$wall" 'BEGIN { print w / 1e9 }')" "$rss")"
}

# traced OUT CMD...: CMD under `strace -c -f`, the counts in OUT.
traced() {
    local out="$1"
    shift
    sync
    strace -c -f -o "$out" -- "$@" </dev/null >>"$logs/strace.log" 2>&1 ||
        fail "strace $* failed; see $logs/strace.log"
}

# The tree, its archive and its image, made once and kept.
prepare() {
    local n="$1" base="$root/trees/modes/n$1-v1"
    if [ ! -d "$base" ]; then
        say "generating a tree of $n files ..."
        py generate "$base" "$n"
    fi
    if [ ! -f "$base.tar.gz" ]; then
        say "making $base.tar.gz ..."
        tar -C "$base" --format=pax -czf "$base.tar.gz.tmp" .
        mv "$base.tar.gz.tmp" "$base.tar.gz"
    fi
    if [ ! -d "$base.oci" ]; then
        say "making the OCI layout $base.oci ..."
        rm -rf "$base.oci.tmp"
        py oci "$base" "$base.oci.tmp" bench
        mv "$base.oci.tmp" "$base.oci"
    fi
}

# Each binary's turn in round RND: all of them, the first rotated to the back.
order() {
    local rnd="$1" k i
    k=$((rnd % ${#bins[@]}))
    for i in "${!bins[@]}"; do echo $(((i + k) % ${#bins[@]})); done
}

run_size() {
    local n="$1" rounds="$2" all=0 rnd i src tgz lay d
    [ "$n" -le "$upto" ] && all=1
    prepare "$n"
    src="$root/trees/modes/n$n-v1" tgz="$root/trees/modes/n$n-v1.tar.gz" lay="oci-layout:$root/trees/modes/n$n-v1.oci:bench"
    for rnd in $(seq "$rounds"); do
        mapfile -t turn < <(order "$rnd")
        # Directory: first sync, no-op, --checksum no-op, then a 1% update
        # itemized (--dry-run) and synced; the tree is put back after.
        for i in "${turn[@]}"; do
            d="$work/dir-$i"; rm -rf "$d"; mkdir -p "$d"
            m "$n" "p$i" dir-first "$rnd" log "${bins[$i]}" sync -q "$src" "$d/dest"
        done
        if [ "$all" = 1 ]; then
            for i in "${turn[@]}"; do m "$n" "p$i" dir-noop "$rnd" log "${bins[$i]}" sync -q "$src" "$work/dir-$i/dest"; done
            for i in "${turn[@]}"; do m "$n" "p$i" dir-checksum "$rnd" log "${bins[$i]}" sync -q --checksum "$src" "$work/dir-$i/dest"; done
            py touch "$src" "$n" "$rnd" "$touched"
            for i in "${turn[@]}"; do m "$n" "p$i" dir-dryrun "$rnd" /dev/null "${bins[$i]}" sync --dry-run --itemize "$src" "$work/dir-$i/dest"; done
            for i in "${turn[@]}"; do m "$n" "p$i" dir-update "$rnd" log "${bins[$i]}" sync -q "$src" "$work/dir-$i/dest"; done
            py restore "$touched"
        fi
        for i in "${turn[@]}"; do rm -rf "$work/dir-$i"; done
        # Archive.
        for i in "${turn[@]}"; do
            d="$work/tar-$i"; rm -rf "$d"; mkdir -p "$d"
            m "$n" "p$i" tar-first "$rnd" log "${bins[$i]}" sync -q "$tgz" "$d/dest"
        done
        if [ "$all" = 1 ]; then
            for i in "${turn[@]}"; do m "$n" "p$i" tar-noop "$rnd" log "${bins[$i]}" sync -q "$tgz" "$work/tar-$i/dest"; done
        fi
        for i in "${turn[@]}"; do rm -rf "$work/tar-$i"; done
        # Image.
        for i in "${turn[@]}"; do
            d="$work/oci-$i"; rm -rf "$d"; mkdir -p "$d"
            m "$n" "p$i" oci-first "$rnd" log "${bins[$i]}" sync -q "$lay" "$d/dest"
        done
        if [ "$all" = 1 ]; then
            for i in "${turn[@]}"; do m "$n" "p$i" oci-noop "$rnd" log "${bins[$i]}" sync -q "$lay" "$work/oci-$i/dest"; done
        fi
        for i in "${turn[@]}"; do rm -rf "$work/oci-$i"; done
        # rsync and cp -a.
        d="$work/rsync"; rm -rf "$d"; mkdir -p "$d"
        m "$n" rsync rsync-first "$rnd" log rsync -a --delete "$src/" "$d/"
        if [ "$all" = 1 ]; then m "$n" rsync rsync-noop "$rnd" log rsync -a --delete "$src/" "$d/"; fi
        rm -rf "$d"
        d="$work/cp"; rm -rf "$d"; mkdir -p "$d"
        m "$n" cp cp-first "$rnd" log cp -a "$src/." "$d/"
        rm -rf "$d"
    done
    # Syscalls per entry: one untimed run each under strace, smallest size.
    if [ "$use_strace" = 1 ] && [ "$n" = "$smallest" ] && [ "$all" = 1 ]; then
        for i in "${!bins[@]}"; do
            d="$work/strace-$i"; rm -rf "$d"; mkdir -p "$d"
            local pfx="$logs/strace-$n-p$i"
            say "strace of p$i's directory first sync, no-op and 1% update ..."
            traced "$pfx-dir-first.txt" "${bins[$i]}" sync -q "$src" "$d/dest"
            traced "$pfx-dir-noop.txt" "${bins[$i]}" sync -q "$src" "$d/dest"
            py touch "$src" "$n" 0 "$touched"
            traced "$pfx-dir-update.txt" "${bins[$i]}" sync -q "$src" "$d/dest"
            py restore "$touched"
            rm -rf "$d"
        done
    fi
}

t0=$(date +%s)
for k in "${!size_list[@]}"; do
    r="${round_list[$k]:-${round_list[$((${#round_list[@]} - 1))]}}"
    run_size "${size_list[$k]}" "$r"
done

rounds_used=()
for k in "${!size_list[@]}"; do rounds_used+=("${round_list[$k]:-${round_list[$((${#round_list[@]} - 1))]}}"); done
out="${out:-$here/results/$(date +%Y-%m-%d)-modes.md}"
mkdir -p "$(dirname "$out")"
cp "$tsv" "${out%.md}.tsv"
MODES_CMDLINE="$cmdline" MODES_SIZES="${size_list[*]}" MODES_ROUNDS="${rounds_used[*]}" MODES_UPTO="$upto" \
    MODES_ORIGS="$(printf '%s\n' "${origs[@]}")" MODES_BINS="$(printf '%s\n' "${bins[@]}")" \
    MODES_LOGS="$logs" MODES_ELAPSED="$(($(date +%s) - t0))" \
    py report "$tsv" "$out"
say "report written to $out"
