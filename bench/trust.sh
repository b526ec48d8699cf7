#!/usr/bin/env bash
# bench/trust.sh: what `--verify-key` costs, side by side with the same
# sync without it, in one run:
#   * an image (5,000 files, 40 MiB, one gzip layer) from a local registry,
#     signed as cosign signs (the legacy `sha256-HEX.sig` tag, ECDSA P-256):
#     cold publish verified vs unverified, and the no-op (tag unchanged)
#     verified vs unverified;
#   * the same tree as an OPA bundle over HTTP (a tar.gz whose
#     /.signatures.json lists every file's SHA-256, ES256): cold publish
#     verified vs unverified, and the verified no-op (a 304); and the same
#     bundle unpacked into a directory: cold publish and no-op;
#   * syscalls per entry of the cold publish, verified and not (strace -c -f);
#   * peak RSS (/usr/bin/time's %M) of each cold publish, verified and not.
#
#   RUSTFLAGS='-C target-feature=+crt-static' cargo build --release --target x86_64-unknown-linux-gnu
#   bench/trust.sh            # RUNS=7 by default; prints median, min, max
#
# FILES (default 5000) and MAXSIZE (bytes, default 15360) change the tree:
# FILES files of 1 KiB to MAXSIZE bytes (0 to MAXSIZE below 1 KiB), in 50
# packs. PACKSYNC names the binary.
#
# Needs docker-registry, skopeo, openssl, curl, python3 and strace.
# Everything lives in a temporary directory; the servers it starts are
# stopped (by their pids) at the end.
set -euo pipefail
cd "$(dirname "$0")/.."
P=$(realpath "${PACKSYNC:-target/x86_64-unknown-linux-gnu/release/packsync}")
RUNS=${RUNS:-7}
W=$(mktemp -d "${TMPDIR:-/tmp}/packsync-trust.XXXXXX")
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$W"; }
trap cleanup EXIT

openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$W/key.pem" 2>/dev/null
openssl pkey -in "$W/key.pem" -pubout -out "$W/key.pub"

# The tree, the image (tag 1) with its cosign signature, and the signed bundle.
FILES=${FILES:-5000} MAXSIZE=${MAXSIZE:-15360} python3 - "$W" <<'PY'
import base64, gzip, hashlib, io, json, os, random, subprocess, sys, tarfile
w = sys.argv[1]
random.seed(25)
lay = os.path.join(w, "layout")
os.makedirs(os.path.join(lay, "blobs", "sha256"))
def put(data, media):
    d = hashlib.sha256(data).hexdigest()
    open(os.path.join(lay, "blobs", "sha256", d), "wb").write(data)
    return {"mediaType": media, "digest": "sha256:" + d, "size": len(data)}
files = {}
nfiles, maxsize = int(os.environ.get("FILES", "5000")), int(os.environ.get("MAXSIZE", "15360"))
for i in range(nfiles):
    size = random.randint(min(1024, maxsize), maxsize)
    half = size // 2
    files["packs/p%02d/actions/a%04d.py" % (i % 50, i)] = (os.urandom(half) + b"#" * (size - half))
def tar_of(entries):
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
raw = tar_of(sorted(files.items()))
layer = put(gzip.compress(raw, compresslevel=6, mtime=0), "application/vnd.oci.image.layer.v1.tar+gzip")
cfg = put(json.dumps({"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers",
    "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()]}}).encode(), "application/vnd.oci.image.config.v1+json")
m = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": cfg, "layers": [layer]}).encode(), "application/vnd.oci.image.manifest.v1+json")
m["annotations"] = {"org.opencontainers.image.ref.name": "1"}
digest = m["digest"]
# cosign's legacy signature: a simple-signing payload naming the digest,
# its ECDSA signature (DER, base64) in the layer's annotation.
payload = json.dumps({"critical": {"identity": {"docker-reference": "127.0.0.1/packs"},
    "image": {"docker-manifest-digest": digest}, "type": "cosign container image signature"},
    "optional": None}).encode()
sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", os.path.join(w, "key.pem")],
    input=payload, capture_output=True, check=True).stdout
p = put(payload, "application/vnd.dev.cosign.simplesigning.v1+json")
p["annotations"] = {"dev.cosignproject.cosign/signature": base64.b64encode(sig).decode()}
c = put(b"{}", "application/vnd.oci.image.config.v1+json")
s = put(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
    "config": c, "layers": [p]}).encode(), "application/vnd.oci.image.manifest.v1+json")
s["annotations"] = {"org.opencontainers.image.ref.name": digest.replace(":", "-") + ".sig"}
json.dump({"schemaVersion": 2, "manifests": [m, s]}, open(os.path.join(lay, "index.json"), "w"))
open(os.path.join(lay, "oci-layout"), "w").write('{"imageLayoutVersion": "1.0.0"}')
open(os.path.join(w, "sigtag"), "w").write(digest.replace(":", "-") + ".sig")
# The OPA bundle: the same files, a .manifest, and /.signatures.json (ES256).
def b64(b): return base64.urlsafe_b64encode(b).rstrip(b"=").decode()
manifest = json.dumps({"revision": "r1", "roots": ["packs"]}, sort_keys=True, separators=(",", ":")).encode()
listed = [{"name": ".manifest", "hash": hashlib.sha256(manifest).hexdigest(), "algorithm": "SHA-256"}]
listed += [{"name": n, "hash": hashlib.sha256(d).hexdigest(), "algorithm": "SHA-256"} for n, d in sorted(files.items())]
signing = (b64(json.dumps({"alg": "ES256"}).encode()) + "." + b64(json.dumps({"files": listed}).encode())).encode()
der = subprocess.run(["openssl", "dgst", "-sha256", "-sign", os.path.join(w, "key.pem")],
    input=signing, capture_output=True, check=True).stdout
def der_to_raw(der, n):
    i = 2 if der[1] < 0x80 else 2 + (der[1] & 0x7f)
    out = b""
    for _ in range(2):
        l = der[i + 1]
        out += der[i + 2:i + 2 + l].lstrip(b"\0").rjust(n, b"\0")
        i += 2 + l
    return out
sigs = json.dumps({"signatures": [signing.decode() + "." + b64(der_to_raw(der, 32))]}).encode()
extra = [(".manifest", manifest), (".signatures.json", sigs)]
open(os.path.join(w, "bundle.tar.gz"), "wb").write(
    gzip.compress(tar_of(extra + sorted(files.items())), compresslevel=6, mtime=0))
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
for tag in 1 "$(cat "$W/sigtag")"; do
  skopeo copy -q --dest-tls-verify=false "oci:$W/layout:$tag" "docker://127.0.0.1:$port/packs:$tag"
done
# An HTTP server that answers If-None-Match with 304 (python's http.server
# sends no ETag), serving the bundle.
cat >"$W/serve.py" <<'PY'
import hashlib, http.server, os, sys
root = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        data = open(os.path.join(root, self.path.lstrip("/")), "rb").read()
        etag = '"' + hashlib.sha256(data).hexdigest()[:16] + '"'
        if self.headers.get("If-None-Match") == etag:
            self.send_response(304); self.send_header("ETag", etag); self.end_headers(); return
        self.send_response(200); self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
s = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
PY
python3 -u "$W/serve.py" "$W" >"$W/http.port" 2>"$W/http.log" &
pids+=($!)
until hport=$(head -1 "$W/http.port" 2>/dev/null) && [ -n "$hport" ]; do sleep 0.1; done
img="oci://127.0.0.1:$port/packs:1"
url="http://127.0.0.1:$hport/bundle.tar.gz"
# The same bundle unpacked: a bundle in a directory (an init container's).
dir="$W/bundle-dir"
mkdir -p "$dir" && tar -xzf "$W/bundle.tar.gz" -C "$dir"
key=(--verify-key "$W/key.pub")
# Both are checked once, so the figures below are of syncs that succeed.
mkdir -p "$W/check"
"$P" sync -q "${key[@]}" "$img" "$W/check/img"
"$P" sync -q "${key[@]}" "$url" "$W/check/bundle"
"$P" sync -q "${key[@]}" "$dir" "$W/check/dir"
rm -rf "$W/check"

time_ms() { local t0 t1; t0=$(date +%s%N); "$@" >/dev/null 2>&1; t1=$(date +%s%N); echo $(( (t1 - t0) / 1000000 )); }
stats() { sort -n | awk '{ a[NR] = $1 } END {
  printf "median %.3f s (min %.3f, max %.3f)\n", a[int((NR + 1) / 2)] / 1000, a[1] / 1000, a[NR] / 1000 }'; }
row() { printf '%-52s ' "$1"; }
fresh() { rm -rf "$W/vol"; mkdir -p "$W/vol"; sync; }

# Each pair runs interleaved, round by round, so that a load that comes and
# goes on a shared machine weighs on both sides alike.
pair() { # pair LABEL_A LABEL_B: a() and b(), each after fresh, RUNS times
  local ta=() tb=()
  for _ in $(seq "$RUNS"); do
    fresh; ta+=("$(time_ms a)")
    fresh; tb+=("$(time_ms b)")
  done
  row "$1"; printf '%s\n' "${ta[@]}" | stats
  row "$2"; printf '%s\n' "${tb[@]}" | stats
}
# pair_noop: the same, on a volume published once before (no fresh).
pair_noop() {
  local ta=() tb=()
  fresh
  "$P" sync -q "${key[@]}" "$3" "$W/vol/a"
  "$P" sync -q "$3" "$W/vol/b"
  for _ in $(seq "$RUNS"); do
    ta+=("$(time_ms a)")
    tb+=("$(time_ms b)")
  done
  row "$1"; printf '%s\n' "${ta[@]}" | stats
  row "$2"; printf '%s\n' "${tb[@]}" | stats
}

a() { "$P" sync -q "${key[@]}" "$img" "$W/vol/a"; }
b() { "$P" sync -q "$img" "$W/vol/b"; }
pair "image, cold, --verify-key (cosign .sig tag)" "image, cold, no key"
pair_noop "image, no-op, --verify-key" "image, no-op, no key" "$img"
a() { "$P" sync -q "${key[@]}" "$url" "$W/vol/a"; }
b() { "$P" sync -q "$url" "$W/vol/b"; }
pair "OPA bundle over HTTP, cold, --verify-key" "OPA bundle over HTTP, cold, no key"
pair_noop "OPA bundle over HTTP, no-op (304), --verify-key" "OPA bundle over HTTP, no-op (304), no key" "$url"
a() { "$P" sync -q "${key[@]}" "$dir" "$W/vol/a"; }
b() { "$P" sync -q "$dir" "$W/vol/b"; }
pair "OPA bundle in a directory, cold, --verify-key" "OPA bundle in a directory, cold, no key"
pair_noop "OPA bundle in a directory, no-op, --verify-key" "OPA bundle in a directory, no-op, no key" "$dir"

# The entries: FILES files, packs/, 50 pN/ and their actions/.
entries=$(( ${FILES:-5000} + 101 ))
rss_kib() { /usr/bin/time -f %M -o "$W/time.out" "$@" >/dev/null 2>&1; cat "$W/time.out"; }
for what in img url dir; do
  src=${!what}
  fresh; row "  $what cold --verify-key: peak RSS"; echo "$(rss_kib "$P" sync -q "${key[@]}" "$src" "$W/vol/a") KiB"
  fresh; row "  $what cold no key: peak RSS"; echo "$(rss_kib "$P" sync -q "$src" "$W/vol/b") KiB"
done
fresh; "$P" sync -q "${key[@]}" "$dir" "$W/vol/a"
row "  dir no-op --verify-key: peak RSS"; echo "$(rss_kib "$P" sync -q "${key[@]}" "$dir" "$W/vol/a") KiB"
sys_per_entry() { strace -c -f -o "$W/strace.out" "$@" >/dev/null 2>&1; awk '$NF == "total" { print $(NF-2) }' "$W/strace.out"; }
for what in img url dir; do
  src=${!what}
  fresh; n=$(sys_per_entry "$P" sync -q "${key[@]}" "$src" "$W/vol/a")
  row "  $what cold --verify-key: syscalls per entry"; awk -v n="$n" -v e="$entries" 'BEGIN { printf "%.1f (%d in all)\n", n / e, n }'
  fresh; n=$(sys_per_entry "$P" sync -q "$src" "$W/vol/b")
  row "  $what cold no key: syscalls per entry"; awk -v n="$n" -v e="$entries" 'BEGIN { printf "%.1f (%d in all)\n", n / e, n }'
done
