//! provider-service, as this controller calls it: the shared domain client ([`ProviderService`]) under this
//! controller's name, and its error answers ([`CallError`]) in this controller's terms: who failed becomes an
//! [`Error`] variant with its condition reason and retry class. Nothing else in the crate sees prost types.

use std::collections::BTreeMap;

use peerpods_provider_client::{CallError, CloudFailure, Failure, ProviderService, Refusal};
use peerpods_runtime::Cause;

use crate::Error;
use crate::error::human_message;
use peerpods_api::peerpod::{CleanedReason, FailureReason};

pub use peerpods_provider_client::{
    About, DeleteAnswer, Deleted, Instance, ProviderClient, ProviderClientConfig, Waiting,
};

/// The requester's component on every call.
const COMPONENT: &str = "peerpod-ctrl";

/// The condition and Event reason of a confirmed delete.
pub fn deleted_reason(outcome: Deleted) -> CleanedReason {
    match outcome {
        Deleted::Deleted => CleanedReason::InstanceDeleted,
        Deleted::AlreadyGone => CleanedReason::InstanceAlreadyGone,
    }
}

/// provider-service client. Cheap to clone: clones share one connection.
#[derive(Clone)]
pub struct Provider {
    service: ProviderService,
}

impl Provider {
    pub fn new(client: ProviderClient) -> Self {
        Provider {
            service: ProviderService::new(client, COMPONENT),
        }
    }

    /// The same client with a circuit breaker of its own in front of its deletes: while provider-service or a
    /// cloud is down, one delete probes it and the others fail at once with [`Error::CircuitOpen`].
    pub fn with_breaker(&self) -> Self {
        Provider {
            service: self.service.with_breaker(),
        }
    }

    /// Connects lazily: the controller starts while provider-service is down, and calls fail with
    /// [`Error::ProviderUnavailable`] until it is up.
    pub fn connect(config: &ProviderClientConfig) -> Result<Self, Error> {
        peerpods_provider_client::connect(config)
            .map(Provider::new)
            .map_err(|e| Error::config_from("", e))
    }

    /// Deletes one VM, or asks how the delete provider-service is running for it goes. Only
    /// [`DeleteAnswer::Gone`] lets the caller release its finalizer; an error or
    /// [`DeleteAnswer::InProgress`] keeps it in place.
    pub async fn delete_instance(
        &self,
        provider: &str,
        instance_id: &str,
        about: About<'_>,
    ) -> Result<DeleteAnswer, Error> {
        Ok(self
            .service
            .delete_instance(provider, instance_id, about)
            .await?)
    }

    /// Names of the providers configured on provider-service.
    pub async fn providers(&self) -> Result<Vec<String>, Error> {
        Ok(self.service.providers().await?)
    }

    /// VMs of `provider` carrying every tag of `selector`.
    pub async fn instances(
        &self,
        provider: &str,
        selector: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, Error> {
        Ok(self.service.instances(provider, selector).await?)
    }
}

/// The reason this controller records for a refusal provider-service named: its own word (a test ties each
/// pair). All of them are configuration or guards that do not change by themselves.
fn refusal_reason(refusal: Refusal) -> FailureReason {
    match refusal {
        Refusal::NotOwnedByCluster => FailureReason::NotOwnedByCluster,
        Refusal::ProviderNotConfigured => FailureReason::ProviderNotConfigured,
        Refusal::CloudUnauthenticated => FailureReason::CloudUnauthenticated,
        // The cloud refused provider-service's own credentials a permission: the cloud policy needs fixing,
        // neither this controller's credentials nor provider-service's health.
        Refusal::CloudPermissionDenied => FailureReason::CloudPermissionDenied,
    }
}

/// A failure of the cloud behind provider-service: the condition says the cloud failed, not provider-service.
fn cloud_failure_reason(failure: CloudFailure) -> FailureReason {
    match failure {
        CloudFailure::Unavailable => FailureReason::CloudUnavailable,
        CloudFailure::Throttled => FailureReason::CloudThrottled,
    }
}

/// An error answer in this controller's terms ([`Failure`] says who failed): this controller's request
/// (`ProviderRejected`, permanent), provider-service (`Provider*`) or the cloud behind it (`Cloud*`). The message
/// is cut to a human size ([`crate::error::human_message`]); the status, when there was one, is the source.
impl From<CallError> for Error {
    fn from(call: CallError) -> Self {
        let (failure, message, status) = match call {
            CallError::Failed {
                failure,
                message,
                status,
            } => (failure, message, status),
            CallError::Held(held) => return Error::CircuitOpen(held),
        };
        let message = human_message(&message);
        let source = status.map(Cause::from);
        match failure {
            Failure::Protected => Error::InstanceProtected { message, source },
            Failure::Refused(refusal) => Error::ProviderRefused {
                reason: refusal_reason(refusal),
                message,
                // A configuration or a guard does not change by itself.
                permanent: true,
                source,
            },
            Failure::Cloud {
                failure,
                retry_after,
            } => Error::CloudFailed {
                reason: cloud_failure_reason(failure),
                message,
                retry_after,
                source,
            },
            Failure::Rejected => Error::ProviderRejected { message, source },
            Failure::Precondition => Error::ProviderPrecondition { message, source },
            Failure::Throttled { retry_after } => Error::ProviderThrottled {
                retry_after,
                message,
                source,
            },
            Failure::Unavailable => Error::ProviderUnavailable { message, source },
            Failure::Unauthorized => Error::ProviderUnauthorized { message, source },
            Failure::Failed => Error::ProviderFailed { message, source },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tonic::Code;
    use tonic_types::{ErrorDetails, StatusExt};

    /// How this controller reads an error answer.
    fn status_error(status: &tonic::Status) -> Error {
        Error::from(CallError::from(status.clone()))
    }

    #[test]
    fn a_named_refusal_is_recorded_in_provider_services_words() {
        for refusal in [
            Refusal::NotOwnedByCluster,
            Refusal::ProviderNotConfigured,
            Refusal::CloudUnauthenticated,
            Refusal::CloudPermissionDenied,
        ] {
            assert_eq!(refusal_reason(refusal).as_str(), refusal.reason().as_str());
        }
        assert_eq!(
            deleted_reason(Deleted::Deleted),
            CleanedReason::InstanceDeleted
        );
        assert_eq!(
            deleted_reason(Deleted::AlreadyGone),
            CleanedReason::InstanceAlreadyGone
        );
    }

    #[test]
    fn an_unreadable_answer_is_a_failure_of_provider_service_without_a_status() {
        use std::error::Error as _;
        let error = Error::from(CallError::unreadable(
            "DeleteInstance answered without a result",
        ));
        assert_eq!(error.reason(), "ProviderFailed");
        assert!(error.source().is_none());
        assert!(error.to_string().contains("without a result"), "{error}");
    }

    #[test]
    fn the_status_is_the_source_and_the_transport_error_under_it_is_kept() {
        use std::error::Error as _;
        // What tonic hands back when the connect fails: a terse message, the reason in the source.
        let mut status = tonic::Status::unavailable("tcp connect error");
        status.set_source(std::sync::Arc::new(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "Connection refused (os error 111)",
        )));
        let error = status_error(&status);
        assert_eq!(error.reason(), "ProviderUnavailable");
        assert_eq!(
            error.to_string(),
            "provider-service is unavailable: Unavailable: tcp connect error"
        );
        let answer = error
            .source()
            .and_then(|s| s.downcast_ref::<tonic::Status>())
            .expect("the gRPC status is the source");
        assert_eq!(answer.code(), Code::Unavailable);
        let refused = error
            .source()
            .and_then(|s| s.source())
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the transport's error is under the status");
        assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);

        // Every class built from an answer keeps it.
        for status in [
            tonic::Status::invalid_argument("instance_id: bad"),
            tonic::Status::failed_precondition("aws not configured"),
            tonic::Status::resource_exhausted("slow down"),
            tonic::Status::unauthenticated("no token"),
            tonic::Status::not_found("x"),
        ] {
            let error = status_error(&status);
            assert!(error.source().is_some(), "{}: {error}", error.reason());
        }
    }

    #[test]
    fn status_codes_map_to_retry_classes() {
        assert!(status_error(&tonic::Status::invalid_argument("instance_id: bad")).is_permanent());
        assert!(
            status_error(&tonic::Status::failed_precondition("aws not configured")).is_permanent()
        );
        let unavailable = status_error(&tonic::Status::unavailable("down"));
        assert_eq!(unavailable.reason(), "ProviderUnavailable");
        assert!(!unavailable.is_permanent());
        assert_eq!(
            status_error(&tonic::Status::unauthenticated("no token")).reason(),
            "ProviderUnauthorized"
        );
        // NOT_FOUND is not in the delete contract; it must never be mistaken for "gone".
        assert_eq!(
            status_error(&tonic::Status::not_found("x")).reason(),
            "ProviderFailed"
        );
    }

    #[test]
    fn a_do_not_delete_refusal_is_a_permanent_hold_with_its_own_reason() {
        let status = tonic::Status::with_error_details(
            Code::FailedPrecondition,
            "instance vm-1 is marked do-not-delete",
            ErrorDetails::with_error_info(
                "DoNotDelete",
                "provider.peerpods.io",
                std::collections::HashMap::new(),
            ),
        );
        let error = status_error(&status);
        assert_eq!(error.reason(), "DoNotDelete");
        assert!(error.is_permanent());
        assert!(error.to_string().contains("vm-1"), "{error}");
        // Another FAILED_PRECONDITION stays what it was.
        let other = tonic::Status::with_error_details(
            Code::FailedPrecondition,
            "not configured",
            ErrorDetails::with_error_info(
                "ProviderNotConfigured",
                "provider.peerpods.io",
                std::collections::HashMap::new(),
            ),
        );
        assert_eq!(status_error(&other).reason(), "ProviderNotConfigured");
        let unnamed = tonic::Status::failed_precondition("not configured");
        assert_eq!(status_error(&unnamed).reason(), "ProviderPrecondition");
    }

    #[test]
    fn each_named_refusal_keeps_its_reason_and_retry_class() {
        let refusal = |code, reason: &str| {
            status_error(&tonic::Status::with_error_details(
                code,
                "refused",
                ErrorDetails::with_error_info(
                    reason,
                    "provider.peerpods.io",
                    std::collections::HashMap::new(),
                ),
            ))
        };
        let guard = refusal(Code::FailedPrecondition, "NotOwnedByCluster");
        assert_eq!(guard.reason(), "NotOwnedByCluster");
        assert!(guard.is_permanent());
        let credentials = refusal(Code::FailedPrecondition, "CloudUnauthenticated");
        assert_eq!(credentials.reason(), "CloudUnauthenticated");
        assert!(credentials.is_permanent());
        assert_eq!(
            refusal(Code::InvalidArgument, "UnknownProvider").reason(),
            "ProviderRejected"
        );
        // Refusals of the caller stay in the class the circuit breaker counts.
        assert_eq!(
            refusal(Code::PermissionDenied, "CallerNotAllowed").reason(),
            "ProviderUnauthorized"
        );
        // A reason this controller does not know keeps the class of its status code.
        assert_eq!(
            refusal(Code::FailedPrecondition, "SomethingNew").reason(),
            "ProviderPrecondition"
        );
    }

    #[test]
    fn throttling_carries_the_retry_delay() {
        let status = tonic::Status::with_error_details(
            Code::ResourceExhausted,
            "slow down",
            ErrorDetails::with_retry_info(Some(Duration::from_secs(7))),
        );
        let error = status_error(&status);
        assert_eq!(error.reason(), "ProviderThrottled");
        assert_eq!(error.retry_after(), Some(Duration::from_secs(7)));
    }
    fn with_info(code: Code, reason: &str, retry: Option<Duration>) -> tonic::Status {
        let mut details = ErrorDetails::with_error_info(
            reason,
            "provider.peerpods.io",
            std::collections::HashMap::new(),
        );
        if retry.is_some() {
            details.set_retry_info(retry);
        }
        tonic::Status::with_error_details(code, "from provider-service", details)
    }

    #[test]
    fn each_reason_says_who_failed() {
        // The cloud behind a working provider-service: Cloud*, counted against that cloud.
        let cloud_down = status_error(&with_info(Code::Unavailable, "CloudUnavailable", None));
        assert_eq!(cloud_down.reason(), "CloudUnavailable");
        assert!(!cloud_down.is_permanent());
        let throttled = status_error(&with_info(
            Code::ResourceExhausted,
            "Throttled",
            Some(Duration::from_secs(3)),
        ));
        assert_eq!(throttled.reason(), "CloudThrottled");
        assert_eq!(throttled.retry_after(), Some(Duration::from_secs(3)));
        // provider-service itself: shutting down, shedding load, or not reachable at all.
        for status in [
            with_info(Code::Unavailable, "ShuttingDown", None),
            tonic::Status::unavailable("tcp connect error"),
        ] {
            let error = status_error(&status);
            assert_eq!(error.reason(), "ProviderUnavailable", "{status:?}");
        }
        assert_eq!(
            status_error(&with_info(Code::ResourceExhausted, "Overloaded", None)).reason(),
            "ProviderThrottled"
        );
        // The cloud refusing provider-service's own permissions is a cloud policy to fix, not this
        // controller's credentials: its own reason, and permanent.
        let policy = status_error(&with_info(
            Code::PermissionDenied,
            "CloudPermissionDenied",
            None,
        ));
        assert_eq!(policy.reason(), "CloudPermissionDenied");
        assert!(policy.is_permanent());
        // This controller (the caller) refused: provider-service's ProviderUnauthorized.
        assert_eq!(
            status_error(&with_info(Code::Unauthenticated, "Unauthenticated", None)).reason(),
            "ProviderUnauthorized"
        );
    }

    #[test]
    fn a_cut_transport_is_provider_service_unreachable_not_its_failure() {
        // What the client's transport makes of a connection cut mid-call: no ErrorInfo.
        let cut = status_error(&tonic::Status::unknown(
            "transport error: connection reset by peer",
        ));
        assert_eq!(cut.reason(), "ProviderUnavailable");
        assert!(!cut.is_permanent());
        let broken = status_error(&tonic::Status::internal("h2 protocol error"));
        assert_eq!(broken.reason(), "ProviderUnavailable");
        // provider-service's own INTERNAL carries its ErrorInfo: it failed.
        let internal = status_error(&with_info(Code::Internal, "Internal", None));
        assert_eq!(internal.reason(), "ProviderFailed");
    }

    #[test]
    fn malformed_and_oversized_requests_are_permanent() {
        for status in [
            with_info(Code::InvalidArgument, "InvalidArgument", None),
            with_info(Code::OutOfRange, "MessageTooLarge", None),
            tonic::Status::out_of_range("instance_id: longer than 1024 bytes"),
        ] {
            let error = status_error(&status);
            assert_eq!(error.reason(), "ProviderRejected", "{status:?}");
            assert!(error.is_permanent(), "{status:?}");
        }
    }

    #[test]
    fn condition_messages_are_human_sized() {
        let dump = format!(
            "transport error: {}",
            "Os { code: 104, kind: ConnectionReset } ".repeat(20)
        );
        let error = status_error(&tonic::Status::unavailable(dump.clone()));
        let message = error.to_string();
        assert!(message.chars().count() <= 256 + 40, "{message}");
        assert!(message.ends_with('…'), "{message}");
        // A short message is kept whole.
        let short = status_error(&tonic::Status::unavailable("down"));
        assert_eq!(
            short.to_string(),
            "provider-service is unavailable: Unavailable: down"
        );
    }
}
