//! What the webhook does to a peer pod, as a pure function from the Pod to a JSON patch.
//!
//! A peer pod runs in its own VM, not on the node: the node only has to count VMs. So the webhook takes the
//! pod's resource requests and limits off every container and init container (the node would otherwise reserve
//! them for nothing), gives the first container one unit of the extended resource that counts VMs
//! (`kata.peerpods.io/vm`), and moves the pod's size into annotations the remote hypervisor reads to pick the VM:
//!
//! - `io.katacontainers.config.hypervisor.default_vcpus`: CPUs, in whole units rounded up;
//! - `io.katacontainers.config.hypervisor.default_memory`: memory in MiB, rounded up;
//! - `io.katacontainers.config.hypervisor.default_gpus`: `nvidia.com/gpu` requested.
//!
//! For CPU and memory the limit is taken when there is a request and the limit is at least as large, otherwise
//! the request; nothing is written for zero. Totals are the sum over containers *and* init containers (not
//! Kubernetes' max-of-init rule) and leave out the RuntimeClass overhead, which is for a sandbox on the node.
//! This is the behaviour of upstream's webhook, kept so a pod gets the same VM with either.

use std::collections::BTreeMap;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::{Container, Pod, ResourceRequirements};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity as ApiQuantity;
use serde_json::Value;

use crate::Error;
use crate::quantity::Quantity;

/// What the mutation reads of a Pod, and nothing else: its annotations, its runtime class and each container's
/// and init container's resources. The webhook parses a created Pod straight into this from the request body,
/// so a request's memory follows its containers' resources, not everything else the Pod carries (a full
/// `k8s_openapi` `Container` takes about 2 KiB however little its JSON says; 90,000 one-line containers were
/// hundreds of MiB). Each container is still read as a whole `Container` first, one at a time, so a container
/// that is not one is refused as before.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    #[serde(default)]
    pub metadata: MetadataView,
    pub spec: Option<SpecView>,
}

/// The annotations of a Pod's metadata (and its generateName, which the log names a created pod by).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetadataView {
    pub annotations: Option<BTreeMap<String, String>>,
    pub generate_name: Option<String>,
}

/// The runtime class and the containers' resources of a PodSpec.
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SpecView {
    pub runtime_class_name: Option<String>,
    #[serde(default)]
    pub containers: ContainerResources,
    pub init_containers: Option<ContainerResources>,
}

/// The `resources` of each container of a list, in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ContainerResources(pub Vec<Option<ResourceRequirements>>);

impl<'de> serde::Deserialize<'de> for ContainerResources {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Containers;
        impl<'de> serde::de::Visitor<'de> for Containers {
            type Value = ContainerResources;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a list of containers")
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Self::Value, A::Error> {
                let mut resources = Vec::new();
                // One whole Container at a time: checked as the Pod's, then all but its resources dropped.
                while let Some(container) = seq.next_element::<Container>()? {
                    resources.push(container.resources);
                }
                resources.shrink_to_fit();
                Ok(ContainerResources(resources))
            }
        }
        deserializer.deserialize_seq(Containers)
    }
}

impl PodView {
    /// The view of a whole Pod.
    pub fn of(pod: &Pod) -> PodView {
        let resources = |list: &[Container]| {
            ContainerResources(list.iter().map(|c| c.resources.clone()).collect())
        };
        PodView {
            metadata: MetadataView {
                annotations: pod.metadata.annotations.clone(),
                generate_name: pod.metadata.generate_name.clone(),
            },
            spec: pod.spec.as_ref().map(|spec| SpecView {
                runtime_class_name: spec.runtime_class_name.clone(),
                containers: resources(&spec.containers),
                init_containers: spec.init_containers.as_deref().map(resources),
            }),
        }
    }
}

/// Runtime class of peer pods unless configured otherwise.
pub const DEFAULT_RUNTIME_CLASS: &str = "kata-remote";
/// Extended resource counting peer-pod VMs unless configured otherwise.
pub use peerpods_api::keys::EXTENDED_RESOURCE as DEFAULT_EXTENDED_RESOURCE;
/// vCPUs of the pod VM.
pub const VCPUS_ANNOTATION: &str = "io.katacontainers.config.hypervisor.default_vcpus";
/// Memory of the pod VM, in MiB.
pub const MEMORY_ANNOTATION: &str = "io.katacontainers.config.hypervisor.default_memory";
/// GPUs of the pod VM; cloud-api-adaptor reads this key to choose a GPU instance type.
pub const GPUS_ANNOTATION: &str = "io.katacontainers.config.hypervisor.default_gpus";
/// The GPU resource whose requests become [`GPUS_ANNOTATION`].
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// Which pods are peer pods, and what they ask the node for instead of CPU and memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub runtime_class: String,
    pub extended_resource: String,
}

impl Target {
    /// An empty value means the default, as upstream treats an empty environment variable.
    pub fn new(runtime_class: &str, extended_resource: &str) -> Target {
        let or =
            |value: &str, default: &str| if value.is_empty() { default } else { value }.to_owned();
        Target {
            runtime_class: or(runtime_class, DEFAULT_RUNTIME_CLASS),
            extended_resource: or(extended_resource, DEFAULT_EXTENDED_RESOURCE),
        }
    }

    /// Whether `pod` runs with the peer-pods runtime class.
    pub fn selects(&self, pod: &Pod) -> bool {
        pod.spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref())
            == Some(self.runtime_class.as_str())
    }

    /// [`Target::selects`] on a [`PodView`].
    pub fn selects_view(&self, pod: &PodView) -> bool {
        pod.spec
            .as_ref()
            .and_then(|s| s.runtime_class_name.as_deref())
            == Some(self.runtime_class.as_str())
    }

    /// The resources of a peer pod's first container: one VM, requested and limited.
    pub fn vm_resources(&self) -> ResourceRequirements {
        let one = BTreeMap::from([(self.extended_resource.clone(), ApiQuantity("1".into()))]);
        ResourceRequirements {
            requests: Some(one.clone()),
            limits: Some(one),
            ..ResourceRequirements::default()
        }
    }
}

impl Default for Target {
    fn default() -> Self {
        Target::new("", "")
    }
}

/// What a pod asks for, summed over its containers and init containers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodTotals {
    pub cpu_request: Quantity,
    pub cpu_limit: Quantity,
    pub memory_request: Quantity,
    pub memory_limit: Quantity,
    pub gpu_request: Quantity,
}

impl PodTotals {
    /// Sums the pod's requests and limits; an unparsable quantity is an error naming its field.
    pub fn of(pod: &Pod) -> Result<PodTotals, Error> {
        PodTotals::of_view(&PodView::of(pod))
    }

    /// [`PodTotals::of`] on a [`PodView`].
    pub fn of_view(pod: &PodView) -> Result<PodTotals, Error> {
        let Some(spec) = &pod.spec else {
            return Ok(PodTotals::default());
        };
        let mut totals = PodTotals::default();
        let lists = [
            ("containers", spec.containers.0.as_slice()),
            (
                "initContainers",
                spec.init_containers
                    .as_ref()
                    .map_or(&[][..], |l| l.0.as_slice()),
            ),
        ];
        for (list, containers) in lists {
            for (index, resources) in containers.iter().enumerate() {
                let resources = resources.as_ref();
                let requests = resources.and_then(|r| r.requests.as_ref());
                let limits = resources.and_then(|r| r.limits.as_ref());
                let at = format!("spec.{list}[{index}].resources");
                add_to(&mut totals.cpu_request, requests, &at, "requests", "cpu")?;
                add_to(&mut totals.cpu_limit, limits, &at, "limits", "cpu")?;
                add_to(
                    &mut totals.memory_request,
                    requests,
                    &at,
                    "requests",
                    "memory",
                )?;
                add_to(&mut totals.memory_limit, limits, &at, "limits", "memory")?;
                // GPUs are whole and their limit equals the request (Kubernetes requires it of extended
                // resources), so requests alone say how many.
                add_to(
                    &mut totals.gpu_request,
                    requests,
                    &at,
                    "requests",
                    GPU_RESOURCE,
                )?;
            }
        }
        Ok(totals)
    }

    /// The VM-size annotations these totals call for (none for a resource the pod does not ask for).
    pub fn annotations(&self) -> BTreeMap<String, String> {
        let mut annotations = BTreeMap::new();
        if let Some(cpu) = preferred(self.cpu_request, self.cpu_limit) {
            annotations.insert(VCPUS_ANNOTATION.to_owned(), cpu.value().to_string());
        }
        if let Some(memory) = preferred(self.memory_request, self.memory_limit) {
            // At or above 2^63-1 bytes upstream's conversion fails and it writes 0, which leaves the size to
            // the runtime's default; kept so both webhooks give the same pod the same VM.
            let mib = memory.mebibytes_rounded_up().unwrap_or(0);
            annotations.insert(MEMORY_ANNOTATION.to_owned(), mib.to_string());
        }
        if self.gpu_request.is_positive() {
            annotations.insert(GPUS_ANNOTATION.to_owned(), self.gpu_request.to_string());
        }
        annotations
    }
}

/// Adds `list[name]`, if there, to `total`; an error names the field as `<at>.<kind>[<name>]`.
fn add_to(
    total: &mut Quantity,
    list: Option<&BTreeMap<String, ApiQuantity>>,
    at: &str,
    kind: &str,
    name: &str,
) -> Result<(), Error> {
    let Some(text) = list.and_then(|l| l.get(name)) else {
        return Ok(());
    };
    let invalid = |source| Error::PodField {
        field: format!("{at}.{kind}[{name}]"),
        source: Box::new(source),
    };
    let quantity = Quantity::parse(&text.0).map_err(invalid)?;
    *total = total.checked_add(quantity).ok_or_else(|| {
        invalid(Error::Quantity {
            quantity: text.0.clone(),
            problem: "the pod's total is too large",
        })
    })?;
    Ok(())
}

/// The limit when there is a request and the limit covers it (a VM as large as the pod may grow), else the
/// request when positive.
fn preferred(request: Quantity, limit: Quantity) -> Option<Quantity> {
    if !request.is_zero() && limit >= request {
        Some(limit)
    } else {
        request.is_positive().then_some(request)
    }
}

/// The JSON patch that turns `pod` into a peer pod, or `None` when there is nothing to change: it is not a peer
/// pod, or it already is one (a reinvocation after another webhook changed something else).
///
/// Only the fields that change are patched, so fields this crate's Kubernetes types do not know survive.
pub fn patch(pod: &Pod, target: &Target) -> Result<Option<Patch>, Error> {
    patch_view(&PodView::of(pod), target)
}

/// [`patch`] on a [`PodView`], what the webhook parses a created Pod into.
pub fn patch_view(pod: &PodView, target: &Target) -> Result<Option<Patch>, Error> {
    if !target.selects_view(pod) {
        return Ok(None);
    }
    let Some(spec) = &pod.spec else {
        return Ok(None);
    };
    // A pod without containers is invalid; the API server's validation then says so better than we could.
    if spec.containers.0.is_empty() {
        return Ok(None);
    }
    let totals = PodTotals::of_view(pod)?;
    let mut operations = annotation_operations(pod, totals.annotations());

    let cleared = ResourceRequirements::default();
    let vm = target.vm_resources();
    let lists = [
        ("containers", spec.containers.0.as_slice()),
        (
            "initContainers",
            spec.init_containers
                .as_ref()
                .map_or(&[][..], |l| l.0.as_slice()),
        ),
    ];
    for (list, containers) in lists {
        for (index, resources) in containers.iter().enumerate() {
            let wanted = if list == "containers" && index == 0 {
                &vm
            } else {
                &cleared
            };
            if !has_resources(resources.as_ref(), wanted) {
                let value = serde_json::to_value(wanted).map_err(|e| Error::Patch(e.into()))?;
                operations.push(add(&["spec", list, &index.to_string(), "resources"], value));
            }
        }
    }
    Ok((!operations.is_empty()).then_some(Patch(operations)))
}

fn has_resources(resources: Option<&ResourceRequirements>, wanted: &ResourceRequirements) -> bool {
    resources.unwrap_or(&ResourceRequirements::default()) == wanted
}

/// Sets each annotation that differs. `add` creates a member or replaces it; the map itself is added whole
/// when the pod has none (a JSON patch cannot add below a missing parent).
fn annotation_operations(pod: &PodView, wanted: BTreeMap<String, String>) -> Vec<PatchOperation> {
    let current = pod.metadata.annotations.as_ref();
    let changed: BTreeMap<String, String> = wanted
        .into_iter()
        .filter(|(key, value)| current.and_then(|c| c.get(key)) != Some(value))
        .collect();
    if changed.is_empty() {
        return Vec::new();
    }
    match current {
        None => vec![add(
            &["metadata", "annotations"],
            Value::Object(
                changed
                    .into_iter()
                    .map(|(k, v)| (k, Value::String(v)))
                    .collect(),
            ),
        )],
        Some(_) => changed
            .into_iter()
            .map(|(key, value)| add(&["metadata", "annotations", &key], Value::String(value)))
            .collect(),
    }
}

fn add(path: &[&str], value: Value) -> PatchOperation {
    PatchOperation::Add(AddOperation {
        path: PointerBuf::from_tokens(path.iter().copied()),
        value,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A pod of `runtime_class` with containers and init containers given as `(requests, limits)` JSON.
    fn pod(runtime_class: &str, containers: &[Value], init_containers: &[Value]) -> Value {
        let named = |prefix: &str, list: &[Value]| -> Vec<Value> {
            list.iter()
                .enumerate()
                .map(|(i, resources)| {
                    json!({"name": format!("{prefix}{i}"), "image": "busybox", "resources": resources})
                })
                .collect()
        };
        let mut spec =
            json!({"runtimeClassName": runtime_class, "containers": named("c", containers)});
        if !init_containers.is_empty() {
            spec["initContainers"] = Value::Array(named("init", init_containers));
        }
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": "ns"}, "spec": spec})
    }

    fn resources(requests: Value, limits: Value) -> Value {
        json!({"requests": requests, "limits": limits})
    }

    /// The pod after the webhook's patch, applied as the API server applies it.
    fn mutated(pod: &Value) -> Option<Value> {
        let typed: Pod = serde_json::from_value(pod.clone()).unwrap();
        let patch = patch(&typed, &Target::default()).unwrap()?;
        let mut out = pod.clone();
        json_patch::patch(&mut out, &patch).unwrap();
        Some(out)
    }

    fn annotations(pod: &Value) -> BTreeMap<String, String> {
        serde_json::from_value(pod["metadata"]["annotations"].clone()).unwrap_or_default()
    }

    fn expect(pod: &Value, vcpus: Option<&str>, memory: Option<&str>, gpus: Option<&str>) {
        let a = annotations(pod);
        assert_eq!(
            a.get(VCPUS_ANNOTATION).map(String::as_str),
            vcpus,
            "vcpus: {a:?}"
        );
        assert_eq!(
            a.get(MEMORY_ANNOTATION).map(String::as_str),
            memory,
            "memory: {a:?}"
        );
        assert_eq!(
            a.get(GPUS_ANNOTATION).map(String::as_str),
            gpus,
            "gpus: {a:?}"
        );
        // Every container but the first and every init container asks for nothing; the first asks for a VM.
        assert_eq!(
            pod["spec"]["containers"][0]["resources"],
            json!({"requests": {"kata.peerpods.io/vm": "1"}, "limits": {"kata.peerpods.io/vm": "1"}})
        );
        for list in ["containers", "initContainers"] {
            let skip = usize::from(list == "containers");
            for c in pod["spec"][list]
                .as_array()
                .into_iter()
                .flatten()
                .skip(skip)
            {
                assert_eq!(c["resources"], json!({}), "{list}: {c}");
            }
        }
    }

    #[test]
    fn limit_preferred_over_request() {
        let p = pod(
            "kata-remote",
            &[resources(
                json!({"cpu": "2", "memory": "4Gi"}),
                json!({"cpu": "3", "memory": "5Gi"}),
            )],
            &[],
        );
        expect(&mutated(&p).unwrap(), Some("3"), Some("5120"), None);
    }

    #[test]
    fn requests_alone() {
        let cpu = pod("kata-remote", &[json!({"requests": {"cpu": "2"}})], &[]);
        expect(&mutated(&cpu).unwrap(), Some("2"), None, None);
        let memory = pod(
            "kata-remote",
            &[json!({"requests": {"memory": "4Gi"}})],
            &[],
        );
        expect(&mutated(&memory).unwrap(), None, Some("4096"), None);
        let gpu = pod(
            "kata-remote",
            &[json!({"requests": {"nvidia.com/gpu": "1"}})],
            &[],
        );
        expect(&mutated(&gpu).unwrap(), None, None, Some("1"));
    }

    #[test]
    fn no_resources_still_asks_for_a_vm() {
        let p = pod("kata-remote", &[json!({})], &[]);
        expect(&mutated(&p).unwrap(), None, None, None);
        let no_field: Value = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"runtimeClassName": "kata-remote", "containers": [{"name": "c", "image": "busybox"}]}});
        expect(&mutated(&no_field).unwrap(), None, None, None);
    }

    #[test]
    fn equal_request_and_limit() {
        let same = json!({"cpu": "2", "memory": "4Gi"});
        let p = pod("kata-remote", &[resources(same.clone(), same)], &[]);
        expect(&mutated(&p).unwrap(), Some("2"), Some("4096"), None);
    }

    #[test]
    fn limit_below_request_falls_back_to_the_request() {
        // Invalid for Kubernetes, but the webhook sees it before validation and must not pick the smaller one.
        let p = pod(
            "kata-remote",
            &[resources(
                json!({"cpu": "4", "memory": "2Gi"}),
                json!({"cpu": "1", "memory": "1Gi"}),
            )],
            &[],
        );
        expect(&mutated(&p).unwrap(), Some("4"), Some("2048"), None);
    }

    #[test]
    fn init_containers_are_summed_with_containers() {
        let p = pod(
            "kata-remote",
            &[
                resources(
                    json!({"cpu": "2", "memory": "4Gi"}),
                    json!({"cpu": "3", "memory": "5Gi"}),
                ),
                resources(
                    json!({"cpu": "1", "memory": "1Gi"}),
                    json!({"cpu": "1", "memory": "1Gi"}),
                ),
                resources(
                    json!({"cpu": "1", "nvidia.com/gpu": "1"}),
                    json!({"cpu": "1", "nvidia.com/gpu": "1"}),
                ),
            ],
            &[resources(
                json!({"cpu": "1", "memory": "2Gi"}),
                json!({"cpu": "1", "memory": "2Gi"}),
            )],
        );
        expect(&mutated(&p).unwrap(), Some("6"), Some("8192"), Some("1"));
    }

    #[test]
    fn fractional_cpu_rounds_up_to_whole_vcpus() {
        let mem = json!("4Gi");
        let one = pod(
            "kata-remote",
            &[resources(
                json!({"cpu": "200m", "memory": mem}),
                json!({"cpu": "500m", "memory": mem}),
            )],
            &[],
        );
        expect(&mutated(&one).unwrap(), Some("1"), Some("4096"), None);
        let two = pod(
            "kata-remote",
            &[resources(
                json!({"cpu": "200m", "memory": mem}),
                json!({"cpu": "1500m", "memory": mem}),
            )],
            &[],
        );
        expect(&mutated(&two).unwrap(), Some("2"), Some("4096"), None);
        // 0.7 + 0.5 = 1.2 CPUs: 2 vCPUs; 4Gi + 4Gi of memory.
        let summed = pod(
            "kata-remote",
            &[resources(
                json!({"cpu": "200m", "memory": mem}),
                json!({"cpu": "0.5", "memory": mem}),
            )],
            &[resources(
                json!({"cpu": "200m", "memory": mem}),
                json!({"cpu": "0.7", "memory": mem}),
            )],
        );
        expect(&mutated(&summed).unwrap(), Some("2"), Some("8192"), None);
    }

    #[test]
    fn memory_rounds_up_to_whole_mebibytes() {
        let p = pod("kata-remote", &[json!({"requests": {"memory": "1G"}})], &[]);
        expect(&mutated(&p).unwrap(), None, Some("954"), None);
    }

    #[test]
    fn other_runtime_classes_and_none_are_left_alone() {
        let p = pod(
            "different-runtime",
            &[resources(
                json!({"cpu": "2", "memory": "4Gi"}),
                json!({"cpu": "3", "memory": "5Gi"}),
            )],
            &[],
        );
        assert_eq!(mutated(&p), None);
        let mut no_class = p.clone();
        no_class["spec"]
            .as_object_mut()
            .unwrap()
            .remove("runtimeClassName");
        assert_eq!(mutated(&no_class), None);
    }

    #[test]
    fn configured_runtime_class_and_extended_resource() {
        let target = Target::new("kata-remote-snp", "example.com/pod-vm");
        let p: Pod = serde_json::from_value(pod("kata-remote-snp", &[json!({})], &[])).unwrap();
        let ops = serde_json::to_value(patch(&p, &target).unwrap().unwrap()).unwrap();
        assert_eq!(
            ops,
            json!([{"op": "add", "path": "/spec/containers/0/resources",
                    "value": {"requests": {"example.com/pod-vm": "1"}, "limits": {"example.com/pod-vm": "1"}}}])
        );
        let default: Pod = serde_json::from_value(pod("kata-remote", &[json!({})], &[])).unwrap();
        assert_eq!(
            patch(&default, &target).unwrap(),
            None,
            "kata-remote is not the target here"
        );
        assert_eq!(Target::new("", ""), Target::default());
        assert_eq!(Target::default().runtime_class, "kata-remote");
        assert_eq!(Target::default().extended_resource, "kata.peerpods.io/vm");
    }

    #[test]
    fn existing_annotations_are_kept_and_ours_overwritten() {
        let mut p = pod("kata-remote", &[json!({"requests": {"cpu": "2"}})], &[]);
        p["metadata"]["annotations"] = json!({"team": "a/b", VCPUS_ANNOTATION: "16"});
        let out = mutated(&p).unwrap();
        assert_eq!(
            annotations(&out).get("team").map(String::as_str),
            Some("a/b")
        );
        expect(&out, Some("2"), None, None);
    }

    #[test]
    fn a_mutated_pod_needs_no_second_patch() {
        let p = pod(
            "kata-remote",
            &[
                resources(
                    json!({"cpu": "1", "memory": "1Gi"}),
                    json!({"cpu": "1", "memory": "1Gi"}),
                ),
                json!({"requests": {"cpu": "1"}}),
            ],
            &[json!({"limits": {"memory": "1Gi"}})],
        );
        let once = mutated(&p).unwrap();
        assert_eq!(mutated(&once), None, "reinvocation changes nothing");
    }

    #[test]
    fn unknown_fields_survive_the_patch() {
        let mut p = pod("kata-remote", &[json!({"requests": {"cpu": "1"}})], &[]);
        p["spec"]["futureField"] = json!({"x": 1});
        p["spec"]["containers"][0]["futureField"] = json!(true);
        let out = mutated(&p).unwrap();
        assert_eq!(out["spec"]["futureField"], json!({"x": 1}));
        assert_eq!(out["spec"]["containers"][0]["futureField"], json!(true));
    }

    #[test]
    fn invalid_quantity_names_the_field() {
        let p: Pod = serde_json::from_value(pod(
            "kata-remote",
            &[json!({}), json!({"limits": {"memory": "lots"}})],
            &[],
        ))
        .unwrap();
        let error = patch(&p, &Target::default()).unwrap_err();
        assert!(error.is_bad_request());
        assert_eq!(
            error.to_string(),
            "spec.containers[1].resources.limits[memory]: quantity \"lots\": no digits"
        );
    }

    #[test]
    fn a_pod_without_containers_is_left_to_validation() {
        let p: Pod = serde_json::from_value(
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"runtimeClassName": "kata-remote", "containers": []}}),
        )
        .unwrap();
        assert_eq!(patch(&p, &Target::default()).unwrap(), None);
    }

    #[test]
    fn gpus_in_canonical_form() {
        let p = pod(
            "kata-remote",
            &[
                json!({"requests": {"nvidia.com/gpu": "2"}}),
                json!({"requests": {"nvidia.com/gpu": "2"}}),
            ],
            &[],
        );
        expect(&mutated(&p).unwrap(), None, None, Some("4"));
    }
}
