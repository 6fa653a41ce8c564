//! What every provider-service cloud backend shares, and nothing cloud-specific:
//!
//! - [`provider`]: the [`Provider`] trait and its domain types (never prost types).
//! - [`Budgeted`]: a backend behind a [`CallBudget`], deletes and reads on separate semaphores.
//! - [`Error`]: the one error type, with a stable `reason()` for logs, metrics and gRPC details.
//! - [`config`]: cloud-api-adaptor's configuration keys, read from mounted files and the
//!   environment; secrets stay wrapped.
//! - [`CloudCalls`]: the `cloud_api_calls` / `cloud_batch_size` metrics each backend records.
//! - [`http`]: how a REST answer (status, `Retry-After`) maps to an [`Error`], once for all clouds.
//! - [`OwnerTag`]: the cluster tag an instance must carry to be deleted (`CLUSTER_TAG`,
//!   `DELETE_UNTAGGED`), and [`parse_tags`] for cloud-api-adaptor's `TAGS`.
//! - [`Redactor`]: keeps configured secrets out of cloud error texts.
//! - [`deletion`]: the driver of the protocol's deletion engine, and the [`DeletionPorts`] a
//!   backend implements for it.
//!
//! A cloud backend is its own crate (`providers/<cloud>`) that implements [`Provider`] with this
//! crate alone; provider-service maps a configured name to the backend (behind a cargo feature).

mod budget;
pub mod config;
pub mod deletion;
mod error;
pub mod http;
mod ids;
mod metrics;
mod ownership;
pub mod provider;
mod redact;

pub use budget::Budgeted;
pub use config::{ExposeSecret, ProviderConfig, SecretString};
pub use deletion::{Deleter, DeletionPorts, Pace};
pub use error::Error;
pub use ids::is_uuid;
pub use metrics::{ATTEMPT_RESULTS, CloudCallLabels, CloudCalls, ProviderLabels, attempt_result};
pub use ownership::{
    DO_NOT_DELETE_PORTABLE_TAG, DO_NOT_DELETE_TAG, OwnerTag, do_not_delete, parse_tags,
    require_owner_choice,
};
pub use peerpods_proto::ProviderName;
pub use peerpods_protocol::{Guard, InstanceKey, Window};
pub use provider::{
    CallBudget, Capacity, DEFAULT_RETRY_AFTER, DeleteOutcome, Figure, Health, Instance, Provider,
    Requester, TagSelector,
};
pub use redact::Redactor;
