#!/usr/bin/env bash
# holdfast's container image, built without a Docker engine (`make image`):
#
#   scripts/image.sh build         static (musl) release binaries of holdfast-webhook,
#                                  holdfast-controller and the kubectl plugin kubectl-holdfast
#                                  for linux/amd64 and linux/arm64, and an OCI image layout holding
#                                  one image per platform, on nothing else (a `FROM scratch`
#                                  image), made with umoci, under one image index (tag <version>;
#                                  each image is also tagged <version>-amd64, <version>-arm64):
#                                    /usr/local/bin/holdfast-webhook     (the entrypoint)
#                                    /usr/local/bin/holdfast-controller
#                                    /usr/local/bin/kubectl-holdfast     (also target/image/kubectl-holdfast)
#                                    /etc/ssl/certs/ca-certificates.crt  (SSL_CERT_FILE)
#                                  user 65532:65532, no shell, nothing written at run time (a
#                                  read-only root file system is fine), OCI annotations
#                                  org.opencontainers.image.{source,revision,version,licenses}.
#                                  Prints the layout's path and the index's digest.
#   scripts/image.sh binaries      only the static release binaries (make test builds them while
#                                  the Go builds of make deps run)
#   scripts/image.sh archive NAME  writes the linux/amd64 image as a docker-archive tarball tagged
#                                  NAME (target/image/holdfast.tar), for `kind load image-archive`
#   scripts/image.sh push REPO     copies the index and both images to REPO:<version> with skopeo (plain HTTP
#                                  when REPO's registry is a loopback address or
#                                  $HOLDFAST_CLUSTER_REGISTRY) and prints
#                                  REPO@sha256:… — what manifests, the chart and the package name.
#
# Outputs, under $CARGO_TARGET_DIR (target/): image/oci (the layout), image/digest (the index's),
# image/digest-amd64 and image/digest-arm64 (each platform's image manifest), image/pushed (the
# last REPO@digest pushed), image/kubectl-holdfast and image/kubectl-holdfast-linux-arm64 (the
# plugin). Tools: `make deps` installs skopeo, musl-tools and jq from Debian, the rustup targets
# x86_64-unknown-linux-musl and aarch64-unknown-linux-musl, umoci built from its Go module
# ($HOLDFAST_CACHE/peers/umoci), and for arm64 cargo-zigbuild and zig (install-deps.sh
# install_cross: Debian has no aarch64 musl cross compiler).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT="$TARGET_DIR/image"
LAYOUT="$OUT/oci"
# The image's platforms (linux/ARCH) and each one's Rust target.
PLATFORMS=(amd64 arm64)
triple() {
  case $1 in
    amd64) echo x86_64-unknown-linux-musl ;;
    arm64) echo aarch64-unknown-linux-musl ;;
  esac
}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
LICENSE=$(sed -n 's/^license = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
REVISION=${HOLDFAST_REVISION:-$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || echo unknown)}
# Where the source lives: HOLDFAST_SOURCE_URL, else the clone's origin remote.
SOURCE_URL=${HOLDFAST_SOURCE_URL:-$(git -C "$ROOT" config --get remote.origin.url 2>/dev/null || echo unknown)}
BINARIES=(holdfast-webhook holdfast-controller kubectl-holdfast)
# The images' and the index's annotations (and the images' config labels).
ANNOTATIONS=(
  "org.opencontainers.image.source=$SOURCE_URL"
  "org.opencontainers.image.revision=$REVISION"
  "org.opencontainers.image.version=$VERSION"
  "org.opencontainers.image.licenses=$LICENSE"
  "org.opencontainers.image.title=holdfast"
  "org.opencontainers.image.description=holdfast-webhook, holdfast-controller and kubectl-holdfast (static, non-root)"
)
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
UMOCI="$CACHE_DIR/peers/umoci/bin/umoci"
ZIG_VENV="$CACHE_DIR/zig-0.14.1"
ZIGBUILD="$CACHE_DIR/cargo-tools/bin/cargo-zigbuild"
umoci() {
  [ -x "$UMOCI" ] || { echo "image: $UMOCI is missing: run \`make deps\` first" >&2; exit 1; }
  "$UMOCI" "$@"
}

log() { printf '[image %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

build_binaries() {
  # Run from a test, cargo's variables for the test (CARGO_MANIFEST_DIR, CARGO_PKG_*, …) would
  # reach this build, and ring's build script reruns when CARGO_MANIFEST_DIR changes: every
  # switch between a shell and a test would rebuild everything. The build sees what a shell sees.
  local name unset=()
  for name in $(compgen -e); do
    case "$name" in
      CARGO_HOME | CARGO_TARGET_DIR) ;;
      CARGO | CARGO_*) unset+=(-u "$name") ;;
    esac
  done
  local packages=(-p holdfast-webhook -p holdfast-controller -p kubectl-holdfast --bins)
  # Symbols stripped: the image carries no debugger, and the SBOM (make sbom) says what went in.
  log "building ${BINARIES[*]} for $(triple amd64) (release, static)"
  # ring's C and assembly, mimalloc's C: musl-gcc from Debian's musl-tools.
  (cd "$ROOT" && env "${unset[@]}" CC_x86_64_unknown_linux_musl=musl-gcc CARGO_PROFILE_RELEASE_STRIP=symbols \
    cargo build --release --locked --target "$(triple amd64)" "${packages[@]}")
  log "building ${BINARIES[*]} for $(triple arm64) (release, static; cargo-zigbuild)"
  if [ ! -x "$ZIGBUILD" ] || [ ! -x "$ZIG_VENV/bin/python3" ]; then
    echo "image: cargo-zigbuild or zig is missing: run \`scripts/install-deps.sh --cross\` (or --release-tools) first" >&2
    exit 1
  fi
  # zig from the virtualenv (cargo-zigbuild runs `python3 -m ziglang`), its cache in target/.
  (cd "$ROOT" && env "${unset[@]}" PATH="$ZIG_VENV/bin:$PATH" CARGO_PROFILE_RELEASE_STRIP=symbols \
    ZIG_GLOBAL_CACHE_DIR="$TARGET_DIR/zig-cache" ZIG_LOCAL_CACHE_DIR="$TARGET_DIR/zig-cache" \
    "$ZIGBUILD" zigbuild --release --locked --target "$(triple arm64)" "${packages[@]}")
  local arch bin
  for arch in "${PLATFORMS[@]}"; do
    for bin in "${BINARIES[@]}"; do
      if readelf -d "$TARGET_DIR/$(triple "$arch")/release/$bin" 2>/dev/null | grep -q NEEDED ||
        readelf -l "$TARGET_DIR/$(triple "$arch")/release/$bin" | grep -q INTERP; then
        echo "image: $bin ($arch) is not statically linked" >&2
        exit 1
      fi
    done
  done
  # The plugin on its own, for `kubectl holdfast` on an operator's machine (put it on PATH).
  mkdir -p "$OUT"
  install -m 0755 "$TARGET_DIR/$(triple amd64)/release/kubectl-holdfast" "$OUT/kubectl-holdfast"
  install -m 0755 "$TARGET_DIR/$(triple arm64)/release/kubectl-holdfast" "$OUT/kubectl-holdfast-linux-arm64"
}

# build_image ARCH: the image of linux/ARCH in the layout, tagged <version>-ARCH.
build_image() {
  local arch=$1 rootfs="$OUT/rootfs" tag="$LAYOUT:$VERSION-$1" epoch
  rm -rf "$rootfs"
  mkdir -p "$rootfs/usr/local/bin" "$rootfs/etc/ssl/certs"
  install -m 0755 "${BINARIES[@]/#/$TARGET_DIR/$(triple "$arch")/release/}" "$rootfs/usr/local/bin/"
  install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/ssl/certs/ca-certificates.crt"
  # Same sources, same layer: every file dated at the commit, owned by root (the user cannot
  # change them), nothing writable by 65532.
  epoch=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 0)
  find "$rootfs" -exec touch -h -d "@$epoch" {} +
  local created
  created=$(date -u -d "@$epoch" +%Y-%m-%dT%H:%M:%SZ)
  umoci new --image "$tag"
  # History dated at the commit too: the same commit builds the same digest.
  umoci insert --image "$tag" --history.created "$created" \
    --history.created_by "scripts/image.sh: /usr/local/bin" "$rootfs/usr" /usr
  umoci insert --image "$tag" --history.created "$created" \
    --history.created_by "scripts/image.sh: the CA bundle" "$rootfs/etc" /etc
  local flags=() a
  for a in "${ANNOTATIONS[@]}"; do
    flags+=(--manifest.annotation "$a" --config.label "$a")
  done
  # 8443: admission (TLS); 8080: the webhook's admin port; 8081: the controller's.
  umoci config --image "$tag" \
    --os linux --architecture "$arch" --author holdfast \
    --created "$created" --history.created "$created" \
    --config.user 65532:65532 \
    --config.entrypoint /usr/local/bin/holdfast-webhook \
    --config.env SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt \
    --config.exposedports 8443/tcp --config.exposedports 8080/tcp --config.exposedports 8081/tcp \
    --config.workingdir / \
    "${flags[@]}"
  rm -rf "$rootfs"
}

# descriptor TAG: the layout's descriptor of TAG (mediaType, digest, size).
descriptor() {
  jq -c --arg t "$1" '.manifests[] | select(.annotations["org.opencontainers.image.ref.name"] == $t)
    | {mediaType, digest, size}' "$LAYOUT/index.json"
}

build_layout() {
  rm -rf "$LAYOUT"
  umoci init --layout "$LAYOUT"
  local arch
  for arch in "${PLATFORMS[@]}"; do build_image "$arch"; done
  umoci gc --layout "$LAYOUT"
  # The index (umoci writes images only): each platform's manifest, with its platform, and the
  # release's annotations; written canonically (jq -c), so the same images give the same digest.
  local manifests='[]' index digest size image
  for arch in "${PLATFORMS[@]}"; do
    image=$(descriptor "$VERSION-$arch")
    manifests=$(jq -c --argjson d "$image" --arg a "$arch" \
      '. + [$d + {platform: {architecture: $a, os: "linux"}}]' <<<"$manifests")
    jq -r .digest <<<"$image" >"$OUT/digest-$arch"
  done
  index=$(printf '%s\n' "${ANNOTATIONS[@]}" | jq -cRn --argjson m "$manifests" \
    '{schemaVersion: 2, mediaType: "application/vnd.oci.image.index.v1+json", manifests: $m,
      annotations: ([inputs | capture("^(?<key>[^=]+)=(?<value>.*)$")] | from_entries)}')
  printf '%s' "$index" >"$OUT/index.json"
  digest=sha256:$(sha256sum "$OUT/index.json" | cut -d' ' -f1)
  size=$(stat -c %s "$OUT/index.json")
  mv "$OUT/index.json" "$LAYOUT/blobs/sha256/${digest#sha256:}"
  jq -c --arg d "$digest" --argjson s "$size" --arg v "$VERSION" \
    '.manifests += [{mediaType: "application/vnd.oci.image.index.v1+json", digest: $d, size: $s,
      annotations: {"org.opencontainers.image.ref.name": $v}}]' "$LAYOUT/index.json" >"$OUT/layout-index.json"
  mv "$OUT/layout-index.json" "$LAYOUT/index.json"
  echo "$digest" >"$OUT/digest"
  log "built $LAYOUT:$VERSION ($digest: ${PLATFORMS[*]}, $(du -sk "$LAYOUT/blobs" | cut -f1) KiB of blobs)"
  echo "$LAYOUT:$VERSION $digest"
}

# push_layout IMAGE REPO:TAG DIGESTFILE: copies IMAGE (oci:LAYOUT:TAG, every platform of an
# index) to REPO:TAG with skopeo, digests kept; the digest pushed goes to DIGESTFILE. Plain HTTP to
# loopback, and to the address `make cluster`'s node gives the environment's registry
# (HOLDFAST_CLUSTER_REGISTRY, scripts/node.sh). Also for the other images make cluster builds
# (scripts/kapp-controller.sh sources this file).
push_layout() {
  local image=$1 dest=$2 digestfile=$3 registry tls=()
  registry=${dest%%/*}
  case "$registry" in
    127.*|localhost|localhost:*|\[::1\]*|"${HOLDFAST_CLUSTER_REGISTRY:-}") tls=(--dest-tls-verify=false) ;;
  esac
  skopeo copy -q --all --preserve-digests "${tls[@]}" --digestfile "$digestfile" \
    "oci:$image" "docker://$dest"
}

push() {
  local repo=$1
  [ -f "$OUT/digest" ] || { echo "image: run \`scripts/image.sh build\` first" >&2; exit 1; }
  push_layout "$LAYOUT:$VERSION" "$repo:$VERSION" "$OUT/pushed.digest"
  local digest
  digest=$(cat "$OUT/pushed.digest")
  if [ "$digest" != "$(cat "$OUT/digest")" ]; then
    echo "image: $repo stored $digest, the layout holds $(cat "$OUT/digest")" >&2
    exit 1
  fi
  echo "$repo@$digest" | tee "$OUT/pushed"
}

archive() {
  [ -f "$OUT/digest" ] || { echo "image: run \`scripts/image.sh build\` first" >&2; exit 1; }
  rm -f "$OUT/holdfast.tar"
  skopeo copy -q "oci:$LAYOUT:$VERSION-amd64" "docker-archive:$OUT/holdfast.tar:$1"
  echo "$OUT/holdfast.tar"
}

# Sourced (scripts/kapp-controller.sh: umoci, push_layout), it only defines.
[ "${BASH_SOURCE[0]}" = "$0" ] || return 0
case "${1:-}" in
  archive) [ $# -eq 2 ] || { echo "usage: $0 archive NAME" >&2; exit 2; }; archive "$2" ;;
  binaries) build_binaries ;;
  build) mkdir -p "$OUT"; build_binaries; build_layout ;;
  push) [ $# -eq 2 ] || { echo "usage: $0 push REPO" >&2; exit 2; }; push "$2" ;;
  *) echo "usage: $0 build | binaries | archive NAME | push REPO" >&2; exit 2 ;;
esac
