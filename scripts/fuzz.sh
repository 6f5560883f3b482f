#!/usr/bin/env bash
# holdfast's fuzz targets (fuzz/, cargo-fuzz + libFuzzer) on the stable toolchain.
#
#   scripts/fuzz.sh smoke [SECONDS]         every target for SECONDS (default 5) from its committed
#                                           corpus (a copy: the corpus is not changed); `make test`
#   scripts/fuzz.sh run TARGET SECONDS      one long run under nice 19, growing fuzz/work/TARGET
#   scripts/fuzz.sh minimize TARGET         merge fuzz/work/TARGET into the committed corpus,
#                                           keeping only inputs that add an edge
#
# cargo-fuzz's -Z flags need nightly; RUSTC_BOOTSTRAP=1 lets stable accept them. No sanitizer
# (-s none): holdfast forbids unsafe code, and the rate is what finds panics and hangs. Limits
# on every run: -rss_limit_mb=1024 (bounded memory), -timeout=10 (a hang is a failure).
set -euo pipefail
cd "$(dirname "$0")/.."

TARGETS=(admission_review reference www_authenticate manifest bundle semver dockerconfigjson tag_list_json link_header retry_after token_json)
LIMITS=(-rss_limit_mb=1024 -timeout=10 -print_final_stats=1)
export RUSTC_BOOTSTRAP=1

# cargo-fuzz from crates.io when missing (cached in ~/.cargo/bin afterwards); unoptimized (--debug):
# it only drives cargo, and its optimized build took minutes of a new machine's make test.
ensure_cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        echo "fuzz: installing cargo-fuzz (once)" >&2
        cargo install --locked --debug cargo-fuzz
    fi
}

fuzz() {
    (cd fuzz && cargo fuzz "$@")
}

# The long runs yield the CPU to everything else.
fuzz_low() {
    (cd fuzz && nice -n 19 cargo fuzz "$@")
}

case "${1:-}" in
smoke)
    seconds="${2:-5}"
    ensure_cargo_fuzz
    # --dev: a few seconds of each target need no optimised build, whose instrumented compile of
    # every dependency was one of the longest steps of a first `make test`; debug assertions and
    # overflow checks stay on, as in the long runs.
    fuzz build --dev -s none
    scratch="$(mktemp -d)"
    trap 'rm -rf "$scratch"' EXIT
    for target in "${TARGETS[@]}"; do
        mkdir -p "$scratch/$target"
        cp fuzz/corpus/"$target"/* "$scratch/$target/"
        if ! fuzz run --dev -s none "$target" "$scratch/$target" -- -max_total_time="$seconds" "${LIMITS[@]}" \
            -artifact_prefix="$scratch/" >"$scratch/$target.log" 2>&1; then
            cat "$scratch/$target.log" >&2
            echo "fuzz-smoke: $target FAILED (the input is in the log above)" >&2
            exit 1
        fi
        echo "fuzz-smoke: $target $(grep -E '^stat::number_of_executed_units' "$scratch/$target.log" | awk '{print $2}') runs, ok"
    done
    ;;
run)
    target="$2" seconds="$3"
    ensure_cargo_fuzz
    mkdir -p fuzz/work/"$target"
    cp -n fuzz/corpus/"$target"/* fuzz/work/"$target"/ 2>/dev/null || true
    fuzz build -s none "$target"
    fuzz_low run -s none "$target" work/"$target" -- -max_total_time="$seconds" "${LIMITS[@]}"
    ;;
minimize)
    target="$2"
    ensure_cargo_fuzz
    merged="$(mktemp -d)"
    trap 'rm -rf "$merged"' EXIT
    # Edges only (-use_counters=0): every covered edge keeps an input, hit counts do not, so
    # the committed corpus stays small.
    fuzz_low run -s none "$target" "$merged" corpus/"$target" work/"$target" -- -merge=1 -use_counters=0 "${LIMITS[@]}"
    rm -f fuzz/corpus/"$target"/*
    cp "$merged"/* fuzz/corpus/"$target"/
    ;;
*)
    sed -n '2,12p' "$0" >&2
    exit 2
    ;;
esac
