// Command kube-proxy is the upstream Kubernetes Service proxy, built from the
// k8s.io/kubernetes module at the same pinned release as kube-apiserver. The
// real-cluster tests (tests/cluster) run one per node in nftables mode, so
// that Service addresses reach the subres replicas as in a cluster.
// Each Go tool is a module of its own, built and cached by tests/gotools.py.
package main

import (
	"os"

	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-proxy/app"
)

func main() {
	os.Exit(cli.Run(app.NewProxyCommand()))
}
