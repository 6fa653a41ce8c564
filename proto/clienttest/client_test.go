// Package clienttest checks the generated Go client the way cloud-api-adaptor uses it: against a
// real provider-service process (libvirt's in-process test driver, no authentication) on loopback.
package clienttest

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	providerv1 "github.com/peerpods/peerpods-controllers/proto/gen/go/peerpods/provider/v1"
)

func freePort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
}

func randomUUID(t *testing.T) string {
	t.Helper()
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	b[6] = (b[6] & 0x0f) | 0x40
	b[8] = (b[8] & 0x3f) | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// startProviderService runs the provider-service binary (PROVIDER_SERVICE_BIN) on libvirt's
// in-process test driver without caller authentication, with extraArgs, until the test ends.
// It returns the gRPC address.
func startProviderService(t *testing.T, extraArgs ...string) string {
	t.Helper()
	bin := os.Getenv("PROVIDER_SERVICE_BIN")
	if bin == "" {
		t.Fatal("PROVIDER_SERVICE_BIN must name a built provider-service binary (make proto-go-test sets it)")
	}
	port, admin := freePort(t), freePort(t)
	var logs bytes.Buffer
	args := append([]string{"--auth=none", "--listen", "127.0.0.1:" + port, "--admin-listen", "127.0.0.1:" + admin}, extraArgs...)
	cmd := exec.Command(bin, args...)
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CONFIG_DIR=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	// libvirt's test driver is accepted in provider-service's development mode only.
	cmd.Env = append(cmd.Env, "CLOUD_PROVIDER=libvirt", "LIBVIRT_URI=test:///default", "PROVIDER_SERVICE_DEVELOPMENT=true")
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		if t.Failed() {
			t.Logf("provider-service output:\n%s", logs.String())
		}
	})
	return "127.0.0.1:" + port
}

func TestGoClientAgainstProviderService(t *testing.T) {
	addr := startProviderService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	client := providerv1.NewProviderServiceClient(conn)

	// The process needs a moment to listen; WaitForReady holds the call until it does.
	providers, err := client.ListProviders(ctx, &providerv1.ListProvidersRequest{}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("ListProviders: %v", err)
	}
	if len(providers.GetProviders()) != 1 || providers.GetProviders()[0].GetName() != "libvirt" || !providers.GetProviders()[0].GetHealthy() {
		t.Fatalf("ListProviders = %v, want one healthy libvirt", providers.GetProviders())
	}

	deleted, err := client.DeleteInstance(ctx, &providerv1.DeleteInstanceRequest{
		CloudProvider: "libvirt",
		InstanceId:    randomUUID(t),
		Requester:     &providerv1.Requester{Component: "cloud-api-adaptor", Reason: "test"},
	})
	if err != nil {
		t.Fatalf("DeleteInstance: %v", err)
	}
	if deleted.GetResult() != providerv1.DeleteResult_DELETE_RESULT_ALREADY_GONE {
		t.Fatalf("DeleteInstance(unknown uuid) = %v, want ALREADY_GONE", deleted.GetResult())
	}

	_, err = client.DeleteInstance(ctx, &providerv1.DeleteInstanceRequest{CloudProvider: "libvirt", InstanceId: "not-a-uuid"})
	if status.Code(err) != codes.InvalidArgument {
		t.Fatalf("DeleteInstance(malformed) error = %v, want InvalidArgument", err)
	}
}
