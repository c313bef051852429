// Package controlplane runs a real, throwaway Kubernetes control plane on 127.0.0.1 for tests and
// for the local demo cluster: etcd, kube-apiserver, kube-scheduler and kube-controller-manager,
// built from Go modules at a pinned version by hack/controlplane/build.sh.
//
// Every process gets free ports and a fresh data directory, so several test packages can run
// clusters at the same time. TLS, RBAC and Node authorization are on, identities are client
// certificates signed by a CA this package generates, and service-account tokens are signed with
// an RSA key generated here too, so nothing outside the repository and the binary cache is
// needed.
//
// Typical use in a test:
//
//	c := controlplane.StartT(t, controlplane.Options{})
//	node, err := c.CreateReadyNode(ctx, "node-a", nil)
//	...
//	_, err = c.Admin().ResourceV1().ResourceSlices().Create(ctx,
//		controlplane.GPUResourceSlice("node-a", "GPU-0", "GPU-1"), metav1.CreateOptions{})
//
// StartT stops every process when the test ends and, if the test failed, prints the tail of each
// component's log and dumps the cluster's nodes, ResourceSlices, DeviceTaintRules,
// ResourceClaims, pods and events to the test log.
//
// Nodes come in two kinds. Real nodes (Options.KubeletNodes, StartKubeletNode) run kubelet
// v1.37.2 on a fake CRI runtime, each with its own address in a network namespace the harness
// creates (nodenet.go): the kubelet's device manager, DRA manager and pod-resources API are the
// real ones, and `kubectl logs` works. Fake nodes (CreateReadyNode) are Node objects made Ready by
// the helpers here, cheap enough for thousands; StartKubelet runs a small stand-in that marks
// their pods Running and completes graceful deletions. See docs/controlplane.md for the flags,
// identities, the node network and gotchas.
package controlplane
