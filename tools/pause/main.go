// Command pause is the pod sandbox image's only program for the real-cluster
// tests (tests/cluster): there is no registry to pull Kubernetes' own pause
// image from, and any program that sleeps, reaps and exits on SIGTERM will do.
// It holds the pod's namespaces until the kubelet stops the sandbox, reaps any
// child re-parented to it (PID 1 of a shared process namespace), and exits 0
// on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap collects every child that has exited, without waiting for the others.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
