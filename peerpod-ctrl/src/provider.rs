//! The calls this controller makes to provider-service, in domain terms: gRPC status codes become
//! [`Error`] variants, protobuf messages become plain values. Nothing else in the crate sees prost types.

use std::collections::BTreeMap;
use std::time::Duration;

use peerpods_proto::v1::{
    DeleteInstanceRequest, DeleteResult, ListInstancesRequest, ListProvidersRequest, Requester,
};
use tonic::Code;

use crate::Error;

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
    pub fn reason(self) -> &'static str {
        match self {
            Deleted::Deleted => "InstanceDeleted",
            Deleted::AlreadyGone => "InstanceAlreadyGone",
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
    /// provider-service is still deleting the VM (the delete runs on there whether or not we wait):
    /// ask again after `retry_after` (its advice, when it gave one). Not gone: the finalizer stays.
    InProgress { retry_after: Option<Duration> },
}

/// A VM as provider-service lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instance {
    pub instance_id: String,
    pub created: Option<jiff::Timestamp>,
    /// The instance's tags (labels); empty when the provider has none.
    pub tags: BTreeMap<String, String>,
}

/// On whose behalf a call is made; provider-service logs it for audit.
#[derive(Debug, Clone, Default)]
pub struct About<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub reason: &'a str,
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
            .map_err(|e| Error::Config(e.to_string()))
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
                reason: about.reason.to_string(),
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
            }),
            // Never treat an answer we do not understand as "gone": that could leak a VM.
            DeleteResult::Unspecified => Err(Error::ProviderFailed(
                "DeleteInstance answered without a result".into(),
            )),
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
            })
            .collect())
    }
}

/// `google.rpc.ErrorInfo` reason of provider-service's refusal to delete a VM tagged do-not-delete.
pub const REASON_DO_NOT_DELETE: &str = "DoNotDelete";

/// The refusals provider-service names (`ErrorInfo.reason`, provider.proto) that get a reason of their own.
fn refusal_reason(reason: &str) -> Option<&'static str> {
    [
        "NotOwnedByCluster",
        "ProviderNotConfigured",
        "CloudUnauthenticated",
    ]
    .into_iter()
    .find(|known| *known == reason)
}

/// Maps a gRPC status to the domain error, following the status contract in provider.proto.
pub fn status_error(status: &tonic::Status) -> Error {
    use tonic_types::StatusExt;
    let message = format!("{:?}: {}", status.code(), status.message());
    let reason = status
        .get_error_details()
        .error_info()
        .map(|i| i.reason.clone());
    if reason.as_deref() == Some(REASON_DO_NOT_DELETE) {
        return Error::InstanceProtected(message);
    }
    // Only refusals of a precondition: PERMISSION_DENIED stays ProviderUnauthorized, which the circuit
    // breaker counts against provider-service, and INVALID_ARGUMENT stays ProviderRejected.
    if let Some(reason) = reason.as_deref().and_then(refusal_reason)
        && status.code() == Code::FailedPrecondition
    {
        return Error::ProviderRefused {
            reason,
            message,
            // A configuration or a guard does not change by itself.
            permanent: true,
        };
    }
    match status.code() {
        Code::InvalidArgument => Error::ProviderRejected(message),
        Code::FailedPrecondition => Error::ProviderPrecondition(message),
        Code::ResourceExhausted => Error::ProviderThrottled {
            retry_after: peerpods_provider_client::retry_after(status),
            message,
        },
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled => {
            Error::ProviderUnavailable(message)
        }
        Code::Unauthenticated | Code::PermissionDenied => Error::ProviderUnauthorized(message),
        _ => Error::ProviderFailed(message),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::{ErrorDetails, StatusExt};

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
                REASON_DO_NOT_DELETE,
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
}
