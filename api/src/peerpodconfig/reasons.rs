//! The reasons peer-pod-config-ctrl writes to a PeerPodConfig's conditions and to the Events about it. The
//! strings are API: `kubectl`, alerts and scripts read them, so a renamed variant keeps its string.

use std::fmt;

/// The condition types of a PeerPodConfig.
pub mod condition_type {
    /// Everything the PeerPodConfig asks for is in place.
    pub const READY: &str = "Ready";
    /// cloud-api-adaptor's DaemonSet runs on the selected nodes.
    pub const DAEMONSET_READY: &str = "DaemonSetReady";
    /// The webhook serves and is registered.
    pub const WEBHOOK_READY: &str = "WebhookReady";
    /// The capacity is advertised (node capacity, or the DRA pool).
    pub const CAPACITY_ADVERTISED: &str = "CapacityAdvertised";
    /// The spec is not acted on (true), or is (false).
    pub const INVALID: &str = "Invalid";
    /// The DRA kubelet plugin DaemonSet: shown in capacityMode dra, and in node mode while the plugin stays for
    /// claims still allocated. Not part of Ready: the pool is published without it.
    pub const DRA_PLUGIN_READY: &str = "DraPluginReady";
    /// The deletion waits while peer pods still run.
    pub const DELETION_HELD: &str = "DeletionHeld";
}

/// The reason of any condition of a PeerPodConfig (`Ready`, `Invalid`, `DaemonSetReady`, `WebhookReady`,
/// `CapacityAdvertised`, `DraPluginReady`, `DeletionHeld`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConditionReason {
    /// `Ready`: everything the PeerPodConfig asks for is in place.
    Ready,
    /// `Ready`: something is not in place yet; the message lists the conditions waited for.
    NotReady,
    /// `Invalid` (false): the spec is acted on.
    Valid,
    /// A workload condition while the spec is invalid: nothing is rendered.
    Invalid,
    /// A workload is not created (yet).
    NotCreated,
    /// A workload rolls out.
    Progressing,
    /// A DaemonSet selects no node.
    NoNodes,
    /// Some of a DaemonSet's pods are not ready.
    PodsNotReady,
    /// Every pod of a DaemonSet is ready.
    PodsReady,
    /// The webhook's Deployment has an available replica.
    Available,
    /// The webhook's Deployment has no available replica.
    Unavailable,
    /// `DraPluginReady` in capacityMode node: ResourceClaims of the driver are still allocated, so the DRA
    /// plugin stays to unprepare them.
    DraPluginDraining,
    /// `CapacityAdvertised`: nothing advertised yet.
    NotAdvertised,
    /// `CapacityAdvertised`: the node selector selects no node.
    NoNodesSelected,
    /// `CapacityAdvertised`: node patches are being applied ("n of m nodes").
    Applying,
    /// `CapacityAdvertised` in capacityMode dra: the pool is published.
    Published,
    /// `CapacityAdvertised` in capacityMode node: every selected node advertises its share.
    Advertised,
    /// `DeletionHeld`: PeerPods still run, so the deletion waits for them.
    PeerPodsRunning,
    /// `Invalid` (true) and `Ready`: why the spec is not acted on.
    InvalidSpec(InvalidReason),
    /// What failed, on the condition it concerns.
    Failed(FailureReason),
}

impl ConditionReason {
    /// Every reason with a name of its own (all but [`ConditionReason::InvalidSpec`] and
    /// [`ConditionReason::Failed`], which carry [`InvalidReason::ALL`] and [`FailureReason::ALL`]).
    pub const NAMED: [ConditionReason; 18] = [
        ConditionReason::Ready,
        ConditionReason::NotReady,
        ConditionReason::Valid,
        ConditionReason::Invalid,
        ConditionReason::NotCreated,
        ConditionReason::Progressing,
        ConditionReason::NoNodes,
        ConditionReason::PodsNotReady,
        ConditionReason::PodsReady,
        ConditionReason::Available,
        ConditionReason::Unavailable,
        ConditionReason::DraPluginDraining,
        ConditionReason::NotAdvertised,
        ConditionReason::NoNodesSelected,
        ConditionReason::Applying,
        ConditionReason::Published,
        ConditionReason::Advertised,
        ConditionReason::PeerPodsRunning,
    ];

    /// The string written to the condition.
    pub const fn as_str(self) -> &'static str {
        match self {
            ConditionReason::Ready => "Ready",
            ConditionReason::NotReady => "NotReady",
            ConditionReason::Valid => "Valid",
            ConditionReason::Invalid => "Invalid",
            ConditionReason::NotCreated => "NotCreated",
            ConditionReason::Progressing => "Progressing",
            ConditionReason::NoNodes => "NoNodes",
            ConditionReason::PodsNotReady => "PodsNotReady",
            ConditionReason::PodsReady => "PodsReady",
            ConditionReason::Available => "Available",
            ConditionReason::Unavailable => "Unavailable",
            ConditionReason::DraPluginDraining => "DraPluginDraining",
            ConditionReason::NotAdvertised => "NotAdvertised",
            ConditionReason::NoNodesSelected => "NoNodesSelected",
            ConditionReason::Applying => "Applying",
            ConditionReason::Published => "Published",
            ConditionReason::Advertised => "Advertised",
            ConditionReason::PeerPodsRunning => "PeerPodsRunning",
            ConditionReason::InvalidSpec(reason) => reason.as_str(),
            ConditionReason::Failed(reason) => reason.as_str(),
        }
    }

    /// Every reason string, the carried ones included.
    pub fn all_strings() -> impl Iterator<Item = &'static str> {
        ConditionReason::NAMED
            .map(ConditionReason::as_str)
            .into_iter()
            .chain(InvalidReason::ALL.map(InvalidReason::as_str))
            .chain(FailureReason::ALL.map(FailureReason::as_str))
    }
}

impl fmt::Display for ConditionReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The reasons of peer-pod-config-ctrl's Events about a PeerPodConfig that are not a condition's (an invalid
/// spec's and a failure's Events carry [`InvalidReason`] and [`FailureReason`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventReason {
    /// The owned objects were applied.
    Applied,
    /// The advertised capacity changed.
    CapacityChanged,
    /// cloud-api-adaptor's developer mode changed: its pods roll, node capacity follows.
    DeveloperModeChanged,
    /// The deletion waits while peer pods still run.
    DeletionHeld,
    /// Everything the PeerPodConfig made is removed.
    CleanedUp,
}

impl EventReason {
    /// Every Event reason.
    pub const ALL: [EventReason; 5] = [
        EventReason::Applied,
        EventReason::CapacityChanged,
        EventReason::DeveloperModeChanged,
        EventReason::DeletionHeld,
        EventReason::CleanedUp,
    ];

    /// The Event's reason.
    pub const fn as_str(self) -> &'static str {
        match self {
            EventReason::Applied => "Applied",
            EventReason::CapacityChanged => "CapacityChanged",
            EventReason::DeveloperModeChanged => "DeveloperModeChanged",
            EventReason::DeletionHeld => "DeletionHeld",
            EventReason::CleanedUp => "CleanedUp",
        }
    }
}

/// Why a PeerPodConfig is not acted on: the reason of its Invalid condition and of the Warning Event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InvalidReason {
    /// Outside the controller's namespace, where owner references could not reach the rendered objects.
    WrongNamespace,
    /// Another PeerPodConfig is acted on; looked at again later.
    DuplicateConfig,
    /// `limit`/`limitPerNode` cannot be parsed or both are set.
    InvalidLimit,
    /// `nodeSelector` is not a valid label selector.
    InvalidNodeSelector,
    /// `spec.caa.serviceAccountName` or `spec.webhook.serviceAccountName` names another ServiceAccount than the
    /// one the controller was told (the chart's), e.g. provider-service's.
    ServiceAccountNotAllowed,
    /// `limitPerNode` with `capacityMode: dra`: the pool is cluster-wide, there is no per-node share to give.
    PerNodeLimitInDraMode,
}

impl InvalidReason {
    /// Every reason.
    pub const ALL: [InvalidReason; 6] = [
        InvalidReason::WrongNamespace,
        InvalidReason::DuplicateConfig,
        InvalidReason::InvalidLimit,
        InvalidReason::InvalidNodeSelector,
        InvalidReason::ServiceAccountNotAllowed,
        InvalidReason::PerNodeLimitInDraMode,
    ];

    /// The CamelCase condition reason; never changes for a variant.
    pub const fn as_str(self) -> &'static str {
        match self {
            InvalidReason::WrongNamespace => "WrongNamespace",
            InvalidReason::DuplicateConfig => "DuplicateConfig",
            InvalidReason::InvalidLimit => "InvalidLimit",
            InvalidReason::InvalidNodeSelector => "InvalidNodeSelector",
            InvalidReason::ServiceAccountNotAllowed => "ServiceAccountNotAllowed",
            InvalidReason::PerNodeLimitInDraMode => "PerNodeLimitInDraMode",
        }
    }
}

/// What failed while peer-pod-config-ctrl acted on a PeerPodConfig: the reason of the condition it concerns,
/// of the Warning Event and the `reason` label of the failure metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureReason {
    /// Applying a rendered object failed.
    ApplyFailed,
    /// Reading an object failed.
    ReadFailed,
    /// The webhook's MutatingWebhookConfiguration (installed by the chart) is missing.
    WebhookConfigurationMissing,
    /// Patching a node's capacity failed.
    NodeCapacityFailed,
    /// Writing the status failed.
    StatusFailed,
    /// Adding or removing the finalizer failed.
    FinalizerFailed,
    /// The node cache has not synced yet.
    NodeCacheNotReady,
    /// The DRA caches have not synced yet.
    DraCacheNotReady,
    /// The webhook's certificate could not be made or read.
    CertificateFailed,
    /// provider-service's capacity could not be read.
    ProviderCapacityFailed,
    /// A rendered object could not be serialized.
    SerializeFailed,
    /// The spec cannot be rendered.
    InvalidSpec,
    /// An object lacks its namespace or name.
    MissingMetadata,
}

impl FailureReason {
    /// Every reason.
    pub const ALL: [FailureReason; 13] = [
        FailureReason::ApplyFailed,
        FailureReason::ReadFailed,
        FailureReason::WebhookConfigurationMissing,
        FailureReason::NodeCapacityFailed,
        FailureReason::StatusFailed,
        FailureReason::FinalizerFailed,
        FailureReason::NodeCacheNotReady,
        FailureReason::DraCacheNotReady,
        FailureReason::CertificateFailed,
        FailureReason::ProviderCapacityFailed,
        FailureReason::SerializeFailed,
        FailureReason::InvalidSpec,
        FailureReason::MissingMetadata,
    ];

    /// The CamelCase reason; never changes for a variant.
    pub const fn as_str(self) -> &'static str {
        match self {
            FailureReason::ApplyFailed => "ApplyFailed",
            FailureReason::ReadFailed => "ReadFailed",
            FailureReason::WebhookConfigurationMissing => "WebhookConfigurationMissing",
            FailureReason::NodeCapacityFailed => "NodeCapacityFailed",
            FailureReason::StatusFailed => "StatusFailed",
            FailureReason::FinalizerFailed => "FinalizerFailed",
            FailureReason::NodeCacheNotReady => "NodeCacheNotReady",
            FailureReason::DraCacheNotReady => "DraCacheNotReady",
            FailureReason::CertificateFailed => "CertificateFailed",
            FailureReason::ProviderCapacityFailed => "ProviderCapacityFailed",
            FailureReason::SerializeFailed => "SerializeFailed",
            FailureReason::InvalidSpec => "InvalidSpec",
            FailureReason::MissingMetadata => "MissingMetadata",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_reasons_share_a_string() {
        let mut seen = std::collections::BTreeSet::new();
        for reason in ConditionReason::all_strings() {
            assert!(seen.insert(reason), "{reason} twice");
        }
        assert_eq!(seen.len(), 18 + 6 + 13);
    }

    #[test]
    fn carried_reasons_keep_their_own_strings() {
        assert_eq!(
            ConditionReason::InvalidSpec(InvalidReason::InvalidLimit).as_str(),
            "InvalidLimit"
        );
        assert_eq!(
            ConditionReason::Failed(FailureReason::WebhookConfigurationMissing).to_string(),
            "WebhookConfigurationMissing"
        );
    }
}
