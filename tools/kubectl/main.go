// Command kubectl is the upstream kubectl, built from the published
// k8s.io/kubectl module so that subres tests talk to a real client of a
// pinned version instead of whatever kubectl happens to be on PATH.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubectl/pkg/cmd"

	// Registers the exec/OIDC credential plugins, as the official binary does,
	// so kubeconfigs that use them behave the same.
	_ "k8s.io/client-go/plugin/pkg/client/auth"
)

func main() {
	// cli.Run sets up flag normalisation and logging the way the official
	// kubectl does, and maps errors to an exit code.
	os.Exit(cli.Run(cmd.NewDefaultKubectlCommand()))
}
