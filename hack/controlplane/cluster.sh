#!/usr/bin/env bash
# Starts and stops a local cluster (etcd, kube-apiserver, kube-scheduler,
# kube-controller-manager on 127.0.0.1, and NODES real kubelet nodes, default 1, named
# gpuhealth-node-0..N-1, in a network namespace of their own) in the background.
#
# Usage: hack/controlplane/cluster.sh up       # build if needed, start, wait until ready
#        hack/controlplane/cluster.sh down     # stop everything `up` started (idempotent)
#        hack/controlplane/cluster.sh status   # which recorded processes run, and /readyz
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
	log "compiling the launcher (test/controlplane/cmd/localcluster)"
	mkdir -p "$cluster_dir/bin"
	(cd "$root" && go build -o "$cluster_dir/bin/localcluster" ./test/controlplane/cmd/localcluster)
	log "starting the control plane"
	"$cluster_dir/bin/localcluster" up --dir "$cluster_dir" --bin "$bin_dir" \
		--feature-gates "${GPUHEALTH_FEATURE_GATES:-}" --nodes "${NODES:-1}"
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
	# Newest first, one at a time: controller-manager and scheduler, then the apiserver (whose
	# graceful shutdown is slow if etcd has already gone), then etcd. Each leads its own session
	# and process group, so signal the group.
	while read -r name pid; do
		log "stopping $name (pid $pid)"
		kill -TERM -- "-$pid" 2>/dev/null || true
		deadline=$((SECONDS + 15))
		while alive "$pid" && ((SECONDS < deadline)); do sleep 0.1; done
		if alive "$pid"; then
			log "$name (pid $pid) ignored SIGTERM for 15s: SIGKILL"
			kill -KILL -- "-$pid" 2>/dev/null || true
		fi
	done < <(tac <<<"$live")
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

case ${1:-} in
up) up ;;
down) down ;;
status) status ;;
*)
	echo "usage: $0 up|down|status" >&2
	exit 2
	;;
esac
