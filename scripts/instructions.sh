#!/usr/bin/env bash
# The admission hot path's instruction counts, a guard that needs no timing (`make test`):
#
#   scripts/instructions.sh build     the static release build of webhook/examples/
#                                     admission_instructions.rs, as the image's binaries are built
#                                     (same target, profile and flags: the dependencies are shared)
#   scripts/instructions.sh count     per admission, for each review (pin: a cached pin, the
#                                     pinning rule's hot path; image: an allowed review, no patch;
#                                     bare: the benchmark's bare handler), from callgrind (Debian's
#                                     valgrind): (Ir of RUNS₂ admissions − Ir of RUNS₁) / (RUNS₂ − RUNS₁)
#   scripts/instructions.sh check     count, then fails when pin or image grew more than 10 % over
#                                     webhook/examples/admission_instructions.baseline
#   scripts/instructions.sh baseline  count, and write the baseline (commit it, saying why the
#                                     count moved: `make instructions-baseline`)
#
# Counts do not depend on the machine's load; they move a little with hash seeds (< 1 %).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
TRIPLE=x86_64-unknown-linux-musl
BINARY="$TARGET_DIR/$TRIPLE/release/examples/admission_instructions"
BASELINE="$ROOT/webhook/examples/admission_instructions.baseline"
REVIEWS=(pin image bare)
GUARDED=(pin image)
RUNS1=200
RUNS2=1000
# More than this growth over the baseline fails (percent).
LIMIT=10

log() { printf '[instructions %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

build() {
  log "building the admission driver for $TRIPLE (release, as scripts/image.sh builds the binaries)"
  (cd "$ROOT" && CC_x86_64_unknown_linux_musl=musl-gcc CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo build --release --locked --target "$TRIPLE" -p holdfast-webhook --example admission_instructions)
}

# Ir of one run of $1 admissions of review $2.
instructions() {
  local out
  out=$(mktemp)
  valgrind --tool=callgrind --callgrind-out-file="$out" "$BINARY" "$1" "$2" >/dev/null 2>&1 ||
    { rm -f "$out"; echo "instructions: valgrind failed on $BINARY $1 $2" >&2; exit 1; }
  sed -n 's/^totals: \([0-9]*\).*/\1/p' "$out"
  rm -f "$out"
}

# Prints `review=instructions` per admission for each review.
count() {
  command -v valgrind >/dev/null || { echo "instructions: valgrind is missing (scripts/install-deps.sh --packages)" >&2; exit 1; }
  [ -x "$BINARY" ] || { echo "instructions: $BINARY is missing: run \`scripts/instructions.sh build\`" >&2; exit 1; }
  local review a b
  for review in "${REVIEWS[@]}"; do
    a=$(instructions "$RUNS1" "$review")
    b=$(instructions "$RUNS2" "$review")
    echo "$review=$(((b - a) / (RUNS2 - RUNS1)))"
  done
}

check() {
  [ -f "$BASELINE" ] || { echo "instructions: no baseline ($BASELINE): scripts/instructions.sh baseline" >&2; exit 1; }
  local counted line review now was failed=0
  counted=$(count)
  for review in "${GUARDED[@]}"; do
    now=$(sed -n "s/^$review=//p" <<<"$counted")
    was=$(sed -n "s/^$review=//p" "$BASELINE")
    if [ -z "$now" ] || [ -z "$was" ]; then
      echo "instructions: no count for $review" >&2
      exit 1
    fi
    line="$review: $now instructions per admission, baseline $was ($(((now - was) * 100 / was)) %)"
    if ((now * 100 > was * (100 + LIMIT))); then
      echo "instructions: $line: more than $LIMIT % over the baseline" >&2
      failed=1
    else
      log "$line"
    fi
  done
  echo "$counted" | tr '\n' ' ' | sed 's/ $/\n/'
  if ((failed)); then
    echo "instructions: the admission hot path grew; find why (callgrind_annotate of a run), or if it must, re-baseline: make instructions-baseline" >&2
    exit 1
  fi
}

baseline() {
  local counted
  counted=$(count)
  {
    echo "# Instructions per admission through handler::router (scripts/instructions.sh; make test fails"
    echo "# past +$LIMIT %). Re-baseline with \`make instructions-baseline\` and say why in the commit."
    echo "$counted"
  } >"$BASELINE"
  cat "$BASELINE"
}

case "${1:-}" in
  build) build ;;
  count) count ;;
  check) check ;;
  baseline) baseline ;;
  *) echo "usage: $0 build | count | check | baseline" >&2; exit 2 ;;
esac
