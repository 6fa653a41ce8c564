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
//! - `record`: the status writes, and a failure's Event and metric; [`reminders`]: how often a failure that
//!   stays the same says so again.

mod delete;
mod hold;
mod record;
mod release;
pub(crate) mod reminders;
pub mod rules;
pub mod status;

pub(crate) use delete::{planned_delete, still_listed};
pub(crate) use hold::{developer_hold, hold};
pub(crate) use record::record_failure;
pub(crate) use release::{
    release_by_operator, release_ignored, release_refused, release_still_referenced,
};

/// The field manager of the status the reconciler applies: `status.cleand`, the Cleaned condition, the state
/// and its reason. Reverse collection writes under a manager of its own ([`crate::reverse::FIELD_MANAGER`]).
pub const FIELD_MANAGER: &str = "peerpod-ctrl";
