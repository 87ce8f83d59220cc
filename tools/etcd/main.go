// Command etcd is the upstream etcd server, built from the go.etcd.io/etcd/server/v3
// module at the release k8s.io/kubernetes v1.37.2 requires, so that the subres
// end-to-end tests run kube-apiserver on the storage it is tested with.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	// etcdmain parses the command line, runs the server and exits on its own;
	// it is what etcd's release binary runs too.
	etcdmain.Main(os.Args)
}
