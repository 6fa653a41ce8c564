//! The calls this controller makes to provider-service, in domain terms: gRPC status codes become
//! [`Error`] variants, protobuf messages become plain values. Nothing else in the crate sees prost types.

use std::collections::BTreeMap;
use std::time::Duration;

use peerpods_proto::v1::{
    DeleteInstanceRequest, DeleteResult, DeleteWait, ListInstancesRequest, ListProvidersRequest,
    Requester,
};
use peerpods_proto::{ErrorReason, RequesterReason};
use tonic::Code;

use peerpods_runtime::Cause;

use crate::Error;
use crate::error::human_message;
use peerpods_api::peerpod::CleanedReason;
use peerpods_api::peerpod::FailureReason;

pub use peerpods_provider_client::{ProviderClient, ProviderClientConfig};

/// How provider-service answered a successful delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deleted {
    /// The VM existed and is deleted now.
    Deleted,
    /// The VM did not exist (any more).
    AlreadyGone,
}

impl Deleted {
    /// Event and condition reason.
    pub fn reason(self) -> CleanedReason {
        match self {
            Deleted::Deleted => CleanedReason::InstanceDeleted,
            Deleted::AlreadyGone => CleanedReason::InstanceAlreadyGone,
        }
    }

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
    /// `retry_after` (its advice, when it gave one). Not gone: the finalizer stays.
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

/// provider-service client. Cheap to clone: clones share one connection. Each call carries the token and
/// the current trace context (see `peerpods_runtime::client`), so a reconcile and the cloud call it causes
/// are one trace.
#[derive(Clone)]
pub struct Provider {
    client: ProviderClient,
}

const COMPONENT: &str = "peerpod-ctrl";

impl Provider {
    pub fn new(client: ProviderClient) -> Self {
        Provider { client }
    }

    /// Connects lazily: the controller starts while provider-service is down, and calls fail with
    /// [`Error::ProviderUnavailable`] until it is up.
    pub fn connect(config: &ProviderClientConfig) -> Result<Self, Error> {
        peerpods_provider_client::connect(config)
            .map(Provider::new)
            .map_err(|e| Error::config_from("", e))
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        tonic::Request::new(message)
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
        let request = self.request(DeleteInstanceRequest {
            cloud_provider: provider.to_string(),
            instance_id: instance_id.to_string(),
            requester: Some(Requester {
                component: COMPONENT.to_string(),
                namespace: about.namespace.to_string(),
                name: about.name.to_string(),
                reason: about.reason.as_str().to_owned(),
            }),
            // This controller re-asks with backoff until the VM is confirmed gone.
            accept_in_progress: true,
        });
        let response = self
            .client
            .clone()
            .delete_instance(request)
            .await
            .map_err(|s| status_error(&s))?
            .into_inner();
        match response.result() {
            DeleteResult::Deleted => Ok(DeleteAnswer::Gone(Deleted::Deleted)),
            DeleteResult::AlreadyGone => Ok(DeleteAnswer::Gone(Deleted::AlreadyGone)),
            DeleteResult::InProgress => Ok(DeleteAnswer::InProgress {
                retry_after: response
                    .retry_after
                    .and_then(|d| Duration::try_from(d).ok()),
                waiting: match response.waiting() {
                    DeleteWait::NotYetVisible => Waiting::NotYetVisible {
                        unknown_for: response
                            .unknown_for
                            .and_then(|d| Duration::try_from(d).ok()),
                    },
                    // What provider-service always waited for before it said.
                    DeleteWait::CloudDeleting | DeleteWait::Unspecified => Waiting::CloudDeleting,
                },
            }),
            // Never treat an answer we do not understand as "gone": that could leak a VM.
            DeleteResult::Unspecified => Err(Error::ProviderFailed {
                message: "DeleteInstance answered without a result".into(),
                source: None,
            }),
        }
    }

    /// Names of the providers configured on provider-service.
    pub async fn providers(&self) -> Result<Vec<String>, Error> {
        let response = self
            .client
            .clone()
            .list_providers(self.request(ListProvidersRequest {}))
            .await
            .map_err(|s| status_error(&s))?
            .into_inner();
        Ok(response.providers.into_iter().map(|p| p.name).collect())
    }

    /// VMs of `provider` carrying every tag of `selector`.
    pub async fn instances(
        &self,
        provider: &str,
        selector: &BTreeMap<String, String>,
    ) -> Result<Vec<Instance>, Error> {
        let response = self
            .client
            .clone()
            .list_instances(
                self.request(ListInstancesRequest {
                    cloud_provider: provider.to_string(),
                    tag_selector: selector
                        .iter()
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect(),
                }),
            )
            .await
            .map_err(|s| status_error(&s))?
            .into_inner();
        Ok(response
            .instances
            .into_iter()
            .map(|i| Instance {
                instance_id: i.instance_id,
                created: i
                    .create_time
                    .and_then(|t| jiff::Timestamp::new(t.seconds, t.nanos).ok()),
                tags: i.tags.into_iter().collect(),
                name: i.name,
            })
            .collect())
    }
}

/// The refusals provider-service names (`ErrorInfo.reason`, provider.proto) that get a reason of their own, with
/// the status code each comes with. All of them are configuration or guards that do not change by themselves.
fn refusal_reason(code: Code, reason: ErrorReason) -> Option<FailureReason> {
    use ErrorReason as R;
    // The condition reason repeats provider-service's word (a test ties each pair).
    let (refused_with, recorded) = match reason {
        R::NotOwnedByCluster => (Code::FailedPrecondition, FailureReason::NotOwnedByCluster),
        R::ProviderNotConfigured => (
            Code::FailedPrecondition,
            FailureReason::ProviderNotConfigured,
        ),
        R::CloudUnauthenticated => (
            Code::FailedPrecondition,
            FailureReason::CloudUnauthenticated,
        ),
        // The cloud refused provider-service's own credentials a permission: the cloud policy needs fixing,
        // neither this controller's credentials nor provider-service's health.
        R::CloudPermissionDenied => (Code::PermissionDenied, FailureReason::CloudPermissionDenied),
        // A hold (read before any refusal), the cloud's failures, and what the status code alone says.
        R::DoNotDelete
        | R::CloudUnavailable
        | R::Throttled
        | R::InvalidArgument
        | R::UnknownProvider
        | R::InvalidConfig
        | R::Unauthenticated
        | R::AuthUnavailable
        | R::CallerNotAllowed
        | R::MethodNotAllowed
        | R::UnknownMethod
        | R::NodeNotBound
        | R::NotOnCallersNode
        | R::PlacementUnavailable
        | R::DeleteInProgress
        | R::NotYetVisible
        | R::TooManyDeletes
        | R::ShuttingDown
        | R::Overloaded
        | R::MethodNotFound
        | R::MalformedRequest
        | R::MessageTooLarge
        | R::Timeout
        | R::Tls
        | R::Io
        | R::Internal => return None,
    };
    (code == refused_with).then_some(recorded)
}

/// Reasons provider-service gives for a failure of the cloud behind it (provider.proto), and the reason this
/// controller records for each: the condition says the cloud failed, not provider-service.
fn cloud_failure_reason(code: Code, reason: ErrorReason) -> Option<FailureReason> {
    match (code, reason) {
        (Code::Unavailable, ErrorReason::CloudUnavailable) => Some(FailureReason::CloudUnavailable),
        (Code::ResourceExhausted, ErrorReason::Throttled) => Some(FailureReason::CloudThrottled),
        _ => None,
    }
}

/// Maps a gRPC status to the domain error, following the status contract in provider.proto. The reason says
/// who failed: this controller's request (`ProviderRejected`, permanent), provider-service (`Provider*`) or the
/// cloud behind it (`Cloud*`). The message is cut to a human size ([`crate::error::human_message`]).
pub fn status_error(status: &tonic::Status) -> Error {
    use tonic_types::StatusExt;
    let code = status.code();
    let message = human_message(&format!("{code:?}: {}", status.message()));
    let info = status.get_error_details().error_info().cloned();
    let reason = info.as_ref().and_then(|i| ErrorReason::parse(&i.reason));
    // The status itself is the source: a status made by this side's transport carries its error under it.
    let source = Some(Cause::from(status.clone()));
    if reason == Some(ErrorReason::DoNotDelete) {
        return Error::InstanceProtected { message, source };
    }
    // Only named refusals of a precondition or of the cloud's permission: a caller's PERMISSION_DENIED stays
    // ProviderUnauthorized, which the circuit breaker counts against provider-service, and INVALID_ARGUMENT
    // stays ProviderRejected.
    if let Some(reason) = reason.and_then(|r| refusal_reason(code, r)) {
        return Error::ProviderRefused {
            reason,
            message,
            // A configuration or a guard does not change by itself.
            permanent: true,
            source,
        };
    }
    if let Some(reason) = reason.and_then(|r| cloud_failure_reason(code, r)) {
        return Error::CloudFailed {
            reason,
            message,
            retry_after: peerpods_provider_client::retry_after(status),
            source,
        };
    }
    match code {
        // OUT_OF_RANGE: a field (or the whole message) larger than provider-service takes. The same request
        // fails the same way every time: permanent, never a hot loop.
        Code::InvalidArgument | Code::OutOfRange => Error::ProviderRejected { message, source },
        Code::FailedPrecondition => Error::ProviderPrecondition { message, source },
        Code::ResourceExhausted => Error::ProviderThrottled {
            retry_after: peerpods_provider_client::retry_after(status),
            message,
            source,
        },
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            Error::ProviderUnavailable { message, source }
        }
        Code::Unauthenticated | Code::PermissionDenied => {
            Error::ProviderUnauthorized { message, source }
        }
        // provider-service puts an ErrorInfo on every error it answers (provider.proto), its framework's
        // included: an UNKNOWN or INTERNAL without one was made on this side of the connection, by the
        // transport (a connection cut mid-call, a broken HTTP/2 stream). provider-service is not reachable
        // then, it did not fail.
        Code::Unknown | Code::Internal if info.is_none() => {
            Error::ProviderUnavailable { message, source }
        }
        _ => Error::ProviderFailed { message, source },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

    #[test]
    fn a_named_refusal_is_recorded_in_provider_services_words_and_only_with_its_code() {
        let codes = [
            Code::FailedPrecondition,
            Code::PermissionDenied,
            Code::Unavailable,
            Code::ResourceExhausted,
        ];
        let mut recorded = Vec::new();
        for reason in ErrorReason::ALL {
            for code in codes {
                if let Some(r) = refusal_reason(code, reason) {
                    assert_eq!(r.as_str(), reason.as_str());
                    recorded.push((code, r));
                }
            }
        }
        assert_eq!(
            recorded,
            [
                (Code::FailedPrecondition, FailureReason::NotOwnedByCluster),
                (
                    Code::FailedPrecondition,
                    FailureReason::ProviderNotConfigured
                ),
                (
                    Code::FailedPrecondition,
                    FailureReason::CloudUnauthenticated
                ),
                (Code::PermissionDenied, FailureReason::CloudPermissionDenied),
            ]
        );
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
        assert!(matches!(
            crate::breaker::scope_of("aws", &cloud_down),
            Some(crate::breaker::Scope::Cloud(c)) if c == "aws"
        ));
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
            assert!(matches!(
                crate::breaker::scope_of("aws", &error),
                Some(crate::breaker::Scope::ProviderService)
            ));
        }
        assert_eq!(
            status_error(&with_info(Code::ResourceExhausted, "Overloaded", None)).reason(),
            "ProviderThrottled"
        );
        // The cloud refusing provider-service's own permissions is a cloud policy to fix, not this
        // controller's credentials: its own reason, permanent, and it does not open provider-service's breaker.
        let policy = status_error(&with_info(
            Code::PermissionDenied,
            "CloudPermissionDenied",
            None,
        ));
        assert_eq!(policy.reason(), "CloudPermissionDenied");
        assert!(policy.is_permanent());
        assert!(crate::breaker::scope_of("aws", &policy).is_none());
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
            assert!(crate::breaker::scope_of("aws", &error).is_none());
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
