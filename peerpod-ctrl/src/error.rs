//! The one error type of this crate. `reason()` is stable: it is the condition reason on PeerPods, the Event
//! reason and the `reason` label of metrics, so renaming a reason is a breaking change for alerts.

use peerpods_api::peerpod::CleanedReason;
use std::time::Duration;

use peerpods_api::peerpod::FailureReason;
use peerpods_provider_client::Held;
use peerpods_runtime::{Cause, with_cause};

/// Everything that can go wrong while cleaning up PeerPods.
///
/// The variants made from provider-service's answer (`Provider*`, `InstanceProtected`, `CloudFailed`) keep the
/// gRPC status as their `source`: one made on this side of the connection carries the transport's error under
/// it (the refused TCP connect, the reset stream), which its message alone does not name. Their text is the
/// status's code and message only, so conditions and Events read as before.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The PeerPod names no provider or no instance, so there is nothing that could be deleted safely.
    #[error("PeerPod names no usable instance: {0}")]
    InvalidInstance(String),
    /// provider-service rejected the request as malformed (gRPC INVALID_ARGUMENT): unknown provider,
    /// malformed instance ID. Retrying the same request cannot help.
    #[error("provider-service rejected the instance: {message}")]
    ProviderRejected {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// provider-service cannot act in its current configuration (gRPC FAILED_PRECONDITION), for example the
    /// provider is not configured. Needs an operator; retried slowly in case the configuration is fixed.
    #[error("provider-service cannot delete the instance in its current configuration: {message}")]
    ProviderPrecondition {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// provider-service refuses to delete the VM because it carries the `peerpods.io/do-not-delete` tag
    /// (FAILED_PRECONDITION, reason `DoNotDelete`). A deliberate hold, not a failure to retry: it stays until
    /// someone removes the tag, so it is retried only at the backoff cap.
    #[error(
        "provider-service refuses to delete the instance, it is marked do-not-delete: {message}"
    )]
    InstanceProtected {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// provider-service refused the request (FAILED_PRECONDITION) for a reason it named in
    /// `google.rpc.ErrorInfo`: its cluster-tag guard (`NotOwnedByCluster`), a provider it has no configuration
    /// for (`ProviderNotConfigured`), the cloud rejecting its credentials (`CloudUnauthenticated`). The reason
    /// becomes the condition reason, so `kubectl get` says which guard refused instead of the generic
    /// `ProviderPrecondition`.
    #[error("provider-service refused ({reason}): {message}")]
    ProviderRefused {
        reason: FailureReason,
        message: String,
        permanent: bool,
        #[source]
        source: Option<Cause>,
    },
    /// provider-service did not accept our credentials (UNAUTHENTICATED / PERMISSION_DENIED).
    #[error("provider-service refused our credentials: {message}")]
    ProviderUnauthorized {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The cloud or provider-service asked us to slow down (RESOURCE_EXHAUSTED).
    #[error("provider-service is throttling: {message}")]
    ProviderThrottled {
        message: String,
        retry_after: Option<Duration>,
        #[source]
        source: Option<Cause>,
    },
    /// provider-service could not be reached or is not ready (UNAVAILABLE, DEADLINE_EXCEEDED, connect errors).
    #[error("provider-service is unavailable: {message}")]
    ProviderUnavailable {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// The call was not made: the circuit breaker holds calls back while provider-service or a cloud is down
    /// (provider-client's `breaker`). Not a failure of this PeerPod; retried once the breaker's probe may have
    /// closed it.
    #[error("{0}")]
    CircuitOpen(Held),
    /// provider-service answered with an unexpected error (INTERNAL, UNKNOWN, ...).
    #[error("provider-service failed: {message}")]
    ProviderFailed {
        message: String,
        #[source]
        source: Option<Cause>,
    },
    /// provider-service works, the cloud behind it failed, as provider-service's `google.rpc.ErrorInfo`
    /// names it: unreachable or answering 5xx (`CloudUnavailable`), throttling (`CloudThrottled`). Retried with
    /// backoff (after the cloud's delay when it gave one); the circuit breaker counts it against that cloud.
    #[error("the cloud failed ({reason}): {message}")]
    CloudFailed {
        reason: FailureReason,
        message: String,
        retry_after: Option<Duration>,
        #[source]
        source: Option<Cause>,
    },
    /// Whether cloud-api-adaptor runs in developer mode cannot be read (its ConfigMap is unreadable, or its
    /// `PODVM_DEVELOPER_MODE` is not a boolean): no VM is deleted that the mode might be keeping (fail closed);
    /// retried with backoff, and at once when the mode becomes known.
    #[error(
        "cloud-api-adaptor's developer mode is unknown (its ConfigMap cannot be read, or PODVM_DEVELOPER_MODE is not \
         a boolean); the VM is not deleted while the mode might be keeping it"
    )]
    DeveloperModeUnknown,
    /// Somebody changed the finalizers between our read and our patch; the next pass sees the new state.
    #[error("finalizers changed concurrently; will re-read")]
    FinalizerConflict,
    /// A Kubernetes API call failed.
    #[error("Kubernetes API call failed: {0}")]
    Kube(#[from] kube::Error),
    /// The chart's ValidatingAdmissionPolicyBinding that reads the count of PeerPods holding the finalizer
    /// (`in_use`) is missing: no protection is installed, or someone removed it.
    #[error(
        "no ValidatingAdmissionPolicyBinding {0} owns the count of PeerPods holding the finalizer"
    )]
    InUseBindingMissing(String),
    /// The Lease could not be created or kept.
    #[error("leader election failed: {0}")]
    LeaderElection(#[source] peerpods_runtime::Error),
    /// A setting makes no sense (for example a provider endpoint that is not a URI); `source` is the error that
    /// said so (the provider-service client's), if any.
    #[error("invalid configuration: {}", with_cause(message, source))]
    Config {
        message: String,
        #[source]
        source: Option<Cause>,
    },
}

/// Longest message a condition or an Event carries: enough for a person to read what failed; a dump of a
/// nested error's internals (a transport error's `Debug`, a cloud's whole answer) stays in the log.
pub const MESSAGE_MAX_CHARS: usize = 256;

/// `message` cut to [`MESSAGE_MAX_CHARS`] characters (never inside a character), ending in `…` when cut.
pub fn human_message(message: &str) -> String {
    match message.char_indices().nth(MESSAGE_MAX_CHARS - 1) {
        Some((end, _)) if message[end..].chars().nth(1).is_some() => {
            format!("{}…", &message[..end])
        }
        _ => message.to_owned(),
    }
}

impl Error {
    /// [`Error::Config`] that no other error caused.
    pub fn config(message: impl Into<String>) -> Self {
        Error::Config {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Config`]: `message` names the setting (empty: the cause says it all), `source` is the error that
    /// refused it.
    pub fn config_from(message: impl Into<String>, source: impl Into<Cause>) -> Self {
        Error::Config {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// Stable, CamelCase reason for conditions, Events and metric labels: [`Error::cleaned_reason`]'s string.
    pub fn reason(&self) -> &'static str {
        self.cleaned_reason().as_str()
    }

    /// The reason the Cleaned condition records for this error: provider-service's do-not-delete refusal holds
    /// the cleanup as the annotation does; any other error is a failure under its own reason.
    pub fn cleaned_reason(&self) -> CleanedReason {
        use FailureReason as F;
        CleanedReason::Failed(match self {
            Error::InstanceProtected { .. } => return CleanedReason::DoNotDelete,
            Error::InvalidInstance(_) => F::InvalidInstance,
            Error::ProviderRejected { .. } => F::ProviderRejected,
            Error::ProviderPrecondition { .. } => F::ProviderPrecondition,
            Error::ProviderRefused { reason, .. } | Error::CloudFailed { reason, .. } => *reason,
            Error::ProviderUnauthorized { .. } => F::ProviderUnauthorized,
            Error::ProviderThrottled { .. } => F::ProviderThrottled,
            Error::ProviderUnavailable { .. } => F::ProviderUnavailable,
            Error::ProviderFailed { .. } => F::ProviderFailed,
            Error::CircuitOpen { .. } => F::CircuitOpen,
            Error::FinalizerConflict => F::FinalizerConflict,
            Error::DeveloperModeUnknown => F::DeveloperModeUnknown,
            Error::Kube(_) => F::KubernetesApiError,
            Error::InUseBindingMissing(_) => F::InUseBindingMissing,
            Error::Config { .. } => F::InvalidConfiguration,
            Error::LeaderElection(_) => F::LeaderElection,
        })
    }

    /// Errors that the same request can never fix by itself. They are retried only at the backoff cap, so a
    /// fixed configuration is eventually picked up without hammering anything meanwhile.
    pub fn is_permanent(&self) -> bool {
        matches!(
            self,
            Error::InvalidInstance(_)
                | Error::ProviderRejected { .. }
                | Error::ProviderPrecondition { .. }
                | Error::InstanceProtected { .. }
                | Error::ProviderRefused {
                    permanent: true,
                    ..
                }
                | Error::Config { .. }
        )
    }

    /// Whether provider-service or the cloud behind it asked us to slow down: a rate, not an outage.
    pub fn is_throttling(&self) -> bool {
        match self {
            Error::ProviderThrottled { .. } => true,
            Error::CloudFailed { reason, .. } => *reason == FailureReason::CloudThrottled,
            _ => false,
        }
    }

    /// The earliest retry the other side asked for, if it did.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Error::ProviderThrottled { retry_after, .. }
            | Error::CloudFailed { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_message_is_cut_at_a_character_with_an_ellipsis() {
        let long = "é".repeat(300);
        let cut = human_message(&long);
        assert_eq!(cut.chars().count(), MESSAGE_MAX_CHARS);
        assert!(cut.ends_with("é…"), "{cut}");
        // Exactly at the limit, and below: kept whole.
        let exact = "x".repeat(MESSAGE_MAX_CHARS);
        assert_eq!(human_message(&exact), exact);
        assert_eq!(human_message("short"), "short");
        assert_eq!(human_message(""), "");
    }

    #[test]
    fn wrapped_errors_are_the_source_and_the_texts_are_unchanged() {
        use std::error::Error as _;
        let lease = peerpods_runtime::Error::LeaderElection {
            message: "the Lease call timeout must be above zero".into(),
            source: None,
        };
        let text = lease.to_string();
        let error = Error::LeaderElection(lease);
        assert_eq!(error.to_string(), format!("leader election failed: {text}"));
        assert_eq!(error.source().map(ToString::to_string), Some(text));

        // The provider-service client's refusal of its settings: the same text as when it was a string.
        let refused =
            peerpods_provider_client::connect(&peerpods_provider_client::ProviderClientConfig {
                endpoint: "https://provider-service:50051".into(),
                ..Default::default()
            });
        let Err(client) = refused else {
            panic!("an https endpoint without a CA file is refused");
        };
        let text = client.to_string();
        let config = Error::config_from("", client);
        assert_eq!(config.to_string(), format!("invalid configuration: {text}"));
        assert!(
            config
                .source()
                .and_then(|s| s.downcast_ref::<peerpods_provider_client::Error>())
                .is_some(),
            "{config}"
        );
        assert_eq!(config.reason(), "InvalidConfiguration");
        assert!(config.is_permanent());
        let own = Error::config("cluster tag \"x\" is not KEY=VALUE");
        assert!(own.source().is_none());
    }
}
