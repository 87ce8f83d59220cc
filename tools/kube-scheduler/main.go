// Command kube-scheduler is the upstream Kubernetes scheduler, built from the
// k8s.io/kubernetes module at the same pinned release as kube-apiserver. The
// real-cluster tests (tests/cluster) need it to place deploy/'s replicas on
// two nodes as a cluster would: anti-affinity, topology spread, the PDB.
// Each Go tool is a module of its own, built and cached by tests/gotools.py.
package main

import (
	"os"

	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-scheduler/app"
)

func main() {
	os.Exit(cli.Run(app.NewSchedulerCommand()))
}
