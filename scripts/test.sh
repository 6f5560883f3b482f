#!/usr/bin/env bash
# make test: what `make deps`, `make lint`, `make fuzz-smoke` and `cargo test --workspace` do, in
# an order that keeps both cores busy on a new machine:
#   1. the Go builds of the control plane and the peers (install-deps.sh --peers, most of an hour
#      there) run in the background while cargo builds the lints, the fuzz targets and the test
#      binaries, which need none of them;
#   2. then every suite but the image's runs, while what only those need builds at the lowest
#      priority in the background, in two chains side by side (one: install-deps.sh --cross: the
#      arm64 cross toolchain; then scripts/image.sh binaries: the static release binaries, and
#      scripts/instructions.sh build: the admission driver callgrind counts; the other:
#      install-deps.sh --node: containerd, kubelet, kube-proxy, kube-router, crictl, pause and
#      netcheck for the real node, then install-deps.sh --image-tools: umoci, cosign,
#      cargo-cyclonedx): the suites spend much of their time waiting on controllers, and the
#      builds take what they leave;
#   3. then the admission hot path's instruction counts against their baseline
#      (scripts/instructions.sh check), and the image's suites (IMAGE_SUITES), the real node's
#      and the short soak (holdfast on the node) among them.
# Where everything is cached this is the plain sequence. All runs are `--workspace`: cargo unifies
# the dependencies' features over the packages it selects, and a narrower selection would
# rebuild them.
set -euo pipefail
cd "$(dirname "$0")/.."
CARGO=${CARGO:-cargo}
STATE=.holdfast
LOG="$STATE/install-deps.log"
TOOLS_LOG="$STATE/release-tools.log"
NODE_LOG="$STATE/node-builds.log"
TOOLS_CHAIN='scripts/install-deps.sh --cross && scripts/image.sh binaries && scripts/instructions.sh build'
NODE_CHAIN='scripts/install-deps.sh --node && scripts/install-deps.sh --image-tools'
# The test targets that build, push, sign or package the image (e2e/src/dist.rs) or install it on
# the real node (the short soak too), by name: a name selects that target in every package that
# has one (manifest-checks' chart.rs too).
IMAGE_SUITES=(chart image package node soak)

log() { printf '[test %(%H:%M:%S)T] %s\n' -1 "$*"; }

# Waits for background job $1 (its log $2, its command $3 for the message); fails with its log.
await() {
  if ! wait "$1"; then
    tail -60 "$2" >&2
    echo "test: $3 failed (whole log: $2)" >&2
    exit 1
  fi
  tail -1 "$2"
}

# Debian packages first: the lints need shellcheck, the static build musl-gcc, this script jq.
scripts/install-deps.sh --packages
mkdir -p "$STATE"
log "Go builds of the control plane and the peers in the background (scripts/install-deps.sh --peers), log: $LOG"
# In process groups of their own (setsid: a background job is no group leader, so it execs in
# place and $! leads the group), so that a failed or interrupted run stops every build too.
setsid scripts/install-deps.sh --peers >"$LOG" 2>&1 &
deps=$!
tools=
node=
trap 'kill -- "-$deps" ${tools:+"-$tools"} ${node:+"-$node"} 2>/dev/null || true' EXIT

make --no-print-directory lint CARGO="$CARGO"
# BENCHMARKS.md's plots are what the committed bench data draws.
scripts/plots.sh --check
make --no-print-directory fuzz-smoke
"$CARGO" test --workspace --no-run
# The binaries the suites run as processes (installed.rs, hostile_registry.rs, localenv): `cargo
# test` builds a package's binaries only for that package's own integration tests.
"$CARGO" build --workspace --bins

mapfile -t suites < <("$CARGO" metadata --no-deps --format-version 1 --locked |
  jq -r '.packages[].targets[] | select(.kind == ["test"]) | .name' | sort -u)
first=()
for suite in "${suites[@]}"; do
  [[ " ${IMAGE_SUITES[*]} " == *" $suite "* ]] || first+=(--test "$suite")
done
for suite in "${IMAGE_SUITES[@]}"; do
  [[ " ${suites[*]} " == *" $suite "* ]] || { echo "test: no test target named $suite (IMAGE_SUITES)" >&2; exit 1; }
done

log "waiting for the Go builds of the control plane and the peers"
await "$deps" "$LOG" "scripts/install-deps.sh --peers"
log "the image's static binaries (log: $TOOLS_LOG), the real node's builds and the image's tools (log: $NODE_LOG) at the lowest priority in the background"
setsid nice -n 19 bash -c "$TOOLS_CHAIN" >"$TOOLS_LOG" 2>&1 &
tools=$!
setsid nice -n 19 bash -c "$NODE_CHAIN" >"$NODE_LOG" 2>&1 &
node=$!
"$CARGO" test --workspace --lib --bins "${first[@]}"
"$CARGO" test --workspace --doc
log "waiting for the image's tools and static binaries, and the real node's builds"
await "$tools" "$TOOLS_LOG" "$TOOLS_CHAIN"
await "$node" "$NODE_LOG" "$NODE_CHAIN"
# The admission hot path's instruction counts against their baseline (no timing: callgrind).
scripts/instructions.sh check
image=()
for suite in "${IMAGE_SUITES[@]}"; do image+=(--test "$suite"); done
"$CARGO" test --workspace "${image[@]}"
