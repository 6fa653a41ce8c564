//! The gRPC layer: checks input limits, converts protobuf to domain types and back, maps
//! [`Error`] to status codes and records a metric per call. It knows no cloud.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pb::provider_service_server::ProviderService;
use peerpods_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::deletes::{Answer, Deletes, Wait};
use crate::error::{Error, ProviderError};
use crate::load::RateLimitedLog;
use crate::metrics::Metrics;
use crate::placement::NodeBound;
use crate::provider::{
    Capacity, DeleteOutcome, Figure, Health, Instance, Provider, Requester, TagSelector,
};
use crate::registry::SharedRegistry;

/// Longest accepted `cloud_provider`.
pub const MAX_PROVIDER_LEN: usize = 64;
/// Longest accepted `instance_id` (Azure resource ids are the longest, a few hundred bytes).
pub const MAX_INSTANCE_ID_LEN: usize = 1024;
/// Longest accepted requester field (a Kubernetes object name is at most 253 bytes).
pub const MAX_REQUESTER_FIELD_LEN: usize = 253;
/// Most entries in a tag selector, and the longest key and value (AWS's tag limits).
pub const MAX_SELECTOR_TAGS: usize = 64;
pub const MAX_TAG_KEY_LEN: usize = 128;
pub const MAX_TAG_VALUE_LEN: usize = 256;
/// Largest request message accepted. Far above any valid request, far below tonic's 4 MiB
/// default, so garbage is rejected before it is buffered.
pub const MAX_REQUEST_BYTES: usize = 64 * 1024;

pub use crate::error::{ERROR_DOMAIN, status};

/// The `ProviderService` implementation.
#[derive(Clone)]
pub struct ProviderApi {
    registry: SharedRegistry,
    metrics: Metrics,
    deletes: Deletes,
    /// Callers' mistakes (bad input, unknown names) are logged at most once per period: one
    /// client sending garbage must not flood the logs.
    refusals: Arc<RateLimitedLog>,
}

impl ProviderApi {
    /// `deletes` runs every DeleteInstance's delete (see [`crate::deletes`]).
    pub fn new(registry: SharedRegistry, metrics: Metrics, deletes: Deletes) -> Self {
        ProviderApi {
            registry,
            metrics,
            deletes,
            refusals: Arc::new(RateLimitedLog::new(crate::load::LOG_EVERY)),
        }
    }

    /// The tonic service, with the request size limit applied.
    pub fn into_service(self) -> pb::provider_service_server::ProviderServiceServer<Self> {
        pb::provider_service_server::ProviderServiceServer::new(self)
            .max_decoding_message_size(MAX_REQUEST_BYTES)
    }

    fn provider(&self, name: &str) -> Result<Arc<dyn Provider>, Error> {
        check_len("cloud_provider", name, MAX_PROVIDER_LEN)?;
        self.registry.current().get(name)
    }

    /// Records metrics for one finished call and turns the result into a gRPC answer.
    fn finish<T, E: std::borrow::Borrow<Error>>(
        &self,
        method: &'static str,
        provider: &str,
        started: Instant,
        result: Result<(T, &'static str), E>,
    ) -> Result<Response<T>, Status> {
        let (label, answer) = match result {
            Ok((body, label)) => (label.to_owned(), Ok(Response::new(body))),
            Err(e) => {
                let e: &Error = e.borrow();
                if e.is_internal() {
                    tracing::error!(error = %e, reason = e.reason(), "call failed");
                } else if e.is_wait() {
                    tracing::debug!(error = %e, reason = e.reason(), "call answered: ask again");
                } else if is_callers_mistake(e) {
                    if let Some(refused) = self.refusals.admit() {
                        tracing::warn!(error = %e, reason = e.reason(), refused, "call refused; such refusals are logged at most every 10 s");
                    }
                } else {
                    tracing::warn!(error = %e, reason = e.reason(), "call failed");
                }
                (e.reason().to_owned(), Err(status(e)))
            }
        };
        self.metrics
            .record_call(method, provider, label, started.elapsed());
        answer
    }

    /// Label for metrics: the configured provider's own name, or `unknown` so caller input
    /// never becomes a label value.
    fn provider_label(&self, name: &str) -> String {
        match self.registry.current().get(name) {
            Ok(p) => p.name().as_str().to_owned(),
            Err(_) => "unknown".to_owned(),
        }
    }
}

fn caller_of<T>(request: &Request<T>) -> String {
    request
        .extensions()
        .get::<Caller>()
        .map_or_else(|| "anonymous".to_owned(), Caller::to_string)
}

#[tonic::async_trait]
impl ProviderService for ProviderApi {
    async fn delete_instance(
        &self,
        request: Request<pb::DeleteInstanceRequest>,
    ) -> Result<Response<pb::DeleteInstanceResponse>, Status> {
        let started = Instant::now();
        let caller = caller_of(&request);
        // Whom the caps on running deletes count this one against.
        let started_by = request.extensions().get::<Caller>().cloned();
        let node_bound = request.extensions().get::<NodeBound>().cloned();
        let caller_deadline = crate::deletes::caller_deadline(request.metadata());
        let req = request.into_inner();
        let label = self.provider_label(&req.cloud_provider);
        let settings = self.deletes.settings();
        let result = async {
            let provider = self.provider(&req.cloud_provider)?;
            check_len("instance_id", &req.instance_id, MAX_INSTANCE_ID_LEN)?;
            provider.validate_instance_id(&req.instance_id)?;
            // A caller bound to its node deletes only its node's instances; asked before the
            // delete is started or joined, so it cannot join another node's either.
            if let Some(bound) = &node_bound {
                bound.may_delete(&req.instance_id).await?;
            }
            let requester = requester(req.requester.as_ref())?;
            // The delete's own span, not a child of this call's: it outlives the call, and the
            // calls that join it later only follow from it.
            let span = tracing::info_span!(
                parent: None,
                "delete_instance",
                provider = provider.name().as_str(),
                instance_id = %req.instance_id,
                caller = %caller,
                requester.component = %requester.component,
                requester.namespace = %requester.namespace,
                requester.name = %requester.name,
                requester.reason = %requester.reason,
                outcome = tracing::field::Empty,
            );
            span.follows_from(tracing::Span::current());
            let job =
                self.deletes
                    .delete_for(provider, &req.instance_id, started_by.as_ref(), span)?;
            tracing::debug!(
                instance_id = %req.instance_id,
                joined = job.joined,
                "delete started or joined"
            );
            Ok::<_, Error>(job)
        }
        .await;
        let result = match result {
            Err(e) => Err(Arc::new(e)),
            Ok(job) => match job.answer(settings.answer_window(caller_deadline)).await {
                Answer::Finished(Ok(outcome)) => delete_answer(outcome, &req, settings.retry_after),
                Answer::Finished(Err(e)) => Err(e),
                Answer::InProgress(wait) => in_progress(wait, &req, settings.retry_after),
            },
        };
        self.finish("DeleteInstance", &label, started, result)
    }

    async fn get_capacity(
        &self,
        request: Request<pb::GetCapacityRequest>,
    ) -> Result<Response<pb::GetCapacityResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let label = self.provider_label(&req.cloud_provider);
        let result = async {
            let provider = self.provider(&req.cloud_provider)?;
            Ok::<_, Error>(provider.capacity().await?)
        }
        .await
        .map(|c| {
            self.metrics.record_capacity(&label, &c);
            (capacity_to_pb(c), "ok")
        });
        self.finish("GetCapacity", &label, started, result)
    }

    async fn list_instances(
        &self,
        request: Request<pb::ListInstancesRequest>,
    ) -> Result<Response<pb::ListInstancesResponse>, Status> {
        let started = Instant::now();
        let req = request.into_inner();
        let label = self.provider_label(&req.cloud_provider);
        let result = async {
            let provider = self.provider(&req.cloud_provider)?;
            let selector = selector(req.tag_selector)?;
            Ok::<_, Error>(provider.list_instances(&selector).await?)
        }
        .await
        .map(|instances| {
            let body = pb::ListInstancesResponse {
                instances: instances.into_iter().map(instance_to_pb).collect(),
            };
            (body, "ok")
        });
        self.finish("ListInstances", &label, started, result)
    }

    async fn list_providers(
        &self,
        _request: Request<pb::ListProvidersRequest>,
    ) -> Result<Response<pb::ListProvidersResponse>, Status> {
        let started = Instant::now();
        let registry = self.registry.current();
        // The names are what callers need; health is the last check's (a stale one is refreshed
        // in the background, one check at a time), so a listing waits for no cloud beyond the
        // first check of each, and that for a few seconds at most.
        let statuses = registry.providers().map(|p| async move {
            let health = p.last_health().await.unwrap_or_else(|| Health {
                healthy: false,
                message: "not checked yet".to_owned(),
            });
            pb::ProviderStatus {
                name: p.name().as_str().to_owned(),
                healthy: health.healthy,
                message: health.message,
            }
        });
        let providers = futures::future::join_all(statuses).await;
        self.finish(
            "ListProviders",
            "all",
            started,
            Ok::<_, Error>((pb::ListProvidersResponse { providers }, "ok")),
        )
    }
}

/// A DeleteInstance answer and its metric label, or the error to answer.
type DeleteReply = Result<(pb::DeleteInstanceResponse, &'static str), Arc<Error>>;

/// The answer to `req`, whose delete ended with `outcome`: gone, or (not yet visible) a wait.
fn delete_answer(
    outcome: DeleteOutcome,
    req: &pb::DeleteInstanceRequest,
    retry_after: Duration,
) -> DeleteReply {
    let result = match outcome {
        DeleteOutcome::Deleted => pb::DeleteResult::Deleted,
        DeleteOutcome::AlreadyGone => pb::DeleteResult::AlreadyGone,
        DeleteOutcome::InProgress => return in_progress(Wait::CloudDeleting, req, retry_after),
        DeleteOutcome::NotYetVisible {
            unknown_for,
            window,
            setting,
        } => {
            let wait = Wait::NotYetVisible {
                unknown_for,
                window,
                setting,
            };
            return in_progress(wait, req, retry_after);
        }
    };
    let body = pb::DeleteInstanceResponse {
        result: result as i32,
        ..Default::default()
    };
    Ok((body, outcome.as_str()))
}

/// The answer to `req` while it waits for `wait`, with the retry advice: the service's usual
/// `retry_after`, or, not yet visible, the rest of the window when that is shorter (asked again
/// then, the answer is final). A caller that does not know IN_PROGRESS would read any answer as
/// done: it hears UNAVAILABLE with a reason of the wait's own and RetryInfo.
fn in_progress(wait: Wait, req: &pb::DeleteInstanceRequest, retry_after: Duration) -> DeleteReply {
    let instance_id = req.instance_id.clone();
    let (waiting, unknown, advice, label, refusal) = match wait {
        Wait::CloudDeleting => (
            pb::DeleteWait::CloudDeleting,
            None,
            retry_after,
            "in_progress",
            Error::DeleteInProgress {
                instance_id,
                retry_after,
            },
        ),
        Wait::NotYetVisible {
            unknown_for,
            window,
            setting,
        } => {
            let advice = retry_after.min(window.saturating_sub(unknown_for));
            (
                pb::DeleteWait::NotYetVisible,
                Some(unknown_for),
                advice,
                "not_yet_visible",
                Error::NotYetVisible {
                    instance_id,
                    unknown_for,
                    window,
                    setting,
                    retry_after: advice,
                },
            )
        }
    };
    if !req.accept_in_progress {
        return Err(Arc::new(refusal));
    }
    let body = pb::DeleteInstanceResponse {
        result: pb::DeleteResult::InProgress as i32,
        retry_after: prost_types::Duration::try_from(advice).ok(),
        waiting: waiting as i32,
        unknown_for: unknown.and_then(|d| prost_types::Duration::try_from(d).ok()),
    };
    Ok((body, label))
}

/// Errors that only the caller's request caused (and anyone who reaches the port can cause).
fn is_callers_mistake(e: &Error) -> bool {
    matches!(
        e,
        Error::Provider(
            ProviderError::InvalidArgument { .. } | ProviderError::UnknownProvider { .. }
        ) | Error::NotOnCallersNode { .. }
    )
}

fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), ProviderError> {
    if value.is_empty() {
        Err(ProviderError::invalid(field, "must not be empty"))
    } else if value.len() > max {
        Err(ProviderError::invalid(
            field,
            format!("is {} bytes, at most {max} are allowed", value.len()),
        ))
    } else {
        Ok(())
    }
}

fn requester(r: Option<&pb::Requester>) -> Result<Requester, ProviderError> {
    let Some(r) = r else {
        return Ok(Requester::default());
    };
    for (field, value) in [
        ("requester.component", &r.component),
        ("requester.namespace", &r.namespace),
        ("requester.name", &r.name),
        ("requester.reason", &r.reason),
    ] {
        if value.len() > MAX_REQUESTER_FIELD_LEN {
            return Err(ProviderError::invalid(
                field,
                format!(
                    "is {} bytes, at most {MAX_REQUESTER_FIELD_LEN} are allowed",
                    value.len()
                ),
            ));
        }
    }
    Ok(Requester {
        component: r.component.clone(),
        namespace: r.namespace.clone(),
        name: r.name.clone(),
        reason: r.reason.clone(),
    })
}

fn selector(map: HashMap<String, String>) -> Result<TagSelector, ProviderError> {
    if map.len() > MAX_SELECTOR_TAGS {
        return Err(ProviderError::invalid(
            "tag_selector",
            format!(
                "has {} tags, at most {MAX_SELECTOR_TAGS} are allowed",
                map.len()
            ),
        ));
    }
    for (k, v) in &map {
        if k.is_empty() || k.len() > MAX_TAG_KEY_LEN {
            return Err(ProviderError::invalid(
                "tag_selector",
                format!("keys must be 1 to {MAX_TAG_KEY_LEN} bytes"),
            ));
        }
        if v.len() > MAX_TAG_VALUE_LEN {
            return Err(ProviderError::invalid(
                "tag_selector",
                format!("value of {k:?} is longer than {MAX_TAG_VALUE_LEN} bytes"),
            ));
        }
    }
    Ok(map.into_iter().collect())
}

fn figure_to_pb(f: Figure) -> Option<pb::Figure> {
    (f.limit.is_some() || f.in_use.is_some()).then_some(pb::Figure {
        limit: f.limit,
        in_use: f.in_use,
    })
}

fn capacity_to_pb(c: Capacity) -> pb::GetCapacityResponse {
    pb::GetCapacityResponse {
        instances: figure_to_pb(c.instances),
        vcpus: figure_to_pb(c.vcpus),
        memory_mib: figure_to_pb(c.memory_mib),
    }
}

fn instance_to_pb(i: Instance) -> pb::Instance {
    pb::Instance {
        instance_id: i.id,
        create_time: i.created.map(|t| prost_types::Timestamp {
            seconds: t.as_second(),
            nanos: t.subsec_nanosecond(),
        }),
        tags: i.tags.into_iter().collect::<HashMap<_, _>>(),
        name: i.name,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic_types::StatusExt;

    #[test]
    fn limits_name_the_field() {
        let e = check_len("instance_id", &"x".repeat(2000), MAX_INSTANCE_ID_LEN).unwrap_err();
        assert_eq!(
            e.to_string(),
            "instance_id: is 2000 bytes, at most 1024 are allowed"
        );
        let e = check_len("cloud_provider", "", MAX_PROVIDER_LEN).unwrap_err();
        assert_eq!(e.to_string(), "cloud_provider: must not be empty");
        let long = pb::Requester {
            reason: "r".repeat(300),
            ..Default::default()
        };
        assert!(
            requester(Some(&long))
                .unwrap_err()
                .to_string()
                .starts_with("requester.reason:")
        );
    }

    #[test]
    fn throttling_carries_a_retry_delay() {
        let s = status(&Error::Provider(ProviderError::throttled(
            std::time::Duration::from_secs(3),
            "RequestLimitExceeded",
        )));
        assert_eq!(s.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            s.get_details_retry_info().and_then(|r| r.retry_delay),
            Some(std::time::Duration::from_secs(3))
        );
        assert_eq!(
            s.get_details_error_info().map(|i| i.reason),
            Some("Throttled".to_owned())
        );
    }

    #[test]
    fn unknown_and_unconfigured_providers_have_different_codes() {
        assert_eq!(
            status(&ProviderError::UnknownProvider { name: "x".into() }.into()).code(),
            tonic::Code::InvalidArgument
        );
        assert_eq!(
            status(&ProviderError::ProviderNotConfigured { name: "aws".into() }.into()).code(),
            tonic::Code::FailedPrecondition
        );
    }

    #[test]
    fn deployment_problems_are_failed_preconditions_with_their_reason() {
        // The caller cannot fix another cluster's instance or this service's cloud credentials:
        // neither is the caller's PERMISSION_DENIED.
        for (error, reason) in [
            (
                Error::Provider(ProviderError::NotOwnedByCluster {
                    message: "i-1 lacks the cluster tag".into(),
                }),
                "NotOwnedByCluster",
            ),
            (
                Error::Provider(ProviderError::DoNotDelete {
                    instance_id: "i-2".into(),
                    tag: peerpods_provider_core::DO_NOT_DELETE_TAG,
                    value: "true".into(),
                }),
                "DoNotDelete",
            ),
            (
                Error::Provider(ProviderError::cloud_unauthenticated("HTTP 401")),
                "CloudUnauthenticated",
            ),
            (
                Error::NotServing {
                    reason: peerpods_proto::ErrorReason::ProviderNotConfigured,
                    why: "CLOUD_PROVIDER is not set".into(),
                },
                "ProviderNotConfigured",
            ),
        ] {
            let s = status(&error);
            assert_eq!(s.code(), tonic::Code::FailedPrecondition);
            assert_eq!(
                s.get_details_error_info().map(|i| i.reason),
                Some(reason.to_owned())
            );
        }
    }

    #[test]
    fn unknown_figures_stay_unknown() {
        let pb = capacity_to_pb(Capacity {
            vcpus: Figure {
                limit: Some(8),
                in_use: None,
            },
            ..Default::default()
        });
        assert_eq!(pb.instances, None);
        assert_eq!(pb.vcpus.and_then(|f| f.in_use), None);
        assert_eq!(pb.vcpus.and_then(|f| f.limit), Some(8));
    }
}
