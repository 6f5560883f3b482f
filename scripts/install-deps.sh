#!/usr/bin/env bash
# Installs everything the local control plane and the real peers need, idempotently:
#   - Debian packages: the OCI registry (Distribution), skopeo, openssl, shellcheck, iproute2,
#     promtool (Debian's prometheus: the alerts' checks), and for the image (scripts/image.sh) musl-tools, jq,
#     qemu-user-static (the arm64 binaries run in a test); the rustup targets
#     x86_64-unknown-linux-musl and aarch64-unknown-linux-musl (static binaries);
#   - Go programs built from their Go modules, one module per program under e2e/peers/<name>/
#     (a go.mod that requires the program, its go.sum pinning every hash): Kubernetes
#     (kube-apiserver, kube-controller-manager, kube-scheduler), etcd, kwok, kapp-controller with
#     the vendir/ytt/kapp/kbld it runs, kpack (v0.17.2; v0.17.1 for Korifi; v0.16.1 for the
#     org-deletion benchmark only, with --bench), Korifi's controllers, local-path-provisioner;
#     the real node of `make cluster` (scripts/node.sh): kubelet and kube-proxy of the same
#     Kubernetes release, containerd 2.4 with its runc shim (static), crictl, the pause program
#     (static, compiled from the Kubernetes module's build/pause/linux/pause.c) and the test pods'
#     netcheck (ours, e2e/netcheck/netcheck.c, static), both packed as OCI image layouts, and
#     kube-router (its NetworkPolicy controller); kapp-controller, vendir, ytt, kapp, kbld and helm
#     are static in every mode (CGO_ENABLED=0), the same programs on the host and in
#     kapp-controller's image (scripts/kapp-controller.sh);
#     and the release tools: helm (the chart), imgpkg (the Carvel bundles), cosign (signing the
#     image), umoci (the image's layout); cargo-cyclonedx from crates.io (the SBOMs); the arm64
#     cross toolchain: cargo-zigbuild from crates.io and zig from PyPI (the ziglang wheel).
#     The node's runc, CNI plugins, nftables, conntrack and ipset are Debian's packages.
# Each build is cached outside the repository under $CACHE/peers/<name>-<hash of go.mod+go.sum>/
# (bin/, the upstream CRDs the harness installs, crds/, and the upstream manifests it applies,
# manifests/), and $CACHE/peers/<name> links to the
# current one: a second run rebuilds nothing. Nothing built here is ever committed.
#
#   scripts/install-deps.sh [--bench]            everything (make deps)
#   scripts/install-deps.sh --packages           only the Debian packages and the rustup target
#   scripts/install-deps.sh --builds [--bench]   only the Go builds and cargo-cyclonedx
#   scripts/install-deps.sh --peers [--bench]    only the builds the control plane, the peers and the
#                                                node (make cluster) need
#   scripts/install-deps.sh --demo               only what make up / make demo run: the registry's Debian
#                                                packages, kube-apiserver, kube-controller-manager, etcd,
#                                                kapp-controller with vendir, ytt and kapp, and kpack's and
#                                                Korifi's CRDs read from their module source (no build);
#                                                make up runs kube-scheduler and kwok once another mode
#                                                has built them
#   scripts/install-deps.sh --node               only the node's builds (make cluster), and what make
#                                                cluster runs beyond --demo's set (kube-scheduler, kwok,
#                                                helm); no other mode builds the node's
#   scripts/install-deps.sh --release-tools      only the tools that the image's suites alone need
#                                                (umoci, cosign, cargo-cyclonedx, cargo-zigbuild, zig)
#   scripts/install-deps.sh --cross              of those, only the arm64 cross toolchain (cargo-zigbuild,
#                                                zig: scripts/image.sh binaries needs nothing else)
#   scripts/install-deps.sh --image-tools        of those, only the rest (umoci, cosign, cargo-cyclonedx)
# (--peers and --release-tools together are --builds: make test runs them one after the other and
# the suites that need no release tool in between, scripts/test.sh.)
# The builds run HOLDFAST_DEPS_JOBS (2) groups at a time: one `go build` leaves a core idle while
# it links or waits on a package's dependencies. Programs sharing most of their modules (the kpack
# releases, the Carvel tools) build in one group, one after the other, so the second reuses the
# first's build cache.
# Facts behind each step: ../shared/TESTENV.md; what each build costs: CONTRIBUTING.md "The test environment".
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# --bench: also what only the benchmarks run (kpack v0.16.1 for make bench-deletion).
WITH_BENCH_PEERS=false
DO_PACKAGES=true
DO_PEERS=true
DO_RELEASE_TOOLS=true
# Which of the release tools (--cross and --image-tools each select some).
RELEASE_TOOL_GROUPS=(build_image_tools install_cyclonedx install_cross)
# The real node's builds: only with --node (make cluster runs it), so that neither make up nor
# make test spends ~35 min of builds on a node none of their steps runs.
DO_NODE=false
# --demo: the demo's set only (make up, make demo).
DO_DEMO=false
for arg in "$@"; do
  case "$arg" in
    --bench) WITH_BENCH_PEERS=true ;;
    --packages) DO_PEERS=false DO_RELEASE_TOOLS=false ;;
    --builds) DO_PACKAGES=false ;;
    --peers) DO_PACKAGES=false DO_RELEASE_TOOLS=false ;;
    --release-tools) DO_PACKAGES=false DO_PEERS=false ;;
    --cross) DO_PACKAGES=false DO_PEERS=false RELEASE_TOOL_GROUPS=(install_cross) ;;
    --image-tools) DO_PACKAGES=false DO_PEERS=false RELEASE_TOOL_GROUPS=(build_image_tools install_cyclonedx) ;;
    --node) DO_PACKAGES=false DO_PEERS=false DO_RELEASE_TOOLS=false DO_NODE=true ;;
    --demo) DO_PEERS=false DO_RELEASE_TOOLS=false DO_DEMO=true ;;
    *) echo "usage: $0 [--packages | --builds | --peers | --release-tools | --cross | --image-tools | --node | --demo] [--bench]" >&2; exit 2 ;;
  esac
done
DEPS_JOBS=${HOLDFAST_DEPS_JOBS:-2}
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
PEERS_DIR="$CACHE_DIR/peers"
# iproute2: `ip link set lo up` in the network namespaces of peers with hard-coded ports.
# musl-tools, jq: `make image` (scripts/image.sh) without a Docker engine (umoci: a Go build below;
# bookworm's umoci 0.4.7 writes layer tars without their last padding and end-of-archive blocks).
# The real node of `make cluster` (scripts/node.sh; ../shared/TESTENV.md "Real containers"):
# runc 1.1.5 runs pods here as Debian ships it (containerd is built below); the CNI plugins (bridge,
# host-local, loopback, portmap); nft for kube-proxy's nftables mode and the node's forwarding
# guard; conntrack, which kube-proxy runs to flush UDP flows; ipset for kube-router's network
# policy controller; socat, the forwarders that give the node's address to what listens on loopback.
# prometheus: its promtool checks and unit-tests components/monitoring's alerts
# (manifest-checks --test monitoring); the server it also installs is not started (RUNLEVEL=1).
# valgrind: callgrind counts the admission hot path's instructions (scripts/instructions.sh).
PACKAGES=(docker-registry skopeo curl openssl shellcheck iproute2 musl-tools jq
  runc containernetworking-plugins nftables conntrack ipset socat prometheus valgrind
  qemu-user-static python3-venv)
# What make up and make demo run (--demo): the registry; the rest of PACKAGES only for the other modes.
DEMO_PACKAGES=(docker-registry curl openssl iproute2)
# The static binaries in the image, one per platform (scripts/image.sh).
RUST_TARGETS=(x86_64-unknown-linux-musl aarch64-unknown-linux-musl)
# The Go toolchain of this machine kind (Kubernetes 1.37's go.mod says go 1.26.0).
GO_MIN_MINOR=26

log() { printf '[install-deps %(%H:%M:%S)T] %s\n' -1 "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing_packages() {
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

install_packages() {
  local missing
  if [ "$DO_DEMO" = true ]; then
    missing=$(missing_packages "${DEMO_PACKAGES[@]}")
  else
    missing=$(missing_packages "${PACKAGES[@]}")
  fi
  if [ -z "$missing" ]; then
    log "Debian packages already installed"
    return
  fi
  as_root apt-get update -qq
  log "installing Debian packages: $(echo "$missing" | tr '\n' ' ')"
  # The Debian services must not start system-wide: the harness starts its own on loopback.
  # shellcheck disable=SC2086 # one word per package
  as_root env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
    apt-get install -y -qq --no-install-recommends $missing >/dev/null
  local service
  for service in docker-registry prometheus; do
    if command -v service >/dev/null && service "$service" status >/dev/null 2>&1; then
      as_root service "$service" stop >/dev/null 2>&1 || true
    fi
  done
}

check_go() {
  local go version minor
  go=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
  if ! version=$("$go" env GOVERSION 2>/dev/null); then
    echo "install-deps: no Go toolchain found (need Go >= 1.$GO_MIN_MINOR, e.g. /usr/local/go/bin/go)" >&2
    exit 1
  fi
  minor=$(echo "$version" | sed -E 's/^go1\.([0-9]+).*/\1/')
  if [ "$minor" -lt "$GO_MIN_MINOR" ]; then
    echo "install-deps: $go is $version; the peers need Go >= 1.$GO_MIN_MINOR (put /usr/local/go/bin first on PATH)" >&2
    exit 1
  fi
  GO=$go
  # The module proxy serves these Carvel versions and kpack v0.16.1, but the checksum database
  # does not know them: their hashes are pinned by the go.sum files under e2e/peers/ instead
  # (-mod=readonly below).
  export GONOSUMDB=carvel.dev,github.com/pivotal/kpack GOFLAGS="-mod=readonly -buildvcs=false"
}

# peer_key NAME: the cache key of e2e/peers/NAME's build: its go.mod and go.sum, and whether it
# is static (CGO_ENABLED=0 is keyed apart: a cached cgo build never stands in for a static one).
peer_key() {
  {
    cat "$ROOT/e2e/peers/$1/go.mod" "$ROOT/e2e/peers/$1/go.sum"
    if [ "${CGO_ENABLED:-}" = 0 ]; then echo CGO_ENABLED=0; fi
  } | sha256sum | cut -c1-12
}

# build_peer NAME LDFLAGS PKG=OUT... : builds the packages of e2e/peers/NAME into the cache, each
# one whose program is not there yet (so a smaller set built first, as --demo's Kubernetes without
# kube-scheduler, is completed by a later run instead of built again).
build_peer() {
  local name=$1 ldflags=$2
  shift 2
  local mod="$ROOT/e2e/peers/$name" key dir pair missing=()
  key=$(peer_key "$name")
  dir="$PEERS_DIR/$name-$key"
  for pair in "$@"; do
    [ -x "$dir/bin/${pair#*=}" ] || missing+=("$pair")
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    local started=$SECONDS out
    log "building $name (${missing[*]#*=}) from its Go module $(cd "$mod" && "$GO" list -f '{{.Module.Path}}@{{.Module.Version}}' "${1%%=*}")"
    mkdir -p "$dir/bin"
    for pair in "${missing[@]}"; do
      out="$dir/bin/${pair#*=}"
      mkdir -p "$(dirname "$out")"
      # Written under another name and renamed: a program in bin/ is a whole one.
      (cd "$mod" && "$GO" build -trimpath -ldflags "$ldflags" -o "$out.tmp" "${pair%%=*}") \
        >"$dir/build.log" 2>&1 || { tail -40 "$dir/build.log"; exit 1; }
      mv "$out.tmp" "$out"
    done
    log "built $name in $((SECONDS - started)) s"
  fi
  ln -sfn "$name-$key" "$PEERS_DIR/$name"
}

# module_dir PEER MODULE: where the Go module cache holds MODULE at the version PEER requires.
module_dir() {
  (cd "$ROOT/e2e/peers/$1" && "$GO" list -m -f '{{.Dir}}' "$2")
}

# collect_crds PEER MODULE SUBDIR...: copies the CustomResourceDefinitions found in the module's
# SUBDIRs into the peer's cache directory, one file each, for the harness to install.
collect_crds() {
  local peer=$1 module=$2 src out
  shift 2
  src=$(module_dir "$peer" "$module")
  out="$PEERS_DIR/$peer/crds"
  [ -f "$out/.done" ] && return
  if [ -z "$src" ]; then
    echo "install-deps: $module is not in the Go module cache; its CRDs cannot be collected" >&2
    return 1
  fi
  rm -rf "$out" && mkdir -p "$out"
  local sub f
  for sub in "$@"; do
    # shellcheck disable=SC2086 # SUBDIR may be a glob
    for f in $src/$sub; do
      [ -f "$f" ] || continue
      # Keep only the CRD documents of a multi-document file.
      awk -v out="$out" -v base="$(basename "$f")" '
        function flush() { if (doc ~ /\nkind: CustomResourceDefinition\n/ || doc ~ /^kind: CustomResourceDefinition\n/) { n++; file = out "/" base "." n ".yaml"; printf "%s", doc > file; close(file) } doc = "" }
        /^---/ { flush(); next }
        { doc = doc $0 "\n" }
        END { flush() }' "$f"
    done
  done
  if [ -z "$(find "$out" -name '*.yaml' -print -quit)" ]; then
    echo "install-deps: no CRD found in $src/$* for $peer" >&2
    return 1
  fi
  touch "$out/.done"
  log "collected $(find "$out" -name '*.yaml' | wc -l) CRDs of $peer"
}

# collect_manifests PEER MODULE FILE...: copies upstream manifests (webhook configurations,
# ConfigMaps, roles) from the module into the peer's cache directory, keeping their relative
# paths, for the harness to render and apply (e2e/src/peers/).
collect_manifests() {
  local peer=$1 module=$2 src out f g
  shift 2
  src=$(module_dir "$peer" "$module")
  out="$PEERS_DIR/$peer/manifests"
  # Collected again whenever the list changes.
  [ -f "$out/.done" ] && [ "$(cat "$out/.done")" = "$*" ] && return
  rm -rf "$out" && mkdir -p "$out"
  for f in "$@"; do
    # shellcheck disable=SC2086 # FILE may be a glob
    for g in $src/$f; do
      mkdir -p "$out/$(dirname "${g#"$src"/}")"
      cp "$g" "$out/${g#"$src"/}"
    done
  done
  echo "$*" >"$out/.done"
  log "collected $(find "$out" -name '*.yaml' | wc -l) manifests of $peer"
}

k8s_ldflags() {
  local v=$1 minor
  minor=$(echo "$v" | cut -d. -f2)
  echo "-s -w -X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean -X k8s.io/component-base/version.buildDate=1970-01-01T00:00:00Z -X k8s.io/client-go/pkg/version.gitVersion=$v"
}

required_version() { (cd "$ROOT/e2e/peers/$1" && "$GO" list -m -f "{{.Version}}" "$2"); }

install_rust_targets() {
  local target
  for target in "${RUST_TARGETS[@]}"; do
    if rustup target list --installed 2>/dev/null | grep -qx "$target"; then
      log "rustup target $target already installed"
      continue
    fi
    log "installing the rustup target $target"
    rustup target add "$target" >/dev/null
  done
}

# --- the groups of builds, each run as one background job (see spawn) ---

build_kubernetes() {
  build_kubernetes_servers k8s.io/kubernetes/cmd/kube-scheduler=kube-scheduler
}

# The demo's Kubernetes: no kube-scheduler (the demo runs no pod; make up skips it until built).
build_kubernetes_demo() {
  build_kubernetes_servers
}

# build_kubernetes_servers [PKG=OUT...]: kube-apiserver, kube-controller-manager and those.
build_kubernetes_servers() {
  local version
  version=$(required_version kubernetes k8s.io/kubernetes)
  build_peer kubernetes "$(k8s_ldflags "$version")" \
    k8s.io/kubernetes/cmd/kube-apiserver=kube-apiserver \
    k8s.io/kubernetes/cmd/kube-controller-manager=kube-controller-manager "$@"
}

build_cluster_tools() {
  build_etcd
  build_kwok
  # The dynamic volume provisioner kind ships: kpack's build cache volumes (PVCs) are bound through it.
  build_peer local-path-provisioner "-s -w" github.com/rancher/local-path-provisioner=local-path-provisioner
  collect_manifests local-path-provisioner github.com/rancher/local-path-provisioner deploy/local-path-storage.yaml
}

# etcd, the control plane's store.
build_etcd() {
  build_peer etcd "-s -w" go.etcd.io/etcd/server/v3=etcd
}

# kwok (the control plane's nodes), with its stages.
build_kwok() {
  build_peer kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$(required_version kwok sigs.k8s.io/kwok)" \
    sigs.k8s.io/kwok/cmd/kwok=kwok
  # kwok's own node stages (initialize, heartbeat) and pod-ready stage; the harness adds its own
  # pod-complete and pod-delete stages (e2e/kwok/pod-stages.yaml: deletes honour the grace period).
  local stages="$PEERS_DIR/kwok/kwok-stages.yaml" src f
  if [ ! -f "$stages" ]; then
    src=$(module_dir kwok sigs.k8s.io/kwok)/kustomize/stage
    for f in node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml pod/fast/pod-ready.yaml; do
      cat "$src/$f"; echo "---"
    done >"$stages.tmp" && mv "$stages.tmp" "$stages"
  fi
}

# crds_only PEER MODULE SUBDIR...: the peer's CRDs collected from its module source into its cache
# directory without building it (the control plane installs them; make up runs no such peer). A
# later build of the peer replaces the directory and collects them again.
crds_only() {
  local name=$1 mod="$ROOT/e2e/peers/$1" key
  key=$(peer_key "$name")
  mkdir -p "$PEERS_DIR/$name-$key"
  ln -sfn "$name-$key" "$PEERS_DIR/$name"
  # Nothing builds it, so nothing else brings its source into the module cache.
  (cd "$mod" && "$GO" mod download "$2")
  collect_crds "$@"
}

# What make up and make demo run: kapp-controller with the tools the demo's Apps run (vendir, ytt,
# kapp; kbld and helm only with the other modes), and the CRDs of kpack and Korifi, whose
# controllers they do not run.
build_demo_peers() {
  build_kapp_controller_core
  crds_only kpack github.com/pivotal/kpack 'config/*.yaml'
  crds_only korifi code.cloudfoundry.org/korifi 'helm/korifi/controllers/crds/*.yaml'
}

# kapp-controller with the tools it runs, and imgpkg (the Carvel bundles of make package).
build_carvel() {
  build_kapp_controller
  build_peer imgpkg "-s -w -X carvel.dev/imgpkg/pkg/imgpkg/cmd.Version=$(required_version imgpkg carvel.dev/imgpkg)" \
    carvel.dev/imgpkg/cmd/imgpkg=imgpkg
}

# kapp-controller with its CRDs and the tools it runs (helm is a group of its own).
build_kapp_controller() {
  build_kapp_controller_core
  CGO_ENABLED=0 build_peer kbld "-s -w" carvel.dev/kbld/cmd/kbld=kbld
}

# kapp-controller with its CRDs, vendir, ytt and kapp: what every App runs. Static
# (CGO_ENABLED=0, as upstream's Dockerfile builds them), so that the same programs run on the host
# (make up) and in kapp-controller's image on the real node (make cluster,
# scripts/kapp-controller.sh), built once.
build_kapp_controller_core() {
  CGO_ENABLED=0 build_peer kapp-controller "-s -w -X main.Version=$(required_version kapp-controller carvel.dev/kapp-controller)" \
    carvel.dev/kapp-controller/cmd/controller=kapp-controller
  collect_crds kapp-controller carvel.dev/kapp-controller config/config/crds.yml
  local name
  for name in vendir ytt kapp; do
    CGO_ENABLED=0 build_peer "$name" "-s -w" "carvel.dev/$name/cmd/$name=$name"
  done
}

build_kpack() {
  build_peer kpack "-s -w" github.com/pivotal/kpack/cmd/controller=kpack-controller \
    github.com/pivotal/kpack/cmd/webhook=kpack-webhook
  collect_crds kpack github.com/pivotal/kpack 'config/*.yaml'
  collect_manifests kpack github.com/pivotal/kpack config/webhook.yaml config/config-logging.yaml
  # The kpack release Korifi v0.18.0 is built against (v0.17.2 rejects the Images it writes); same
  # CRDs and manifests as v0.17.2, which the control plane installs.
  build_peer kpack-0.17.1 "-s -w" github.com/pivotal/kpack/cmd/controller=kpack-controller \
    github.com/pivotal/kpack/cmd/webhook=kpack-webhook
  # The last kpack release before kpack#1820 (Images and Builds being deleted still reconciled): the
  # org-deletion benchmark's "v0.16" pair (`--bench`, as `make bench-deletion` calls it; no test
  # needs it). Same v1alpha2 CRDs as v0.17.
  if [ "$WITH_BENCH_PEERS" = true ]; then
    build_peer kpack-0.16.1 "-s -w" github.com/pivotal/kpack/cmd/controller=kpack-controller \
      github.com/pivotal/kpack/cmd/webhook=kpack-webhook
  fi
}

build_korifi() {
  build_peer korifi "-s -w" code.cloudfoundry.org/korifi/controllers=korifi-controllers
  collect_crds korifi code.cloudfoundry.org/korifi 'helm/korifi/controllers/crds/*.yaml'
  collect_manifests korifi code.cloudfoundry.org/korifi helm/korifi/controllers/manifests.yaml \
    helm/korifi/kpack-image-builder/manifests.yaml helm/korifi/statefulset-runner/manifests.yaml \
    helm/korifi/statefulset-runner/runner-rbac.yaml helm/korifi/job-task-runner/runner-rbac.yaml \
    'helm/korifi/controllers/cf_roles/*.yaml'
}

# oci_layout DIR PROGRAM TAG USER: DIR becomes an OCI image layout of one image, tagged TAG, whose one
# layer holds the static PROGRAM as /NAME (its basename), the entrypoint, run as USER ("" for the
# runtime's default). Byte for byte the same from the same program (no timestamps, sorted, numeric
# owners), so its digest changes only with the program. scripts/node.sh pushes it with skopeo.
oci_layout() {
  local dir=$1 program=$2 tag=$3 user=$4 name tmp diff_id layer config manifest
  name=$(basename "$program")
  tmp=$(mktemp -d)
  mkdir -p "$tmp/root" "$tmp/oci/blobs/sha256"
  install -m 0755 "$program" "$tmp/root/$name"
  tar --sort=name --owner=0 --group=0 --numeric-owner --mtime=@0 --format=gnu \
    -C "$tmp/root" -cf "$tmp/layer.tar" "$name"
  diff_id=$(sha256sum <"$tmp/layer.tar" | cut -d' ' -f1)
  gzip -n -9 <"$tmp/layer.tar" >"$tmp/layer.tar.gz"
  layer=$(oci_blob "$tmp/oci" "$tmp/layer.tar.gz" application/vnd.oci.image.layer.v1.tar+gzip)
  printf '{"architecture":"amd64","os":"linux","config":{"Entrypoint":["/%s"]%s},"rootfs":{"type":"layers","diff_ids":["sha256:%s"]}}' \
    "$name" "${user:+,\"User\":\"$user\"}" "$diff_id" >"$tmp/config.json"
  config=$(oci_blob "$tmp/oci" "$tmp/config.json" application/vnd.oci.image.config.v1+json)
  printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":%s,"layers":[%s]}' \
    "$config" "$layer" >"$tmp/manifest.json"
  manifest=$(oci_blob "$tmp/oci" "$tmp/manifest.json" application/vnd.oci.image.manifest.v1+json)
  printf '{"schemaVersion":2,"manifests":[%s]}' \
    "${manifest%\}},\"annotations\":{\"org.opencontainers.image.ref.name\":\"$tag\"}}" >"$tmp/oci/index.json"
  printf '{"imageLayoutVersion":"1.0.0"}' >"$tmp/oci/oci-layout"
  rm -rf "$dir" && mkdir -p "$(dirname "$dir")" && mv "$tmp/oci" "$dir"
  rm -rf "$tmp"
}

# oci_blob LAYOUT FILE MEDIATYPE: moves FILE into LAYOUT's blobs; prints its descriptor.
oci_blob() {
  local digest size
  digest=$(sha256sum <"$2" | cut -d' ' -f1)
  size=$(stat -c %s "$2")
  mv "$2" "$1/blobs/sha256/$digest"
  printf '{"mediaType":"%s","digest":"sha256:%s","size":%s}' "$3" "$digest" "$size"
}

# The real node (make cluster, scripts/node.sh): kubelet and kube-proxy of the control plane's
# release (sharing most of its build cache: spawned after it), the sandbox image's pause program
# compiled from that module's source as upstream's build/pause/Makefile compiles it (static),
# containerd and its runc shim (static, as upstream builds the shim), and crictl (the node's pods
# are stopped through the CRI, so CNI removes their network namespaces and veths).
build_node() {
  local version src tag
  version=$(required_version kubernetes-node k8s.io/kubernetes)
  build_peer kubernetes-node "$(k8s_ldflags "$version")" \
    k8s.io/kubernetes/cmd/kubelet=kubelet \
    k8s.io/kubernetes/cmd/kube-proxy=kube-proxy
  if [ ! -f "$PEERS_DIR/kubernetes-node/images/pause/index.json" ]; then
    src=$(module_dir kubernetes-node k8s.io/kubernetes)/build/pause
    tag=$(sed -n 's/^TAG ?= *//p' "$src/Makefile")
    mkdir -p "$PEERS_DIR/kubernetes-node/pause"
    gcc -Os -Wall -Werror -static -DVERSION="v$tag-holdfast" -o "$PEERS_DIR/kubernetes-node/pause/pause" \
      "$src/linux/pause.c"
    # As upstream's image: the nobody user.
    oci_layout "$PEERS_DIR/kubernetes-node/images/pause" "$PEERS_DIR/kubernetes-node/pause/pause" "$tag" 65535:65535
    log "built the pause image $tag (static pause from $src/linux/pause.c)"
  fi
  CGO_ENABLED=0 build_peer containerd "-s -w -X github.com/containerd/containerd/v2/version.Version=$(required_version containerd github.com/containerd/containerd/v2)" \
    github.com/containerd/containerd/v2/cmd/containerd=containerd \
    github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2=containerd-shim-runc-v2
  build_peer cri-tools "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$(required_version cri-tools sigs.k8s.io/cri-tools)" \
    sigs.k8s.io/cri-tools/cmd/crictl=crictl
}

# The node's other programs: the image of its test pods' program (e2e/netcheck/netcheck.c, ours;
# static, keyed by its source), and kube-router (its NetworkPolicy controller only).
build_node_tools() {
  local src="$ROOT/e2e/netcheck/netcheck.c" dir
  dir="$PEERS_DIR/netcheck-$(sha256sum <"$src" | cut -c1-12)"
  if [ ! -f "$dir/images/netcheck/index.json" ]; then
    mkdir -p "$dir/bin"
    gcc -Os -Wall -Wextra -Werror -static -o "$dir/bin/netcheck" "$src"
    oci_layout "$dir/images/netcheck" "$dir/bin/netcheck" "$(basename "$dir" | cut -d- -f2)" ""
    log "built the netcheck image (static, from $src)"
  fi
  ln -sfn "$(basename "$dir")" "$PEERS_DIR/netcheck"
  build_peer kube-router "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$(required_version kube-router github.com/cloudnativelabs/kube-router/v2)" \
    github.com/cloudnativelabs/kube-router/v2/cmd/kube-router=kube-router
}

# helm's ldflags, as helm's own Makefile links it: its version, and the Kubernetes version of its
# client-go as the default capabilities (else `helm template` assumes 1.20 and the chart's
# kubeVersion fails). For the host's helm and the static one of kapp-controller's image.
helm_ldflags() {
  local minor ld pkg
  minor=$(required_version helm k8s.io/client-go | cut -d. -f2)
  ld="-s -w -X helm.sh/helm/v3/internal/version.version=$(required_version helm helm.sh/helm/v3)"
  for pkg in chartutil lint/rules; do
    ld+=" -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMajor=1 -X helm.sh/helm/v3/pkg/$pkg.k8sVersionMinor=$minor"
  done
  echo "$ld"
}

# Release tools: the chart (make chart, tests/dist.rs); static, as the host's kapp-controller
# (the same program is in kapp-controller's image, for helmTemplate).
build_helm() {
  CGO_ENABLED=0 build_peer helm "$(helm_ldflags)" helm.sh/helm/v3/cmd/helm=helm
}

# The image's layout (make image) and signing it (make sign).
build_image_tools() {
  build_peer umoci "-s -w -X github.com/opencontainers/umoci.version=$(required_version umoci github.com/opencontainers/umoci)" \
    github.com/opencontainers/umoci/cmd/umoci=umoci
  build_peer cosign "-s -w -X sigs.k8s.io/release-utils/version.gitVersion=$(required_version cosign github.com/sigstore/cosign/v2)" \
    github.com/sigstore/cosign/v2/cmd/cosign=cosign
}

# cargo-cyclonedx (the SBOMs, scripts/sign.sh) from crates.io, into the cache. Unoptimized
# (--debug): it reads cargo's metadata of one workspace, and its optimized build (the cargo crate
# and ~300 more) was the longest of a new machine's release tools.
install_cyclonedx() {
  local version=0.5.9
  if [ "$("$CACHE_DIR/cargo-tools/bin/cargo-cyclonedx" cyclonedx --version 2>/dev/null | awk '{print $2}')" != "$version" ]; then
    log "installing cargo-cyclonedx $version from crates.io"
    cargo install --quiet --locked --debug cargo-cyclonedx --version "$version" --root "$CACHE_DIR/cargo-tools"
  fi
}

# The arm64 cross toolchain of scripts/image.sh: cargo-zigbuild (crates.io) links with zig's
# bundled musl and compiles ring's and mimalloc's C for aarch64 with `zig cc`; zig from PyPI's
# ziglang wheel (the Zig Software Foundation's release, repackaged), in a virtualenv of the cache.
# Debian has no zig and no aarch64 musl cross compiler. cargo-zigbuild unoptimized (--debug): it only
# starts zig and cargo.
install_cross() {
  local zigbuild=0.24.1 zig=0.14.1
  if [ "$("$CACHE_DIR/cargo-tools/bin/cargo-zigbuild" --version 2>/dev/null | awk '{print $2}')" != "$zigbuild" ]; then
    log "installing cargo-zigbuild $zigbuild from crates.io"
    cargo install --quiet --locked --debug cargo-zigbuild --version "$zigbuild" --root "$CACHE_DIR/cargo-tools"
  fi
  local venv="$CACHE_DIR/zig-$zig"
  if [ "$("$venv/bin/python" -m ziglang version 2>/dev/null)" != "$zig" ]; then
    log "installing zig $zig from PyPI (ziglang)"
    rm -rf "$venv"
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet --disable-pip-version-check "ziglang==$zig"
  fi
}

# The run's groups of builds (spawn: started, HOLDFAST_DEPS_JOBS at a time), each logged as it
# ends: its time, how many of the run's groups are done, which are still building.
TASK_PIDS=()
TASK_NAMES=()
TASK_STARTS=()
TASKS_DONE=0
TASKS_FAILED=()

# plan GROUP...: the run's groups, known before the first starts (for the "[done/all]" count).
PLANNED=0
plan() { PLANNED=$((PLANNED + $#)); }

spawn() {
  while [ $((${#TASK_PIDS[@]} - TASKS_DONE)) -ge "$DEPS_JOBS" ]; do reap_one; done
  "$1" &
  TASK_PIDS+=("$!")
  TASK_NAMES+=("$1")
  TASK_STARTS+=("$SECONDS")
}

# reap_one: waits for the next group to end and logs it.
reap_one() {
  local pid rc=0 i left=()
  wait -n -p pid || rc=$?
  [ -n "${pid:-}" ] || { TASKS_DONE=${#TASK_PIDS[@]}; return; }
  for i in "${!TASK_PIDS[@]}"; do
    if [ "${TASK_PIDS[$i]}" = "$pid" ]; then
      TASKS_DONE=$((TASKS_DONE + 1))
      [ "$rc" -eq 0 ] || TASKS_FAILED+=("${TASK_NAMES[$i]}")
      local name=${TASK_NAMES[$i]#build_} outcome="done" j
      [ "$rc" -eq 0 ] || outcome="FAILED (exit $rc)"
      local took=$((SECONDS - TASK_STARTS[i]))
      for j in "${!TASK_PIDS[@]}"; do
        kill -0 "${TASK_PIDS[$j]}" 2>/dev/null && [ "${TASK_PIDS[$j]}" != "$pid" ] && left+=("${TASK_NAMES[$j]#build_}")
      done
      log "[$TASKS_DONE/$PLANNED] ${name} ${outcome} in ${took} s; still building: ${left[*]:-nothing}; $((SECONDS - STARTED)) s so far"
      return
    fi
  done
}

# await_all: waits for every spawned group (a group that fails leaves the others to finish: their
# builds are cached for the next run); fails naming the groups that failed (their build logs
# were printed as they failed).
await_all() {
  while [ "$TASKS_DONE" -lt "${#TASK_PIDS[@]}" ]; do reap_one; done
  if [ "${#TASKS_FAILED[@]}" -gt 0 ]; then
    echo "install-deps: failed: ${TASKS_FAILED[*]}" >&2
    exit 1
  fi
}

if [ "$DO_PACKAGES" = true ]; then
  install_packages
  # The static targets are the image's (make image), which the demo does not build.
  [ "$DO_DEMO" = true ] || install_rust_targets
fi
STARTED=$SECONDS
if [ "$DO_PEERS" = true ] || [ "$DO_RELEASE_TOOLS" = true ] || [ "$DO_NODE" = true ] || [ "$DO_DEMO" = true ]; then
  check_go
  mkdir -p "$PEERS_DIR"
fi
RUN_GROUPS=()
# Longest first (CONTRIBUTING.md "The test environment" has each build's time).
[ "$DO_PEERS" = true ] && RUN_GROUPS+=(build_kubernetes build_kpack build_carvel build_korifi build_helm build_cluster_tools)
[ "$DO_DEMO" = true ] && RUN_GROUPS+=(build_kubernetes_demo build_demo_peers build_etcd)
# With the node's builds, what make cluster runs beyond the demo's set: kbld (kapp-controller's
# image has it), kube-scheduler, kwok's nodes (for pods that need no container) and helm (it
# installs holdfast with it).
[ "$DO_NODE" = true ] && RUN_GROUPS+=(build_node build_node_tools build_kapp_controller build_kubernetes build_kwok build_helm)
[ "$DO_RELEASE_TOOLS" = true ] && RUN_GROUPS+=("${RELEASE_TOOL_GROUPS[@]}")
if [ "${#RUN_GROUPS[@]}" -gt 0 ]; then
  plan "${RUN_GROUPS[@]}"
  log "building ${#RUN_GROUPS[@]} groups, $DEPS_JOBS at a time (a build already cached for its go.mod is skipped): ${RUN_GROUPS[*]#build_}"
  for group in "${RUN_GROUPS[@]}"; do spawn "$group"; done
fi
if [ "$DO_PEERS" = true ] || [ "$DO_RELEASE_TOOLS" = true ] || [ "$DO_NODE" = true ] || [ "$DO_DEMO" = true ]; then
  await_all
  log "ready in $((SECONDS - STARTED)) s: peers in $PEERS_DIR: $(cd "$PEERS_DIR" && find . -maxdepth 1 -type l -printf '%f ')"
fi
