// Command kube-controller-manager is the upstream Kubernetes controller manager,
// built from the k8s.io/kubernetes module at the same pinned release as
// kube-apiserver. The subres end-to-end tests run only its
// clusterrole-aggregation controller, so that the built-in edit and admin
// ClusterRoles gather the rules deploy/ labels for them, as in a real cluster.
// It has kube-apiserver's shape on purpose: each Go tool is a module of its own,
// built and cached by tests/gotools.py, so the two mains cannot share code.
package main

import (
	"os"

	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
