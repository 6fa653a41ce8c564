package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/pflag"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
	"k8s.io/kubernetes/cmd/kube-controller-manager/app/options"
)

// controllers are the kube-controller-manager controllers the tests rely on. There is no kubelet, so controllers
// that only act on running Pods or Nodes (node lifecycle, endpoints, ...) would do nothing useful.
var controllers = []string{
	"garbage-collector-controller",
	"namespace-controller",
	"serviceaccount-controller",
	"serviceaccount-token-controller",
	"root-ca-certificate-publisher-controller",
	"deployment-controller",
	"replicaset-controller",
	"daemonset-controller",
	"statefulset-controller",
	"job-controller",
}

// startControllerManager runs kube-controller-manager in this process until ctx ends.
func startControllerManager(ctx context.Context, kubeconfig string, p *pki, forNode bool) (<-chan error, error) {
	s, err := options.NewKubeControllerManagerOptions()
	if err != nil {
		return nil, err
	}
	registry := basecompatibility.NewComponentGlobalsRegistry()
	gate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	version := utilcompatibility.DefaultKubeEffectiveVersionForTest()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, version, gate); err != nil {
		return nil, err
	}
	s.ComponentGlobalsRegistry = registry

	all, disabled, aliases := app.KnownControllers(), app.ControllersDisabledByDefault(), app.ControllerAliases()
	named := s.Flags(all, disabled, aliases)
	fs := pflag.NewFlagSet("kube-controller-manager", pflag.ContinueOnError)
	for _, f := range named.FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--kubeconfig=" + kubeconfig,
		"--controllers=" + strings.Join(enabledControllers(forNode), ","),
		"--leader-elect=false",
		"--secure-port=0",
		"--service-account-private-key-file=" + p.SAKey,
		"--root-ca-file=" + p.CACert,
		"--use-service-account-credentials=false",
		// Tests and benchmarks create and delete objects in bursts; the default client limits (20 qps) would make
		// the garbage collector the bottleneck rather than what we measure.
		"--kube-api-qps=500",
		"--kube-api-burst=1000",
		"--concurrent-gc-syncs=50",
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-controller-manager flags: %w", err)
	}
	s.ParsedFlags = &named
	if err := registry.Set(); err != nil {
		return nil, err
	}
	config, err := s.Config(ctx, all, disabled, aliases)
	if err != nil {
		return nil, fmt.Errorf("kube-controller-manager config: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, config.Complete())
	}()
	return done, nil
}

// nodeControllers are the controllers a node needs: kube-proxy and CoreDNS read EndpointSlices, the node
// lifecycle controller lifts the not-ready taint a kubelet registers its Node with, and the ResourceClaim
// controller frees a DRA allocation once its pod is gone (it drops the pod from the claim's reservedFor and the
// claim's finalizer; the slot a peer pod held in capacityMode dra is allocatable again only then).
var nodeControllers = []string{"endpointslice-controller", "node-lifecycle-controller", "resourceclaim-controller"}

func enabledControllers(forNode bool) []string {
	if forNode {
		return append(append([]string{}, controllers...), nodeControllers...)
	}
	return controllers
}
