//! Deleting a PeerPodConfig while peer pods still run would tear the runtime down under them: the CAA DaemonSet
//! goes (owner references), the node capacity and the webhook configuration are removed. So the cleanup (and
//! with it the finalizer) waits while any PeerPod that is not being deleted exists: the PeerPodConfig gets the
//! condition `DeletionHeld=True` and a Warning Event naming the peer pods, and it looks again every
//! [`RECHECK`]. The annotation [`FORCE_DELETE`] (`"true"`) lets the deletion proceed at once.
//!
//! A PeerPod is the record cloud-api-adaptor keeps of one running peer-pod VM, so "PeerPods not being deleted"
//! is exactly "peer pods that still run". Without the PeerPod CRD (404) none can run.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};
use peerpods_runtime::status::apply_status;

use crate::Error;
use peerpods_api::peerpod::PeerPod;
use peerpods_api::peerpodconfig::{ConditionReason, PeerPodConfig};

/// Annotation on a PeerPodConfig that lets its deletion proceed while peer pods still run.
pub const FORCE_DELETE: &str = "peerpods.io/force-delete";
/// Condition type of a held deletion (its Event says DeletionHeld too).
pub use peerpods_api::peerpodconfig::condition_type::DELETION_HELD;
/// How often a held deletion looks again for peer pods (nothing watches PeerPods here).
pub const RECHECK: Duration = Duration::from_secs(10);
/// Field manager of the hold's condition: a manager of its own, so applying it leaves the conditions the
/// reconcile owns alone (and theirs leave this one alone).
const HOLD_MANAGER: &str = "peer-pod-config-ctrl-deletion-hold";
/// How many peer pods a message names before it counts the rest.
const NAMED: usize = 10;

/// Whether the force annotation asks to delete anyway (`true`, any case).
pub fn forced(config: &PeerPodConfig) -> bool {
    config
        .annotations()
        .get(FORCE_DELETE)
        .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"))
}

/// `namespace/name` of every PeerPod not being deleted, sorted.
pub async fn running_peer_pods(client: &Client) -> Result<Vec<String>, Error> {
    let api: Api<PeerPod> = Api::all(client.clone());
    // Names and deletion marks only: a metadata list.
    let list = match api.list_metadata(&ListParams::default()).await {
        Ok(list) => list,
        Err(kube::Error::Api(status)) if status.code == 404 => return Ok(Vec::new()),
        Err(source) => {
            return Err(Error::Read {
                kind: "PeerPod",
                name: "*".into(),
                source,
            });
        }
    };
    let mut running: Vec<String> = list
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any()))
        .collect();
    running.sort();
    Ok(running)
}

/// The condition message (also the Event note): which peer pods hold the deletion and how to override.
pub fn message(running: &[String]) -> String {
    let mut named = running
        .iter()
        .take(NAMED)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    if running.len() > NAMED {
        named.push_str(&format!(" and {} more", running.len() - NAMED));
    }
    format!(
        "deletion held: {} peer pod(s) still run ({named}); delete them first, or annotate this PeerPodConfig \
         {FORCE_DELETE}=true to tear the runtime down under them",
        running.len()
    )
}

/// The condition as it stands, if any.
pub fn condition(config: &PeerPodConfig) -> Option<&Condition> {
    config
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == DELETION_HELD)
}

/// Writes `DeletionHeld=True` with `message` (server-side apply, own field manager). Returns whether the
/// message changed, so the caller announces only a change.
pub async fn write(client: &Client, config: &PeerPodConfig, message: &str) -> Result<bool, Error> {
    if condition(config).is_some_and(|c| c.status == "True" && c.message == message) {
        return Ok(false);
    }
    let name = config.name_any();
    let api: Api<PeerPodConfig> =
        Api::namespaced(client.clone(), &config.namespace().unwrap_or_default());
    let status = serde_json::json!({
        "conditions": [Condition {
            type_: DELETION_HELD.into(),
            status: "True".into(),
            reason: ConditionReason::PeerPodsRunning.as_str().into(),
            message: message.into(),
            observed_generation: config.metadata.generation,
            last_transition_time: condition(config)
                .filter(|c| c.status == "True")
                .map(|c| c.last_transition_time.clone())
                .unwrap_or_else(|| Time(jiff::Timestamp::now())),
        }]
    });
    apply_status(&api, &name, HOLD_MANAGER, &status, None)
        .await
        .map_err(|source| Error::Status { name, source })?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_true_forces() {
        let mut config = PeerPodConfig::new(
            "c",
            serde_json::from_value(serde_json::json!({"limit": 1})).expect("spec"),
        );
        assert!(!forced(&config));
        for (value, expected) in [
            ("true", true),
            (" TRUE ", true),
            ("yes", false),
            ("false", false),
        ] {
            config.metadata.annotations =
                Some([(FORCE_DELETE.to_owned(), value.to_owned())].into());
            assert_eq!(forced(&config), expected, "{value:?}");
        }
    }

    #[test]
    fn the_message_names_the_first_peer_pods_and_counts_the_rest() {
        let running: Vec<String> = (0..12).map(|i| format!("ns/pod-{i:02}")).collect();
        let text = message(&running);
        assert!(text.contains("12 peer pod(s)"), "{text}");
        assert!(
            text.contains("ns/pod-00") && text.contains("ns/pod-09"),
            "{text}"
        );
        assert!(!text.contains("ns/pod-10"), "{text}");
        assert!(text.contains("and 2 more"), "{text}");
        assert!(text.contains(FORCE_DELETE), "{text}");
    }
}
