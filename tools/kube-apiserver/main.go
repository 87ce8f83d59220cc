// Command kube-apiserver is the upstream Kubernetes API server, built from the
// k8s.io/kubernetes module at a pinned release so that the subres end-to-end
// tests register their aggregated API with a real control plane.
package main

import (
	"os"

	// CronJob time zones work without the host's zoneinfo, as in the release binary.
	_ "time/tzdata"

	"k8s.io/component-base/cli"
	// The release binary registers these too: JSON logging, client-go and
	// version metrics.
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() {
	os.Exit(cli.Run(app.NewAPIServerCommand()))
}
