package main

// Upstream's mutation, restated: cloud-api-adaptor v0.22, src/webhook/pkg/mutating (Handle, mutatePod,
// adjustResourceSpec, defaultContainerResourceRequirements) and src/webhook/pkg/utils (the per-resource sums and
// the MiB conversion). Same decisions in the same order, same library calls; only names and layout are this
// file's. Keep it in step with upstream's when the reference release changes.

import (
	"context"
	"encoding/json"
	"log"
	"net/http"
	"os"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/cloud-provider/volume/helpers"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	defaultRuntimeClass     = "kata-remote"
	defaultExtendedResource = "kata.peerpods.io/vm"
	vcpusAnnotation         = "io.katacontainers.config.hypervisor.default_vcpus"
	memoryAnnotation        = "io.katacontainers.config.hypervisor.default_memory"
	gpusAnnotation          = "io.katacontainers.config.hypervisor.default_gpus"
	gpuResource             = corev1.ResourceName("nvidia.com/gpu")
)

var logger = log.New(log.Writer(), "[pod-mutator] ", log.LstdFlags|log.Lmsgprefix)

type podMutator struct {
	decoder admission.Decoder
}

// Handle is upstream's: every request that reaches it is decoded as a Pod (whatever its operation or kind), and
// the answer is the diff between the object as received and the mutated Pod as Go encodes it.
func (m *podMutator) Handle(_ context.Context, req admission.Request) admission.Response {
	pod := &corev1.Pod{}
	if err := m.decoder.Decode(req, pod); err != nil {
		return admission.Errored(http.StatusBadRequest, err)
	}
	mutated := mutatePod(pod)
	encoded, err := json.Marshal(mutated)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err)
	}
	return admission.PatchResponseFromRaw(req.Object.Raw, encoded)
}

func envOr(name, fallback string) string {
	if value := os.Getenv(name); value != "" {
		return value
	}
	return fallback
}

func mutatePod(pod *corev1.Pod) *corev1.Pod {
	mutated := pod.DeepCopy()
	runtimeClass := envOr("TARGET_RUNTIMECLASS", defaultRuntimeClass)
	if mutated.Spec.RuntimeClassName == nil || *mutated.Spec.RuntimeClassName != runtimeClass {
		return mutated
	}

	cpuRequest := requestTotal(mutated, corev1.ResourceCPU)
	cpuLimit := limitTotal(mutated, corev1.ResourceCPU)
	memoryRequest := requestTotal(mutated, corev1.ResourceMemory)
	memoryLimit := limitTotal(mutated, corev1.ResourceMemory)
	// Requests only: a GPU's limit equals its request.
	gpuRequest := requestTotal(mutated, gpuResource)

	annotations := mutated.GetAnnotations()
	if annotations == nil {
		annotations = map[string]string{}
	}
	// The limit when there is a request and the limit covers it, else a positive request; nothing for zero.
	if !cpuRequest.IsZero() && cpuLimit.Cmp(cpuRequest) >= 0 {
		annotations[vcpusAnnotation] = strconv.FormatInt(cpuLimit.Value(), 10)
	} else if cpuRequest.Sign() == 1 {
		annotations[vcpusAnnotation] = strconv.FormatInt(cpuRequest.Value(), 10)
	}
	if !memoryRequest.IsZero() && memoryLimit.Cmp(memoryRequest) >= 0 {
		annotations[memoryAnnotation] = mebibytes(memoryLimit)
	} else if memoryRequest.Sign() == 1 {
		annotations[memoryAnnotation] = mebibytes(memoryRequest)
	}
	if gpuRequest.Sign() == 1 {
		annotations[gpusAnnotation] = gpuRequest.String()
	}
	mutated.SetAnnotations(annotations)

	for i := range mutated.Spec.Containers {
		mutated.Spec.Containers[i].Resources = corev1.ResourceRequirements{}
	}
	for i := range mutated.Spec.InitContainers {
		mutated.Spec.InitContainers[i].Resources = corev1.ResourceRequirements{}
	}
	// Upstream indexes the first container without a length check: a Pod without containers panics here.
	mutated.Spec.Containers[0].Resources = vmResources()
	return mutated
}

func vmResources() corev1.ResourceRequirements {
	name := corev1.ResourceName(envOr("POD_VM_EXTENDED_RESOURCE", defaultExtendedResource))
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{name: resource.MustParse("1")},
		Limits:   corev1.ResourceList{name: resource.MustParse("1")},
	}
}

// The total starts as an empty quantity of the resource's format, then adds containers, then init containers.
func emptyTotal(name corev1.ResourceName) resource.Quantity {
	if name == corev1.ResourceMemory {
		return resource.Quantity{Format: resource.BinarySI}
	}
	return resource.Quantity{Format: resource.DecimalSI}
}

func requestTotal(pod *corev1.Pod, name corev1.ResourceName) resource.Quantity {
	total := emptyTotal(name)
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Requests[name]; ok {
			total.Add(q)
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if q, ok := c.Resources.Requests[name]; ok {
			total.Add(q)
		}
	}
	return total
}

func limitTotal(pod *corev1.Pod, name corev1.ResourceName) resource.Quantity {
	total := emptyTotal(name)
	for _, c := range pod.Spec.Containers {
		if q, ok := c.Resources.Limits[name]; ok {
			total.Add(q)
		}
	}
	for _, c := range pod.Spec.InitContainers {
		if q, ok := c.Resources.Limits[name]; ok {
			total.Add(q)
		}
	}
	return total
}

// A failed conversion is logged and written as "0", as upstream does.
func mebibytes(q resource.Quantity) string {
	mib, err := helpers.RoundUpToMiB(q)
	if err != nil {
		logger.Printf("Error converting memory quantity to MiB: %v", err)
		return "0"
	}
	return strconv.FormatInt(mib, 10)
}
