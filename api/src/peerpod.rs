//! The `PeerPod` custom resource, wire-compatible with what cloud-api-adaptor (CAA) writes.
//!
//! CAA creates one PeerPod per pod VM in the Pod's namespace, owned by the Pod, carrying the finalizer
//! [`FINALIZER`]. The field names (`instanceID`, and the misspelt `cleand`) are CAA's wire names and must not
//! change. Everything this project adds is optional so that CAA's create body stays valid.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, CustomResourceExt, ResourceExt};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::Error;

/// The finalizer CAA puts on every PeerPod. It stays until the VM is confirmed deleted.
pub const FINALIZER: &str = "peer.pod/finalizer";

/// The condition type this controller maintains on PeerPods it cleans up.
pub const CONDITION_CLEANED: &str = "Cleaned";

/// The condition type reverse collection maintains on live PeerPods: whether the cloud still shows the VM.
pub const CONDITION_INSTANCE_PRESENT: &str = "InstancePresent";

mod reasons;
pub use reasons::{CleanedReason, EventReason, FailureReason, InstancePresentReason};

/// Annotation on a PeerPod (and tag on a VM, which provider-service honours) that keeps its VM from being
/// deleted by any path: the cleanup of the PeerPod (its finalizer stays), the reaping of older PeerPods of
/// the same Pod, the orphan scan. Any value counts except `false` (ignoring case and surrounding blanks), so a
/// typo protects rather than exposes ([`peerpods_protocol::marks_do_not_delete`], the rule provider-service
/// applies to the tag too).
pub use peerpods_protocol::DO_NOT_DELETE;

/// The annotation an operator sets on a PeerPod being deleted (by hand or with `kubectl peerpods release`) to
/// have its finalizer released WITHOUT a confirmed delete, and what its values ask for. The rule lives with
/// the protocol's decision kernel, which weighs it.
pub use peerpods_protocol::decide::{RELEASE, ReleaseAsk};

/// The API version peerpod-ctrl's orphan Events give the VM they are about in `related` (not a Kubernetes
/// API: the VM lives in the cloud; the name is `<provider>/<instance id>`).
pub const INSTANCE_API_VERSION: &str = "provider.peerpods.io/v1";

// Doc comments on the CRD types are single lines on purpose: they become `kubectl explain` text, which keeps
// line breaks as they are and would show a hard-wrapped comment as ragged lines.

/// Which VM this is. Written by cloud-api-adaptor when it creates the VM; the PeerPod is owned by the pod, so deleting the pod deletes the PeerPod, and the finalizer peer.pod/finalizer holds it until the VM is deleted.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "confidentialcontainers.org",
    version = "v1alpha1",
    kind = "PeerPod",
    plural = "peerpods",
    singular = "peerpod",
    namespaced,
    status = "PeerPodStatus",
    doc = "A cloud VM that runs one peer pod. Deleting it deletes the VM before the finalizer is released.",
    selectable = ".spec.instanceID",
    printcolumn = r#"{"name":"State","type":"string","description":"Where the PeerPod is in its life: Live, InstanceMissing (the cloud reports its VM gone), WaitingForCloud (deleting the VM failed or is not confirmed yet; see Reason), Held (do-not-delete or cloud-api-adaptor developer mode) or Released (VM gone or deliberately kept, finalizer released)","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Cloud Provider","type":"string","description":"Cloud provider that runs the VM","jsonPath":".spec.cloudProvider"}"#,
    printcolumn = r#"{"name":"Instance ID","type":"string","description":"Provider's ID of the VM","jsonPath":".spec.instanceID"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","priority":1,"description":"Why the PeerPod is in its state (the reason of its latest condition)","jsonPath":".status.reason"}"#,
    printcolumn = r#"{"name":"Last Attempt","type":"date","priority":1,"description":"When the controller last recorded an attempt (a cleanup call or an instance lookup) that changed what the status says","jsonPath":".status.lastAttemptTime"}"#,
    printcolumn = r#"{"name":"Waiting Since","type":"date","priority":1,"description":"Since when the cleanup has been waiting (held, failing or in progress); empty while nothing waits","jsonPath":".status.waitingSince"}"#
)]
pub struct PeerPodSpec {
    /// Cloud provider that runs the VM, as cloud-api-adaptor's CLOUD_PROVIDER names it: aws, azure, gcp, ibmcloud, ibmcloud-powervs, libvirt, alibabacloud or byom.
    #[serde(rename = "cloudProvider", default)]
    pub cloud_provider: String,
    /// The provider's identifier of the VM: an EC2 instance ID (i-...) on aws, the domain UUID on libvirt, the full ARM resource ID on azure, the instance name on gcp.
    #[serde(rename = "instanceID", default)]
    pub instance_id: String,
}

/// What is known about deleting the VM.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct PeerPodStatus {
    /// True once the VM has been deleted (or was found already gone) and the finalizer can be released. The spelling is cloud-api-adaptor's wire name.
    #[serde(default)]
    pub cleand: bool,
    /// Where the PeerPod is in its life, in words: Live (the default), InstanceMissing, WaitingForCloud, Held or Released. The printer column STATE.
    #[serde(default)]
    pub state: PeerPodState,
    /// The reason of the latest condition written, for the wide printer column REASON; unset on a live PeerPod nothing was ever noticed about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// When the controller last recorded an attempt (a cleanup call or an instance lookup) that changed what the status says.
    #[serde(
        rename = "lastAttemptTime",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub last_attempt_time: Option<Time>,
    /// Since when the cleanup of this PeerPod has been waiting: set when its deletion first could not finish (held, failing or in progress), kept while that lasts, cleared when it ends. The wide printer column WAITING SINCE.
    #[serde(
        rename = "waitingSince",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub waiting_since: Option<Time>,
    /// The latest observations of the cleanup. Type Cleaned is True once the VM is confirmed gone, and False with a reason while it is not: DeleteInProgress while provider-service is still deleting it (asked again after its retry advice), or why deleting it fails (for example ProviderUnavailable or InvalidInstance); the finalizer stays until it is True.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The metadata.generation the conditions were computed from.
    #[serde(
        rename = "observedGeneration",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub observed_generation: Option<i64>,
    /// Only while spec.instanceID is empty: the instance ID of the one VM of the PeerPod's provider that cloud-api-adaptor's name (podvm-<pod>-<sandbox>) ties to this PeerPod's Pod. Unset when no VM or several match. Shown only: no VM is ever deleted on its name alone.
    #[serde(
        rename = "matchedInstance",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub matched_instance: Option<String>,
}

/// `status.state`: one word for `kubectl get peerpods`. The CRD defaults it (and `status` itself) so that a
/// PeerPod nobody has written status for yet, as cloud-api-adaptor creates it, reads `Live` at no API write.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum PeerPodState {
    /// The PeerPod is in use and nothing is wrong with it that the controller knows of.
    #[default]
    Live,
    /// Not being deleted, but the cloud confirmed its VM gone (after a grace period); nothing is deleted.
    InstanceMissing,
    /// Being deleted; deleting the VM failed or is not confirmed yet, and the finalizer stays.
    WaitingForCloud,
    /// Being deleted, but held by do-not-delete (annotation or VM tag) or cloud-api-adaptor's developer mode: the VM and the finalizer stay.
    Held,
    /// The VM is confirmed gone (or deliberately kept for a live PeerPod naming it); the finalizer is released.
    Released,
}

impl PeerPodState {
    /// The state a Cleaned condition stands for: `done` is its status, `reason` its reason. An exhaustive match,
    /// so a new reason says which state it means.
    pub fn of_cleanup(done: bool, reason: CleanedReason) -> PeerPodState {
        use CleanedReason as R;
        match reason {
            _ if done => PeerPodState::Released,
            R::DoNotDelete | R::DeveloperMode => PeerPodState::Held,
            R::InstanceDeleted
            | R::InstanceAlreadyGone
            | R::ReleasedByOperator
            | R::InstanceStillReferenced
            | R::DeleteInProgress
            | R::InstanceNotYetVisible
            | R::InstanceStillListed
            | R::UnknownReleaseValue
            | R::Failed(_) => PeerPodState::WaitingForCloud,
        }
    }
}

impl PeerPod {
    /// The condition of type [`CONDITION_CLEANED`], if any.
    pub fn cleaned_condition(&self) -> Option<&Condition> {
        self.status
            .as_ref()?
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_CLEANED)
    }

    /// What the PeerPod's [`RELEASE`] annotation asks for, if it carries one.
    pub fn release_ask(&self) -> Option<ReleaseAsk> {
        self.annotations()
            .get(RELEASE)
            .map(|v| ReleaseAsk::parse(v))
    }
}

/// The CustomResourceDefinition: the derived one, with `status` defaulting to `{}` so that its own defaults
/// (`state: Live`) show on a PeerPod whose status nobody wrote (the API server drops status on create), and
/// without a default for `cleand`.
pub fn crd()
-> k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition {
    let mut crd = PeerPod::crd();
    for version in &mut crd.spec.versions {
        let status = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|s| s.properties.as_mut())
            .and_then(|p| p.get_mut("status"));
        if let Some(status) = status {
            // `cleand` keeps no schema default: with `status` defaulted it would show `Cleand: false` (the
            // wire name, misspelt) on every live PeerPod in `kubectl describe`, beside `State: Live`.
            if let Some(cleand) = status.properties.as_mut().and_then(|p| p.get_mut("cleand")) {
                cleand.default = None;
            }
            status.default = Some(
                k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::JSON(
                    serde_json::json!({}),
                ),
            );
        }
    }
    crd
}

/// The CustomResourceDefinition as YAML, exactly as committed under `deploy/crds/peerpods.yaml`.
pub fn crd_yaml() -> Result<String, Error> {
    let yaml = serde_saphyr::to_string(&crd()).map_err(|e| Error::CrdSerialization {
        kind: "PeerPod",
        source: e.into(),
    })?;
    Ok(format!(
        "# Generated from api/src/peerpod.rs by `make manifests`; do not edit.\n{yaml}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caa_create_body_deserializes() {
        let body = include_str!("../tests/fixtures/caa-peerpod.json");
        let pp: PeerPod = serde_json::from_str(body).expect("CAA body parses");
        assert_eq!(pp.spec.cloud_provider, "aws");
        assert_eq!(pp.spec.instance_id, "i-0123456789abcdef0");
        assert_eq!(
            pp.metadata.finalizers.as_deref(),
            Some(&[FINALIZER.to_string()][..])
        );
        assert_eq!(pp.status, Some(PeerPodStatus::default()));
    }

    #[test]
    fn wire_names_are_caas() {
        let pp = PeerPod::new(
            "p",
            PeerPodSpec {
                cloud_provider: "libvirt".into(),
                instance_id: "abc".into(),
            },
        );
        let json = serde_json::to_value(&pp.spec).expect("serializes");
        assert_eq!(
            json,
            serde_json::json!({"cloudProvider": "libvirt", "instanceID": "abc"})
        );
        let status = serde_json::to_value(PeerPodStatus {
            cleand: true,
            ..Default::default()
        })
        .expect("serializes");
        // `cleand` keeps CAA's spelling; `state` is always written with it so the STATE column follows.
        assert_eq!(status, serde_json::json!({"cleand": true, "state": "Live"}));
    }

    #[test]
    fn a_peerpod_without_status_reads_live_and_shows_no_wire_name() {
        let crd = serde_json::to_value(crd()).expect("serializes");
        let status =
            &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"];
        assert_eq!(status["default"], serde_json::json!({}));
        assert_eq!(status["properties"]["state"]["default"], "Live");
        assert!(status["properties"]["cleand"].get("default").is_none());
        let columns: Vec<(&str, i64)> = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .expect("columns")
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap_or_default(),
                    c["priority"].as_i64().unwrap_or_default(),
                )
            })
            .collect();
        assert_eq!(
            columns,
            [
                ("State", 0),
                ("Cloud Provider", 0),
                ("Instance ID", 0),
                ("Age", 0),
                ("Reason", 1),
                ("Last Attempt", 1),
                ("Waiting Since", 1)
            ]
        );
    }

    /// cloud-api-adaptor's own PeerPod CRD prints these columns (its kubebuilder printcolumn markers); when both
    /// charts install the CRD, whichever applies last decides what `kubectl get peerpods` shows, so ours keeps
    /// each of them, by name, type, path and default visibility.
    #[test]
    fn every_column_of_upstreams_crd_is_kept() {
        let upstream: serde_json::Value = serde_json::from_str(include_str!(
            "../tests/fixtures/caa-peerpod-printer-columns.json"
        ))
        .expect("fixture parses");
        let crd = serde_json::to_value(crd()).expect("serializes");
        let ours = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .expect("columns");
        let key = |c: &serde_json::Value| {
            (
                c["name"].as_str().unwrap_or_default().to_owned(),
                c["type"].as_str().unwrap_or_default().to_owned(),
                c["jsonPath"].as_str().unwrap_or_default().to_owned(),
                c["priority"].as_i64().unwrap_or_default(),
            )
        };
        let ours: Vec<_> = ours.iter().map(key).collect();
        let upstream = upstream["columns"].as_array().expect("fixture columns");
        assert!(!upstream.is_empty());
        for column in upstream.iter().map(key) {
            assert!(
                ours.contains(&column),
                "upstream's column {column:?} is missing from ours: {ours:?}"
            );
        }
    }

    #[test]
    fn schema_requires_nothing_caa_might_omit() {
        let crd = serde_json::to_value(crd()).expect("serializes");
        let version = &crd["spec"]["versions"][0];
        let schema = &version["schema"]["openAPIV3Schema"]["properties"];
        assert!(
            schema["spec"].get("required").is_none(),
            "spec must not require fields"
        );
        assert!(
            schema["status"].get("required").is_none(),
            "status must not require fields"
        );
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["group"], "confidentialcontainers.org");
        assert_eq!(version["name"], "v1alpha1");
        assert_eq!(version["subresources"]["status"], serde_json::json!({}));
    }
}
