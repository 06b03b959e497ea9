// The kube-controller-manager command, unchanged: k8s.io/kubernetes/cmd/kube-controller-manager's main.
package main

import (
	"os"
	_ "time/tzdata" // for CronJob time zones, as Kubernetes builds it

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
