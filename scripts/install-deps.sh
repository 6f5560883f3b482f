#!/usr/bin/env bash
# Installs everything the local control plane needs, idempotently:
#   Debian packages (etcd, registry, skopeo, Go toolchain) and kube-apiserver +
#   kube-controller-manager 1.20.2 built from Debian's `kubernetes` source package.
# Built binaries are cached outside the repository; a second run does not rebuild.
# Facts behind each step: ../shared/TESTENV.md.
set -euo pipefail

K8S_VERSION=1.20.2
K8S_DEB_VERSION=1.20.5+really1.20.2-1.1+deb12u1
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
BIN_DIR="$CACHE_DIR/k8s/$K8S_VERSION"
PACKAGES=(etcd-server docker-registry skopeo golang-go rsync curl openssl shellcheck
  golang-github-modern-go-reflect2-dev golang-github-json-iterator-go-dev)

log() { printf '[install-deps %(%H:%M:%S)T] %s\n' -1 "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi
}

missing_packages() {
  local p
  for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}

enable_deb_src() {
  local f=/etc/apt/sources.list.d/holdfast-deb-src.sources
  if [ ! -f "$f" ]; then
    log "enabling Debian source packages ($f)"
    as_root tee "$f" >/dev/null <<'SRC'
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    return 0
  fi
  return 1
}

install_packages() {
  local missing updated=0
  if enable_deb_src; then as_root apt-get update -qq; updated=1; fi
  missing=$(missing_packages)
  if [ -n "$missing" ]; then
    [ "$updated" -eq 1 ] || as_root apt-get update -qq
    log "installing Debian packages: $(echo "$missing" | tr '\n' ' ')"
    # The Debian services must not start system-wide: the harness starts its own on loopback.
    as_root env DEBIAN_FRONTEND=noninteractive RUNLEVEL=1 \
      apt-get install -y -qq --no-install-recommends $missing >/dev/null
    # Packages may start daemons through invoke-rc.d where no init blocks them; stop them.
    for svc in etcd docker-registry; do
      if command -v service >/dev/null && service "$svc" status >/dev/null 2>&1; then
        as_root service "$svc" stop >/dev/null 2>&1 || true
      fi
    done
  else
    log "Debian packages already installed"
  fi
}

build_kubernetes() {
  if [ -x "$BIN_DIR/kube-apiserver" ] && [ -x "$BIN_DIR/kube-controller-manager" ] \
    && [ -s "$BIN_DIR/kube-apiserver" ] && [ -s "$BIN_DIR/kube-controller-manager" ]; then
    log "kube-apiserver and kube-controller-manager $K8S_VERSION cached in $BIN_DIR"
    return
  fi
  local work="$CACHE_DIR/build"
  mkdir -p "$work"
  cd "$work"
  if ! ls kubernetes_*.orig.tar.gz >/dev/null 2>&1; then
    log "downloading Debian source package kubernetes=$K8S_DEB_VERSION"
    apt-get source --download-only "kubernetes=$K8S_DEB_VERSION" >/dev/null
  fi
  local src="$work/kubernetes-$K8S_VERSION"
  if [ ! -f "$src/.holdfast-prepared" ]; then
    rm -rf "$src"
    log "unpacking source"
    tar xzf kubernetes_*.orig.tar.gz
    # reflect2 v1.0.1 (vendored) segfaults under Go >= 1.18; take Debian's fixed copies.
    log "replacing vendored reflect2 and json-iterator with Debian's copies"
    local lib
    for lib in github.com/modern-go/reflect2 github.com/json-iterator/go; do
      rm -rf "$src/vendor/$lib"
      cp -rL "/usr/share/gocode/src/$lib" "$src/vendor/$lib"
      find "$src/vendor/$lib" -name '*_test.go' -delete
    done
    touch "$src/.holdfast-prepared"
  fi
  cd "$src"
  # An interrupted tool build leaves empty placeholder binaries behind: start generation clean.
  if [ ! -f .holdfast-generated ]; then
    rm -rf _output
    log "generating files (about 2.5 minutes on 2 cores)"
    make generated_files >"$work/generate.log" 2>&1 || { tail -40 "$work/generate.log"; exit 1; }
    touch .holdfast-generated
  fi
  log "building kube-apiserver and kube-controller-manager (about 11 minutes on 2 cores)"
  make WHAT="cmd/kube-apiserver cmd/kube-controller-manager" >"$work/build.log" 2>&1 \
    || { tail -40 "$work/build.log"; exit 1; }
  mkdir -p "$BIN_DIR"
  for b in kube-apiserver kube-controller-manager; do
    install -m 0755 "_output/local/bin/linux/amd64/$b" "$BIN_DIR/$b.tmp"
    mv "$BIN_DIR/$b.tmp" "$BIN_DIR/$b"
  done
  log "cached binaries in $BIN_DIR"
  cd "$CACHE_DIR"
  rm -rf "$work"
}

install_packages
build_kubernetes
log "ready: etcd $(command -v etcd), docker-registry $(command -v docker-registry), kubernetes in $BIN_DIR"
