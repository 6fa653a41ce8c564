package clienttest

// The Go code docs/caa-integration.md shows cloud-api-adaptor: dial provider-service over TLS with
// the CA the DaemonSet mounts, send the projected ServiceAccount token on every call, call
// GetCapacity and DeleteInstance, and read the ErrorInfo reason of an error. Kept here, compiled
// and run against a real provider-service, so the documentation cannot drift from working code.

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	providerv1 "github.com/peerpods/peerpods-controllers/proto/gen/go/peerpods/provider/v1"
)

// --- the code docs/caa-integration.md shows -------------------------------------------------

// ProviderServiceConfig is what the CAA DaemonSet's environment says about provider-service.
type ProviderServiceConfig struct {
	Endpoint   string // PROVIDER_SERVICE_ENDPOINT, host:port (an https:// prefix is accepted)
	CAFile     string // PROVIDER_SERVICE_CA_FILE
	TokenFile  string // PROVIDER_SERVICE_TOKEN_FILE
	ServerName string // PROVIDER_SERVICE_SERVER_NAME, when it differs from the endpoint's host
}

// ProviderServiceConfigFromEnv reads the variables peer-pod-config-ctrl sets on the CAA DaemonSet.
func ProviderServiceConfigFromEnv() ProviderServiceConfig {
	return ProviderServiceConfig{
		Endpoint:   os.Getenv("PROVIDER_SERVICE_ENDPOINT"),
		CAFile:     os.Getenv("PROVIDER_SERVICE_CA_FILE"),
		TokenFile:  os.Getenv("PROVIDER_SERVICE_TOKEN_FILE"),
		ServerName: os.Getenv("PROVIDER_SERVICE_SERVER_NAME"),
	}
}

// tokenFile sends the projected ServiceAccount token as a bearer token. It reads the file on
// every call: the kubelet rotates projected tokens in place.
type tokenFile string

func (f tokenFile) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	token, err := os.ReadFile(string(f))
	if err != nil {
		return nil, fmt.Errorf("reading the provider-service token: %w", err)
	}
	return map[string]string{"authorization": "Bearer " + strings.TrimSpace(string(token))}, nil
}

func (tokenFile) RequireTransportSecurity() bool { return true }

// DialProviderService returns a client for provider-service; the connection is made lazily.
func DialProviderService(cfg ProviderServiceConfig) (providerv1.ProviderServiceClient, *grpc.ClientConn, error) {
	pemCA, err := os.ReadFile(cfg.CAFile)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the provider-service CA: %w", err)
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pemCA) {
		return nil, nil, fmt.Errorf("%s holds no PEM certificate", cfg.CAFile)
	}
	tlsConfig := &tls.Config{RootCAs: roots, ServerName: cfg.ServerName, MinVersion: tls.VersionTLS12}
	conn, err := grpc.NewClient(strings.TrimPrefix(cfg.Endpoint, "https://"),
		grpc.WithTransportCredentials(credentials.NewTLS(tlsConfig)),
		grpc.WithPerRPCCredentials(tokenFile(cfg.TokenFile)))
	if err != nil {
		return nil, nil, err
	}
	return providerv1.NewProviderServiceClient(conn), conn, nil
}

// ErrorReason is the stable reason provider-service puts on every error (google.rpc.ErrorInfo),
// e.g. "Throttled", "NotOwnedByCluster", "MethodNotAllowed"; "" when there is none.
func ErrorReason(err error) string {
	for _, detail := range status.Convert(err).Details() {
		if info, ok := detail.(*errdetails.ErrorInfo); ok {
			return info.GetReason()
		}
	}
	return ""
}

// RetryDelay is how long a RESOURCE_EXHAUSTED answer asks to wait (google.rpc.RetryInfo).
func RetryDelay(err error) (time.Duration, bool) {
	for _, detail := range status.Convert(err).Details() {
		if info, ok := detail.(*errdetails.RetryInfo); ok {
			return info.GetRetryDelay().AsDuration(), true
		}
	}
	return 0, false
}

// --- the test ------------------------------------------------------------------------------

// writeServingCertificate writes a CA, and a certificate it signs for "provider-service.peerpods.svc",
// into dir: ca.crt, tls.crt, tls.key.
func writeServingCertificate(t testing.TB, dir string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	ca := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "peerpods test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	leaf := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "provider-service"},
		DNSNames:     []string{"provider-service.peerpods.svc"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	leafDER, err := x509.CreateCertificate(rand.Reader, leaf, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{
		"ca.crt":  {Type: "CERTIFICATE", Bytes: caDER},
		"tls.crt": {Type: "CERTIFICATE", Bytes: leafDER},
		"tls.key": {Type: "PRIVATE KEY", Bytes: keyDER},
	} {
		if err := os.WriteFile(filepath.Join(dir, name), pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

func TestCAAStyleClientOverTLS(t *testing.T) {
	dir := t.TempDir()
	writeServingCertificate(t, dir)
	// provider-service checks tokens with TokenReview in a cluster; here it runs without, so the
	// token only has to be sent (a TLS-only credential, which grpc-go refuses on plaintext).
	if err := os.WriteFile(filepath.Join(dir, "token"), []byte("projected-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	addr := startProviderService(t, "--tls-cert", filepath.Join(dir, "tls.crt"), "--tls-key", filepath.Join(dir, "tls.key"))

	client, conn, err := DialProviderService(ProviderServiceConfig{
		Endpoint:   "https://" + addr,
		CAFile:     filepath.Join(dir, "ca.crt"),
		TokenFile:  filepath.Join(dir, "token"),
		ServerName: "provider-service.peerpods.svc",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	capacity, err := client.GetCapacity(ctx, &providerv1.GetCapacityRequest{CloudProvider: "libvirt"}, grpc.WaitForReady(true))
	if err != nil {
		t.Fatalf("GetCapacity: %v", err)
	}
	if capacity.GetVcpus() == nil {
		t.Fatalf("GetCapacity = %v, want libvirt's vCPU figure", capacity)
	}
	deleted, err := client.DeleteInstance(ctx, &providerv1.DeleteInstanceRequest{
		CloudProvider: "libvirt",
		InstanceId:    randomUUID(t),
		Requester:     &providerv1.Requester{Component: "cloud-api-adaptor", Namespace: "default", Name: "pod-a", Reason: "PodDeleted"},
	})
	if err != nil || deleted.GetResult() != providerv1.DeleteResult_DELETE_RESULT_ALREADY_GONE {
		t.Fatalf("DeleteInstance(unknown uuid) = %v, %v; want ALREADY_GONE", deleted, err)
	}
	_, err = client.DeleteInstance(ctx, &providerv1.DeleteInstanceRequest{CloudProvider: "nimbus", InstanceId: "x"})
	if status.Code(err) != codes.InvalidArgument || ErrorReason(err) != "UnknownProvider" {
		t.Fatalf("DeleteInstance(unknown provider) = %v (reason %q), want InvalidArgument/UnknownProvider", err, ErrorReason(err))
	}
	if _, ok := RetryDelay(err); ok {
		t.Fatalf("an INVALID_ARGUMENT answer carries no retry delay: %v", err)
	}

	// A client that does not trust the CA is refused before any call reaches the service.
	dirOther := t.TempDir()
	writeServingCertificate(t, dirOther)
	stranger, strangerConn, err := DialProviderService(ProviderServiceConfig{
		Endpoint: "https://" + addr, CAFile: filepath.Join(dirOther, "ca.crt"),
		TokenFile: filepath.Join(dir, "token"), ServerName: "provider-service.peerpods.svc",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer strangerConn.Close()
	if _, err := stranger.ListProviders(ctx, &providerv1.ListProvidersRequest{}); status.Code(err) != codes.Unavailable {
		t.Fatalf("ListProviders with a foreign CA = %v, want Unavailable (TLS refused)", err)
	}
}

// BenchmarkRoundTrip is what `make bench` reports as the latency a Go client (CAA) sees: a
// health Check and a DeleteInstance (of an instance that is already gone) per iteration, over
// the TLS connection and with the token `make bench` set up through the PROVIDER_SERVICE_*
// variables (TokenReview on). It reports each call's p50 and p99 in microseconds.
func BenchmarkRoundTrip(b *testing.B) {
	cfg := ProviderServiceConfigFromEnv()
	if cfg.Endpoint == "" {
		b.Skip("PROVIDER_SERVICE_ENDPOINT is not set (make bench sets it)")
	}
	client, conn, err := DialProviderService(cfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	ctx := context.Background()
	health := healthCheck(conn)
	// Warm up: connection, TLS handshake, the token review cache.
	for range 20 {
		if _, err := client.ListProviders(ctx, &providerv1.ListProvidersRequest{}, grpc.WaitForReady(true)); err != nil {
			b.Fatal(err)
		}
	}
	checks := make([]time.Duration, 0, b.N)
	deletes := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		started := time.Now()
		if err := health(ctx); err != nil {
			b.Fatal(err)
		}
		checks = append(checks, time.Since(started))
		started = time.Now()
		if _, err := client.DeleteInstance(ctx, &providerv1.DeleteInstanceRequest{CloudProvider: "libvirt", InstanceId: "00000000-0000-4000-8000-000000000000"}); err != nil {
			b.Fatal(err)
		}
		deletes = append(deletes, time.Since(started))
	}
	b.StopTimer()
	for _, m := range []struct {
		name  string
		times []time.Duration
	}{{"check", checks}, {"delete", deletes}} {
		sort.Slice(m.times, func(i, j int) bool { return m.times[i] < m.times[j] })
		b.ReportMetric(float64(m.times[len(m.times)/2].Microseconds()), m.name+"-p50-us")
		b.ReportMetric(float64(m.times[len(m.times)*99/100].Microseconds()), m.name+"-p99-us")
	}
}

// healthCheck calls the standard health service for ProviderService.
func healthCheck(conn *grpc.ClientConn) func(context.Context) error {
	client := healthpb.NewHealthClient(conn)
	return func(ctx context.Context) error {
		answer, err := client.Check(ctx, &healthpb.HealthCheckRequest{Service: "peerpods.provider.v1.ProviderService"})
		if err == nil && answer.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			err = fmt.Errorf("health: %v", answer.GetStatus())
		}
		return err
	}
}
