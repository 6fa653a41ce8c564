//! The one error type of this crate. `reason()` is stable: it is used as a condition reason and a metric label.

use peerpods_api::peerpodconfig::FailureReason;
pub use peerpods_runtime::Cause;
use peerpods_runtime::with_cause;

/// What went wrong while keeping a PeerPodConfig true.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Server-side apply of an owned object (DaemonSet, Deployment, Service, Secret, webhook configuration).
    #[error("applying {kind} {name}: {source}")]
    Apply {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },

    /// Reading an owned object before deciding whether it needs a write.
    #[error("reading {kind} {name}: {source}")]
    Read {
        kind: &'static str,
        name: String,
        #[source]
        source: kube::Error,
    },

    /// The MutatingWebhookConfiguration the chart creates does not exist. This controller only adds its webhook
    /// to it and never creates one (its ServiceAccount may not: a webhook configuration of its own would reach
    /// every Pod of the cluster).
    #[error(
        "MutatingWebhookConfiguration {name} does not exist: the Helm chart creates it (with no webhooks) and \
         peer-pod-config-ctrl only adds its webhook to it; install the chart, or without the chart create it as \
         deploy/samples/webhook-configuration.yaml does"
    )]
    WebhookConfigurationMissing { name: &'static str },

    /// Patching `status.capacity` of a node.
    #[error("patching kata.peerpods.io/vm on node {node}: {source}")]
    NodeCapacity {
        node: String,
        #[source]
        source: kube::Error,
    },

    /// Writing the PeerPodConfig status.
    #[error("writing status of PeerPodConfig {name}: {source}")]
    Status {
        name: String,
        #[source]
        source: kube::Error,
    },

    /// Adding or removing the finalizer, or a failure inside cleanup.
    #[error("finalizer: {0}")]
    Finalizer(#[source] Box<kube::runtime::finalizer::Error<Error>>),

    /// The node cache has not been filled yet; reconciling now would remove capacity from every node.
    #[error("node cache is not ready yet")]
    NodeCacheNotReady,

    /// capacityMode dra, but the ResourceClaims (or the pool's slices) have not been listed: resizing now could
    /// drop a device a running pod holds. Also what a cluster that does not serve resource.k8s.io/v1 gets.
    #[error(
        "the ResourceClaim, ResourceSlice or DeviceClass cache is not ready (is resource.k8s.io/v1 served?)"
    )]
    DraCacheNotReady,

    /// Generating or reading the webhook serving certificate; `source` is the error that made it fail, if any.
    #[error("webhook certificate: {}", with_cause(message, source))]
    Certificate {
        message: String,
        #[source]
        source: Option<Cause>,
    },

    /// Asking provider-service for free capacity; `message` is the answer's code and message.
    #[error("provider capacity for {provider}: {message}")]
    ProviderCapacity {
        provider: String,
        message: String,
        #[source]
        source: Cause,
    },

    /// Turning an object into JSON or YAML.
    #[error("serializing: {0}")]
    Serialize(#[source] Cause),

    /// The spec cannot be acted on (reported as the Invalid condition before this is ever returned).
    #[error("invalid spec: {0}")]
    InvalidSpec(String),

    /// The object lacks a namespace or name (never true for objects the API server returns).
    #[error("object without {0}")]
    MissingMetadata(&'static str),
}

impl Error {
    /// A CamelCase word for conditions, Events and metric labels; never changes for a variant.
    pub fn reason(&self) -> &'static str {
        self.failure_reason().as_str()
    }

    /// What failed, as the condition it concerns and its Event record it.
    pub fn failure_reason(&self) -> FailureReason {
        use FailureReason as F;
        match self {
            Self::Apply { .. } => F::ApplyFailed,
            Self::Read { .. } => F::ReadFailed,
            Self::WebhookConfigurationMissing { .. } => F::WebhookConfigurationMissing,
            Self::NodeCapacity { .. } => F::NodeCapacityFailed,
            Self::Status { .. } => F::StatusFailed,
            Self::Finalizer(inner) => match inner.as_ref() {
                kube::runtime::finalizer::Error::ApplyFailed(e)
                | kube::runtime::finalizer::Error::CleanupFailed(e) => e.failure_reason(),
                _ => F::FinalizerFailed,
            },
            Self::NodeCacheNotReady => F::NodeCacheNotReady,
            Self::DraCacheNotReady => F::DraCacheNotReady,
            Self::Certificate { .. } => F::CertificateFailed,
            Self::ProviderCapacity { .. } => F::ProviderCapacityFailed,
            Self::Serialize(_) => F::SerializeFailed,
            Self::InvalidSpec(_) => F::InvalidSpec,
            Self::MissingMetadata(_) => F::MissingMetadata,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_are_distinct() {
        let errors = [
            Error::NodeCacheNotReady,
            Error::DraCacheNotReady,
            Error::Certificate {
                message: String::new(),
                source: None,
            },
            Error::Serialize(std::fmt::Error.into()),
            Error::MissingMetadata("name"),
            Error::WebhookConfigurationMissing { name: "x" },
            Error::ProviderCapacity {
                provider: "aws".into(),
                message: String::new(),
                source: std::fmt::Error.into(),
            },
        ];
        let reasons: std::collections::BTreeSet<_> = errors.iter().map(Error::reason).collect();
        assert_eq!(reasons.len(), errors.len());
    }

    #[test]
    fn wrapped_errors_are_the_source_and_the_texts_are_unchanged() {
        use std::error::Error as _;
        let json = serde_json::from_str::<u8>("x").unwrap_err();
        let text = json.to_string();
        let serialize = Error::Serialize(json.into());
        assert_eq!(serialize.to_string(), format!("serializing: {text}"));
        assert_eq!(serialize.source().map(ToString::to_string), Some(text));

        let certificate = Error::Certificate {
            message: String::new(),
            source: Some(std::fmt::Error.into()),
        };
        assert_eq!(
            certificate.to_string(),
            format!("webhook certificate: {}", std::fmt::Error)
        );
        assert!(certificate.source().is_some());
        let own = Error::Certificate {
            message: "no certificate".into(),
            source: None,
        };
        assert_eq!(own.to_string(), "webhook certificate: no certificate");
        assert!(own.source().is_none());
    }
}
