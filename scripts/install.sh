#!/usr/bin/env bash
# holdfast onto `make cluster`'s real node, the way a user installs it: the image built here without
# a Docker engine (scripts/image.sh), pushed to the environment's registry and named by digest,
# then `helm install` of charts/holdfast into holdfast-system, which is created first with the Pod
# Security labels of manifests/base/namespace.yaml (`restricted` enforced): Helm keeps its release
# record in the release's namespace, so that namespace must exist before `helm install` (the
# chart's `namespace.create` is for renderers: helm template, Argo CD). The pods tolerate the
# node's taint and select it, so the
# webhook and controller Deployments run in real containers there and kube-apiserver calls the
# webhook through its Service. Then STATE/env gets what `make up` writes there: HOLDFAST_REGISTRY
# becomes the node's name for the registry (what pods and the host both reach), and
# HOLDFAST_WEBHOOK_ADMIN / HOLDFAST_CONTROLLER_ADMIN the pods' admin addresses.
#
#   scripts/install.sh [STATE]            install, or upgrade an installed release
#   scripts/install.sh uninstall [STATE]  helm uninstall (the namespace stays)
#
# HOLDFAST_HELM_ARGS: more arguments for helm (e.g. --set webhook.replicas=1).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
action=install
if [ "${1:-}" = uninstall ]; then action=uninstall; shift; fi
state_arg=${1:-.holdfast}
STATE=$(cd "$state_arg" && pwd)
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
HELM="$CACHE_DIR/peers/helm/bin/helm"
RELEASE=holdfast
NAMESPACE=holdfast-system

log() { printf '[install %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { echo "install: $*" >&2; exit 1; }

[ -x "$HELM" ] || die "$HELM is missing: run scripts/install-deps.sh --demo (make deps-demo) first"
[ -f "$STATE/env" ] || die "$STATE/env is missing: start the environment first (make cluster)"
[ -f "$STATE/node/env" ] || die "$STATE/node/env is missing: the node is not running (scripts/node.sh up)"
# shellcheck disable=SC1091 # written by make up and scripts/node.sh up
source "$STATE/env" && source "$STATE/node/env"
: "${KUBECONFIG:?} ${HOLDFAST_CLUSTER_REGISTRY:?} ${HOLDFAST_NODE:?} ${HOLDFAST_NODE_TAINT:?}"

if [ "$action" = uninstall ]; then
  "$HELM" uninstall "$RELEASE" -n "$NAMESPACE" --wait --ignore-not-found
  exit 0
fi

started=$SECONDS
log "building the image (scripts/image.sh build)"
"$ROOT/scripts/image.sh" build >/dev/null
image=$("$ROOT/scripts/image.sh" push "$HOLDFAST_CLUSTER_REGISTRY/holdfast")
log "pushed $image"

values=$(mktemp --suffix=.json)
trap 'rm -f "$values"' EXIT
placement=$(jq -n --arg node "$HOLDFAST_NODE" --arg taint "$HOLDFAST_NODE_TAINT" '{
  nodeSelector: {"kubernetes.io/hostname": $node},
  tolerations: [{key: $taint, operator: "Exists", effect: "NoSchedule"}]
}')
jq -n --arg repo "${image%@*}" --arg digest "${image#*@}" --arg registry "$HOLDFAST_CLUSTER_REGISTRY" \
  --argjson placement "$placement" '{
  image: {repository: $repo, digest: $digest},
  insecureRegistries: [$registry],
  webhook: $placement,
  controller: $placement
}' >"$values"
kubectl apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $NAMESPACE
  labels:
    pod-security.kubernetes.io/enforce: restricted
    pod-security.kubernetes.io/enforce-version: latest
    pod-security.kubernetes.io/warn: restricted
    pod-security.kubernetes.io/audit: restricted
EOF
# The control plane installs holdfast's CRD itself (as for `make up`'s host processes): the release
# adopts it (--take-ownership), as a user moving from kustomize to the chart does (README).
# shellcheck disable=SC2086 # HOLDFAST_HELM_ARGS is a list of arguments
"$HELM" upgrade --install --take-ownership "$RELEASE" "$ROOT/charts/holdfast" -n "$NAMESPACE" --values "$values" \
  --wait --timeout 5m ${HOLDFAST_HELM_ARGS:-} >/dev/null
log "helm release $RELEASE in $NAMESPACE: $(kubectl get pods -n "$NAMESPACE" --no-headers | awk '{print $1 " " $3}' | paste -sd, -)"

# The admin ports (metrics, readyz) of one pod of each Deployment.
admin() {
  local ip port
  ip=$(kubectl get pods -n "$NAMESPACE" -l "app.kubernetes.io/component=$1" -o jsonpath='{.items[0].status.podIP}')
  port=$(kubectl get pods -n "$NAMESPACE" -l "app.kubernetes.io/component=$1" \
    -o jsonpath='{.items[0].spec.containers[0].ports[?(@.name=="admin")].containerPort}')
  echo "http://$ip:$port"
}
partial="$STATE/env.partial"
grep -vE '^export HOLDFAST_(REGISTRY|WEBHOOK_ADMIN|CONTROLLER_ADMIN)=' "$STATE/env" >"$partial"
{
  echo "export HOLDFAST_REGISTRY=$HOLDFAST_CLUSTER_REGISTRY"
  echo "export HOLDFAST_WEBHOOK_ADMIN=$(admin webhook)"
  echo "export HOLDFAST_CONTROLLER_ADMIN=$(admin controller)"
} >>"$partial"
mv "$partial" "$STATE/env"
log "holdfast installed in $((SECONDS - started)) s from $image; run: source $STATE/env"
