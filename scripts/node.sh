#!/usr/bin/env bash
# One real node for the environment `make up` runs (`make cluster`): containerd (2.4, its own root,
# state and socket under STATE/node/), Debian's runc, the CNI bridge, host-local, loopback and
# portmap plugins on a bridge this script creates, kubelet and kube-proxy (nftables mode) of the
# control plane's release and kube-router's NetworkPolicy controller, all built by
# scripts/install-deps.sh (the node group), and the pause image built there from the Kubernetes
# module's source and pushed here to the environment's registry. The
# kwok nodes stay for the workloads that need no containers: this node is tainted
# (holdfast.dev/real-node=true:NoSchedule), so only pods that tolerate it run here.
#
#   scripts/node.sh up [STATE]     start it (STATE/env must exist: `make up`); returns once the
#                                  Node is Ready; writes STATE/node/env (images, crictl endpoint)
#   scripts/node.sh check [STATE]  prove it on the running node, in a namespace of its own: netcheck
#                                  pods Ready with bridge addresses, a ClusterIP Service reached
#                                  from the host and from a pod through kube-proxy, kubectl logs
#                                  and exec, a NetworkPolicy letting one client in and not another
#   scripts/node.sh registry-outage on|off [STATE]
#                                  a registry outage as the node's pods see it (on), or its end
#                                  (off): the registry's forwarder refuses every connection from the
#                                  bridge (TCP reset, as a registry that is down); the host keeps
#                                  it (pushes on loopback, the kubelet's pulls through containerd)
#   scripts/node.sh down [STATE]   stop it and remove what it made: pod sandboxes (through the CRI,
#                                  so CNI deletes their veths and network namespaces), mounts under
#                                  STATE/node/, the bridge, nftables tables, iptables chains and
#                                  ipsets of kubelet and kube-router, cgroups, the Node object;
#                                  the sysctls it changed get their values back
#
# Addresses: pods get 10.244.0.0/24 on the bridge hf-br0 (host side 10.244.0.1, also the node's
# InternalIP and the kubelet's only listening address); only network namespaces containerd
# creates for pod sandboxes hold pod addresses. Forwarding is switched on (a pod reaching a
# ClusterIP is DNATed by the host back onto the bridge), and the table `inet holdfast-node` drops
# every forwarded packet that does not both enter and leave the bridge, so no pod traffic is
# routed off the machine; its input chain takes traffic for the node's address only from the bridge
# and from the host itself. Pods get an empty resolv.conf (no DNS server to call).
# What pods call on the host listens on loopback (`make up`): socat forwarders give the registry and
# kube-apiserver the node's address too, on the same ports. The registry is then named
# $NODE_IP:PORT everywhere on the node (HOLDFAST_CLUSTER_REGISTRY: host and pods both reach it),
# and the `kubernetes` Service's EndpointSlice (the control plane runs with
# --endpoint-reconciler-type=none) points at the API server's forwarder, so in-cluster clients
# reach it at its ClusterIP, as in any cluster.
# Facts behind each setting: ../shared/TESTENV.md, "Real containers on these machines".
set -euo pipefail

usage() { echo "usage: $0 up|check|down [STATE] | registry-outage on|off [STATE]" >&2; exit 2; }
[ $# -ge 1 ] || usage
action=$1
if [ "$action" = registry-outage ]; then
  outage=${2:-}
  [ "$outage" = on ] || [ "$outage" = off ] || usage
  shift
fi
state_arg=${2:-.holdfast}
if [ "$(id -u)" -ne 0 ]; then exec sudo -E "$0" "$@"; fi
mkdir -p "$state_arg"
STATE=$(cd "$state_arg" && pwd)
DIR="$STATE/node"
CACHE_DIR=${HOLDFAST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/holdfast}
PEERS_DIR="$CACHE_DIR/peers"

NODE_NAME=holdfast-node
BRIDGE=hf-br0
POD_CIDR=10.244.0.0/24
NODE_IP=10.244.0.1
# The control plane's --service-cluster-ip-range (e2e/src/control_plane.rs).
SERVICE_CIDR=10.96.0.0/24
GUARD_TABLE=holdfast-node
TAINT=holdfast.dev/real-node
CNI_BIN=/usr/lib/cni
RUNC=/usr/sbin/runc
SOCAT=/usr/bin/socat
CONTAINERD_SOCK="$DIR/containerd/containerd.sock"

log() { printf '[node %(%H:%M:%S)T] %s\n' -1 "$*"; }
die() { echo "node: $*" >&2; exit 1; }

# A free port for the node's daemons, below the NodePort range (30000-32767): kube-router accepts
# any local traffic to that range ("allow LOCAL traffic to node ports"), so a kubelet listening
# there would be reachable from every pod whatever the NetworkPolicies say.
free_port() {
  local port
  while :; do
    port=$((20000 + RANDOM % 10000))
    if [ -z "$(ss -Htan "sport = :$port")" ]; then echo "$port"; return; fi
  done
}

pid_of() { sed -n "s/^$1=//p" "$DIR/pids" 2>/dev/null || true; }

running() {
  local pid
  pid=$(pid_of "$1")
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}

# start NAME PROGRAM ARGS...: in the background, in a session of its own, logging to DIR/NAME.log.
start() {
  local name=$1
  shift
  setsid "$@" >"$DIR/$name.log" 2>&1 </dev/null &
  echo "$name=$!" >>"$DIR/pids"
}

# stop NAME SECONDS: SIGTERM, then SIGKILL after SECONDS.
stop() {
  local pid i
  pid=$(pid_of "$1")
  [ -n "$pid" ] || return 0
  if kill -TERM "$pid" 2>/dev/null; then
    for ((i = 0; i < $2 * 5; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.2
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$1 (pid $pid) did not stop in $2 s; killing it"
      kill -KILL "$pid" 2>/dev/null || true
    fi
  fi
  sed -i "/^$1=/d" "$DIR/pids"
}

# until_ok SECONDS WHAT NAME COMMAND...: retries COMMAND until it succeeds; fails with the log of the
# process NAME when it exits or SECONDS pass.
until_ok() {
  local seconds=$1 what=$2 name=$3 i
  shift 3
  for ((i = 0; i < seconds * 2; i++)); do
    if "$@" >/dev/null 2>&1; then return 0; fi
    if ! running "$name"; then
      tail -30 "$DIR/$name.log" >&2
      die "$name exited while waiting for $what (log: $DIR/$name.log)"
    fi
    sleep 0.5
  done
  tail -30 "$DIR/$name.log" >&2
  die "timed out after $seconds s waiting for $what (log: $DIR/$name.log)"
}

crictl() {
  if [ ! -f "$DIR/crictl.yaml" ]; then
    printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n' \
      "$CONTAINERD_SOCK" "$CONTAINERD_SOCK" >"$DIR/crictl.yaml"
  fi
  "$PEERS_DIR/cri-tools/bin/crictl" --config "$DIR/crictl.yaml" "$@"
}

peer() {
  [ -e "$PEERS_DIR/$1" ] || die "$PEERS_DIR/$1 is missing: run scripts/install-deps.sh --node (make deps) first"
  echo "$PEERS_DIR/$1"
}

# --- up ---

write_containerd_config() {
  local registry=$1 pause=$2
  mkdir -p "$DIR/containerd/certs.d/$registry"
  # The environment's registry speaks plain HTTP on loopback; nothing else is ever pulled from.
  cat >"$DIR/containerd/certs.d/$registry/hosts.toml" <<EOF
server = "http://$registry"

[host."http://$registry"]
  capabilities = ["pull", "resolve"]
EOF
  # Version 3 (containerd 2.0's layout; 2.4 migrates it at start, an info line): written as version 4
  # the CRI plugins did not load here.
  cat >"$DIR/containerd/config.toml" <<EOF
version = 3
root = "$DIR/containerd/root"
state = "$DIR/containerd/state"
# Plugins that would use paths of their own outside the node's directory, or that no pod here needs.
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.erofs", "io.containerd.differ.v1.erofs",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.nri.v1.nri",
  "io.containerd.image-verifier.v1.bindir"]

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"

[plugins]
  [plugins."io.containerd.cri.v1.images"]
    snapshotter = "overlayfs"
    [plugins."io.containerd.cri.v1.images".pinned_images]
      sandbox = "$pause"
    [plugins."io.containerd.cri.v1.images".registry]
      config_path = "$DIR/containerd/certs.d"
  [plugins."io.containerd.cri.v1.runtime"]
    # Negative oom_score_adj is refused here, even for root: the kubelet's -998 for sandboxes would
    # fail runc ("can't get final child's PID from pipe: EOF").
    restrict_oom_score_adj = true
    # Pod network namespaces under the node's state directory, not /var/run/netns.
    netns_mounts_under_state_dir = true
    enable_selinux = false
    [plugins."io.containerd.cri.v1.runtime".containerd]
      default_runtime_name = "runc"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
          BinaryName = "$RUNC"
          Root = "$DIR/containerd/runc"
          SystemdCgroup = false
    [plugins."io.containerd.cri.v1.runtime".cni]
      bin_dirs = ["$CNI_BIN"]
      conf_dir = "$DIR/cni/net.d"
EOF
}

write_cni_config() {
  mkdir -p "$DIR/cni/net.d" "$DIR/cni/ipam"
  cat >"$DIR/cni/net.d/10-holdfast.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "holdfast-node",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$NODE_IP"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$DIR/cni/ipam"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
}

write_kubelet_config() {
  local port=$1 healthz=$2
  mkdir -p "$DIR/kubelet/root" "$DIR/kubelet/pod-logs"
  : >"$DIR/resolv.conf"
  cat >"$DIR/kubelet/config.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
imageServiceEndpoint: unix://$CONTAINERD_SOCK
# cgroups v1 here, and no systemd.
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
podCIDR: $POD_CIDR
podLogsDir: $DIR/kubelet/pod-logs
resolvConf: $DIR/resolv.conf
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  # kube-apiserver's client certificate (logs, exec, port-forward), when the environment has one.
  x509: {clientCAFile: "${HOLDFAST_KUBELET_CLIENT_CA:-}"}
authorization:
  mode: Webhook
registerWithTaints:
- {key: $TAINT, value: "true", effect: NoSchedule}
serializeImagePulls: false
# The defaults (nodefs 10 %, imagefs 15 % free) taint a test machine's node with disk pressure
# as soon as the Go and cargo caches fill its disk: only a nearly full disk counts here.
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
EOF
}

write_kube_proxy_config() {
  local kubeconfig=$1 healthz=$2 metrics=$3
  mkdir -p "$DIR/kube-proxy"
  cat >"$DIR/kube-proxy/config.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $kubeconfig
hostnameOverride: $NODE_NAME
mode: nftables
clusterCIDR: $POD_CIDR
bindAddress: $NODE_IP
healthzBindAddress: 127.0.0.1:$healthz
metricsBindAddress: 127.0.0.1:$metrics
nodePortAddresses: ["$NODE_IP/32"]
# Zero: leave the machine's conntrack sysctls as they are.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}

# The bridge (pods' gateway and the node's address) and the guard on forwarding.
setup_network() {
  # What was there before, to take away only what the node added.
  [ -f "$DIR/nft-tables.before" ] || nft list tables >"$DIR/nft-tables.before"
  [ -f "$DIR/ipsets.before" ] || ipset list -n >"$DIR/ipsets.before"
  if [ ! -f "$DIR/sysctl.saved" ]; then
    {
      echo "net.ipv4.ip_forward=$(sysctl -n net.ipv4.ip_forward)"
      echo "net.bridge.bridge-nf-call-iptables=$(sysctl -n net.bridge.bridge-nf-call-iptables)"
    } >"$DIR/sysctl.saved"
  fi
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge
    ip addr add "$NODE_IP/${POD_CIDR#*/}" dev "$BRIDGE"
  fi
  ip link set "$BRIDGE" up
  nft -f - <<EOF
table inet $GUARD_TABLE
delete table inet $GUARD_TABLE
table inet $GUARD_TABLE {
  chain forward {
    type filter hook forward priority filter - 10; policy drop;
    iifname "$BRIDGE" oifname "$BRIDGE" accept
  }
  chain input {
    type filter hook input priority filter - 10; policy accept;
    ip daddr $NODE_IP iifname != { "lo", "$BRIDGE" } drop
  }
}
EOF
  sysctl -qw net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1
}

push_images() {
  local registry=$1 layout tag
  for layout in "$(peer kubernetes-node)/images/pause" "$(peer netcheck)/images/netcheck"; do
    tag=$(jq -r '.manifests[0].annotations["org.opencontainers.image.ref.name"]' "$layout/index.json")
    skopeo copy -q --dest-tls-verify=false "oci:$layout:$tag" "docker://$registry/$(basename "$layout"):$tag"
    echo "$registry/$(basename "$layout"):$tag"
  done
}

# forward NAME PORT TARGET: socat on the node's address, PORT, to TARGET (host:port on loopback).
forward() {
  start "$1" "$SOCAT" "TCP-LISTEN:$2,bind=$NODE_IP,reuseaddr,fork" "TCP:$3"
  until_ok 10 "$1 on $NODE_IP:$2" "$1" bash -c "exec 3<>/dev/tcp/$NODE_IP/$2"
}

# The `kubernetes` Service's endpoint: the API server's forwarder on the node's address.
kubernetes_endpoints() {
  kubectl apply -f - >/dev/null <<EOF
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: kubernetes
  namespace: default
  labels: {kubernetes.io/service-name: kubernetes, endpointslice.kubernetes.io/managed-by: holdfast.dev-node}
addressType: IPv4
endpoints: [{addresses: ["$NODE_IP"], conditions: {ready: true}}]
ports: [{name: https, port: $1, protocol: TCP}]
EOF
}

node_ready() {
  [ "$(kubectl get node "$NODE_NAME" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" = True ]
}

up() {
  [ -f "$STATE/env" ] || die "$STATE/env is missing: start the environment first (make up)"
  # shellcheck disable=SC1091 # written by make up: KUBECONFIG, HOLDFAST_REGISTRY
  source "$STATE/env"
  : "${KUBECONFIG:?} ${HOLDFAST_REGISTRY:?} ${HOLDFAST_APISERVER:?}"
  if running kubelet && running containerd && running kube-proxy && running kube-router \
    && running registry-forwarder && running apiserver-forwarder; then
    echo "holdfast node already running (kubelet pid $(pid_of kubelet)); source $DIR/env"
    return
  fi
  [ ! -f "$DIR/pids" ] || down_node
  local started=$SECONDS images pause netcheck
  mkdir -p "$DIR"
  : >"$DIR/pids"
  # A start that fails stops what it started and takes away what it made.
  trap 'log "the node did not start; stopping it"; down_node' EXIT
  local kubelet kube_proxy containerd_bin
  containerd_bin=$(peer containerd)/bin
  kubelet=$(peer kubernetes-node)/bin/kubelet
  kube_proxy=$(peer kubernetes-node)/bin/kube-proxy
  peer cri-tools >/dev/null

  setup_network
  local registry=$NODE_IP:${HOLDFAST_REGISTRY##*:} apiserver_port=${HOLDFAST_APISERVER##*:}
  forward registry-forwarder "${HOLDFAST_REGISTRY##*:}" "$HOLDFAST_REGISTRY"
  forward apiserver-forwarder "$apiserver_port" "$HOLDFAST_APISERVER"
  kubernetes_endpoints "$apiserver_port"
  images=$(push_images "$registry")
  pause=$(echo "$images" | sed -n 1p)
  netcheck=$(echo "$images" | sed -n 2p)
  log "pushed $pause and $netcheck"

  write_containerd_config "$registry" "$pause"
  write_cni_config
  # containerd starts its runc shim from PATH: the one built beside it.
  start containerd env PATH="$containerd_bin:$PATH" "$containerd_bin/containerd" \
    --config "$DIR/containerd/config.toml"
  until_ok 30 "containerd's CRI" containerd crictl info
  log "containerd $("$containerd_bin/containerd" --version | awk '{print $3}') up (socket $CONTAINERD_SOCK)"

  write_kubelet_config "$(free_port)" "$(free_port)"
  start kubelet "$kubelet" --config="$DIR/kubelet/config.yaml" --kubeconfig="$KUBECONFIG" \
    --root-dir="$DIR/kubelet/root" --hostname-override="$NODE_NAME" --node-ip="$NODE_IP"
  until_ok 90 "the Node $NODE_NAME to register" kubelet kubectl get node "$NODE_NAME"

  write_kube_proxy_config "$KUBECONFIG" "$(free_port)" "$(free_port)"
  start kube-proxy "$kube_proxy" --config="$DIR/kube-proxy/config.yaml"
  until_ok 90 "the Node $NODE_NAME to be Ready" kubelet node_ready
  until_ok 30 "kube-proxy's nftables table" kube-proxy nft list table ip kube-proxy

  # NetworkPolicy: kube-router's policy controller alone (iptables and ipset; no BGP, no proxy,
  # no health or metrics port).
  start kube-router "$(peer kube-router)/bin/kube-router" --run-firewall=true --run-router=false \
    --run-service-proxy=false --kubeconfig="$KUBECONFIG" --hostname-override="$NODE_NAME" \
    --service-cluster-ip-range="$SERVICE_CIDR" --enable-ipv6=false --health-port=0 --metrics-port=0
  until_ok 60 "kube-router's firewall chains" kube-router iptables -S KUBE-ROUTER-FORWARD

  cat >"$DIR/env.partial" <<EOF
export HOLDFAST_NODE=$NODE_NAME
export HOLDFAST_NODE_TAINT=$TAINT
export HOLDFAST_NODE_IP=$NODE_IP
export HOLDFAST_CLUSTER_REGISTRY=$registry
export HOLDFAST_PAUSE_IMAGE=$pause
export HOLDFAST_NETCHECK_IMAGE=$netcheck
export CRI_CONFIG_FILE=$DIR/crictl.yaml
export PATH=$PEERS_DIR/cri-tools/bin:\$PATH
EOF
  mv "$DIR/env.partial" "$DIR/env"
  trap - EXIT
  log "node $NODE_NAME Ready in $((SECONDS - started)) s: $(kubectl get node "$NODE_NAME" -o jsonpath='{.status.nodeInfo.containerRuntimeVersion} kubelet {.status.nodeInfo.kubeletVersion}'), pods on $POD_CIDR ($BRIDGE)"
  echo "run: source $STATE/env && source $DIR/env; pods tolerate $TAINT and select kubernetes.io/hostname=$NODE_NAME"
}

# --- down ---

# kube-router's filter chains (KUBE-ROUTER-*, KUBE-NWPLCY-*, KUBE-POD-FW-*), the rules jumping to
# them, and its ipsets (KUBE-SRC-*, KUBE-DST-*) that were not there before. Its own
# --cleanup-config does not do it in v2.1.0: it cleans no policy chain and then panics (nil
# pointer in the proxy's deleteHairpinIptablesRules).
cleanup_kube_router() {
  local cmd set pattern='KUBE-(ROUTER|NWPLCY|POD-FW)-'
  local rules
  for cmd in iptables ip6tables; do
    rules=$("$cmd-save" -t filter 2>/dev/null) || continue
    if grep -qE "$pattern" <<<"$rules"; then
      grep -vE "^:$pattern|^-A .*$pattern" <<<"$rules" | "$cmd-restore" -T filter
    fi
  done
  for set in $(ipset list -n 2>/dev/null | grep -E '^KUBE-(SRC|DST)-'); do
    grep -qx "$set" "$DIR/ipsets.before" 2>/dev/null || ipset destroy "$set"
  done
  rm -f "$DIR/ipsets.before"
}

# The chains the kubelet makes in each iptables table (iptables-nft here): its canaries, the hint
# kube-proxy detects the mode by, and KUBE-FIREWALL (drops non-local packets to 127.0.0.0/8).
cleanup_kubelet_chains() {
  local cmd table chain
  for cmd in iptables ip6tables; do
    for table in filter nat mangle; do
      "$cmd" -t "$table" -D INPUT -j KUBE-FIREWALL 2>/dev/null || true
      "$cmd" -t "$table" -D OUTPUT -j KUBE-FIREWALL 2>/dev/null || true
      for chain in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        if "$cmd" -t "$table" -F "$chain" 2>/dev/null; then "$cmd" -t "$table" -X "$chain"; fi
      done
    done
  done
}

# Processes containerd's shims run as: theirs is our socket (found by it, stopped by PID).
shim_pids() {
  local p args
  for p in /proc/[0-9]*; do
    args=$({ tr '\0' ' ' <"$p/cmdline"; } 2>/dev/null) || continue
    if [[ $args == *"-address $CONTAINERD_SOCK "* ]]; then echo "${p#/proc/}"; fi
  done
  return 0
}

down_node() {
  local pid m link
  stop kube-router 10
  stop kube-proxy 10
  stop apiserver-forwarder 5
  stop registry-forwarder 5
  stop kubelet 30
  if running containerd; then
    # Through the CRI, so CNI DEL removes each sandbox's veth, address and network namespace.
    local sandboxes
    mapfile -t sandboxes < <(crictl pods -q 2>/dev/null)
    if [ "${#sandboxes[@]}" -gt 0 ]; then
      crictl stopp "${sandboxes[@]}" >/dev/null || true
      crictl rmp -f "${sandboxes[@]}" >/dev/null || true
    fi
  fi
  stop containerd 20
  for pid in $(shim_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  # containerd's shims keep their sockets in /run/containerd/s whatever the state directory:
  # gone with the shims; the directories go too when nothing else uses them.
  rmdir /run/containerd/s /run/containerd 2>/dev/null || true
  # Deepest first: containers' rootfs and shm, network namespaces, the kubelet's volumes.
  for m in $(findmnt -rn -o TARGET | grep -F "$DIR/" | sort -r); do
    umount "$m" 2>/dev/null || umount -l "$m"
  done
  if ip link show "$BRIDGE" >/dev/null 2>&1; then
    for link in $(ip -o link show master "$BRIDGE" | awk -F': ' '{print $2}' | cut -d@ -f1); do
      ip link delete "$link" || true
    done
    ip link delete "$BRIDGE"
  fi
  "$(peer kubernetes-node)/bin/kube-proxy" --cleanup >"$DIR/kube-proxy-cleanup.log" 2>&1 || true
  nft delete table ip kube-proxy 2>/dev/null || true
  nft delete table ip6 kube-proxy 2>/dev/null || true
  nft delete table inet "$GUARD_TABLE" 2>/dev/null || true
  cleanup_kube_router
  cleanup_kubelet_chains
  local chain
  for chain in $(iptables-save -t nat 2>/dev/null | sed -n 's/^:\(CNI-[^ ]*\).*/\1/p'); do
    iptables-save -t nat | sed -n "s/^-A \([A-Z-]*\) \(.*-j $chain\)\$/\1 \2/p" | while read -r parent rule; do
      # shellcheck disable=SC2086 # the rule's words
      iptables -t nat -D "$parent" $rule || true
    done
    iptables -t nat -F "$chain" || true
    iptables -t nat -X "$chain" || true
  done
  # iptables-nft's tables, when the node's programs made them: emptied above, so deleted.
  local family table
  for family in ip ip6; do
    for table in filter nat mangle; do
      if ! grep -qx "table $family $table" "$DIR/nft-tables.before" 2>/dev/null \
        && [ "$(nft -j list table "$family" "$table" 2>/dev/null | jq '[.nftables[] | select(.rule)] | length')" = 0 ]; then
        nft delete table "$family" "$table"
      fi
    done
  done
  rm -f "$DIR/nft-tables.before"
  if [ -f "$DIR/sysctl.saved" ]; then
    sysctl -q -p "$DIR/sysctl.saved" >/dev/null
    rm -f "$DIR/sysctl.saved"
  fi
  # The kubelet's cgroups (cgroupfs driver, root /: kubepods) and containerd's for containers
  # without a parent (k8s.io, its namespace), in every hierarchy; rmdir removes only empty ones.
  for m in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/*/k8s.io; do
    if [ -d "$m" ]; then find "$m" -depth -type d -exec rmdir {} + 2>/dev/null || true; fi
  done
  rm -f "$DIR/pids" "$DIR/env" "$DIR/crictl.yaml"
}

down() {
  if [ ! -f "$DIR/pids" ]; then
    echo "holdfast node not running"
    return
  fi
  down_node
  if [ -f "$STATE/env" ]; then
    # shellcheck disable=SC1091 # written by make up
    source "$STATE/env"
    kubectl delete node "$NODE_NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  fi
  # Logs stay (STATE/node/*.log); the node's runtime state goes.
  rm -rf "$DIR/containerd" "$DIR/kubelet" "$DIR/cni" "$DIR/kube-proxy" "$DIR/resolv.conf"
  echo "holdfast node stopped"
}

# --- registry-outage ---

# A chain of the guard table (so `down` removes it with the table) that refuses the registry's
# forwarder to the bridge.
OUTAGE_CHAIN="registry-outage"

registry_outage() {
  [ -f "$DIR/env" ] || die "the node is not running (scripts/node.sh up)"
  # shellcheck disable=SC1091 # written by scripts/node.sh up
  source "$DIR/env"
  local port=${HOLDFAST_CLUSTER_REGISTRY##*:}
  if nft list chain inet "$GUARD_TABLE" "$OUTAGE_CHAIN" >/dev/null 2>&1; then
    nft flush chain inet "$GUARD_TABLE" "$OUTAGE_CHAIN"
    nft delete chain inet "$GUARD_TABLE" "$OUTAGE_CHAIN"
  fi
  if [ "$1" = on ]; then
    nft -f - <<EOF
table inet $GUARD_TABLE {
  chain $OUTAGE_CHAIN {
    type filter hook input priority filter - 20; policy accept;
    iifname "$BRIDGE" ip daddr $NODE_IP tcp dport $port reject with tcp reset
  }
}
EOF
    log "registry outage: $NODE_IP:$port refuses the node's pods"
  else
    log "registry outage over: $NODE_IP:$port serves the node's pods again"
  fi
}

# --- check ---

# check_pod NAME LABEL ARGS...: a netcheck pod on the real node (e2e/netcheck/netcheck.c).
check_pod() {
  local name=$1 label=$2 args
  shift 2
  args=$(printf '"%s",' "$@")
  kubectl apply -n "$CHECK_NS" -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata: {name: $name, labels: {$label}}
spec:
  nodeSelector: {kubernetes.io/hostname: $NODE_NAME}
  tolerations: [{key: $TAINT, operator: Exists, effect: NoSchedule}]
  automountServiceAccountToken: false
  securityContext: {runAsNonRoot: true, runAsUser: 65532, seccompProfile: {type: RuntimeDefault}}
  containers:
  - name: main
    image: $HOLDFAST_NETCHECK_IMAGE
    args: [${args%,}]
    securityContext: {readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, capabilities: {drop: [ALL]}}
EOF
}

# connects FROM TARGET: whether the pod FROM opens a TCP connection to TARGET (host:port).
connects() {
  kubectl exec -n "$CHECK_NS" "$1" -- /netcheck connect "$2" 3 >/dev/null 2>&1
}

pass() { log "ok: $*"; }

check() {
  [ -f "$DIR/env" ] || die "the node is not running (scripts/node.sh up)"
  # shellcheck disable=SC1091 # written by make up and node.sh up
  source "$STATE/env" && source "$DIR/env"
  CHECK_NS=node-check-$RANDOM
  kubectl create namespace "$CHECK_NS" >/dev/null
  trap 'kubectl delete namespace "$CHECK_NS" --wait=false >/dev/null 2>&1 || true' EXIT
  check_pod server "app: server" serve 8080
  check_pod client-allowed "role: allowed" pause
  check_pod client-other "role: other" pause
  kubectl apply -n "$CHECK_NS" -f - >/dev/null <<EOF
apiVersion: v1
kind: Service
metadata: {name: server}
spec:
  selector: {app: server}
  ports: [{port: 80, targetPort: 8080}]
EOF
  kubectl wait -n "$CHECK_NS" --for=condition=Ready pod --all --timeout=90s >/dev/null
  local server_ip cluster_ip
  server_ip=$(kubectl get pod -n "$CHECK_NS" server -o jsonpath='{.status.podIP}')
  cluster_ip=$(kubectl get service -n "$CHECK_NS" server -o jsonpath='{.spec.clusterIP}')
  pass "3 pods Ready on $NODE_NAME; server at $server_ip (bridge $BRIDGE, $POD_CIDR)"
  until_ok 30 "the Service's endpoints in kube-proxy's rules" kube-proxy \
    curl -fsS -m 2 "http://$cluster_ip/hostname"
  pass "the host reaches the Service at $cluster_ip through kube-proxy: $(curl -fsS -m 2 "http://$cluster_ip/hostname")"
  connects client-other "$cluster_ip:80" || die "client-other could not reach the Service at $cluster_ip:80"
  pass "a pod reaches the Service at $cluster_ip:80 (kubectl exec)"
  [[ $(kubectl logs -n "$CHECK_NS" server) == *"GET /hostname"* ]] || die "kubectl logs did not show the server's requests"
  pass "kubectl logs"
  kubectl apply -n "$CHECK_NS" -f - >/dev/null <<EOF
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: server-from-allowed}
spec:
  podSelector: {matchLabels: {app: server}}
  policyTypes: [Ingress]
  ingress:
  - from: [{podSelector: {matchLabels: {role: allowed}}}]
    ports: [{port: 8080, protocol: TCP}]
EOF
  local i
  for ((i = 0; i < 30; i++)); do
    if ! connects client-other "$server_ip:8080"; then break; fi
    sleep 1
  done
  if connects client-other "$server_ip:8080"; then
    die "the NetworkPolicy was not enforced after 30 s (client-other still connects)"
  fi
  pass "NetworkPolicy: client-other (role=other) refused by kube-router"
  connects client-allowed "$server_ip:8080" || die "the NetworkPolicy refused client-allowed too"
  pass "NetworkPolicy: client-allowed (role=allowed) still connects"
  log "all checks passed (namespace $CHECK_NS deleted)"
}

case "$action" in
  up) up ;;
  check) check ;;
  down) down ;;
  registry-outage) registry_outage "$outage" ;;
  *) usage ;;
esac
