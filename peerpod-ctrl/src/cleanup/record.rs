//! Records the cleanup on the PeerPod: its status (the Cleaned condition, `status.cleand`, the state) and, for a
//! failure, a Warning Event and a metric.

use std::time::Instant;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use peerpods_runtime::status::apply_status;
use tracing::{debug, warn};

use super::FIELD_MANAGER;
use super::status::Cleaned;
use crate::Error;
use crate::breaker;
use crate::context::{Context, publish};
use crate::crd::{CONDITION_CLEANED, CleanedReason, PeerPod, PeerPodState, PeerPodStatus};

/// Writes `status.cleand` and the Cleaned condition when they differ from what is there. Returns false when
/// the PeerPod no longer exists.
pub(crate) async fn set_cleaned(
    api: &Api<PeerPod>,
    peerpod: &PeerPod,
    cleaned: bool,
    reason: CleanedReason,
    message: &str,
) -> Result<bool, Error> {
    let state = Cleaned {
        done: cleaned,
        vm_gone: cleaned,
        reason,
    };
    set_condition(api, peerpod, state, message).await
}

/// Writes `state` when it differs from what is there. Returns false when the PeerPod no longer exists.
pub(crate) async fn set_condition(
    api: &Api<PeerPod>,
    peerpod: &PeerPod,
    state: Cleaned,
    message: &str,
) -> Result<bool, Error> {
    let Cleaned {
        done,
        vm_gone: cleaned,
        reason,
    } = state;
    let status_value = if done { "True" } else { "False" };
    let current = peerpod.cleaned_condition();
    let generation = peerpod.metadata.generation;
    let old_status = peerpod.status.clone().unwrap_or_default();
    if current.is_some_and(|c| {
        c.status == status_value && c.reason == reason.as_str() && c.message == message
    }) && old_status.cleand == cleaned
        && old_status.observed_generation == generation
        && old_status.state == PeerPodState::of_cleanup(done, reason)
        && old_status.waiting_since.is_some() != done
    {
        return Ok(true);
    }
    let last_transition_time = match current {
        Some(c) if c.status == status_value => c.last_transition_time.clone(),
        _ => Time(jiff::Timestamp::now()),
    };
    // Only the Cleaned condition: the conditions are a map keyed by type, so the API server keeps every other
    // one (reverse collection's InstancePresent, another manager's) as the live object has it.
    let conditions = vec![Condition {
        type_: CONDITION_CLEANED.to_string(),
        status: status_value.to_string(),
        reason: reason.as_str().to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time,
    }];
    // Since when the cleanup waits: from the first write that found it not done, kept while the Cleaned
    // condition stays False (whatever the reason: held, failing, in progress), cleared once it is done.
    let waiting_since = match (done, current) {
        (true, _) => None,
        (false, Some(c)) if c.status == "False" => old_status.waiting_since.clone(),
        (false, _) => None,
    }
    .or_else(|| (!done).then(|| Time(jiff::Timestamp::now())));
    // The words `kubectl get` shows follow the condition, so every writer of it keeps them in step.
    let status = PeerPodStatus {
        waiting_since,
        cleand: cleaned,
        conditions,
        observed_generation: generation,
        state: PeerPodState::of_cleanup(done, reason),
        reason: Some(reason.as_str().to_string()),
        last_attempt_time: Some(Time(jiff::Timestamp::now())),
        // Reverse collection's, under its own field manager: not sent, so this apply leaves it alone.
        matched_instance: None,
    };
    // Forced (see `apply_status`): state, reason and lastAttemptTime are shared with reverse collection's
    // field manager, the later write of the two wins by design, and PeerPods written by versions that
    // merge-patched their status have these fields under that older Update manager.
    match apply_status(api, &peerpod.name_any(), FIELD_MANAGER, &status, None).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Makes a failure visible: metric always; condition and Event when the PeerPod is waiting for cleanup.
/// `cleanup`: the PeerPod waits for its cleanup (the plan said so).
pub(crate) async fn record_failure(peerpod: &PeerPod, ctx: &Context, error: &Error, cleanup: bool) {
    if let Error::CircuitOpen { .. } = error {
        // Not this PeerPod's failure: the breaker's opening was logged, counted and recorded on the PeerPod
        // whose call opened it. Writing it on every held PeerPod is the write storm the breaker prevents.
        debug!(%error, "held back while provider-service or its cloud is down");
        return;
    }
    ctx.metrics.reconcile_error(error.reason());
    warn!(reason = error.reason(), %error, "reconcile failed");
    if !cleanup {
        return;
    }
    // One status write and one Event per change of failure class, not per attempt: a retry that fails the same
    // way has nothing new to say (the metric and the log count the attempts).
    let key = ObjectRef::from_obj(peerpod);
    let message = format!("Instance not deleted yet, finalizer kept: {error}");
    if breaker::same_failure_recorded(peerpod, error.reason()) {
        // The Event repeats (a series update, kube's aggregation) at most every breaker::EVENT_REPEAT.
        if ctx.reminders.due(&key, Instant::now()) {
            publish(
                ctx,
                peerpod,
                EventType::Warning,
                error.reason(),
                "DeleteInstance",
                message,
            )
            .await;
        }
        return;
    }
    let api: Api<PeerPod> =
        Api::namespaced(ctx.client.clone(), &peerpod.namespace().unwrap_or_default());
    if let Err(e) = set_cleaned(&api, peerpod, false, error.cleaned_reason(), &message).await {
        warn!(error = %e, "cannot record the failure in status");
    }
    ctx.reminders.published(&key, Instant::now());
    publish(
        ctx,
        peerpod,
        EventType::Warning,
        error.reason(),
        "DeleteInstance",
        message,
    )
    .await;
}
