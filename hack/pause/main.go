// Command pause is the process of a pod's sandbox container: it holds the pod's namespaces
// open, reaps the zombies a shared PID namespace hands it, and exits on SIGINT or SIGTERM,
// as the upstream pause image (a C program) does. The registry that serves that image is
// unreachable here, so the test node's sandbox image is built from this file.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			var status syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
