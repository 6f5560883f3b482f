#!/usr/bin/env bash
# The demo: pushes the images the examples refer to, applies examples/ with kubectl as a user
# would, and prints each reference as written and as stored (what holdfast did to it).
set -euo pipefail
state=${1:-.holdfast}
# shellcheck disable=SC1091
source "$state/env"

target/debug/holdfast-localenv seed --registry "$HOLDFAST_REGISTRY" >"$state/seed.log"
echo "pushed demo images to $HOLDFAST_REGISTRY (see $state/seed.log)"

rendered="$state/examples"
mkdir -p "$rendered"
for f in examples/*.yaml; do
  sed "s|REGISTRY|$HOLDFAST_REGISTRY|g" "$f" >"$rendered/$(basename "$f")"
done
kubectl apply -f "$rendered/namespace.yaml"
for f in app-image app-deployed packagerepository package korifi-app; do
  kubectl apply -f "$rendered/$f.yaml"
done
# The Image is owned by the BuildWorkload just created, by its uid, as Korifi makes it.
workload=$(kubectl get -n demo buildworkload 0c9d8e7f-6a5b-4c3d-8e2f-1a0b9c8d7e6f -o jsonpath='{.metadata.uid}')
sed -i "s|BUILDWORKLOAD_UID|$workload|" "$rendered/korifi-image.yaml"
kubectl apply -f "$rendered/korifi-image.yaml"

echo
echo "=== each reference as written (examples/) and as stored after admission ==="
target/debug/holdfast-localenv show "$rendered/app-image.yaml" "$rendered/app-deployed.yaml" \
  "$rendered/packagerepository.yaml" "$rendered/package.yaml" "$rendered/korifi-app.yaml" \
  "$rendered/korifi-image.yaml"
echo
echo "=== the real kapp-controller reconciles the pinned App demo-deployed ==="
kubectl wait -n demo app.kappctrl.k14s.io/demo-deployed --for=condition=ReconcileSucceeded --timeout=180s
kubectl get -n demo app.kappctrl.k14s.io/demo-deployed \
  -o jsonpath='{.spec.fetch[0].image.url}{"  ->  "}{.status.friendlyDescription}{"\n"}'
kubectl get -n demo configmap demo -o jsonpath='deployed: ConfigMap {.metadata.name} (kapp app {.metadata.labels.kapp\.k14s\.io/app}){"\n"}'
echo
echo "The environment keeps running: source $state/env to use it; make down stops it."
