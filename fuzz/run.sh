#!/usr/bin/env bash
# Run each fuzz target for N seconds (default 60): fuzz/run.sh [N] [TARGET...]
# Builds the targets with cargo-fuzz on stable Rust (no sanitizer: only
# nightly has them; coverage instrumentation and debug assertions work on
# stable), then runs each, restarting after a finding until its time is
# used. Prints executions per second and findings per target; findings are
# written to fuzz/artifacts/TARGET/. Exits 1 if any target found anything,
# or if a target executed nothing (a missing binary, a bad dictionary or
# option makes libFuzzer stop at once). The seeds under fuzz/seeds/ are
# replayed by `cargo test` too (fuzzing::target). CI runs 5 s a target;
# a longer run: fuzz/run.sh 600 tar.
# Needs cargo-fuzz (`cargo install cargo-fuzz`) and a C++ compiler.
set -euo pipefail
cd "$(dirname "$0")"
secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(manifest chmod label duration exclude_from tar oci_reference oci_manifest docker_config oci_record manifest_index opa_signatures opa_canonical cosign_signature semver tag_list trusted_root checkpoint zstd_toc estargz_toc)
fi
triple=$(rustc -vV | sed -n 's/^host: //p')
cargo fuzz build --sanitizer none --debug-assertions
bin=target/$triple/release
total_findings=0
idle=()
printf '%-14s %12s %9s %s\n' target execs/s findings 'corpus, crash inputs'
for t in "${targets[@]}"; do
    mkdir -p "corpus/$t" "artifacts/$t"
    before=$(find "artifacts/$t" -type f | wc -l)
    dict=()
    if [ -f "$t.dict" ]; then dict=("-dict=$t.dict"); fi
    # Every input builds a few gitignore matchers (regexes): keep them short.
    if [ "$t" = exclude_from ]; then dict+=("-max_len=256"); fi
    if [ ! -x "$bin/$t" ]; then
        echo "$t: no fuzz binary at $bin/$t" >&2
        idle+=("$t")
        continue
    fi
    execs=0
    sites=$(mktemp)
    start=$(date +%s)
    end=$((start + secs))
    runs=0
    while now=$(date +%s) && [ "$now" -lt "$end" ] && [ "$runs" -lt 50 ]; do
        runs=$((runs + 1))
        log=$(mktemp)
        "$bin/$t" "corpus/$t" "seeds/$t" "${dict[@]}" \
            -max_total_time=$((end - now)) -timeout=10 -print_final_stats=1 \
            -artifact_prefix="artifacts/$t/" >"$log" 2>&1 || true
        # A finding: the panic's place and message (one a line in sites).
        grep -A1 'panicked at' "$log" | grep -v '^--$' | paste -d' ' - - >>"$sites" || true
        n=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
        if [ -z "$n" ] && ! grep -q 'panicked at\|deadly signal\|ERROR: libFuzzer' "$log"; then
            # No final stats and no finding: libFuzzer refused to start
            # (a bad dictionary or option). Show why, and stop this target.
            sed 's/^/    /' "$log" | tail -5 >&2
            rm -f "$log"
            break
        fi
        execs=$((execs + ${n:-0}))
        rm -f "$log"
    done
    elapsed=$(($(date +%s) - start))
    [ "$elapsed" -gt 0 ] || elapsed=1
    crashes=$(($(find "artifacts/$t" -type f | wc -l) - before))
    found=$(sed 's/^thread [^)]*) //' "$sites" | sort -u | wc -l)
    [ "$found" -gt 0 ] || [ "$crashes" -eq 0 ] || found=1
    total_findings=$((total_findings + found))
    printf '%-14s %12d %9d %s\n' "$t" $((execs / elapsed)) "$found" \
        "$(find "corpus/$t" -type f | wc -l) inputs, $crashes new in artifacts/$t"
    sed 's/^thread [^)]*) //' "$sites" | sort | uniq -c | sed 's/^/    /'
    rm -f "$sites"
    [ "$execs" -gt 0 ] || idle+=("$t")
done
if [ ${#idle[@]} -gt 0 ]; then
    echo "fuzz targets that executed nothing: ${idle[*]}" >&2
    exit 1
fi
[ "$total_findings" -eq 0 ]
