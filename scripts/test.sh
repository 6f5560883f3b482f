#!/usr/bin/env bash
# make test: what `make deps`, `make lint`, `make fuzz-smoke` and `cargo test --workspace` do, in
# an order that keeps both cores busy on a new machine. The Go builds of install-deps.sh (half an
# hour there) run in the background while cargo builds the lints, the fuzz targets, the test
# binaries and the image's static binaries (scripts/image.sh binaries), which need none of them;
# the tests start once both are done. Where everything is cached this is the plain sequence.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
STATE=.holdfast
LOG="$STATE/install-deps.log"

log() { printf '[test %(%H:%M:%S)T] %s\n' -1 "$*"; }

# Debian packages first: the lints need shellcheck, the static build musl-gcc.
scripts/install-deps.sh --packages
mkdir -p "$STATE"
log "Go builds in the background (scripts/install-deps.sh --builds), log: $LOG"
# In a process group of its own (setsid: a background job is no group leader, so it execs in
# place and $! leads the group), so that a failed or interrupted run stops every `go build` too.
setsid scripts/install-deps.sh --builds >"$LOG" 2>&1 &
deps=$!
trap 'kill -- "-$deps" 2>/dev/null || true' EXIT

make --no-print-directory lint CARGO="$CARGO"
make --no-print-directory fuzz-smoke
"$CARGO" test --workspace --no-run
scripts/image.sh binaries

log "waiting for the Go builds"
if ! wait "$deps"; then
  tail -60 "$LOG" >&2
  echo "test: scripts/install-deps.sh --builds failed (whole log: $LOG)" >&2
  exit 1
fi
tail -1 "$LOG"
"$CARGO" test --workspace
