# Shared by bench/flags.sh, bench/bare.sh and bench/netfs.sh (sourced, not run): the
# binaries to compare, bench/measure.c built once, the generated trees
# bench/modes.sh keeps, and one measured run. bench/modes.sh uses
# bench_measure_bin.
#
#   bench_measure_bin CC    -> $bench_dir/bin/measure, built where missing
#                              or older than bench/measure.c
#   bench_setup NAME FILES  -> $bench_dir, $measure, $tree, $work (emptied),
#                              $bench_dir/bin/NAME-new and NAME-old
#   bench_run WHO ARGS...   -> prints "wall-s cpu-s rss-KiB" of
#                              $bench_dir/bin/NAME-WHO ARGS (WHO new or old;
#                              any other WHO is run as a command: rsync, cp)
#   bench_note STEP WHO R   -> keeps bench_run's result R as a row (and says it)
#   bench_table             -> prints the rows kept as a Markdown table

bench_measure_bin() {
    local here
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    if [ ! -x "$bench_dir/bin/measure" ] || [ "$here/measure.c" -nt "$bench_dir/bin/measure" ]; then
        "$1" -O2 -Wall -Wextra -o "$bench_dir/bin/measure" "$here/measure.c"
    fi
}

bench_setup() {
    bench_name="$1"
    local files="$2" here cc var
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
    for var in PACKSYNC PACKSYNC_OLD; do
        [ -x "${!var:-}" ] || { echo "bench: $var must name an executable" >&2; exit 2; }
    done
    cc="$(command -v gcc || command -v cc || true)"
    [ -n "$cc" ] || { echo "bench: missing: gcc" >&2; exit 2; }
    bench_dir="${BENCH_DIR:-/tmp/packsync-bench}"
    mkdir -p "$bench_dir/bin" "$bench_dir/trees/modes"
    bench_dir="$(cd "$bench_dir" && pwd)"
    bench_measure_bin "$cc"
    measure="$bench_dir/bin/measure"
    cp "$PACKSYNC" "$bench_dir/bin/$bench_name-new"
    cp "$PACKSYNC_OLD" "$bench_dir/bin/$bench_name-old"
    tree="$bench_dir/trees/modes/n$files-v1"
    if [ ! -d "$tree" ]; then
        BENCH_HERE="$here" python3 -c 'import os, sys; sys.path.insert(0, os.environ["BENCH_HERE"]); import scale; scale.generate(sys.argv[1], int(sys.argv[2]))' "$tree" "$files"
    fi
    work="$bench_dir/run/$bench_name"
    rm -rf "$work"
    mkdir -p "$work"
}

bench_run() {
    local who="$1" cmd ns rss code cpu
    shift
    case "$who" in
    new | old) cmd="$bench_dir/bin/$bench_name-$who" ;;
    *) cmd="$who" ;;
    esac
    sync
    "$measure" "$work/m.out" "$cmd" "$@" >/dev/null 2>"$work/m.err" || true
    read -r ns rss code cpu _ <"$work/m.out"
    [ "$code" = 0 ] || { echo "bench: $who $* exited $code: $(head -1 "$work/m.err")" >&2; exit 1; }
    printf '%s %s %s\n' "$(awk "BEGIN{printf \"%.3f\", $ns/1e9}")" "$(awk "BEGIN{printf \"%.2f\", $cpu/1e9}")" "$rss"
}

bench_rows=()
bench_note() {
    bench_rows+=("$1|$2|$3")
    echo "bench: $1 $2: $3" >&2
}

bench_table() {
    echo "| step | who | s | CPU s | peak RSS KiB |"
    echo "| --- | --- | ---: | ---: | ---: |"
    local l step who r s c m
    for l in "${bench_rows[@]}"; do
        IFS='|' read -r step who r <<<"$l"
        read -r s c m <<<"$r"
        echo "| $step | $who | $s | $c | $m |"
    done
}
