//! provider-service's answers in domain terms: how a delete went, what a wait waits for, a VM as listed, and on
//! whose behalf a call is made. The gRPC layer ([`crate::ProviderService`]) converts; no prost type leaves it.

use std::collections::BTreeMap;
use std::time::Duration;

use peerpods_proto::RequesterReason;

/// How provider-service answered a successful delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The VM existed and is deleted now.
    Deleted,
    /// The VM did not exist (any more).
    AlreadyGone,
}

impl Deleted {
    /// Metric `result` label.
    pub fn label(self) -> &'static str {
        match self {
            Deleted::Deleted => "deleted",
            Deleted::AlreadyGone => "already_gone",
        }
    }
}

/// What provider-service answered a DeleteInstance that did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteAnswer {
    /// The VM is confirmed gone.
    Gone(Deleted),
    /// The VM is not confirmed gone, and nothing failed: provider-service waits for what `waiting` says
    /// (a delete it runs on whether or not we wait, or the cloud to show the VM). Ask again after
    /// `retry_after` (its advice, when it gave one). Not gone: a finalizer stays.
    InProgress {
        retry_after: Option<Duration>,
        waiting: Waiting,
    },
}

/// What an in-progress delete waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Waiting {
    /// The cloud is deleting the VM (or provider-service waits for one of its delete slots). Also what an
    /// in-progress answer that does not say (from a provider-service that predates the field) means.
    CloudDeleting,
    /// The cloud has not shown the VM for `unknown_for` (if provider-service said), less than its consistency
    /// window: it may be a new VM the cloud does not show everywhere yet. Once the window passes the VM is
    /// confirmed gone; a cloud that shows it meanwhile has it deleted. Not an outage: the cloud answered.
    NotYetVisible { unknown_for: Option<Duration> },
}

/// A VM as provider-service lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub instance_id: String,
    pub created: Option<jiff::Timestamp>,
    /// The instance's tags (labels); empty when the provider has none.
    pub tags: BTreeMap<String, String>,
    /// The name the cloud shows (cloud-api-adaptor's `podvm-<pod>-<sandbox>` where it keeps one); empty when
    /// provider-service reports none.
    pub name: String,
}

/// On whose behalf a call is made; provider-service logs it for audit.
#[derive(Debug, Clone)]
pub struct About<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub reason: RequesterReason,
}
