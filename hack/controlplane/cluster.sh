#!/usr/bin/env bash
# Starts and stops a local cluster (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager on 127.0.0.1, and NODES real kubelet nodes, default 1, named
# gpuhealth-node-0..N-1, in a network namespace of their own) in the background.
#
# Usage: hack/controlplane/cluster.sh up       # build if needed, start, wait until ready
#        hack/controlplane/cluster.sh down     # stop everything `up` started (idempotent)
#        hack/controlplane/cluster.sh status   # which recorded processes run, and /readyz
#        hack/controlplane/cluster.sh image-load ARCHIVE NAME  # import an image into every node
#
# Each node publishes GPUS (default 8) simulated GPUs in a ResourceSlice of driver gpu.nvidia.com,
# with the UUIDs the sim backend gives them, so an agent replaying a scenario finds devices to taint.
#
# CONTAINERS=1 gives the nodes containerd + runc + CNI (test/controlplane/containerd.go) instead
# of the fake CRI; image-load needs that. `down` then first stops the kubelets, removes every pod
# through each node's containerd (containers, CNI, mounts, cgroups), and kills leftover shims.
#
# `up` writes .cluster/kubeconfig (admin), links .cluster/bin/kubectl, records PIDs in
# .cluster/pids, logs under .cluster/run/logs, and each node's directories (kubeconfig,
# device-plugins/, plugins_registry/, plugins/, pod-resources/) under .cluster/nodes/NAME. The processes run in their own sessions, so they
# outlive this script and its terminal; `down` signals exactly the recorded PIDs, and only if each
# still runs the recorded binary (a PID may have been reused). Set GPUHEALTH_FEATURE_GATES to pass
# --feature-gates to all components.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster_dir=${GPUHEALTH_CLUSTER_DIR:-$root/.cluster}
pids_file=$cluster_dir/pids

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# live_pids prints "name pid" for each recorded process still running its recorded binary.
live_pids() {
	[[ -f $pids_file ]] || return 0
	local name pid bin exe
	while read -r name pid bin; do
		[[ -n ${pid:-} ]] || continue
		exe=$(readlink "/proc/$pid/exe" 2>/dev/null) || continue
		[[ ${exe% (deleted)} == "$bin" ]] && echo "$name $pid"
	done <"$pids_file"
}

# alive PID: the process exists and is not a zombie (an init that does not reap leaves those).
alive() {
	local state
	state=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null) || return 1
	[[ -n $state && $state != Z ]]
}

up() {
	log "building or finding the control-plane binaries (a cold build takes 12-15 min on 2 cores)"
	local bin_dir
	bin_dir=$("$here/build.sh")
	local containers=()
	if [[ ${CONTAINERS:-0} == 1 ]]; then
		containers=(--containers --containerd-bin "$("$here/containerd.sh")")
	fi
	log "compiling the launcher (test/controlplane/cmd/localcluster)"
	mkdir -p "$cluster_dir/bin"
	(cd "$root" && go build -o "$cluster_dir/bin/localcluster" ./test/controlplane/cmd/localcluster)
	log "starting the control plane"
	"$cluster_dir/bin/localcluster" up --dir "$cluster_dir" --bin "$bin_dir" \
		--feature-gates "${GPUHEALTH_FEATURE_GATES:-}" --nodes "${NODES:-1}" --gpus "${GPUS:-8}" "${containers[@]}"
}

down() {
	local live
	live=$(live_pids)
	if [[ -z $live ]]; then
		log "no cluster running"
		rm -f "$pids_file"
		return 0
	fi
	local name pid deadline
	# Nodes with real containers: kubelets first (so they start nothing new), then every pod
	# through its containerd, which still runs.
	stop_group() {
		log "stopping $1 (pid $2)"
		kill -TERM -- "-$2" 2>/dev/null || true
		deadline=$((SECONDS + 15))
		while alive "$2" && ((SECONDS < deadline)); do sleep 0.1; done
		if alive "$2"; then
			log "$1 (pid $2) ignored SIGTERM for 15s: SIGKILL"
			kill -KILL -- "-$2" 2>/dev/null || true
		fi
	}
	local sockets=() node
	if grep -q '^containerd-' <<<"$live"; then
		local crihelper
		crihelper="$(dirname "$(awk '/^containerd-/ {print $3; exit}' "$pids_file")")/crihelper"
		while read -r name pid; do
			[[ $name == kubelet-* ]] && stop_group "$name" "$pid"
		done <<<"$live"
		while read -r name pid; do
			[[ $name == containerd-* ]] || continue
			node=${name#containerd-}
			sockets+=("$cluster_dir/nodes/$node/cri.sock")
			log "removing the pods of $node"
			"$crihelper" clean --endpoint "$cluster_dir/nodes/$node/cri.sock" || log "removing the pods of $node failed"
		done <<<"$live"
		live=$(live_pids)
	fi
	# Newest first, one at a time: controller-manager and scheduler, then the apiserver (whose
	# graceful shutdown is slow if etcd has already gone), then etcd. Each leads its own session
	# and process group, so signal the group.
	while read -r name pid; do
		[[ -n $name ]] && stop_group "$name" "$pid"
	done < <(tac <<<"$live")
	# Shims have left containerd's process group; their command line names its socket.
	local socket shim
	for socket in "${sockets[@]}"; do
		for shim in $(pgrep -f -- "-address $socket( |\$)" || true); do
			log "killing leftover shim $shim"
			kill -KILL "$shim" 2>/dev/null || true
		done
	done
	# runc removed each container's cgroup; the parent the CRI puts them under goes once empty.
	((${#sockets[@]} == 0)) || rmdir /sys/fs/cgroup/*/k8s.io 2>/dev/null || true
	rm -f "$pids_file"
	log "cluster stopped (logs kept in $cluster_dir/run/logs)"
}

status() {
	local live
	live=$(live_pids)
	if [[ -z $live ]]; then
		echo "no cluster running"
		return 1
	fi
	echo "$live"
	"$cluster_dir/bin/kubectl" --kubeconfig "$cluster_dir/kubeconfig" get --raw /readyz
	echo
}

# image_load ARCHIVE NAME: import the archive into every node's containerd, NAME tagged as the CRI
# resolves it (see crihelper image-ref).
image_load() {
	local archive=${1:?usage: cluster.sh image-load ARCHIVE NAME} name=${2:?usage: cluster.sh image-load ARCHIVE NAME}
	local bin ref socket n=0
	bin=$("$here/containerd.sh")
	ref=$("$bin/crihelper" image-ref "$name")
	for socket in "$cluster_dir"/nodes/*/cri.sock; do
		[[ -S $socket && -d $(dirname "$socket")/containerd ]] || continue
		# ctr warns on every call that cgroup v1 is deprecated: true, and not news here.
		"$bin/ctr" --address "$socket" --namespace k8s.io images import --platform "linux/$(go env GOARCH)" "$archive" \
			2> >(grep -v DEPRECATION >&2) >/dev/null
		[[ $ref == "$name" ]] || "$bin/ctr" --address "$socket" --namespace k8s.io images tag --force "$name" "$ref" \
			2> >(grep -v DEPRECATION >&2) >/dev/null
		log "loaded $name into $(basename "$(dirname "$socket")")"
		n=$((n + 1))
	done
	if ((n == 0)); then
		log "no node with containerd runs: start one with make cluster-up CONTAINERS=1"
		return 1
	fi
}

case ${1:-} in
up) up ;;
image-load) image_load "${@:2}" ;;
down) down ;;
status) status ;;
*)
	echo "usage: $0 up|down|status|image-load ARCHIVE NAME" >&2
	exit 2
	;;
esac
