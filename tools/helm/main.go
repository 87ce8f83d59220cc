// Command helm is the upstream Helm v4 client, built from the published
// helm.sh/helm/v4 module so that the chart in deploy/chart is rendered, linted
// and installed by a pinned Helm instead of whatever helm happens to be on PATH.
// The body is upstream's cmd/helm/helm.go, which imports only public packages.
package main

import (
	"errors"
	"log/slog"
	"os"

	// Registers the exec/OIDC credential plugins, as the official binary does.
	_ "k8s.io/client-go/plugin/pkg/client/auth"

	helmcmd "helm.sh/helm/v4/pkg/cmd"
	"helm.sh/helm/v4/pkg/kube"
)

func main() {
	// The field manager Helm's server-side applies record, as upstream names it.
	kube.ManagedFieldsManager = "helm"

	cmd, err := helmcmd.NewRootCmd(os.Stdout, os.Args[1:], helmcmd.SetupLogging)
	if err != nil {
		slog.Warn("command failed", slog.Any("error", err))
		os.Exit(1)
	}
	if err := cmd.Execute(); err != nil {
		if cerr, ok := errors.AsType[helmcmd.CommandError](err); ok {
			os.Exit(cerr.ExitCode)
		}
		os.Exit(1)
	}
}
