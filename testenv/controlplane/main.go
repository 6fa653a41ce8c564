// Command controlplane runs a real, minimal Kubernetes control plane in one process for tests and local
// development: embedded etcd, kube-apiserver and kube-controller-manager, all on 127.0.0.1.
//
// It writes an admin kubeconfig to the path given with --kubeconfig, prints one line starting with "ready" on
// standard output when the API is ready and the controllers run, and stops cleanly on SIGINT/SIGTERM, or when the
// process given with --parent-pid is no longer its parent (so a crashed test run leaves no server behind).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"go.etcd.io/etcd/server/v3/embed"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	logsapi "k8s.io/component-base/logs/api/v1"
	"k8s.io/klog/v2"
)

// tuning lists, for the "ready" line, every way this control plane is set up for speed rather than like a
// production cluster (see etcd.go, apiserver.go, controllermanager.go), so benchmark results record what they ran on.
var tuning = []string{
	"etcd-in-process",
	"etcd-unsafe-no-fsync",
	"etcd-data-in-tmpdir",
	"apiserver-max-requests-inflight=2000",
	"apiserver-max-mutating-requests-inflight=1000",
	"kcm-kube-api-qps=500",
	"kcm-kube-api-burst=1000",
	"kcm-leader-elect=false",
}

func main() {
	kubeconfig := flag.String("kubeconfig", "", "where to write the admin kubeconfig (required)")
	parentPID := flag.Int("parent-pid", 0, "stop when this process is no longer our parent (0: never)")
	startTimeout := flag.Duration("start-timeout", 3*time.Minute, "give up when not ready within this time")
	nodeIP := flag.String("node-ip", "", "serve on this address instead of 127.0.0.1, for a node's kubelet and pods "+
		"in a network namespace of their own (see testenv/node); also runs the controllers a node needs")
	klog.InitFlags(nil)
	flag.Parse()
	if *kubeconfig == "" {
		fmt.Fprintln(os.Stderr, "controlplane: --kubeconfig is required")
		os.Exit(2)
	}
	// The API server and the controller manager each apply logging options; allow the second, unchanged apply.
	logsapi.ReapplyHandling = logsapi.ReapplyHandlingIgnoreUnchanged

	address := "127.0.0.1"
	if *nodeIP != "" {
		if net.ParseIP(*nodeIP) == nil {
			fmt.Fprintf(os.Stderr, "controlplane: --node-ip %q is not an IP address\n", *nodeIP)
			os.Exit(2)
		}
		address = *nodeIP
	}
	if err := run(*kubeconfig, *parentPID, *startTimeout, serving{address: address, forNode: *nodeIP != ""}); err != nil {
		fmt.Fprintf(os.Stderr, "controlplane: %v\n", err)
		os.Exit(1)
	}
}

// serving says where the API is served and whether a node (kubelet, kube-proxy, pods) will join.
type serving struct {
	address string
	forNode bool
}

func run(kubeconfigPath string, parentPID int, startTimeout time.Duration, at serving) error {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go stopOnSignalOrOrphan(cancel, parentPID)

	dir, err := os.MkdirTemp("", "testenv-controlplane-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	pkiDir, etcdDir := filepath.Join(dir, "pki"), filepath.Join(dir, "etcd")
	for _, d := range []string{pkiDir, etcdDir} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}

	started := time.Now()
	p, err := newPKI(pkiDir, net.ParseIP(at.address))
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	etcd, etcdURL, err := startEtcd(etcdDir)
	if err != nil {
		return err
	}
	defer closeEtcd(etcd)

	listener, err := net.Listen("tcp", net.JoinHostPort(at.address, "0"))
	if err != nil {
		return err
	}
	serverURL := "https://" + listener.Addr().String()
	if err := writeKubeconfig(kubeconfigPath, serverURL, p); err != nil {
		return fmt.Errorf("kubeconfig: %w", err)
	}
	apiDone, err := startAPIServer(ctx, listener, etcdURL, filepath.Join(dir, "apiserver"), p, at)
	if err != nil {
		return err
	}
	client, err := adminClient(kubeconfigPath)
	if err != nil {
		return err
	}
	readyCtx, readyCancel := context.WithTimeout(ctx, startTimeout)
	defer readyCancel()
	if err := waitFor(readyCtx, apiDone, func(ctx context.Context) bool { return apiReady(ctx, client) }); err != nil {
		return fmt.Errorf("kube-apiserver not ready: %w", err)
	}
	kcmDone, err := startControllerManager(ctx, kubeconfigPath, p, at.forNode)
	if err != nil {
		return err
	}
	// The default ServiceAccount appearing proves the controllers run.
	if err := waitFor(readyCtx, kcmDone, func(ctx context.Context) bool {
		_, err := client.CoreV1().ServiceAccounts("default").Get(ctx, "default", metav1.GetOptions{})
		return err == nil
	}); err != nil {
		return fmt.Errorf("kube-controller-manager not running: %w", err)
	}
	fmt.Printf("ready server=%s kubeconfig=%s pid=%d startup=%s tuning=%s\n", serverURL, kubeconfigPath, os.Getpid(),
		time.Since(started).Round(time.Millisecond), strings.Join(tuning, ","))

	select {
	case <-ctx.Done():
	case err := <-apiDone:
		return fmt.Errorf("kube-apiserver stopped: %v", err)
	case err := <-kcmDone:
		return fmt.Errorf("kube-controller-manager stopped: %v", err)
	}
	// Give both components a bounded time to stop; the deferred calls then close etcd and remove the data.
	deadline := time.After(15 * time.Second)
	for _, done := range []<-chan error{apiDone, kcmDone} {
		select {
		case <-done:
		case <-deadline:
			return nil
		}
	}
	return nil
}

// stopOnSignalOrOrphan cancels on SIGINT/SIGTERM, or when parentPID (if set) is no longer our parent: polling
// the parent pid is robust where PR_SET_PDEATHSIG is not (it fires when the spawning *thread* exits, and test
// harnesses spawn from short-lived threads). A second signal exits at once.
func stopOnSignalOrOrphan(cancel context.CancelFunc, parentPID int) {
	signals := make(chan os.Signal, 2)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM)
	tick := time.NewTicker(500 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-signals:
			cancel()
			<-signals
			os.Exit(1)
		case <-tick.C:
			if parentPID > 0 && os.Getppid() != parentPID {
				cancel()
				// Nobody is left to send a second signal: bound the shutdown ourselves.
				time.Sleep(20 * time.Second)
				os.Exit(1)
			}
		}
	}
}

func closeEtcd(e *embed.Etcd) {
	done := make(chan struct{})
	go func() {
		e.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
}

func writeKubeconfig(path, serverURL string, p *pki) error {
	ca, err := os.ReadFile(p.CACert)
	if err != nil {
		return err
	}
	cert, err := os.ReadFile(p.AdminCert)
	if err != nil {
		return err
	}
	key, err := os.ReadFile(p.AdminKey)
	if err != nil {
		return err
	}
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["testenv"] = &clientcmdapi.Cluster{Server: serverURL, CertificateAuthorityData: ca}
	cfg.AuthInfos["testenv-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: cert, ClientKeyData: key}
	cfg.Contexts["testenv"] = &clientcmdapi.Context{Cluster: "testenv", AuthInfo: "testenv-admin", Namespace: "default"}
	cfg.CurrentContext = "testenv"
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	// Write then rename, so a reader never sees half a file.
	tmp := path + ".tmp"
	if err := clientcmd.WriteToFile(*cfg, tmp); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

func adminClient(kubeconfigPath string) (*kubernetes.Clientset, error) {
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfigPath)
	if err != nil {
		return nil, err
	}
	cfg.Timeout = 5 * time.Second
	return kubernetes.NewForConfig(cfg)
}

func apiReady(ctx context.Context, client *kubernetes.Clientset) bool {
	var status int
	client.CoreV1().RESTClient().Get().AbsPath("/readyz").Do(ctx).StatusCode(&status)
	return status == http.StatusOK
}

// waitFor polls ready until it holds, the component reports its end on done, or ctx ends.
func waitFor(ctx context.Context, done <-chan error, ready func(context.Context) bool) error {
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	for {
		if ready(ctx) {
			return nil
		}
		select {
		case err := <-done:
			if err == nil {
				err = errors.New("stopped")
			}
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}
