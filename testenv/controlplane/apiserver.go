package main

import (
	"context"
	"flag"
	"fmt"
	"net"

	"github.com/spf13/pflag"
	utilerrors "k8s.io/apimachinery/pkg/util/errors"
	utilcompatibility "k8s.io/apiserver/pkg/util/compatibility"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	"k8s.io/client-go/rest"
	basecompatibility "k8s.io/component-base/compatibility"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
	"k8s.io/kubernetes/cmd/kube-apiserver/app/options"
)

// serviceAccountIssuer is the issuer (and default audience) of ServiceAccount tokens, as in a kubeadm cluster.
const serviceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

// admissionPlugins are admission plugins to enable besides kube-apiserver's defaults, for tests of what a
// distribution turns on (OpenShift enables OwnerReferencesPermissionEnforcement, for one).
var admissionPlugins = flag.String("enable-admission-plugins", "",
	"comma-separated admission plugins to enable besides kube-apiserver's defaults")

// startAPIServer runs kube-apiserver in this process until ctx ends. It serves TLS on listener and reports
// its end on the returned channel.
func startAPIServer(ctx context.Context, listener net.Listener, etcdURL, certDir string, p *pki, at serving) (<-chan error, error) {
	s := options.NewServerRunOptions()
	// A registry of its own per component, as Kubernetes' own in-process test servers do, so the API server and the
	// controller manager in this one process do not contend for the global one.
	registry := basecompatibility.NewComponentGlobalsRegistry()
	gate := utilfeature.DefaultMutableFeatureGate.DeepCopy()
	version := utilcompatibility.DefaultKubeEffectiveVersionForTest()
	if err := registry.Register(basecompatibility.DefaultKubeComponent, version, gate); err != nil {
		return nil, err
	}
	s.GenericServerRunOptions.ComponentGlobalsRegistry = registry

	fs := pflag.NewFlagSet("kube-apiserver", pflag.ContinueOnError)
	for _, f := range s.Flags().FlagSets {
		fs.AddFlagSet(f)
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=" + at.address,
		"--advertise-address=" + at.address,
		"--cert-dir=" + certDir,
		"--tls-cert-file=" + p.ServingCert,
		"--tls-private-key-file=" + p.ServingKey,
		"--client-ca-file=" + p.CACert,
		"--authorization-mode=Node,RBAC",
		"--service-account-issuer=" + serviceAccountIssuer,
		"--service-account-key-file=" + p.SAPub,
		"--service-account-signing-key-file=" + p.SAKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=" + endpointReconciler(at),
		// The CAA DaemonSet that peer-pod-config-ctrl deploys is privileged.
		"--allow-privileged=true",
		"--profiling=false",
		// Benchmarks create thousands of objects quickly; the defaults (400/200) are sized for shared clusters.
		"--max-requests-inflight=2000",
		"--max-mutating-requests-inflight=1000",
	}
	audit, err := auditArgs(certDir)
	if err != nil {
		return nil, err
	}
	args = append(args, audit...)
	if *admissionPlugins != "" {
		args = append(args, "--enable-admission-plugins="+*admissionPlugins)
	}
	if at.forNode {
		// Logs, exec and port-forward go through the node's kubelet, which authenticates the API server by its
		// client certificate (the admin one: in system:masters, so kubelet's authorization webhook allows it).
		args = append(args, "--kubelet-client-certificate="+p.AdminCert, "--kubelet-client-key="+p.AdminKey)
	}
	if err := fs.Parse(args); err != nil {
		return nil, fmt.Errorf("kube-apiserver flags: %w", err)
	}
	if err := registry.Set(); err != nil {
		return nil, err
	}
	s.SecureServing.Listener = listener
	s.SecureServing.BindPort = listener.Addr().(*net.TCPAddr).Port
	rest.SetDefaultWarningHandler(rest.NoWarnings{})

	completed, err := s.Complete(ctx)
	if err != nil {
		return nil, fmt.Errorf("kube-apiserver options: %w", err)
	}
	if errs := completed.Validate(); len(errs) != 0 {
		return nil, fmt.Errorf("kube-apiserver options: %w", utilerrors.NewAggregate(errs))
	}
	done := make(chan error, 1)
	go func() {
		done <- app.Run(ctx, completed)
	}()
	return done, nil
}

// endpointReconciler publishes the API server as the endpoint of the kubernetes Service only when a node joins:
// without kubelet and kube-proxy nothing would route to it.
func endpointReconciler(at serving) string {
	if at.forNode {
		return "lease"
	}
	return "none"
}
