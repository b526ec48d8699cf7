#!/usr/bin/env bash
# bench/delta.sh: what a 1% update of a one-layer image costs, pushed as
# zstd:chunked, as plain zstd and as gzip. The image holds 2,000 files of
# 48 KiB (random bytes, as in issue 26); v2 changes 20 of them. Each format
# is built by buildah and pushed to the container rig's registry; for each,
# RUNS times: a cold publish of v1 onto an empty volume, then the update to
# v2. Bytes are what the registry's access log says it sent packsync (not
# packsync's own account); times are wall clock. The figures in
# BENCHMARKS.md ("Fetching only what changed") come from here.
#
#   cargo build --release
#   sudo bench/delta.sh                 # RUNS=5; prints medians
#   PACKSYNC_BEFORE=/path/to/old/packsync sudo bench/delta.sh   # also the gzip update with another binary
#
# Needs root and ../shared/container-rig.sh (buildah, skopeo, a registry);
# the rig is brought up in a private directory on its own port and down at exit.
set -euo pipefail
cd "$(dirname "$0")/.."
P=$(realpath "${PACKSYNC:-target/release/packsync}")
BEFORE=${PACKSYNC_BEFORE:-}
RUNS=${RUNS:-5}
RIG=$(realpath "${CONTAINER_RIG:-../shared/container-rig.sh}")
export CONTAINER_RIG_DIR=${CONTAINER_RIG_DIR:-/tmp/packsync-delta-rig}
export CONTAINER_RIG_REGISTRY_PORT=${CONTAINER_RIG_REGISTRY_PORT:-5055}
W=$(mktemp -d "${TMPDIR:-/tmp}/packsync-delta.XXXXXX")
cleanup() { bash "$RIG" down >/dev/null 2>&1 || true; rm -rf "$W"; }
trap cleanup EXIT
bash "$RIG" up >/dev/null
set -a; eval "$(bash "$RIG" env)"; set +a

python3 - "$W" <<'PY'
import os, random, sys
w = sys.argv[1]
for v, changed in (("1", 0), ("2", 20)):
    d = f"{w}/tree{v}/packs"
    os.makedirs(d)
    for i in range(2000):
        data = random.Random(i).randbytes(48 << 10)
        if i < changed:
            data = b"changed!" + data[8:]
        with open(f"{d}/f{i:04}", "wb") as f:
            f.write(data)
        os.utime(f"{d}/f{i:04}", (1700000000, 1700000000))
PY

for fmt in zstd:chunked zstd gzip; do
  repo=delta-${fmt/:/-}
  for v in 1 2; do
    c=$(buildah from scratch); m=$(buildah mount "$c")
    cp -a "$W/tree$v/." "$m/"
    buildah umount "$c" >/dev/null
    buildah commit -q "$c" "localhost/$repo:$v" >/dev/null; buildah rm "$c" >/dev/null
    buildah push -q --compression-format "$fmt" --tls-verify=false "localhost/$repo:$v" \
      "docker://$CONTAINER_RIG_REGISTRY/$repo:$v"
  done
done

python3 - "$W" "$P" "$BEFORE" "$RUNS" "$CONTAINER_RIG_REGISTRY" "$CONTAINER_RIG_DIR/logs/registry.log" <<'PY'
import os, shutil, statistics, subprocess, sys, time
w, p, before, runs, reg, log = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], sys.argv[6]

def sent(since):
    """Bytes the registry sent packsync for blobs after offset `since` of its log."""
    with open(log, "rb") as f:
        f.seek(since)
        n = 0
        for line in f.read().decode(errors="replace").splitlines():
            if "packsync/" in line and "/blobs/" in line:
                try:
                    n += int(line.split('HTTP/1.1" ')[1].split()[1])
                except (IndexError, ValueError):
                    pass
        return n

def sync(binary, src, dest):
    at = os.path.getsize(log)
    t = time.monotonic()
    subprocess.run([binary, "sync", "--grace", "0", "--no-progress", src, dest], check=True,
                   stdout=subprocess.DEVNULL)
    return time.monotonic() - t, sent(at)

rows = []
cases = [("zstd:chunked", p), ("zstd", p), ("gzip", p)]
if before:
    cases.append(("gzip", before))
for fmt, binary in cases:
    repo = "delta-" + fmt.replace(":", "-")
    cold, upd = [], []
    for _ in range(runs):
        vol = f"{w}/vol"
        shutil.rmtree(vol, ignore_errors=True)
        os.makedirs(vol)
        cold.append(sync(binary, f"oci://{reg}/{repo}:1", f"{vol}/packs"))
        upd.append(sync(binary, f"oci://{reg}/{repo}:2", f"{vol}/packs"))
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    who = "this build" if binary == p else os.path.basename(binary) + " (before)"
    rows.append((fmt, who, med(cold, 0), med(cold, 1), med(upd, 0), med(upd, 1)))

print(f"{runs} runs each; medians. 2,000 files of 48 KiB, 20 changed in v2.")
print("| layer | binary | cold publish s | cold KiB fetched | 1% update s | update KiB fetched |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for fmt, who, cs, cb, us, ub in rows:
    print(f"| {fmt} | {who} | {cs:.2f} | {cb // 1024:,} | {us:.2f} | {ub // 1024:,} |")
PY
