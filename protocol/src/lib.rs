//! The deletion protocol of peer pods apart from I/O: pure rules, std only, shared by
//! provider-service (which drives them against the clouds), peerpod-ctrl and the model checker
//! (which drives them against an adversarial model cloud).
//!
//! - [`ProviderName`]: cloud-api-adaptor's `CLOUD_PROVIDER` names, and each cloud's facts (its id
//!   rule, whether it has tags, what cloud-api-adaptor's DaemonSet mounts for it).
//! - [`InstanceKey`]: one instance, one identity (provider and canonical id).
//! - [`guard`]: what may be deleted (do-not-delete, the cluster tag).
//! - [`window`]: when a cloud's NotFound may be believed.
//! - [`engine`]: the deletion engine, `step(observation) -> command`.
//! - [`decide`]: peerpod-ctrl's decision kernel, over plain facts of a PeerPod, and cloud-api-adaptor's
//!   developer mode as its ConfigMap sets it (read the same way by both controllers).

pub mod decide;
pub mod engine;
pub mod guard;
mod identity;
mod provider_name;
pub mod window;

pub use engine::{Command, Deletion, Observation, Verdict};
pub use guard::{DO_NOT_DELETE, DO_NOT_DELETE_PORTABLE, Guard, Refusal, Tags};
pub use identity::InstanceKey;
pub use provider_name::{CaaToken, CaaWiring, ProviderName, UnknownProviderName};
pub use window::{Memo, Moment, Window};
