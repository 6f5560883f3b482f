#!/usr/bin/env bash
# holdfast's release artefacts for a registry, from the image `scripts/image.sh push` pushed
# (target/image/pushed):
#
#   scripts/package.sh PREFIX      e.g. 127.0.0.1:5000/holdfast  (make package PREFIX=…)
#
#   PREFIX/holdfast-package:<version>  the Carvel package's imgpkg bundle: the chart
#                                      (charts/holdfast, the one templating of manifests/ both
#                                      installers use), values naming the image by digest, and
#                                      .imgpkg/images.yml, the ImagesLock kbld writes for it (so
#                                      `imgpkg copy` relocates the image with the bundle)
#   PREFIX/holdfast-repo:<version>     the PackageRepository bundle: packages/ holding the
#                                      PackageMetadata and the Package (its valuesSchema is
#                                      charts/holdfast/values.schema.json), which fetches the
#                                      package bundle by digest; its own ImagesLock
#   PREFIX/charts/holdfast:<version>   the chart as an OCI artefact (`helm push`), whose default
#                                      image is the release's, by digest
#
# Writes target/package/{bundle,repository,chart} (the pushed references, by digest). Tools:
# helm, imgpkg, kbld from `make deps` ($HOLDFAST_CACHE/peers/).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
TARGET_DIR=${CARGO_TARGET_DIR:-$ROOT/target}
OUT="$TARGET_DIR/package"
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
LICENSE=$(sed -n 's/^license = "\(.*\)"/\1/p' "$ROOT/Cargo.toml" | head -1)
REF_NAME=holdfast.holdfast.dev

[ $# -eq 1 ] || { echo "usage: $0 PREFIX (e.g. 127.0.0.1:5000/holdfast)" >&2; exit 2; }
PREFIX=$1
REGISTRY=${PREFIX%%/*}

tool() {
  local bin="$CACHE_DIR/peers/$1/bin/$1"
  [ -x "$bin" ] || { echo "package: $bin is missing: run \`make deps\` first" >&2; exit 1; }
  echo "$bin"
}
HELM=$(tool helm)
IMGPKG=$(tool imgpkg)
KBLD=$(tool kbld)

# Plain HTTP only for a loopback registry (the local one `make up` and the tests run) and for the
# address `make cluster`'s node gives it (HOLDFAST_CLUSTER_REGISTRY, scripts/node.sh), as
# scripts/image.sh pushes.
PLAIN=()
case "$REGISTRY" in
  127.*|localhost|localhost:*|"${HOLDFAST_CLUSTER_REGISTRY:-}") PLAIN=(1) ;;
esac
imgpkg() { "$IMGPKG" "$@" ${PLAIN:+--registry-insecure}; }

log() { printf '[package %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }

[ -f "$TARGET_DIR/image/pushed" ] || { echo "package: push the image first (make image IMAGE_REPO=$PREFIX/holdfast)" >&2; exit 1; }
IMAGE=$(cat "$TARGET_DIR/image/pushed")
IMAGE_REPO=${IMAGE%@*}
IMAGE_DIGEST=${IMAGE#*@}

rm -rf "$OUT" && mkdir -p "$OUT"

# The package bundle. The chart is copied with its links followed (the CRD is manifests/crds').
bundle="$OUT/bundle-dir"
mkdir -p "$bundle/config" "$bundle/.imgpkg"
cp -rL "$ROOT/charts/holdfast" "$bundle/config/chart"
# The package installs into holdfast-system, which it creates (the chart's namespace.create; the
# helmTemplate step below names the namespace), as kustomize's base does. Without the chart's
# uninstall hook: `helm template` renders hooks as plain objects, so kapp would run its Job at
# install and delete the webhook configurations (the key is also left out of the valuesSchema).
# kapp orders the removal itself: the configurations' change group, deleted before the objects
# an admission goes through (their change rules; manifest-checks' check_removal_order).
printf 'namespace:\n  create: true\nuninstall:\n  removeWebhooksFirst: false\nimage:\n  repository: %s\n  digest: %s\n' "$IMAGE_REPO" "$IMAGE_DIGEST" >"$bundle/config/image-values.yaml"
# kbld finds every image the chart renders and writes the ImagesLock (by digest).
"$HELM" template holdfast "$bundle/config/chart" --namespace holdfast-system --include-crds --values "$bundle/config/image-values.yaml" 2>/dev/null |
  "$KBLD" -f - ${PLAIN:+--registry-insecure} --imgpkg-lock-output "$bundle/.imgpkg/images.yml" >/dev/null
grep -q "image: $IMAGE" "$bundle/.imgpkg/images.yml" ||
  { echo "package: the ImagesLock does not hold $IMAGE" >&2; cat "$bundle/.imgpkg/images.yml" >&2; exit 1; }
imgpkg push -b "$PREFIX/holdfast-package:$VERSION" -f "$bundle" --lock-output "$OUT/bundle.lock.yml" >/dev/null
BUNDLE=$(sed -n 's/^ *image: //p' "$OUT/bundle.lock.yml")
echo "$BUNDLE" >"$OUT/bundle"
log "package bundle $BUNDLE"

# The repository bundle.
repo="$OUT/repo-dir"
mkdir -p "$repo/packages/$REF_NAME" "$repo/.imgpkg"
cat >"$repo/packages/$REF_NAME/metadata.yml" <<EOF
apiVersion: data.packaging.carvel.dev/v1alpha1
kind: PackageMetadata
metadata:
  name: $REF_NAME
spec:
  displayName: holdfast
  shortDescription: Pins Carvel fetch references to digests at admission; fast Korifi org deletion
  longDescription: >-
    An admission webhook and controller that rewrite the OCI references of App,
    PackageRepository and Package fetch specs from tags to digests from a shared digest cache
    (so kapp-controller keeps reconciling while a registry is down), and make Korifi org
    deletion fast.
  providerName: holdfast
  maintainers:
  - name: holdfast
  categories:
  - supply-chain
  - kapp-controller
EOF
{
  cat <<EOF
apiVersion: data.packaging.carvel.dev/v1alpha1
kind: Package
metadata:
  name: $REF_NAME.$VERSION
spec:
  refName: $REF_NAME
  version: $VERSION
  licenses:
  - $LICENSE
  releaseNotes: holdfast $VERSION
  template:
    spec:
      fetch:
      - imgpkgBundle:
          image: $BUNDLE
      template:
      # The chart, with the image by digest, in holdfast-system (created by the chart); a
      # PackageInstall's values come after these. Rendered for the cluster's Kubernetes version (the chart needs >= 1.30; helm's own default is
      # the version it was built against).
      - helmTemplate:
          path: config/chart
          namespace: holdfast-system
          kubernetesVersion: {}
          valuesFrom:
          - path: config/image-values.yaml
      # Relocation: the image from the bundle's ImagesLock (where imgpkg copy put it).
      - kbld:
          paths:
          - '-'
          - .imgpkg/images.yml
      deploy:
      - kapp: {}
  valuesSchema:
    openAPIv3:
EOF
  # The chart's values schema, as YAML under openAPIv3 (JSON is YAML; keywords JSON Schema has and
  # OpenAPI lacks are dropped); the package creates its namespace (config/image-values.yaml) and
  # has no uninstall hook (Helm's only).
  jq 'del(."$schema", .title, .properties.uninstall) | .properties.namespace.properties.create.default = true' \
    "$ROOT/charts/holdfast/values.schema.json" | sed 's/^/      /'
} >"$repo/packages/$REF_NAME/$VERSION.yml"
"$KBLD" -f "$repo/packages" ${PLAIN:+--registry-insecure} --imgpkg-lock-output "$repo/.imgpkg/images.yml" >/dev/null
imgpkg push -b "$PREFIX/holdfast-repo:$VERSION" -f "$repo" --lock-output "$OUT/repository.lock.yml" >/dev/null
REPOSITORY=$(sed -n 's/^ *image: //p' "$OUT/repository.lock.yml")
echo "$REPOSITORY" >"$OUT/repository"
log "repository bundle $REPOSITORY"

# The chart as an OCI artefact, its default image the release's, by digest (so that `helm
# install` of it needs no image values).
chart="$OUT/chart-dir/holdfast"
mkdir -p "$OUT/chart-dir"
cp -rL "$ROOT/charts/holdfast" "$chart"
sed -i -e "s|^  repository: holdfast$|  repository: $IMAGE_REPO|" -e "s|^  digest: \"\"$|  digest: $IMAGE_DIGEST|" "$chart/values.yaml"
grep -q "digest: $IMAGE_DIGEST" "$chart/values.yaml" || { echo "package: could not set the chart's image" >&2; exit 1; }
# Artifact Hub's list of the chart's images: the release's, by digest.
sed -i -e "s|^      image: holdfast:$VERSION$|      image: $IMAGE|" "$chart/Chart.yaml"
grep -q "image: $IMAGE$" "$chart/Chart.yaml" || { echo "package: could not set the chart's image annotation" >&2; exit 1; }
"$HELM" package "$chart" --destination "$OUT" >/dev/null 2>&1
"$HELM" push "$OUT/holdfast-$VERSION.tgz" "oci://$PREFIX/charts" ${PLAIN:+--plain-http} >"$OUT/chart.log" 2>&1
CHART="$PREFIX/charts/holdfast@$(sed -n 's/^Digest: //p' "$OUT/chart.log")"
echo "$CHART" >"$OUT/chart"
log "chart $CHART"
printf '%s\n%s\n%s\n' "$BUNDLE" "$REPOSITORY" "$CHART"
