#!/usr/bin/env bash
# kapp-controller as a pod on `make cluster`'s real node, installed the way its users install it:
# an image of its own programs and its release configuration, so the App path (fetch, template,
# deploy; the packaging API) is the one a cluster has. `make cluster` runs this instead of the
# host processes `make up` runs (holdfast-localenv up --without-kapp-controller).
#
#   scripts/kapp-controller.sh image        the image, built without a Docker engine as
#                                           scripts/image.sh builds holdfast's (umoci, an OCI layout
#                                           cached beside the programs): kapp-controller, vendir,
#                                           ytt, kapp, kbld and helm (helmTemplate, as holdfast's
#                                           own package templates), static (CGO_ENABLED=0, as
#                                           upstream's Dockerfile builds them; the host's
#                                           programs, scripts/install-deps.sh),
#                                           laid out as upstream's image lays them out: the programs
#                                           in / (on PATH, where kapp-controller runs them from),
#                                           the user kapp-controller (1000, group 0) in /etc/passwd,
#                                           the CA bundle at /etc/pki/tls/certs/ca-bundle.crt (and
#                                           .orig) in a directory group 0 may write (its sidecar
#                                           adds the configured CA certificates there). No git or
#                                           ssh (upstream's image has them for git fetches; Debian's
#                                           git is dynamically linked, and nothing here fetches
#                                           from git).
#   scripts/kapp-controller.sh up [STATE]   the image pushed to the node's registry
#                                           (HOLDFAST_CLUSTER_REGISTRY) and the release rendered
#                                           from kapp-controller's own config/ in the Go module cache
#                                           (as its package renders it: ytt over config/, then kbld)
#                                           with data values that place it on the node, the image set
#                                           by a kbld override; applied with kubectl, then waited
#                                           for: the Deployment rolled out and the packaging
#                                           APIService Available through its Service (kube-proxy).
#
# Nothing of kapp-controller is committed: the programs come from e2e/peers/*/go.mod, the YAML
# from the module. `make down` (scripts/node.sh down) stops the pod with the node.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
# umoci (the wrapper that asks for make deps) and push_layout.
# shellcheck source=scripts/image.sh
source "$ROOT/scripts/image.sh"
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
PEERS_DIR="$CACHE_DIR/peers"
TOOLS=(vendir ytt kapp kbld helm)
NAMESPACE=kapp-controller
API_SERVICE=v1alpha1.data.packaging.carvel.dev
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}

log() { printf '[kapp-controller %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { echo "kapp-controller: $*" >&2; exit 1; }

# static NAME: the build of NAME (kapp-controller or one of TOOLS), static in every mode.
static() {
  local bin="$PEERS_DIR/$1/bin/$1"
  [ -x "$bin" ] || die "$bin is missing: run scripts/install-deps.sh --node (make cluster) first"
  echo "$bin"
}

# The module's directory in the Go module cache, at the version e2e/peers/kapp-controller requires.
module_dir() {
  (cd "$ROOT/e2e/peers/kapp-controller" && GOFLAGS=-mod=readonly "$GO" list -m -f '{{.Dir}}' carvel.dev/kapp-controller)
}

version() {
  (cd "$ROOT/e2e/peers/kapp-controller" && GOFLAGS=-mod=readonly "$GO" list -m -f '{{.Version}}' carvel.dev/kapp-controller)
}

# image: prints the layout's image (LAYOUT:TAG); built again only when a program changed.
image() {
  local tag layout stamp rootfs sums name created
  tag=$(version)
  layout="$PEERS_DIR/kapp-controller/images/kapp-controller"
  stamp="$layout.programs"
  sums=$(for name in kapp-controller "${TOOLS[@]}"; do sha256sum "$(static "$name")" | cut -d' ' -f1; done)
  if [ -f "$layout/index.json" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$sums" ]; then
    echo "$layout:$tag"
    return
  fi
  rootfs="$TMP/rootfs"
  mkdir -p "$rootfs"
  install -m 0755 "$(static kapp-controller)" "$rootfs/kapp-controller"
  for name in "${TOOLS[@]}"; do install -m 0755 "$(static "$name")" "$rootfs/$name"; done
  # As upstream's image: the user in group 0, its home an emptyDir of the Deployment; the CA
  # bundle's directory writable by group 0, its original kept for the sidecar to start from.
  mkdir -p "$rootfs/etc/pki/tls/certs" "$rootfs/home/kapp-controller" "$rootfs/tmp"
  echo "kapp-controller:x:1000:0:/home/kapp-controller:/usr/sbin/nologin" >"$rootfs/etc/passwd"
  echo "root:x:0:" >"$rootfs/etc/group"
  install -m 0664 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/pki/tls/certs/ca-bundle.crt"
  install -m 0644 /etc/ssl/certs/ca-certificates.crt "$rootfs/etc/pki/tls/certs/ca-bundle.crt.orig"
  chmod 0775 "$rootfs/etc/pki/tls/certs"
  chmod 1777 "$rootfs/tmp"
  # Dated at the release (the module's publication time): the same programs give the same digest.
  created=$(cd "$ROOT/e2e/peers/kapp-controller" && GOFLAGS=-mod=readonly "$GO" list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' carvel.dev/kapp-controller)
  find "$rootfs" -exec touch -h -d "$created" {} +
  rm -rf "$layout" "$stamp"
  mkdir -p "$(dirname "$layout")"
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci insert --image "$layout:$tag" --history.created "$created" \
    --history.created_by "scripts/kapp-controller.sh: kapp-controller ${TOOLS[*]}, passwd, CA bundle" "$rootfs" /
  umoci config --image "$layout:$tag" --os linux --architecture amd64 --author holdfast \
    --created "$created" --history.created "$created" \
    --config.user 1000 \
    --config.entrypoint /kapp-controller \
    --config.env PATH=/:/usr/local/bin:/usr/bin:/bin \
    --config.workingdir / \
    --config.label "org.opencontainers.image.version=$tag" \
    --config.label "org.opencontainers.image.title=kapp-controller (built by holdfast's scripts/kapp-controller.sh)"
  umoci gc --layout "$layout"
  echo "$sums" >"$stamp"
  log "built $layout:$tag ($(du -sk "$layout/blobs" | cut -f1) KiB of blobs)"
  echo "$layout:$tag"
}

# render IMAGE VALUES: the release, as kapp-controller's package renders it (ytt over config/, then
# kbld), with IMAGE (repo@digest) for the `kapp-controller` image it names.
render() {
  local dir
  dir=$(module_dir)
  [ -d "$dir/config" ] || die "$dir/config is missing (go mod download in e2e/peers/kapp-controller)"
  # The schema types `tolerations` as a list of strings (its default is [""]) while the Deployment's
  # overlay adds them to the pod's tolerations, which are objects: a schema file of ours, overlaid
  # on upstream's (ytt merges schema files), lets the value be what the pod takes.
  cat >"$TMP/tolerations-schema.yml" <<'EOF'
#@data/values-schema
---
#@schema/type any=True
#@overlay/replace
tolerations: []
EOF
  # preresolved: the digest skopeo pushed is the reference; kbld asks no registry.
  cat >"$TMP/kbld.yml" <<EOF
apiVersion: kbld.k14s.io/v1alpha1
kind: Config
overrides:
- image: kapp-controller
  newImage: $1
  preresolved: true
EOF
  "$(static ytt)" -f "$dir/config" -f "$TMP/tolerations-schema.yml" --data-values-file "$2" |
    "$(static kbld)" -f - -f "$TMP/kbld.yml"
}

apiservice_available() {
  [ "$(kubectl get apiservice "$API_SERVICE" -o jsonpath='{.status.conditions[?(@.type=="Available")].status}')" = True ]
}

up() {
  local state_arg=${1:-.holdfast} state started=$SECONDS layout pushed digest values rendered
  state=$(cd "$state_arg" && pwd)
  [ -f "$state/env" ] || die "$state/env is missing: start the environment first (make cluster)"
  [ -f "$state/node/env" ] || die "$state/node/env is missing: the node is not running (scripts/node.sh up)"
  # shellcheck disable=SC1091 # written by make up and scripts/node.sh up
  source "$state/env" && source "$state/node/env"
  : "${KUBECONFIG:?} ${HOLDFAST_CLUSTER_REGISTRY:?} ${HOLDFAST_NODE:?} ${HOLDFAST_NODE_TAINT:?}"
  layout=$(image)
  digest="$TMP/digest" values="$TMP/values.json" rendered="$TMP/release.yml"
  push_layout "$layout" "$HOLDFAST_CLUSTER_REGISTRY/kapp-controller:${layout##*:}" "$digest"
  pushed="$HOLDFAST_CLUSTER_REGISTRY/kapp-controller@$(cat "$digest")"
  log "pushed $pushed"
  # The release's data values (config/values-schema.yml): on the node (its taint tolerated, selected
  # by name); API priority and fairness off, because its API server library (k8s.io/apiserver
  # 0.27) watches flowcontrol v1beta3, which Kubernetes 1.32 removed: it logs a failed watch every
  # second otherwise.
  jq -n --arg node "$HOLDFAST_NODE" --arg taint "$HOLDFAST_NODE_TAINT" '{
    enableApiPriorityAndFairness: false,
    nodeSelector: {"kubernetes.io/hostname": $node},
    tolerations: [{key: $taint, operator: "Exists", effect: "NoSchedule"}]
  }' >"$values"
  render "$pushed" "$values" >"$rendered" 2>"$TMP/render.log" ||
    { cat "$TMP/render.log" >&2; die "rendering the release failed"; }
  # All at once, as its users apply it: the controller exits at start when its APIService is not
  # there yet (it writes its serving CA into it). Server-side: the control plane created the CRDs.
  kubectl apply --server-side --force-conflicts --field-manager=kapp-controller-release \
    -f "$rendered" >/dev/null
  kubectl rollout status -n "$NAMESPACE" deployment/kapp-controller --timeout=5m >/dev/null
  local i
  for ((i = 0; i < 300; i++)); do
    if apiservice_available; then break; fi
    sleep 1
  done
  apiservice_available || {
    kubectl logs -n "$NAMESPACE" deployment/kapp-controller -c kapp-controller --tail=30 >&2 || true
    die "the APIService $API_SERVICE is not Available after 300 s"
  }
  # Discovery fetched again now that the server answers (an update of the APIService does it):
  # kube-apiserver marks a group whose server it could not reach (before the pod served) stale
  # and retries with a backoff of up to a minute, and while a group is stale the namespace
  # controller deletes no namespace.
  kubectl annotate apiservice "$API_SERVICE" --overwrite \
    "holdfast.dev/discovery-refresh=$(date +%s)" >/dev/null
  log "kapp-controller ${layout##*:} Running on $HOLDFAST_NODE in $((SECONDS - started)) s: $(kubectl get pods -n "$NAMESPACE" -l app=kapp-controller --no-headers | awk '{print $1 " " $2 " " $3}' | paste -sd, -); $API_SERVICE Available"
}

TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
case "${1:-}" in
  image) image ;;
  up) up "${2:-.holdfast}" ;;
  *) echo "usage: $0 image | up [STATE]" >&2; exit 2 ;;
esac
