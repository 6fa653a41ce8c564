// Command caa-reference serves cloud-api-adaptor v0.22's pod mutation for the side-by-side test of
// peerpods-webhook (webhook/tests/it/caa_parity.rs). It is test tooling, never shipped.
//
// cloud-api-adaptor's webhook module is not served by the Go module proxy, so its mutation (about sixty lines in
// src/webhook/pkg/mutating and pkg/utils of the v0.22 release) is restated in mutation.go. Everything around it is
// the code its binary runs, at the versions its go.mod names: controller-runtime's admission webhook (HTTP handling,
// body limit, AdmissionReview decoding, panic recovery, the Pod decoder, the JSON patch built by diffing the
// request's object with the mutated Pod), k8s.io/api's Pod type, apimachinery's resource.Quantity and
// cloud-provider's RoundUpToMiB. The settings come from the environment as upstream reads them, per request:
// TARGET_RUNTIMECLASS and POD_VM_EXTENDED_RESOURCE (POD_VM_INSTANCE_TYPE is no longer read by v0.22).
//
// It listens on -listen (127.0.0.1 with a free port by default), prints the address it got on the first line of
// standard output and serves until standard input closes, so it ends with the test that started it:
//   - POST /mutate-v1-pod: an AdmissionReview in, upstream's AdmissionReview out;
//   - POST /canonical: a Pod in, the Pod as the API server stores it out (decoded into k8s.io/api's v1.Pod and
//     encoded again: unknown fields dropped, quantities in canonical form), so the test compares what each
//     webhook's patch leaves in the API server rather than two spellings of it.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

func main() {
	// controller-runtime complains on stderr when no logger is set; the answers are what the test reads.
	logf.SetLogger(logr.Discard())
	listen := flag.String("listen", "127.0.0.1:0", "address to serve on")
	flag.Parse()

	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	mux := http.NewServeMux()
	// As upstream's main registers it: webhook.Admission with its defaults (panics recovered).
	mux.Handle("/mutate-v1-pod", &webhook.Admission{Handler: &podMutator{decoder: admission.NewDecoder(scheme)}})
	mux.HandleFunc("/canonical", canonical)

	listener, err := net.Listen("tcp", *listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(listener.Addr().String())
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	if err := http.Serve(listener, mux); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

func canonical(w http.ResponseWriter, r *http.Request) {
	var pod corev1.Pod
	if err := json.NewDecoder(r.Body).Decode(&pod); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(&pod)
}
