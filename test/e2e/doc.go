// Package e2e holds end-to-end tests that run against a real control plane (etcd,
// kube-apiserver, kube-scheduler, kube-controller-manager) started by test/controlplane. The tests
// carry the e2e build tag; run them with `make e2e`, which builds or finds the binaries first.
package e2e
