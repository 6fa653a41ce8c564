//! The reconcile of one PeerPod (watch → decide → act → record): its plan ([`rules::plan`]) is decided once
//! from what is known before it acts, then carried out by the activity that owns it: [`crate::stale`] for a
//! live PeerPod (older PeerPods of the same Pod are deleted, and come back here for cleanup), [`crate::cleanup`]
//! for one being deleted. Failures keep the finalizer, say why on the object, and retry with per-object
//! backoff ([`error_policy`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use peerpods_provider_client::held_delay;
use peerpods_runtime::backoff;
use tracing::{Instrument, debug, info_span};

use crate::Error;
use crate::cleanup;
use crate::cleanup::rules::{self, Hold, Plan};
use crate::context::Context;
use crate::stale;
use peerpods_api::peerpod::{CleanedReason, PeerPod};

/// Decides the plan of `peerpod` and carries it out; a failure is recorded on the PeerPod being cleaned up.
pub(crate) async fn reconcile(peerpod: Arc<PeerPod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = info_span!(
        "reconcile",
        namespace = %peerpod.namespace().unwrap_or_default(),
        name = %peerpod.name_any(),
    );
    async move {
        ctx.metrics.reconciles.inc();
        let key = ObjectRef::from_obj(peerpod.as_ref());
        // The facts the plan is made of. Only a PeerPod being deleted is compared with the rest of the cache.
        let namesake = match peerpod.metadata.deletion_timestamp {
            Some(_) => ctx
                .store
                .find(|other| rules::is_live_namesake(&peerpod, other)),
            None => None,
        };
        let progress = ctx.in_progress().get(&key).cloned();
        let plan = rules::plan(
            &peerpod,
            namesake.as_deref(),
            progress.as_ref(),
            Instant::now(),
            ctx.developer_mode.current(),
        );
        let is_cleanup = plan.is_cleanup();
        // Each act is boxed: a reconcile's task is then the size of the plan and one pointer, and an act's state
        // (API and gRPC calls in flight) is allocated only while that act runs. Unboxed, every task was the size
        // of the largest act, and with 256 reconciles at once and 10,000 queued at a start, 5 MiB of peak RSS
        // (make bench's memory scenario).
        let result = match plan {
            Plan::ReapStale => {
                if peerpod.release_ask().is_some() {
                    Box::pin(cleanup::release_ignored(&peerpod, &ctx)).await;
                }
                Box::pin(stale::reap_stale(&peerpod, &ctx)).await
            }
            Plan::Nothing => {
                debug!("released by cloud-api-adaptor; nothing to do");
                Ok(Action::await_change())
            }
            Plan::Hold(Hold::Invalid(why)) => Err(Error::InvalidInstance(why)),
            Plan::Hold(Hold::DoNotDelete) => Box::pin(cleanup::hold(&peerpod, &ctx)).await,
            Plan::Hold(Hold::DeveloperMode) => {
                Box::pin(cleanup::developer_hold(&peerpod, &ctx)).await
            }
            Plan::Hold(Hold::DeveloperModeUnknown) => Err(Error::DeveloperModeUnknown),
            Plan::Hold(Hold::UnknownRelease(value)) => {
                let why = format!("{value:?} is not a value it knows (operator or instance-gone)");
                Box::pin(cleanup::release_refused(
                    &peerpod,
                    &ctx,
                    CleanedReason::UnknownReleaseValue,
                    &why,
                ))
                .await
            }
            Plan::ReleaseByOperator {
                provider,
                instance_id,
            } => {
                Box::pin(cleanup::release_by_operator(
                    &peerpod,
                    &ctx,
                    &provider,
                    &instance_id,
                ))
                .await
            }
            Plan::Release {
                provider,
                instance_id,
                by,
            } => {
                Box::pin(cleanup::release_still_referenced(
                    &peerpod,
                    &ctx,
                    &provider,
                    &instance_id,
                    &by,
                ))
                .await
            }
            Plan::Wait { until, .. } => {
                debug!("provider-service is deleting the VM; asking again later");
                Ok(Action::requeue(
                    until.saturating_duration_since(Instant::now()),
                ))
            }
            Plan::ConfirmGone {
                provider,
                instance_id,
            } => match Box::pin(cleanup::still_listed(&ctx, &provider, &instance_id)).await {
                Err(error) => Err(error),
                Ok(true) => {
                    let why = "instance-gone, but provider-service still lists the instance";
                    Box::pin(cleanup::release_refused(
                        &peerpod,
                        &ctx,
                        CleanedReason::InstanceStillListed,
                        why,
                    ))
                    .await
                }
                // Not listed: provider-service's DeleteInstance is the judge of gone (it waits out the
                // cloud's consistency window), as for any cleanup.
                Ok(false) => {
                    Box::pin(cleanup::planned_delete(
                        &peerpod,
                        &ctx,
                        &key,
                        progress,
                        (&provider, &instance_id, false),
                    ))
                    .await
                }
            },
            Plan::Delete {
                provider,
                instance_id,
                in_progress,
            } => {
                Box::pin(cleanup::planned_delete(
                    &peerpod,
                    &ctx,
                    &key,
                    progress,
                    (&provider, &instance_id, in_progress),
                ))
                .await
            }
        };
        match result {
            Ok(action) => {
                ctx.forget(&key);
                Ok(action)
            }
            // Someone else changed the finalizers meanwhile: not a failure, nothing to record; re-read.
            Err(Error::FinalizerConflict) => {
                debug!("finalizers changed concurrently; re-reading");
                Err(Error::FinalizerConflict)
            }
            Err(error) => {
                Box::pin(cleanup::record_failure(&peerpod, &ctx, &error, is_cleanup)).await;
                Err(error)
            }
        }
    }
    .instrument(span)
    .await
}

/// Per-object exponential backoff. Counting happens here because kube calls `error_policy` exactly once
/// per failed reconcile.
pub(crate) fn error_policy(peerpod: Arc<PeerPod>, error: &Error, ctx: Arc<Context>) -> Action {
    if matches!(error, Error::FinalizerConflict) {
        // Not a failure of anything (and not counted as one): re-read soon and decide again.
        return Action::requeue(Duration::from_millis(200));
    }
    if let Error::CircuitOpen(held) = error {
        // Held back, not failed: the PeerPod's own backoff does not grow, or it would come back minutes after
        // provider-service did. Spread over one more wait, so the held PeerPods do not return together.
        return Action::requeue(held_delay(held.retry_in, backoff::jitter()));
    }
    let key = ObjectRef::from_obj(peerpod.as_ref());
    let failures = ctx.failures.record(key);
    // Full jitter from a fresh draw: PeerPods that failed together (an outage) retry spread over the window.
    let delay = ctx.backoff.delay(
        failures,
        error.is_permanent(),
        error.retry_after(),
        backoff::jitter(),
    );
    Action::requeue(delay)
}
