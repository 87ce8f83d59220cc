// Command kubelet is the upstream Kubernetes node agent, built from the
// k8s.io/kubernetes module at the same pinned release as kube-apiserver. The
// real-cluster tests (tests/cluster) run two of them, each with its own
// containerd, so that deploy/ is installed on real nodes: pods, probes,
// volumes, securityContext and rolling updates as a cluster runs them.
// Each Go tool is a module of its own, built and cached by tests/gotools.py.
package main

import (
	"context"
	"os"

	_ "time/tzdata"

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kubelet/app"
)

func main() {
	os.Exit(cli.Run(app.NewKubeletCommand(context.Background())))
}
