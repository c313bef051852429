// Command etcd is etcd v3.7 built from Go modules, for the local test control plane.
//
// It lives in its own module so etcd's dependency graph never mixes with Kubernetes'.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
