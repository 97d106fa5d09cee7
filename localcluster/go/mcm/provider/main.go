// Command machine-controller is machine-controller-manager's provider machine controller with an in-memory
// driver (provider "fake") instead of a cloud: it lets tests run the real machine lifecycle locally.
//
// Besides MCM's own flags it reads two environment variables:
//   - FAKE_PROVIDER_KUBECONFIG: the kubeconfig the driver registers and deletes Nodes with (it plays the
//     cloud and the kubelets); defaults to the --target-kubeconfig value.
//   - FAKE_PROVIDER_STATE: a file the driver keeps its VMs in, so they survive a restart of this process;
//     without it the VMs live in memory only.
package main

import (
	"fmt"
	"os"
	"time"

	"github.com/gardener/machine-controller-manager/pkg/util/provider/app"
	"github.com/gardener/machine-controller-manager/pkg/util/provider/app/options"
	"github.com/spf13/pflag"
	cliflag "k8s.io/component-base/cli/flag"
	"k8s.io/component-base/logs"
)

// A Node appears this long after CreateMachine returned, as a real VM's kubelet would register later:
// MCM only finalizes Nodes whose ADD event comes after the Machine carries the node label.
const registrationDelay = 2 * time.Second

func main() {
	server := options.NewMCServer()
	server.AddFlags(pflag.CommandLine)
	cliflag.InitFlags()
	logs.InitLogs()
	defer logs.FlushLogs()

	kubeconfig := os.Getenv("FAKE_PROVIDER_KUBECONFIG")
	if kubeconfig == "" {
		kubeconfig = server.TargetKubeconfig
	}
	fake, err := newFakeDriver(kubeconfig, os.Getenv("FAKE_PROVIDER_STATE"), registrationDelay)
	if err != nil {
		fmt.Fprintf(os.Stderr, "fake driver: %v\n", err)
		os.Exit(1)
	}
	if err := app.Run(server, fake); err != nil {
		fmt.Fprintf(os.Stderr, "%v\n", err)
		os.Exit(1)
	}
}
