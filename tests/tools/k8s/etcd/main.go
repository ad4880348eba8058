// Command etcd is etcd (go.etcd.io/etcd/server/v3) built for the cluster
// tests, in the module of the Kubernetes binaries it serves.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
