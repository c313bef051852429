#!/usr/bin/env bash
# `make demo CHART=1`: the Helm chart installed as users install it, on a fresh local cluster (a
# running one is stopped first) whose nodes run containerd (make cluster-up CONTAINERS=1, NODES
# default 2), with the image built here (make
# image-load), ci/local-values.yaml, the device plugin on, and examples/demo-scenario.yaml replayed
# by every agent on its own node. It prints the agents, the GPUs' health, the kubelets' allocatable
# and an agent's log as the faults come and go, and leaves the cluster running: `make
# cluster-down` stops it, `helm uninstall gpuhealth -n gpuhealth-system` removes the chart.
set -euo pipefail
cd "$(dirname "$0")/../.."
export KUBECONFIG=$PWD/.cluster/kubeconfig
kubectl=.cluster/bin/kubectl
helm=$(hack/tools.sh bindir)/helm
scenario=${SCENARIO:-examples/demo-scenario.yaml}
start=$SECONDS

say() { printf '\n[%4ss] %s\n' "$((SECONDS - start))" "$*"; }
# wait_for WHAT COMMAND...: poll COMMAND for up to 90 s.
wait_for() {
	local what=$1 deadline=$((SECONDS + 90))
	shift
	until "$@" >/dev/null 2>&1; do
		((SECONDS < deadline)) || { echo "demo: timed out waiting for $what" >&2; return 1; }
		sleep 1
	done
}
unhealthy_ids() { [[ $($kubectl get node "$1" -o jsonpath='{.metadata.annotations.volcano\.sh/gpu-unhealthy-ids}') == "$2" ]]; }
allocatable() { [[ $($kubectl get node "$1" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}') == "$2" ]]; }
gpus() { $kubectl get nodes -o custom-columns='NODE:.metadata.name,GPUS:.status.capacity.nvidia\.com/gpu,ALLOCATABLE:.status.allocatable.nvidia\.com/gpu,UNHEALTHY:.metadata.annotations.volcano\.sh/gpu-unhealthy-ids'; }
rules() { [[ $($kubectl get devicetaintrules -l gpuhealth.dev/node="$1" -o name | wc -l) == "$2" ]]; }

say "a local cluster with containerd nodes, and the image on them"
hack/controlplane/cluster.sh down
make --no-print-directory cluster-up CONTAINERS=1 NODES="${NODES:-2}"
make --no-print-directory image-load build
hack/tools.sh install helm >/dev/null

say "\$ helm install gpuhealth deployments/helm/gpuhealth -n gpuhealth-system --create-namespace -f deployments/helm/gpuhealth/ci/local-values.yaml --set agent.devicePlugin.enabled=true --set-file agent.sim.scenario=$scenario"
"$helm" upgrade --install gpuhealth deployments/helm/gpuhealth -n gpuhealth-system --create-namespace \
	-f deployments/helm/gpuhealth/ci/local-values.yaml --set agent.devicePlugin.enabled=true \
	--set-file agent.sim.scenario="$scenario" --wait --timeout 3m >/dev/null
$kubectl -n gpuhealth-system get pods -o wide

# Every agent replays the same scenario, so every step waits for every node before it shows them.
mapfile -t nodes < <($kubectl get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
node=${nodes[0]}
# on_every_node WHAT CHECK ARGS...: wait_for CHECK NODE ARGS... on each node.
on_every_node() {
	local what=$1 check=$2 n
	shift 2
	for n in "${nodes[@]}"; do wait_for "$what on $n" "$check" "$n" "$@"; done
}
say "every agent replays $scenario on its own node: GPU 3 falls off the bus, GPU 5 overheats"
on_every_node "GPUs 3 and 5 to be reported" unhealthy_ids 3,5
bin/gpuhealth status --kubeconfig "$KUBECONFIG" --problems
say "\$ kubectl get devicetaintrules: one per sick GPU, selecting its device in the node's ResourceSlice"
on_every_node "a DeviceTaintRule for each of them" rules 2
$kubectl get devicetaintrules
on_every_node "the kubelet to count 6 healthy GPUs" allocatable 6
gpus

say "GPU 5 cools down and recovers; GPU 3 stays out until the node reboots"
on_every_node "GPU 5 to recover" unhealthy_ids 3
on_every_node "the kubelet to count 7 healthy GPUs" allocatable 7
gpus
say "\$ kubectl -n gpuhealth-system logs <agent on $node> -c agent | tail -4"
pod=$($kubectl -n gpuhealth-system get pods --field-selector spec.nodeName="$node" -o jsonpath='{.items[0].metadata.name}')
$kubectl -n gpuhealth-system logs "$pod" -c agent | tail -4

say "done; the cluster keeps running (KUBECONFIG=$KUBECONFIG). make cluster-down stops it."
