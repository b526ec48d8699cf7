#!/usr/bin/env bash
# bench/sources.sh: sources that are not directories, side by side with what
# a user would script instead, in one run:
#   * cold publish of a venv-like image (13k files, 150 MiB, 3 gzip layers)
#     from a local registry: `packsync sync oci://...` vs `skopeo copy
#     docker://... oci:DIR` followed by `umoci raw unpack`;
#   * the same tree as one tar.gz over HTTP: `packsync sync http://...` vs
#     `curl | tar -xz`;
#   * a no-op (the tag unchanged) and a 1% update (a new top layer touching
#     1% of the files);
#   * peak RSS of the cold image publish vs a directory sync of the same
#     tree, and of the 1% update;
#   * a second image shape, one layer of 20,000 small files (64 B-2 KiB)
#     and one 50 MiB random blob: cold publish vs skopeo copy + umoci, and
#     syscalls per entry of both (strace -c -f).
#
#   RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu
#   bench/sources.sh          # RUNS=5 by default; prints median, min, max
#
# Needs docker-registry, skopeo, umoci, curl, python3 and /usr/bin/time.
# Everything lives in a temporary directory; the registry it starts is
# stopped (by its pid) at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
P=$(realpath "${PACKSYNC:-target/x86_64-unknown-linux-gnu/release/packsync}")
RUNS=${RUNS:-5}
W=$(mktemp -d "${TMPDIR:-/tmp}/packsync-sources.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT

# The image: 13000 files in 3 layers (6000 + 5000 + 2000), 150 MiB in all,
# half of each file random (a venv's .so and .pyc compress about that well).
python3 - "$W" <<'PY'
import gzip, hashlib, io, json, os, random, sys, tarfile
w = sys.argv[1]
random.seed(12)
lay = os.path.join(w, "layout")
os.makedirs(os.path.join(lay, "blobs", "sha256"))
def put(data):
    d = hashlib.sha256(data).hexdigest()
    open(os.path.join(lay, "blobs", "sha256", d), "wb").write(data)
    return {"digest": "sha256:" + d, "size": len(data)}
total = 150 << 20
counts = [6000, 5000, 2000]
n = sum(counts)
sizes = [max(64, int(random.expovariate(1 / (total / n)))) for _ in range(n)]
scale = total / sum(sizes)
sizes = [max(64, int(s * scale)) for s in sizes]
def content(i, size, salt=b""):
    half = size // 2
    return os.urandom(half) + (b"# venv %d %s\n" % (i, salt)) * ((size - half) // 12 + 1)
files = {}
layers_entries = []
i = 0
for li, c in enumerate(counts):
    entries = []
    for _ in range(c):
        path = "venv/lib/python3.11/site-packages/pkg%03d/mod%05d.py" % (i % 400, i)
        data = content(i, sizes[i])[: sizes[i]]
        files[path] = data
        entries.append((path, data))
        i += 1
    layers_entries.append(entries)
def tar_of(entries, whiteouts=()):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as t:
        dirs = set()
        for path, data in entries:
            parts = path.split("/")
            for k in range(1, len(parts)):
                d = "/".join(parts[:k])
                if d not in dirs:
                    dirs.add(d)
                    ti = tarfile.TarInfo(d); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; ti.mtime = 1700000000
                    t.addfile(ti)
            ti = tarfile.TarInfo(path); ti.size = len(data); ti.mode = 0o644; ti.mtime = 1700000000
            t.addfile(ti, io.BytesIO(data))
    return buf.getvalue()
def image(tag, layer_tars):
    layers = []
    diff_ids = ["sha256:" + hashlib.sha256(raw).hexdigest() for raw in layer_tars]
    for raw in layer_tars:
        d = put(gzip.compress(raw, compresslevel=6, mtime=0))
        d["mediaType"] = "application/vnd.oci.image.layer.v1.tar+gzip"
        layers.append(d)
    cfg = put(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode())
    cfg["mediaType"] = "application/vnd.oci.image.config.v1+json"
    m = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
                        "config": cfg, "layers": layers}).encode())
    m["mediaType"] = "application/vnd.oci.image.manifest.v1+json"
    m["annotations"] = {"org.opencontainers.image.ref.name": tag}
    return m
base = [tar_of(e) for e in layers_entries]
# The 1% update: a fourth layer rewriting 130 files.
changed = [(p, content(7, len(d), b"v2")[: len(d)]) for p, d in list(files.items())[::100]]
top = tar_of(changed)
# The second shape: 20,000 small files and a 50 MiB random blob, one layer.
small = [("app/data/d%03d/f%05d.txt" % (k % 200, k), os.urandom(random.randint(32, 1024)).hex().encode())
         for k in range(20000)]
small.sort()  # as a build's directory walk writes a layer: a directory's files together
small.append(("app/blob.bin", os.urandom(50 << 20)))
tester = image("t1", [tar_of(small)])
idx = {"schemaVersion": 2, "manifests": [image("1", base), image("2", base + [top]), tester]}
json.dump(idx, open(os.path.join(lay, "index.json"), "w"))
open(os.path.join(lay, "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
# The same tree as one tar.gz, and as a directory.
with open(os.path.join(w, "venv.tar.gz"), "wb") as f:
    f.write(gzip.compress(tar_of(list(files.items())), compresslevel=6, mtime=0))
for path, data in files.items():
    p = os.path.join(w, "dir", path)
    os.makedirs(os.path.dirname(p), exist_ok=True)
    open(p, "wb").write(data)
PY

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat >"$W/registry.yml" <<EOF
version: 0.1
log:
  level: error
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: $W/registry
http:
  addr: 127.0.0.1:$port
EOF
docker-registry serve "$W/registry.yml" >"$W/registry.log" 2>&1 &
pids+=($!)
until curl -s -o /dev/null "http://127.0.0.1:$port/v2/"; do sleep 0.1; done
for tag in 1 2; do
  skopeo copy -q --dest-tls-verify=false "oci:$W/layout:$tag" "docker://127.0.0.1:$port/venv:$tag"
done
skopeo copy -q --dest-tls-verify=false "oci:$W/layout:t1" "docker://127.0.0.1:$port/tester:1"
python3 -u -m http.server --directory "$W" --bind 127.0.0.1 0 >"$W/http.log" 2>&1 &
pids+=($!)
until hport=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$W/http.log" | head -1) && [ -n "$hport" ]; do sleep 0.1; done
img="oci://127.0.0.1:$port/venv"
url="http://127.0.0.1:$hport/venv.tar.gz"

# time_ms CMD...: wall time of one run, in milliseconds, caches warm.
time_ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
stats() { sort -n | awk '{ a[NR] = $1 } END {
  printf "median %.3f s (min %.3f, max %.3f)\n", a[int((NR + 1) / 2)] / 1000, a[1] / 1000, a[NR] / 1000 }'; }
row() { printf '%-44s ' "$1"; }

fresh() { rm -rf "$W/vol" "$W/o" "$W/u" "$W/x"; mkdir -p "$W/vol" "$W/x"; sync; }
rootless=--rootless
[ "$(id -u)" = 0 ] && rootless=
skopeo_umoci() { # [REPO]: venv by default
  skopeo copy -q --src-tls-verify=false "docker://127.0.0.1:$port/${1:-venv}:1" "oci:$W/o:1" &&
    umoci raw unpack $rootless --image "$W/o:1" "$W/u"
}

# Each pair runs interleaved, round by round, so that a load that comes and
# goes on a shared machine weighs on both sides alike.
pair() { # pair LABEL_A LABEL_B: runs a() and b(), each after fresh, RUNS times
  local ta=() tb=()
  for _ in $(seq "$RUNS"); do
    fresh; ta+=("$(time_ms a)")
    fresh; tb+=("$(time_ms b)")
  done
  row "$1"; printf '%s\n' "${ta[@]}" | stats
  row "$2"; printf '%s\n' "${tb[@]}" | stats
}
a() { "$P" sync -q "$img:1" "$W/vol/venv"; }
b() { skopeo_umoci; }
pair "packsync sync oci:// (cold)" "skopeo copy + umoci raw unpack (cold)"
a() { "$P" sync -q "oci://127.0.0.1:$port/tester:1" "$W/vol/t"; }
b() { skopeo_umoci tester; }
pair "packsync sync oci:// 20k files + 50 MiB (cold)" "skopeo copy + umoci (the same image, cold)"
# Syscalls per entry of both (20,001 entries and their directories).
sys_per_entry() { strace -c -f -o "$W/strace.out" "$@" >/dev/null 2>&1; awk '$NF == "total" { print $(NF-2) }' "$W/strace.out"; }
fresh
n=$(sys_per_entry "$P" sync -q "oci://127.0.0.1:$port/tester:1" "$W/vol/t")
row "  packsync: syscalls per entry"; awk -v n="$n" 'BEGIN { printf "%.1f (%d in all)\n", n / 20201, n }'
fresh
n=$(sys_per_entry bash -c "skopeo copy -q --src-tls-verify=false docker://127.0.0.1:$port/tester:1 oci:$W/o:1 &&
  umoci raw unpack $rootless --image $W/o:1 $W/u")
row "  skopeo + umoci: syscalls per entry"; awk -v n="$n" 'BEGIN { printf "%.1f (%d in all)\n", n / 20201, n }'
a() { "$P" sync -q "$url" "$W/vol/venv"; }
b() { curl -s "$url" | tar -xz -C "$W/x"; }
pair "packsync sync http:// tar.gz (cold)" "curl | tar -xz (cold)"
a() { "$P" sync -q "$W/dir" "$W/vol/venv"; }
b() { "$P" sync -q "$W/venv.tar.gz" "$W/vol/venv"; }
pair "packsync sync DIR (cold, the tree unpacked)" "packsync sync FILE.tar.gz (cold, no network)"

fresh
"$P" sync -q "$img:1" "$W/vol/venv"
row "packsync sync oci:// (no-op, tag unchanged)"
for _ in $(seq "$RUNS"); do time_ms "$P" sync -q "$img:1" "$W/vol/venv"; done | stats
"$P" sync -q "$url" "$W/vol/bundle"
"$P" sync -q "$W/dir" "$W/vol/dir"
row "packsync sync DIR (no-op: two stat walks)"
for _ in $(seq "$RUNS"); do time_ms "$P" sync -q "$W/dir" "$W/vol/dir"; done | stats
row "packsync sync http:// (no-op, 304)"
for _ in $(seq "$RUNS"); do time_ms "$P" sync -q "$url" "$W/vol/bundle"; done | stats
row "packsync sync oci:// (1% update, tag 1 -> 2)"
for _ in $(seq "$RUNS"); do
  fresh
  "$P" sync -q --grace 0 "$img:1" "$W/vol/venv"
  time_ms "$P" sync -q --grace 0 "$img:2" "$W/vol/venv"
done | stats
# Back and forth: tag 2's generation is still retained from the round
# before, so the commit converges on it and hashes it again (150 MiB).
row "  the same, tag 2's generation retained"
for _ in $(seq "$RUNS"); do
  "$P" sync -q --grace 0 "$img:1" "$W/vol/venv"
  time_ms "$P" sync -q --grace 0 "$img:2" "$W/vol/venv"
done | stats

rss() { /usr/bin/time -f %M "$@" 2>&1 >/dev/null | tail -1; }
fresh
row "peak RSS, oci:// cold publish"
echo "$(rss "$P" sync -q "$img:1" "$W/vol/venv") KiB"
row "peak RSS, directory sync of the same tree"
echo "$(rss "$P" sync -q "$W/dir" "$W/vol/dir") KiB"
fresh
"$P" sync -q "$img:1" "$W/vol/venv"
row "peak RSS, oci:// 1% update (tag 1 -> 2)"
echo "$(rss "$P" sync -q --grace 0 "$img:2" "$W/vol/venv") KiB"
