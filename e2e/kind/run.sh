#!/usr/bin/env bash
# The kind e2e suite: holdfast installed from manifests/ on a kind cluster next to released
# kapp-controller and kpack, and the scenarios of e2e/src/scenarios.rs run against it.
#
#   e2e/kind/run.sh            up, then test (the cluster is kept; `down` removes it)
#   e2e/kind/run.sh up         cluster, registry, peers, holdfast image, manifests
#   e2e/kind/run.sh test       the scenarios against the running cluster
#   e2e/kind/run.sh down       delete the cluster and the registry container
#
# Needs: docker (a running engine), kind, kubectl, cargo, curl. README.md, "Running the kind
# suite", says more. It cannot run where there is no Docker engine (the repository's CI machine):
# there the same scenarios run on the local control plane (`cargo test -p holdfast-e2e --test
# rbac`).
#
# Peers, pinned:
# - kapp-controller: the release manifest of KAPP_CONTROLLER_VERSION (its App, PackageRepository
#   CRDs and its aggregated Package API).
# - kpack: the release manifest of KPACK_VERSION (Image and Build CRDs, its controller and
#   admission webhook). v0.17.0 is the first release that stops reconciling Images and Builds
#   being deleted (kpack PR #1820); set KPACK_VERSION=0.16.1 to see holdfast against the older loop.
# - Korifi: SKIPPED. A Korifi install needs cert-manager, a Gateway API implementation (Contour or
#   Envoy Gateway), a container registry with push credentials for droplets, DNS names for its
#   API and apps, and Helm; the scenarios need only its CFApp and BuildWorkload kinds, so Korifi's
#   upstream CRDs (collected from its Go module by scripts/install-deps.sh) are installed
#   instead. The scenarios create CFApps themselves, as Korifi would.
set -euo pipefail

CLUSTER="${HOLDFAST_KIND_CLUSTER:-holdfast-e2e}"
# kind v0.24+ (kindnet enforces NetworkPolicy); Kubernetes >= 1.30 for the base's fence (a
# ValidatingAdmissionPolicy, v1) and the match-conditions component the kind overlay enables.
KIND_NODE_IMAGE="${KIND_NODE_IMAGE:-kindest/node:v1.31.0}"
KAPP_CONTROLLER_VERSION="${KAPP_CONTROLLER_VERSION:-v0.53.1}"
KPACK_VERSION="${KPACK_VERSION:-0.17.0}"
IMAGE="${IMAGE:-holdfast:dev}"
REGISTRY_NAME=kind-registry
REGISTRY_HOST_PORT="${HOLDFAST_KIND_REGISTRY_PORT:-5001}"

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/../.." && pwd)"
STATE="$REPO/.holdfast/kind"
KUBECONFIG_FILE="$STATE/kubeconfig"

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'e2e/kind: %s\n' "$*" >&2; exit 1; }

need() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' is not on PATH (CONTRIBUTING.md, \"Running the kind suite\")"
  done
}

k() { kubectl --kubeconfig "$KUBECONFIG_FILE" "$@"; }

# A plain-HTTP registry on the kind network: the tests push to 127.0.0.1:$REGISTRY_HOST_PORT,
# pods reach it as kind-registry:5000 (kind's local-registry recipe).
registry_up() {
  if [ "$(docker inspect -f '{{.State.Running}}' "$REGISTRY_NAME" 2>/dev/null || true)" != "true" ]; then
    log "registry $REGISTRY_NAME on 127.0.0.1:$REGISTRY_HOST_PORT"
    docker rm -f "$REGISTRY_NAME" >/dev/null 2>&1 || true
    docker run -d --restart=always --name "$REGISTRY_NAME" \
      -p "127.0.0.1:${REGISTRY_HOST_PORT}:5000" registry:2 >/dev/null
  fi
  if [ "$(docker inspect -f '{{json .NetworkSettings.Networks.kind}}' "$REGISTRY_NAME")" = "null" ]; then
    docker network connect kind "$REGISTRY_NAME"
  fi
}

cluster_up() {
  mkdir -p "$STATE"
  if ! kind get clusters 2>/dev/null | grep -qx "$CLUSTER"; then
    log "kind cluster $CLUSTER ($KIND_NODE_IMAGE)"
    kind create cluster --name "$CLUSTER" --image "$KIND_NODE_IMAGE" --kubeconfig "$KUBECONFIG_FILE" --wait 120s
  else
    kind get kubeconfig --name "$CLUSTER" >"$KUBECONFIG_FILE"
  fi
}

peers_up() {
  log "kapp-controller $KAPP_CONTROLLER_VERSION"
  k apply -f "https://github.com/carvel-dev/kapp-controller/releases/download/${KAPP_CONTROLLER_VERSION}/release.yml"
  log "kpack v$KPACK_VERSION"
  k apply -f "https://github.com/buildpacks-community/kpack/releases/download/v${KPACK_VERSION}/release-${KPACK_VERSION}.yaml"
  log "Korifi: skipped (see the top of this script); installing its upstream CRDs"
  k apply -f "${HOLDFAST_CACHE:-$HOME/.cache/holdfast}/peers/korifi/crds/"
  k -n kapp-controller rollout status deployment/kapp-controller --timeout=300s
  k -n kpack rollout status deployment/kpack-controller --timeout=300s
  k -n kpack rollout status deployment/kpack-webhook --timeout=300s
}

holdfast_up() {
  log "image $IMAGE (make image), loaded into $CLUSTER"
  make -C "$REPO" image IMAGE="$IMAGE"
  # make image writes the image tagged $IMAGE as an archive (no Docker engine is involved).
  kind load image-archive "${CARGO_TARGET_DIR:-$REPO/target}/image/holdfast.tar" --name "$CLUSTER"
  log "manifests/overlays/kind (+ the suite's registry)"
  k apply -k "$HERE/overlay"
  k -n holdfast-system rollout status deployment/holdfast-webhook --timeout=300s
  k -n holdfast-system rollout status deployment/holdfast-controller --timeout=300s
}

up() {
  need docker kind kubectl make
  cluster_up
  registry_up
  peers_up
  holdfast_up
}

run_tests() {
  need kubectl cargo
  [ -f "$KUBECONFIG_FILE" ] || die "no cluster: run '$0 up' first"
  log "the scenarios against $CLUSTER"
  HOLDFAST_E2E_KUBECONFIG="$KUBECONFIG_FILE" \
  HOLDFAST_E2E_REGISTRY="127.0.0.1:${REGISTRY_HOST_PORT}" \
  HOLDFAST_E2E_CLUSTER_REGISTRY="${REGISTRY_NAME}:5000" \
    cargo test --manifest-path "$REPO/Cargo.toml" -p holdfast-e2e --test rbac -- the_
  # The components ran as their ServiceAccounts; a permission they lack shows as a 403 in
  # their logs even where it did not fail a scenario.
  local forbidden
  forbidden="$(k -n holdfast-system logs -l app.kubernetes.io/name=holdfast --all-containers --prefix --tail=-1 | grep -ci 'forbidden' || true)"
  [ "$forbidden" -eq 0 ] || die "holdfast's logs show $forbidden forbidden request(s): k -n holdfast-system logs -l app.kubernetes.io/name=holdfast"
  log "passed"
}

down() {
  need kind docker
  kind delete cluster --name "$CLUSTER" || true
  docker rm -f "$REGISTRY_NAME" >/dev/null 2>&1 || true
  rm -f "$KUBECONFIG_FILE"
}

case "${1:-all}" in
  up) up ;;
  test) run_tests ;;
  down) down ;;
  all) up && run_tests ;;
  *) die "usage: $0 [up|test|down|all]" ;;
esac
