//! The reasons peerpod-ctrl writes on PeerPods, to their conditions and `status.reason` and to the Events
//! about them, and the reasons of its Events about VMs. Each is an enum whose strings are API: `kubectl`,
//! alerts, dashboards and scripts read them, so a renamed variant keeps its string.

/// The reasons of the Cleaned condition (and of the Events that go with them), which `status.reason` and the
/// REASON printer column repeat. The strings are API: `kubectl`, alerts and scripts read them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CleanedReason {
    /// provider-service deleted the VM.
    InstanceDeleted,
    /// The VM was already gone.
    InstanceAlreadyGone,
    /// The operator released the PeerPod without a delete (`peerpods.io/release: operator`).
    ReleasedByOperator,
    /// Released without deleting the VM, because a live PeerPod still names the VM.
    InstanceStillReferenced,
    /// Held by do-not-delete: the PeerPod's annotation, or provider-service's refusal of a VM tagged so.
    DoNotDelete,
    /// Held because cloud-api-adaptor runs in developer mode, which keeps a failed pod's VM for debugging.
    DeveloperMode,
    /// provider-service is still deleting the VM; asked again after its retry advice.
    DeleteInProgress,
    /// The cloud does not show the VM yet, inside its consistency window: a wait, not a failure.
    InstanceNotYetVisible,
    /// `peerpods.io/release: instance-gone` on a PeerPod whose VM provider-service still lists.
    InstanceStillListed,
    /// A `peerpods.io/release` value that is not known.
    UnknownReleaseValue,
    /// Deleting the VM failed, for this reason.
    Failed(FailureReason),
}

impl CleanedReason {
    /// Every reason with a name of its own (all but [`CleanedReason::Failed`]).
    pub const NAMED: [CleanedReason; 10] = [
        CleanedReason::InstanceDeleted,
        CleanedReason::InstanceAlreadyGone,
        CleanedReason::ReleasedByOperator,
        CleanedReason::InstanceStillReferenced,
        CleanedReason::DoNotDelete,
        CleanedReason::DeveloperMode,
        CleanedReason::DeleteInProgress,
        CleanedReason::InstanceNotYetVisible,
        CleanedReason::InstanceStillListed,
        CleanedReason::UnknownReleaseValue,
    ];

    /// The string written to the condition, `status.reason` and the Event.
    pub const fn as_str(self) -> &'static str {
        match self {
            CleanedReason::InstanceDeleted => "InstanceDeleted",
            CleanedReason::InstanceAlreadyGone => "InstanceAlreadyGone",
            CleanedReason::ReleasedByOperator => "ReleasedByOperator",
            CleanedReason::InstanceStillReferenced => "InstanceStillReferenced",
            CleanedReason::DoNotDelete => "DoNotDelete",
            CleanedReason::DeveloperMode => "DeveloperMode",
            CleanedReason::DeleteInProgress => "DeleteInProgress",
            CleanedReason::InstanceNotYetVisible => "InstanceNotYetVisible",
            CleanedReason::InstanceStillListed => "InstanceStillListed",
            CleanedReason::UnknownReleaseValue => "UnknownReleaseValue",
            CleanedReason::Failed(reason) => reason.as_str(),
        }
    }

    /// The named reason a condition carries; `None` for an error's reason or a string this version does not
    /// know (another version's), which the caller treats as not that reason.
    pub fn parse(reason: &str) -> Option<CleanedReason> {
        CleanedReason::NAMED
            .into_iter()
            .find(|named| named.as_str() == reason)
    }
}

/// Why a cleanup (or another act of peerpod-ctrl) failed: the reason of a failed Cleaned condition, of the
/// warning Event that goes with it and the `reason` label of the failure metrics. Who failed is in the name:
/// this controller's request (`ProviderRejected`), provider-service (`Provider*`), the cloud behind it
/// (`Cloud*`), a refusal provider-service named (same words as its `ErrorInfo` reason), or this side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// The PeerPod names no provider or no instance.
    InvalidInstance,
    /// provider-service rejected the request as malformed.
    ProviderRejected,
    /// provider-service cannot act in its current configuration.
    ProviderPrecondition,
    /// provider-service refused this controller's credentials.
    ProviderUnauthorized,
    /// provider-service asked this controller to slow down.
    ProviderThrottled,
    /// provider-service did not answer.
    ProviderUnavailable,
    /// provider-service failed.
    ProviderFailed,
    /// Refused by provider-service: the VM lacks this cluster's tag.
    NotOwnedByCluster,
    /// Refused by provider-service: it has no configuration for the PeerPod's cloud.
    ProviderNotConfigured,
    /// Refused by provider-service: the cloud refused its credentials.
    CloudUnauthenticated,
    /// Refused by provider-service: the cloud refused its credentials a permission.
    CloudPermissionDenied,
    /// The cloud behind provider-service is down.
    CloudUnavailable,
    /// The cloud behind provider-service throttles it.
    CloudThrottled,
    /// The circuit breaker holds calls to provider-service after repeated failures.
    CircuitOpen,
    /// The finalizer changed under the release.
    FinalizerConflict,
    /// cloud-api-adaptor's developer mode cannot be read.
    DeveloperModeUnknown,
    /// The Kubernetes API failed.
    KubernetesApiError,
    /// The in-use binding this controller needs is missing.
    InUseBindingMissing,
    /// This controller's configuration is invalid.
    InvalidConfiguration,
    /// Leader election failed.
    LeaderElection,
}

impl FailureReason {
    /// Every failure reason.
    pub const ALL: [FailureReason; 20] = [
        FailureReason::InvalidInstance,
        FailureReason::ProviderRejected,
        FailureReason::ProviderPrecondition,
        FailureReason::ProviderUnauthorized,
        FailureReason::ProviderThrottled,
        FailureReason::ProviderUnavailable,
        FailureReason::ProviderFailed,
        FailureReason::NotOwnedByCluster,
        FailureReason::ProviderNotConfigured,
        FailureReason::CloudUnauthenticated,
        FailureReason::CloudPermissionDenied,
        FailureReason::CloudUnavailable,
        FailureReason::CloudThrottled,
        FailureReason::CircuitOpen,
        FailureReason::FinalizerConflict,
        FailureReason::DeveloperModeUnknown,
        FailureReason::KubernetesApiError,
        FailureReason::InUseBindingMissing,
        FailureReason::InvalidConfiguration,
        FailureReason::LeaderElection,
    ];

    /// The string written to the condition, `status.reason`, the Event and the metric label.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureReason::InvalidInstance => "InvalidInstance",
            FailureReason::ProviderRejected => "ProviderRejected",
            FailureReason::ProviderPrecondition => "ProviderPrecondition",
            FailureReason::ProviderUnauthorized => "ProviderUnauthorized",
            FailureReason::ProviderThrottled => "ProviderThrottled",
            FailureReason::ProviderUnavailable => "ProviderUnavailable",
            FailureReason::ProviderFailed => "ProviderFailed",
            FailureReason::NotOwnedByCluster => "NotOwnedByCluster",
            FailureReason::ProviderNotConfigured => "ProviderNotConfigured",
            FailureReason::CloudUnauthenticated => "CloudUnauthenticated",
            FailureReason::CloudPermissionDenied => "CloudPermissionDenied",
            FailureReason::CloudUnavailable => "CloudUnavailable",
            FailureReason::CloudThrottled => "CloudThrottled",
            FailureReason::CircuitOpen => "CircuitOpen",
            FailureReason::FinalizerConflict => "FinalizerConflict",
            FailureReason::DeveloperModeUnknown => "DeveloperModeUnknown",
            FailureReason::KubernetesApiError => "KubernetesApiError",
            FailureReason::InUseBindingMissing => "InUseBindingMissing",
            FailureReason::InvalidConfiguration => "InvalidConfiguration",
            FailureReason::LeaderElection => "LeaderElection",
        }
    }

    /// The failure reason a string names; `None` for any other.
    pub fn parse(reason: &str) -> Option<FailureReason> {
        FailureReason::ALL
            .into_iter()
            .find(|known| known.as_str() == reason)
    }
}

impl std::fmt::Display for FailureReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reasons of the `InstancePresent` condition ([`super::CONDITION_INSTANCE_PRESENT`]) reverse collection
/// keeps on live PeerPods, and of the Events that go with them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InstancePresentReason {
    /// The cloud confirmed the VM gone while the PeerPod is live.
    InstanceNotFound,
    /// A VM reported missing is listed again.
    InstanceFound,
}

impl InstancePresentReason {
    /// Every reason of the condition.
    pub const ALL: [InstancePresentReason; 2] = [
        InstancePresentReason::InstanceNotFound,
        InstancePresentReason::InstanceFound,
    ];

    /// The string written to the condition and the Event.
    pub const fn as_str(self) -> &'static str {
        match self {
            InstancePresentReason::InstanceNotFound => "InstanceNotFound",
            InstancePresentReason::InstanceFound => "InstanceFound",
        }
    }
}

/// The reasons of peerpod-ctrl's Events that no condition carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// `peerpods.io/release` on a PeerPod that is not being deleted: ignored until it is.
    ReleaseIgnored,
    /// A PeerPod deleted because a newer PeerPod of the same Pod exists.
    StalePeerPodDeleted,
    /// An untracked VM past the grace period: an orphan.
    OrphanInstanceFound,
    /// An orphan VM the orphan scan deleted (by the opt-in policy).
    OrphanInstanceDeleted,
    /// An untracked VM whose cloud-api-adaptor name belongs to a live Pod.
    AdoptableInstanceFound,
    /// A PeerPod without an instance id linked to the one VM its name matches.
    InstanceMatchedByName,
    /// The orphan scan deletes nothing: the PeerPod cache is not complete yet, so every VM would look orphaned.
    PeerPodCacheNotSynced,
    /// The orphan scan deletes no more orphans this pass: the cap of deletes per scan is reached.
    OrphanDeleteCapExceeded,
}

impl EventReason {
    /// Every Event reason.
    pub const ALL: [EventReason; 8] = [
        EventReason::ReleaseIgnored,
        EventReason::StalePeerPodDeleted,
        EventReason::OrphanInstanceFound,
        EventReason::OrphanInstanceDeleted,
        EventReason::AdoptableInstanceFound,
        EventReason::InstanceMatchedByName,
        EventReason::PeerPodCacheNotSynced,
        EventReason::OrphanDeleteCapExceeded,
    ];

    /// The Event's reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventReason::ReleaseIgnored => "ReleaseIgnored",
            EventReason::StalePeerPodDeleted => "StalePeerPodDeleted",
            EventReason::OrphanInstanceFound => "OrphanInstanceFound",
            EventReason::OrphanInstanceDeleted => "OrphanInstanceDeleted",
            EventReason::AdoptableInstanceFound => "AdoptableInstanceFound",
            EventReason::InstanceMatchedByName => "InstanceMatchedByName",
            EventReason::PeerPodCacheNotSynced => "PeerPodCacheNotSynced",
            EventReason::OrphanDeleteCapExceeded => "OrphanDeleteCapExceeded",
        }
    }

    /// The Event reason a string names; `None` for any other (another controller's, or a condition's).
    pub fn parse(reason: &str) -> Option<EventReason> {
        EventReason::ALL
            .into_iter()
            .find(|known| known.as_str() == reason)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peerpod::PeerPodState;

    #[test]
    fn every_named_cleaned_reason_keeps_its_string_and_reads_back() {
        let strings: Vec<&str> = CleanedReason::NAMED.map(CleanedReason::as_str).to_vec();
        // API: conditions, status.reason, Events, the REASON column and kubectl-peerpods read these.
        assert_eq!(
            strings,
            [
                "InstanceDeleted",
                "InstanceAlreadyGone",
                "ReleasedByOperator",
                "InstanceStillReferenced",
                "DoNotDelete",
                "DeveloperMode",
                "DeleteInProgress",
                "InstanceNotYetVisible",
                "InstanceStillListed",
                "UnknownReleaseValue",
            ]
        );
        for named in CleanedReason::NAMED {
            assert_eq!(CleanedReason::parse(named.as_str()), Some(named));
        }
        assert_eq!(
            CleanedReason::Failed(FailureReason::ProviderUnavailable).as_str(),
            "ProviderUnavailable"
        );
        assert_eq!(CleanedReason::parse("ProviderUnavailable"), None);
    }

    #[test]
    fn only_do_not_delete_and_developer_mode_hold_and_done_is_released() {
        let failed = CleanedReason::Failed(FailureReason::ProviderUnavailable);
        for reason in CleanedReason::NAMED.into_iter().chain([failed]) {
            assert_eq!(
                PeerPodState::of_cleanup(true, reason),
                PeerPodState::Released
            );
            let held = matches!(
                reason,
                CleanedReason::DoNotDelete | CleanedReason::DeveloperMode
            );
            let expected = if held {
                PeerPodState::Held
            } else {
                PeerPodState::WaitingForCloud
            };
            assert_eq!(
                PeerPodState::of_cleanup(false, reason),
                expected,
                "{reason:?}"
            );
        }
    }

    #[test]
    fn every_failure_reason_reads_back_and_keeps_its_wire_spelling() {
        for reason in FailureReason::ALL {
            assert_eq!(FailureReason::parse(reason.as_str()), Some(reason));
        }
        for reason in EventReason::ALL {
            assert_eq!(EventReason::parse(reason.as_str()), Some(reason));
        }
        assert_eq!(EventReason::parse("InstanceDeleted"), None);
        // API since the reasons were strings: alerts and dashboards match on these.
        assert_eq!(
            FailureReason::KubernetesApiError.as_str(),
            "KubernetesApiError"
        );
        assert_eq!(
            FailureReason::InvalidConfiguration.as_str(),
            "InvalidConfiguration"
        );
        assert_eq!(FailureReason::CloudThrottled.as_str(), "CloudThrottled");
    }

    #[test]
    fn no_two_reasons_of_a_peerpod_share_a_string() {
        let mut seen = std::collections::BTreeSet::new();
        let all = CleanedReason::NAMED
            .map(CleanedReason::as_str)
            .into_iter()
            .chain(FailureReason::ALL.map(FailureReason::as_str))
            .chain(EventReason::ALL.map(EventReason::as_str))
            .chain(InstancePresentReason::ALL.map(InstancePresentReason::as_str));
        for reason in all {
            assert!(seen.insert(reason), "{reason} twice");
        }
    }
}
