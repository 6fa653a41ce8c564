//! The `PeerPodConfig` custom resource (`confidentialcontainers.org/v1alpha1`).
//!
//! Field names and defaults follow the upstream peer-pods config controller so existing manifests keep working;
//! everything added here is optional. Doc comments on fields are what `kubectl explain peerpodconfig.spec` shows.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

mod reasons;
pub use reasons::{ConditionReason, EventReason, FailureReason, InvalidReason, condition_type};

/// Largest limit accepted. Keeps every value inside `u32` and CEL's `int()` conversion safe.
pub const MAX_LIMIT: u32 = 999_999_999;

/// Desired state of the peer-pods runtime on this cluster: which nodes run cloud-api-adaptor, how many peer-pod VMs the scheduler may place, and how the CAA DaemonSet and the peer-pods webhook are deployed.
// The lint misreads the repeated `type_ = ...` keys of separate printcolumn(...) entries as duplicates.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "confidentialcontainers.org",
    version = "v1alpha1",
    kind = "PeerPodConfig",
    plural = "peerpodconfigs",
    singular = "peerpodconfig",
    shortname = "ppc",
    namespaced,
    status = "PeerPodConfigStatus",
    derive = "PartialEq",
    doc = "PeerPodConfig stands up peer pods on a cluster: the cloud-api-adaptor DaemonSet on the selected nodes, \
           the peer-pods mutating webhook, and the extended resource kata.peerpods.io/vm on every selected node.",
    printcolumn(name = "Limit", type_ = "string", json_path = ".spec.limit"),
    printcolumn(name = "Per-Node", type_ = "integer", json_path = ".spec.limitPerNode"),
    printcolumn(
        name = "Effective",
        type_ = "integer",
        json_path = ".status.effectiveLimit"
    ),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.selectedNodes"),
    printcolumn(
        name = "Mode",
        type_ = "string",
        json_path = ".spec.capacityMode",
        priority = 1
    ),
    printcolumn(
        name = "Free",
        type_ = "integer",
        json_path = ".status.freeSlots",
        priority = 1
    ),
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Ready\")].status"
    ),
    printcolumn(
        name = "Setup",
        type_ = "boolean",
        json_path = ".status.setupCompleted"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("!(has(self.limit) && has(self.limitPerNode))")
    .message("set either limit (a cluster-wide total spread over the selected nodes) or limitPerNode (the same value on every selected node), not both")
    .reason(Reason::FieldValueForbidden))]
#[x_kube(validation = Rule::new("has(self.limit) || has(self.limitPerNode)")
    .message("set limit (a cluster-wide total spread over the selected nodes) or limitPerNode (the same value on every selected node)")
    .reason(Reason::FieldValueRequired))]
#[serde(rename_all = "camelCase")]
pub struct PeerPodConfigSpec {
    /// Cloud instance type of the peer-pod VMs (informational, as upstream; CAA reads its own configuration from the ConfigMap).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,

    /// Cluster-wide number of peer-pod VMs. It is spread as evenly as possible over the selected nodes (values differ by at most one) and advertised as the extended resource kata.peerpods.io/vm. A non-negative integer, written as a number or, as upstream, as a string such as "10". Mutually exclusive with limitPerNode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(
        "type(self) == int ? (self >= 0 && self <= 999999999) : self.matches('^[0-9]{1,9}$')"
    ).message("limit must be a non-negative integer up to 999999999, as a number or a string of digits such as \"10\"")
    .reason(Reason::FieldValueInvalid))]
    pub limit: Option<IntOrString>,

    /// Number of peer-pod VMs advertised on every selected node (kata.peerpods.io/vm). Mutually exclusive with limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 999_999_999))]
    pub limit_per_node: Option<u32>,

    /// Name of the Secret (in the PeerPodConfig's namespace) holding the cloud credentials CAA reads as environment variables.
    #[serde(default = "default_cloud_secret_name")]
    #[schemars(length(min = 1, max = 253))]
    pub cloud_secret_name: String,

    /// Name of the ConfigMap (in the PeerPodConfig's namespace) holding CAA's settings as environment variables.
    #[serde(default = "default_config_map_name")]
    #[schemars(length(min = 1, max = 253))]
    pub config_map_name: String,

    /// Labels a node must carry to run cloud-api-adaptor and receive kata.peerpods.io/vm capacity. Every listed label must match exactly; an empty value matches a label with an empty value.
    #[serde(default = "default_node_selector")]
    pub node_selector: BTreeMap<String, String>,

    /// Cap the total by the free capacity the provider service reports for a cloud provider. Unset means the limit alone decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_from_provider: Option<CapacityFromProvider>,

    /// How the cloud-api-adaptor DaemonSet is deployed.
    #[serde(default)]
    pub caa: CaaSpec,

    /// How the peer-pods mutating webhook is deployed.
    #[serde(default)]
    pub webhook: WebhookSpec,

    /// How kata.peerpods.io/vm is offered to the scheduler. node (the default, and what every PeerPodConfig written before this field means): the total is spread over the selected nodes and written into each Node's capacity. dra: one cluster-wide pool of slots published as Dynamic Resource Allocation devices (a DeviceClass whose extendedResourceName is kata.peerpods.io/vm and ResourceSlices reachable from the selected nodes); no Node is written. dra needs Kubernetes 1.37 or later and a limit (limitPerNode is refused). See docs/capacity.md.
    #[serde(default)]
    pub capacity_mode: CapacityMode,

    /// The DRA kubelet plugin rendered on the selected nodes in capacityMode dra (ignored in node mode).
    #[serde(default)]
    pub dra: DraSpec,
}

/// How kata.peerpods.io/vm reaches the scheduler.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CapacityMode {
    /// Node capacity: the total is spread over the selected nodes and patched into each Node's status.
    #[default]
    Node,
    /// A cluster-wide pool of Dynamic Resource Allocation devices, one per peer-pod VM.
    Dra,
}

/// The DRA kubelet plugin DaemonSet (capacityMode dra).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DraSpec {
    /// Container image of the DRA kubelet plugin (driver vm.peerpods.io). It registers with the kubelet and answers prepare/unprepare with nothing to inject.
    #[serde(default = "default_dra_plugin_image")]
    #[schemars(length(min = 1))]
    pub plugin_image: String,

    /// The kubelet's root directory (its --root-dir) on the selected nodes: the plugin registers under <kubeletDir>/plugins_registry and serves under <kubeletDir>/plugins/vm.peerpods.io.
    #[serde(default = "default_kubelet_dir")]
    #[schemars(length(min = 1), regex(pattern = r"^/"))]
    pub kubelet_dir: String,
}

impl Default for DraSpec {
    fn default() -> Self {
        Self {
            plugin_image: default_dra_plugin_image(),
            kubelet_dir: default_kubelet_dir(),
        }
    }
}

/// Where the free capacity comes from when the total is capped by the cloud.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CapacityFromProvider {
    /// Cloud provider to ask, by CAA's CLOUD_PROVIDER name.
    pub cloud_provider: CloudProvider,

    /// How often to ask the provider service for free capacity, in seconds.
    #[serde(default = "default_refresh_seconds")]
    #[schemars(range(min = 10, max = 86_400))]
    pub refresh_seconds: u32,

    /// vCPUs of one peer-pod VM. With it, free vCPUs in the cloud also cap the number of VMs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub vcpus_per_instance: Option<u32>,

    /// Memory of one peer-pod VM in MiB. With it, free memory in the cloud also caps the number of VMs.
    #[serde(
        default,
        rename = "memoryMiBPerInstance",
        skip_serializing_if = "Option::is_none"
    )]
    #[schemars(range(min = 1))]
    pub memory_mib_per_instance: Option<u32>,
}

/// CAA's CLOUD_PROVIDER names (one type for the whole project).
pub use peerpods_protocol::ProviderName as CloudProvider;

/// The cloud-api-adaptor DaemonSet.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct CaaSpec {
    /// Container image of cloud-api-adaptor.
    #[serde(default = "default_caa_image")]
    #[schemars(length(min = 1))]
    pub image: String,

    /// Image pull policy (Always, IfNotPresent or Never). Unset means IfNotPresent, where cloud-api-adaptor's Helm chart says Always, so the privileged DaemonSet keeps running the image it pulled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// Cloud the DaemonSet is rendered for (CAA's CLOUD_PROVIDER name). Unset means the CLOUD_PROVIDER of the ConfigMap named by configMapName. It decides the per-cloud parts of the DaemonSet, as cloud-api-adaptor's Helm chart does: the ssh key for libvirt and byom, the projected vault-token for ibmcloud, the RRSA token for alibabacloud.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<CloudProvider>,

    /// ServiceAccount the DaemonSet runs as. Its RBAC (PeerPods create/patch, Pods get, Nodes get/patch, nodes/status patch) ships with the Helm chart; this controller never grants permissions itself. Only the ServiceAccount the controller is told (--caa-service-account, from the chart value caa.serviceAccount.name) is allowed: another one makes the PeerPodConfig invalid (ServiceAccountNotAllowed) and nothing is rendered.
    #[serde(default = "default_caa_service_account")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: String,

    /// Extra environment variables for cloud-api-adaptor, after the Secret and ConfigMap. PEERPODS_LIMIT_PER_NODE is always -1: this controller advertises node capacity, so CAA must not.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

impl Default for CaaSpec {
    fn default() -> Self {
        Self {
            image: default_caa_image(),
            image_pull_policy: None,
            provider: None,
            service_account_name: default_caa_service_account(),
            env: BTreeMap::new(),
        }
    }
}

/// The peer-pods mutating webhook (Deployment, Service, MutatingWebhookConfiguration and serving certificate).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct WebhookSpec {
    /// Container image of the peer-pods webhook. The default is this project's peerpods-webhook; cloud-api-adaptor's image (quay.io/confidential-containers/peer-pods-webhook) runs behind the same Deployment.
    #[serde(default = "default_webhook_image")]
    #[schemars(length(min = 1))]
    pub image: String,

    /// Image pull policy (Always, IfNotPresent or Never). Unset uses the Kubernetes default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<PullPolicy>,

    /// Number of webhook replicas. The webhook fails closed (failurePolicy Fail), so more than one keeps pod creation working during a rollout.
    #[serde(default = "default_webhook_replicas")]
    #[schemars(range(min = 1, max = 10))]
    pub replicas: i32,

    /// Pods with this runtimeClassName are mutated to request kata.peerpods.io/vm.
    #[serde(default = "default_runtime_class")]
    #[schemars(length(min = 1, max = 253))]
    pub target_runtime_class: String,

    /// ServiceAccount the webhook Deployment runs as (it needs no API permissions). Only the one the controller is told (--webhook-service-account, from the chart value webhook.serviceAccount.name) is allowed: another one makes the PeerPodConfig invalid (ServiceAccountNotAllowed).
    #[serde(default = "default_webhook_service_account")]
    #[schemars(length(min = 1, max = 253))]
    pub service_account_name: String,
}

impl Default for WebhookSpec {
    fn default() -> Self {
        Self {
            image: default_webhook_image(),
            image_pull_policy: None,
            replicas: default_webhook_replicas(),
            target_runtime_class: default_runtime_class(),
            service_account_name: default_webhook_service_account(),
        }
    }
}

/// Kubernetes image pull policies.
#[derive(JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum PullPolicy {
    Always,
    IfNotPresent,
    Never,
}

impl PullPolicy {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Always => "Always",
            Self::IfNotPresent => "IfNotPresent",
            Self::Never => "Never",
        }
    }
}

/// Observed state of the peer-pods runtime.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PeerPodConfigStatus {
    /// True once the DaemonSet and webhook objects exist and every selected node advertises its capacity (upstream field; pods becoming ready is reported by the conditions).
    #[serde(default)]
    pub setup_completed: bool,

    /// metadata.generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Total asked for: limit, or limitPerNode times the number of selected nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_limit: Option<u64>,

    /// Free capacity the provider service reported, when capacityFromProvider is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_free_capacity: Option<u64>,

    /// Total advertised over all selected nodes: the requested total, capped by the provider's free capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effective_limit: Option<u64>,

    /// Number of nodes matching nodeSelector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_nodes: Option<u32>,

    /// Smallest kata.peerpods.io/vm value on a selected node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_node_min: Option<u32>,

    /// Largest kata.peerpods.io/vm value on a selected node (at most one more than perNodeMin).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub per_node_max: Option<u32>,

    /// capacityMode dra: devices in the pool (the effective limit, never fewer than the allocated slots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pool_size: Option<u64>,

    /// capacityMode dra: devices of the pool allocated to ResourceClaims now (peer pods scheduled with a slot).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_slots: Option<u64>,

    /// capacityMode dra: devices of the pool not allocated (poolSize - allocatedSlots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_slots: Option<u64>,

    /// Ready, DaemonSetReady, WebhookReady, CapacityAdvertised and Invalid.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

fn default_cloud_secret_name() -> String {
    "peer-pods-secret".into()
}
fn default_config_map_name() -> String {
    "peer-pods-cm".into()
}
fn default_node_selector() -> BTreeMap<String, String> {
    BTreeMap::from([("node.kubernetes.io/worker".to_owned(), String::new())])
}
fn default_refresh_seconds() -> u32 {
    60
}
/// Pinned to the release this controller renders the DaemonSet of (CAA v0.22, docs/caa-daemonset.md), never a
/// moving tag: the image runs privileged on every selected node.
fn default_caa_image() -> String {
    "quay.io/confidential-containers/cloud-api-adaptor:v0.22.0".into()
}
fn default_caa_service_account() -> String {
    "cloud-api-adaptor".into()
}
/// This project's webhook (`peerpods-webhook`, a drop-in for cloud-api-adaptor's image), named as the chart names
/// the project's images (`<repositoryPrefix>/<component>:<appVersion>`, with the chart's default prefix).
pub const DEFAULT_WEBHOOK_IMAGE: &str = concat!(
    "localhost/peerpods/peerpods-webhook:",
    env!("CARGO_PKG_VERSION")
);

fn default_webhook_image() -> String {
    DEFAULT_WEBHOOK_IMAGE.into()
}
/// The DRA kubelet plugin, named and tagged as the default webhook image is (the project's version).
pub const DEFAULT_DRA_PLUGIN_IMAGE: &str = concat!(
    "ghcr.io/confidential-containers/peerpods-dra-plugin:",
    env!("CARGO_PKG_VERSION")
);

fn default_dra_plugin_image() -> String {
    DEFAULT_DRA_PLUGIN_IMAGE.into()
}
/// The kubelet's default --root-dir.
fn default_kubelet_dir() -> String {
    "/var/lib/kubelet".into()
}
fn default_webhook_replicas() -> i32 {
    2
}
fn default_runtime_class() -> String {
    "kata-remote".into()
}
fn default_webhook_service_account() -> String {
    "peer-pods-webhook".into()
}

/// What the spec asks for, once parsed: the schema already rejects most bad input, this catches the rest (and objects stored before the schema was tightened).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Cluster-wide total, spread over the selected nodes.
    Total(u32),
    /// The same value on every selected node.
    PerNode(u32),
}

impl PeerPodConfigSpec {
    /// The limit this spec asks for, or why it is invalid.
    pub fn parsed_limit(&self) -> Result<Limit, String> {
        match (&self.limit, self.limit_per_node) {
            (Some(_), Some(_)) => Err("limit and limitPerNode are mutually exclusive".into()),
            (None, None) => Err("one of limit or limitPerNode is required".into()),
            (None, Some(n)) if n > MAX_LIMIT => {
                Err(format!("limitPerNode {n} is larger than {MAX_LIMIT}"))
            }
            (None, Some(n)) => Ok(Limit::PerNode(n)),
            (Some(limit), None) => parse_total(limit).map(Limit::Total),
        }
    }
}

fn parse_total(limit: &IntOrString) -> Result<u32, String> {
    let value: i64 = match limit {
        IntOrString::Int(i) => i64::from(*i),
        IntOrString::String(s) => s
            .trim()
            .parse::<i64>()
            .map_err(|_| format!("limit {s:?} is not an integer"))?,
    };
    u32::try_from(value)
        .ok()
        .filter(|v| *v <= MAX_LIMIT)
        .ok_or_else(|| format!("limit {value} is outside 0..={MAX_LIMIT}"))
}

/// Label keys and values Kubernetes accepts; a nodeSelector with anything else can never match a node.
pub fn node_selector_problem(selector: &BTreeMap<String, String>) -> Option<String> {
    selector.iter().find_map(|(key, value)| {
        if !valid_label_key(key) {
            Some(format!("nodeSelector key {key:?} is not a valid label key"))
        } else if !valid_label_value(value) {
            Some(format!(
                "nodeSelector value {value:?} for {key:?} is not a valid label value"
            ))
        } else {
            None
        }
    })
}

// Hand-written because the rules are short and stable (RFC 1123 subdomain prefix + qualified name) and no
// well-kept crate exposes Kubernetes' label validation.
fn valid_label_key(key: &str) -> bool {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    let prefix_ok = prefix.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 253
            && p.split('.').all(|label| {
                !label.is_empty()
                    && label.len() <= 63
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && !label.starts_with('-')
                    && !label.ends_with('-')
            })
    });
    prefix_ok && !name.is_empty() && valid_label_value(name)
}

fn valid_label_value(value: &str) -> bool {
    let bytes = value.as_bytes();
    value.is_empty()
        || (value.len() <= 63
            && bytes
                .iter()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
            && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
            && bytes.last().is_some_and(u8::is_ascii_alphanumeric))
}

/// The CRD as YAML, as committed in `deploy/crds/peerpodconfigs.yaml`.
pub fn crd_yaml() -> Result<String, crate::Error> {
    use kube::CustomResourceExt;
    let serialize = |e: serde_json::Error| crate::Error::CrdSerialization {
        kind: "PeerPodConfig",
        source: e.into(),
    };
    let mut crd = serde_json::to_value(PeerPodConfig::crd()).map_err(serialize)?;
    drop_unsigned_formats(&mut crd);
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(crd).map_err(serialize)?;
    let yaml = serde_saphyr::to_string(&crd).map_err(|e| crate::Error::CrdSerialization {
        kind: "PeerPodConfig",
        source: e.into(),
    })?;
    Ok(format!(
        "# Generated from api/src/peerpodconfig.rs by `make manifests`. Do not edit.\n---\n{yaml}"
    ))
}

/// Removes the `format: uint32`/`uint64` schemars gives unsigned fields. The API server does not know these
/// formats and `kubectl apply` warns about each (`unrecognized format "uint32"`); the `minimum: 0` schemars emits
/// beside them keeps the constraint.
fn drop_unsigned_formats(schema: &mut serde_json::Value) {
    match schema {
        serde_json::Value::Object(map) => {
            if map
                .get("format")
                .and_then(serde_json::Value::as_str)
                .is_some_and(|f| f.starts_with("uint"))
            {
                map.remove("format");
            }
            map.values_mut().for_each(drop_unsigned_formats);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(drop_unsigned_formats),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: serde_json::Value) -> PeerPodConfigSpec {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn upstream_manifest_gets_upstream_defaults() {
        let s = spec(serde_json::json!({"limit": "10"}));
        assert_eq!(s.cloud_secret_name, "peer-pods-secret");
        assert_eq!(s.config_map_name, "peer-pods-cm");
        assert_eq!(
            s.node_selector,
            BTreeMap::from([("node.kubernetes.io/worker".into(), String::new())])
        );
        assert_eq!(s.parsed_limit(), Ok(Limit::Total(10)));
    }

    #[test]
    fn limit_accepts_numbers_and_digit_strings() {
        assert_eq!(
            spec(serde_json::json!({"limit": 7})).parsed_limit(),
            Ok(Limit::Total(7))
        );
        assert_eq!(
            spec(serde_json::json!({"limit": "0"})).parsed_limit(),
            Ok(Limit::Total(0))
        );
        assert_eq!(
            spec(serde_json::json!({"limitPerNode": 3})).parsed_limit(),
            Ok(Limit::PerNode(3))
        );
    }

    #[test]
    fn bad_limits_are_explained() {
        let err = |v| spec(v).parsed_limit().unwrap_err();
        assert!(err(serde_json::json!({"limit": "ten"})).contains("not an integer"));
        assert!(err(serde_json::json!({"limit": -1})).contains("outside"));
        assert!(
            err(serde_json::json!({"limit": "1", "limitPerNode": 1}))
                .contains("mutually exclusive")
        );
        assert!(err(serde_json::json!({})).contains("required"));
    }

    #[test]
    fn label_validation() {
        let ok = BTreeMap::from([
            ("node.kubernetes.io/worker".into(), String::new()),
            ("a".into(), "b-c.d".into()),
        ]);
        assert_eq!(node_selector_problem(&ok), None);
        for (k, v) in [
            ("bad key!", ""),
            ("-a/b", ""),
            ("a/", ""),
            ("a", "-x"),
            ("a", &"x".repeat(64)),
        ] {
            let sel = BTreeMap::from([(k.to_owned(), v.to_owned())]);
            assert!(node_selector_problem(&sel).is_some(), "{k}={v} accepted");
        }
    }

    #[test]
    fn crd_schema_carries_cel_rules_and_defaults() {
        let yaml = crd_yaml().unwrap();
        assert!(yaml.contains("!(has(self.limit) && has(self.limitPerNode))"));
        assert!(yaml.contains("x-kubernetes-int-or-string: true"));
        assert!(yaml.contains("peer-pods-secret"));
        assert!(yaml.contains("node.kubernetes.io/worker"));
        assert!(yaml.contains(DEFAULT_WEBHOOK_IMAGE));
    }

    #[test]
    fn the_default_webhook_is_this_project_s() {
        let s = spec(serde_json::json!({"limit": "1"}));
        assert_eq!(s.webhook.image, DEFAULT_WEBHOOK_IMAGE);
        assert!(
            s.webhook
                .image
                .starts_with("localhost/peerpods/peerpods-webhook:")
        );
    }

    #[test]
    fn no_format_the_api_server_does_not_know() {
        let yaml = crd_yaml().unwrap();
        assert!(!yaml.contains("format: uint"), "{yaml}");
        // The bound the format stood for stays.
        let crd: serde_json::Value = serde_saphyr::from_str(&yaml).unwrap();
        let limit_per_node = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
            ["spec"]["properties"]["limitPerNode"];
        assert_eq!(limit_per_node["minimum"], 0.0);
        assert_eq!(limit_per_node.get("format"), None);
    }
}
