//! The cleanup of a PeerPod being deleted with `peer.pod/finalizer`: `DeleteInstance`, then record (Event, log,
//! metric) and release exactly that finalizer. The success path costs two API writes (the Event and the
//! finalizer patch): status is written only when the object outlives the release (another finalizer holds it).
//! Failures keep the finalizer, say why on the object, and retry with per-object backoff.
//!
//! We never add a finalizer of our own: cloud-api-adaptor removes *all* finalizers when it releases a
//! PeerPod, so ours would be gone exactly when we would need it.
//!
//! - [`rules`]: the plan of one PeerPod, the finalizer patch, the wait after an in-progress answer (pure).
//! - [`status`]: what the Cleaned condition says (pure).
//! - `delete`: `DeleteInstance` and the release once the VM is confirmed gone.
//! - `release`: the releases without a delete (a live namesake, the operator's annotation).
//! - `hold`: the holds (do-not-delete, developer mode, a release annotation not acted on).
//! - `record`: the status writes, and a failure's Event and metric.

mod delete;
mod hold;
mod record;
mod release;
pub mod rules;
pub mod status;

pub(crate) use delete::{planned_delete, still_listed};
pub(crate) use hold::{developer_hold, hold};
pub(crate) use record::record_failure;
pub(crate) use release::{
    release_by_operator, release_ignored, release_refused, release_still_referenced,
};
pub use rules::{RELEASE, ReleaseAsk, release_ask};

use crate::crd::CleanedReason;

/// The field manager of the status the reconciler applies: `status.cleand`, the Cleaned condition, the state
/// and its reason. Reverse collection writes under a manager of its own ([`crate::reverse::FIELD_MANAGER`]).
pub const FIELD_MANAGER: &str = "peerpod-ctrl";

/// Event reason of `peerpods.io/release` on a PeerPod that is not being deleted.
pub const REASON_RELEASE_IGNORED: &str = "ReleaseIgnored";
/// Condition reason (and Event reason) of a PeerPod the operator released without a delete.
pub const REASON_RELEASED_BY_OPERATOR: &str = CleanedReason::ReleasedByOperator.as_str();
/// Condition reason (and Event reason) of `peerpods.io/release: instance-gone` on a PeerPod whose VM provider-service
/// still lists: the VM is neither deleted nor released.
pub const REASON_INSTANCE_STILL_LISTED: &str = CleanedReason::InstanceStillListed.as_str();
/// Condition reason (and Event reason) of a `peerpods.io/release` value that is not known.
pub const REASON_RELEASE_UNKNOWN: &str = CleanedReason::UnknownReleaseValue.as_str();

/// Condition reason (and Event reason) of a PeerPod released without deleting its VM, because a live PeerPod
/// still names the VM.
pub const REASON_STILL_REFERENCED: &str = CleanedReason::InstanceStillReferenced.as_str();
/// Condition reason (and Event reason) of a PeerPod whose cleanup is held by the do-not-delete annotation.
pub const REASON_DO_NOT_DELETE: &str = CleanedReason::DoNotDelete.as_str();
/// Condition reason (and Event reason) of a PeerPod whose VM is kept because cloud-api-adaptor runs in developer
/// mode ([`Hold::DeveloperMode`]).
pub const REASON_DEVELOPER_MODE: &str = CleanedReason::DeveloperMode.as_str();
/// Condition reason (and Event reason) of a PeerPod whose VM provider-service is still deleting: the finalizer
/// stays and provider-service is asked again after its retry advice.
pub const REASON_DELETE_IN_PROGRESS: &str = CleanedReason::DeleteInProgress.as_str();
/// Condition reason (and Event reason) of a PeerPod whose VM the cloud does not show yet, inside its consistency
/// window: a wait, not a failure; the finalizer stays and provider-service is asked again after its retry advice.
pub const REASON_NOT_YET_VISIBLE: &str = CleanedReason::InstanceNotYetVisible.as_str();
