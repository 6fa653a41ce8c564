//! The delete of a PeerPod's VM: `DeleteInstance` through the breaker, then, once the VM is confirmed gone, the
//! Event and the release of the finalizer; while provider-service is still deleting it (or the cloud does not
//! show it yet), the finalizer stays and provider-service is asked again later.

use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use peerpods_runtime::backoff;
use tracing::info;

use super::record::{set_cleaned, set_condition};
use super::release::{live_namesake_by_quorum, release_finalizer, release_still_referenced};
use super::rules::{self, InProgress};
use super::status::{Cleaned, waiting_reason};
use crate::Error;
use crate::context::{Context, publish};
use crate::instance::instance_key;
use crate::provider::{About, DeleteAnswer, Deleted, Waiting, deleted_reason};
use peerpods_api::peerpod::{CleanedReason, PeerPod};
use peerpods_proto::RequesterReason;

/// Carries out [`Plan::Delete`] for `(provider, instance_id, in_progress)`.
pub(crate) async fn planned_delete(
    peerpod: &PeerPod,
    ctx: &Context,
    key: &ObjectRef<PeerPod>,
    progress: Option<InProgress>,
    (provider, instance_id, in_progress): (&str, &str, bool),
) -> Result<Action, Error> {
    // The cache may lag a restore that made a live copy of this PeerPod a moment ago. Before the
    // first delete request, a consistent read of the PeerPods naming the instance narrows that race
    // to the time between this read and the cloud's accepting the delete.
    if !in_progress && let Some(by) = live_namesake_by_quorum(peerpod, ctx, instance_id).await? {
        return release_still_referenced(peerpod, ctx, provider, instance_id, &by).await;
    }
    let seen = *ctx
        .deletion_seen()
        .entry(key.clone())
        .or_insert_with(Instant::now);
    let target = Target {
        provider,
        instance_id,
        in_progress: progress.filter(|_| in_progress),
        deletion_seen: seen,
    };
    delete_instance(peerpod, ctx, key, target).await
}

/// Whether provider-service lists `instance_id` among `provider`'s VMs (compared by [`instance_key`]).
/// Only ever a reason to keep a VM: a VM not listed is not yet proven gone.
pub(crate) async fn still_listed(
    ctx: &Context,
    provider: &str,
    instance_id: &str,
) -> Result<bool, Error> {
    let wanted = instance_key(provider, instance_id);
    let listed = ctx
        .provider
        .instances(provider, &std::collections::BTreeMap::new())
        .await?;
    Ok(listed
        .iter()
        .any(|vm| instance_key(provider, &vm.instance_id) == wanted))
}

/// The VM a [`Plan::Delete`] is about, and what this controller knows of its delete so far.
pub(crate) struct Target<'a> {
    provider: &'a str,
    instance_id: &'a str,
    /// provider-service answered in progress before: its delete runs on there.
    in_progress: Option<InProgress>,
    deletion_seen: Instant,
}

/// Carries out [`Plan::Delete`]: asks provider-service, then releases the finalizer once the VM is confirmed
/// gone, or, while provider-service is still deleting it, keeps the finalizer, says so on the object and asks
/// again after its advice (backing off while the answer stays the same).
pub(crate) async fn delete_instance(
    peerpod: &PeerPod,
    ctx: &Context,
    key: &ObjectRef<PeerPod>,
    target: Target<'_>,
) -> Result<Action, Error> {
    let Target {
        provider,
        instance_id,
        in_progress,
        deletion_seen,
    } = target;
    let namespace = peerpod.namespace().unwrap_or_default();
    let name = peerpod.name_any();
    let about = About {
        namespace: &namespace,
        name: &name,
        reason: RequesterReason::PeerPodDeleted,
    };
    let answer = match ctx
        .provider
        .delete_instance(provider, instance_id, about)
        .await
    {
        Ok(answer) => answer,
        Err(error) => {
            ctx.metrics.instance_delete(provider, error.reason());
            return Err(error);
        }
    };
    // What the last in-progress answer waited for, as the condition it wrote says: the cloud to show the VM,
    // or its delete.
    let waited_to_show = peerpod.cleaned_condition().is_some_and(|c| {
        CleanedReason::parse(&c.reason) == Some(CleanedReason::InstanceNotYetVisible)
    });
    let outcome = match answer {
        // Gone once the cloud's window passed without showing the VM: it was already gone, nothing deleted it.
        DeleteAnswer::Gone(outcome) => {
            rules::confirmed(outcome, in_progress.is_some() && !waited_to_show)
        }
        // A wait, whatever it waits for: counted as in progress, never as a failure (no Warning, and the
        // breaker saw an answer).
        DeleteAnswer::InProgress {
            retry_after,
            waiting,
        } => {
            ctx.metrics.instance_delete(provider, "in_progress");
            let now = Instant::now();
            let wall_clock = jiff::Timestamp::now();
            // The same wait goes on (its start, its backoff); another one starts afresh. Not yet visible, it
            // started when provider-service first missed the VM.
            let same = waited_to_show == matches!(waiting, Waiting::NotYetVisible { .. });
            let started = match waiting {
                Waiting::NotYetVisible {
                    unknown_for: Some(unknown_for),
                } => wall_clock.checked_sub(unknown_for).unwrap_or(wall_clock),
                _ => wall_clock,
            };
            let next = rules::after_in_progress(
                in_progress.as_ref().filter(|_| same),
                provider,
                instance_id,
                retry_after,
                &ctx.backoff,
                backoff::seed(&namespace, &name),
                now,
                started,
            );
            let wait = next.ask_again_at.saturating_duration_since(now);
            let since = next.since;
            let asks = next.asks;
            ctx.in_progress().insert(key.clone(), next);
            let waited = Waited {
                waiting,
                since,
                asks,
            };
            return delete_in_progress(peerpod, ctx, provider, instance_id, waited, wait).await;
        }
    };
    ctx.in_progress().remove(key);
    ctx.metrics.instance_delete(provider, outcome.label());
    let message = match outcome {
        Deleted::Deleted => format!("Deleted {provider} instance {instance_id}"),
        Deleted::AlreadyGone => format!("{provider} instance {instance_id} was already gone"),
    };
    info!(
        provider,
        instance_id,
        result = outcome.label(),
        "instance confirmed gone; releasing finalizer"
    );
    // With only our finalizer the object vanishes once it is released: the Event and the log line carry
    // the outcome. Held by another finalizer, it stays, and its status says it is cleaned.
    if rules::outlives_release(peerpod.finalizers())
        && !set_cleaned(ctx, peerpod, true, deleted_reason(outcome), &message).await?
    {
        return Ok(Action::await_change());
    }
    publish(
        ctx,
        peerpod,
        EventType::Normal,
        deleted_reason(outcome).as_str(),
        "DeleteInstance",
        message,
    );
    release_finalizer(ctx, peerpod).await?;
    ctx.metrics
        .finalizer_release_seconds
        .observe(deletion_seen.elapsed().as_secs_f64());
    // The watch's Delete event forgets the object too; this covers one still held by another finalizer.
    ctx.deletion_seen().remove(&ObjectRef::from_obj(peerpod));
    Ok(Action::await_change())
}

/// What an in-progress delete waits for, since when (the first answer of this wait) and how many answers said so.
pub(crate) struct Waited {
    waiting: Waiting,
    since: jiff::Timestamp,
    asks: u32,
}

/// The VM is not confirmed gone and nothing failed: provider-service is still deleting it (its delete runs on
/// there, whatever this controller does), or the cloud does not show it yet, inside its consistency window. The
/// finalizer stays, the Cleaned condition says what it waits for and since when (DeleteInProgress or
/// InstanceNotYetVisible; written, and a Normal Event published, once when the wait begins: its message does not
/// change while it lasts), and the next ask comes after `wait`.
pub(crate) async fn delete_in_progress(
    peerpod: &PeerPod,
    ctx: &Context,
    provider: &str,
    instance_id: &str,
    waited: Waited,
    wait: Duration,
) -> Result<Action, Error> {
    let Waited {
        waiting,
        since,
        asks,
    } = waited;
    let reason = waiting_reason(waiting);
    let message = match waiting {
        Waiting::CloudDeleting => {
            info!(
                provider,
                instance_id,
                asks,
                wait_ms = wait.as_millis() as u64,
                "provider-service is still deleting the instance; finalizer kept, asking again later"
            );
            format!(
                "provider-service is deleting {provider} instance {instance_id} (since {since}); the finalizer \
                 stays until the VM is confirmed gone"
            )
        }
        Waiting::NotYetVisible { unknown_for } => {
            info!(
                provider,
                instance_id,
                asks,
                unknown_for_ms = unknown_for.map(|d| d.as_millis() as u64),
                wait_ms = wait.as_millis() as u64,
                "the cloud does not show the instance yet; finalizer kept, asking again later"
            );
            format!(
                "waiting for the cloud to show {provider} instance {instance_id}: not shown since {since}, within \
                 the cloud's consistency window (a new VM may not show everywhere at once); the finalizer stays \
                 until the VM is deleted, or confirmed gone once the window has passed"
            )
        }
    };
    let entering = peerpod
        .cleaned_condition()
        .is_none_or(|c| CleanedReason::parse(&c.reason) != Some(reason) || c.message != message);
    if !set_condition(ctx, peerpod, Cleaned::pending(reason), &message).await? {
        return Ok(Action::await_change());
    }
    if entering {
        publish(
            ctx,
            peerpod,
            EventType::Normal,
            reason.as_str(),
            "DeleteInstance",
            message,
        );
    }
    Ok(Action::requeue(wait))
}
