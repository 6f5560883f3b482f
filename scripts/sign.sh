#!/usr/bin/env bash
# The image's supply-chain records (`make sbom`, `make sign`):
#
#   scripts/sign.sh sbom                 a CycloneDX SBOM (JSON) of each binary in the image, as
#                                        built for it (target x86_64-unknown-linux-musl), by
#                                        cargo-cyclonedx: target/image/sbom/holdfast-webhook.cdx.json,
#                                        holdfast-controller.cdx.json and kubectl-holdfast.cdx.json
#                                        (shipped beside the image)
#   scripts/sign.sh sign IMAGE KEY       cosign: signs IMAGE (REPO@sha256:…) with the key pair file
#                                        KEY (its password in COSIGN_PASSWORD) and attaches each SBOM
#                                        as a signed CycloneDX attestation. Nothing goes to a
#                                        transparency log (--tlog-upload=false): the key is the
#                                        trust anchor. Signatures and attestations are stored
#                                        beside the image in its repository (sha256-….sig/.att).
#   scripts/sign.sh verify IMAGE PUB     checks the signature and every attestation against the
#                                        public key PUB; prints the attestations' JSON.
#
# Tools from `make deps`: cosign ($HOLDFAST_CACHE/peers/cosign, built from its Go module) and
# cargo-cyclonedx ($HOLDFAST_CACHE/cargo-tools, from crates.io).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
SBOM_DIR="$TARGET_DIR/image/sbom"
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
COSIGN="$CACHE_DIR/peers/cosign/bin/cosign"
CYCLONEDX="$CACHE_DIR/cargo-tools/bin/cargo-cyclonedx"
BINARIES=(holdfast-webhook holdfast-controller kubectl-holdfast)
# The crate directory of each binary.
declare -A CRATE=([holdfast-webhook]=webhook [holdfast-controller]=controller [kubectl-holdfast]=cli)

need() { [ -x "$1" ] || { echo "sign: $1 is missing: run \`make deps\` first" >&2; exit 1; }; }

# Plain HTTP only for a loopback registry (the local one `make up` and the tests run).
registry_flags() {
  case "${1%%/*}" in
    127.*|localhost|localhost:*) echo "--allow-insecure-registry --allow-http-registry" ;;
  esac
}

sbom() {
  need "$CYCLONEDX"
  rm -rf "$SBOM_DIR" && mkdir -p "$SBOM_DIR"
  # One SBOM per binary target of the workspace, of the dependencies built into it (not build
  # dependencies) for the image's target; cargo-cyclonedx writes each beside its crate's
  # Cargo.toml: the image's three are moved to $SBOM_DIR, the rest removed.
  local marker
  marker=$(mktemp)
  (cd "$ROOT" && "$CYCLONEDX" cyclonedx --format json --describe binaries --no-build-deps \
    --target x86_64-unknown-linux-musl --spec-version 1.5 >/dev/null)
  local bin crate
  for bin in "${BINARIES[@]}"; do
    crate=${CRATE[$bin]}
    mv "$ROOT/$crate/${bin}_bin.cdx.json" "$SBOM_DIR/$bin.cdx.json"
    echo "$SBOM_DIR/$bin.cdx.json"
  done
  find "$ROOT" -path "$TARGET_DIR" -prune -o -name '*_bin.cdx.json' -newer "$marker" -print0 | xargs -0 rm -f
  rm -f "$marker"
}

sign() {
  local image=$1 key=$2 bin
  need "$COSIGN"
  [ -n "${COSIGN_PASSWORD+set}" ] || { echo "sign: set COSIGN_PASSWORD (the key's password)" >&2; exit 1; }
  [ -f "$SBOM_DIR/holdfast-webhook.cdx.json" ] || sbom >/dev/null
  # shellcheck disable=SC2046 # one flag per word
  "$COSIGN" sign --yes --key "$key" --tlog-upload=false $(registry_flags "$image") "$image"
  for bin in "${BINARIES[@]}"; do
    # shellcheck disable=SC2046
    "$COSIGN" attest --yes --key "$key" --tlog-upload=false --type cyclonedx \
      --predicate "$SBOM_DIR/$bin.cdx.json" $(registry_flags "$image") "$image"
  done
}

verify() {
  local image=$1 pub=$2
  need "$COSIGN"
  # shellcheck disable=SC2046
  "$COSIGN" verify --key "$pub" --insecure-ignore-tlog=true $(registry_flags "$image") "$image" >/dev/null
  # shellcheck disable=SC2046
  "$COSIGN" verify-attestation --key "$pub" --insecure-ignore-tlog=true --type cyclonedx \
    $(registry_flags "$image") "$image"
}

case "${1:-}" in
  sbom) sbom ;;
  sign) [ $# -eq 3 ] || { echo "usage: $0 sign IMAGE KEY" >&2; exit 2; }; sign "$2" "$3" ;;
  verify) [ $# -eq 3 ] || { echo "usage: $0 verify IMAGE PUB" >&2; exit 2; }; verify "$2" "$3" ;;
  *) echo "usage: $0 sbom | sign IMAGE KEY | verify IMAGE PUB" >&2; exit 2 ;;
esac
