//! Records the cleanup on the PeerPod: its status (the Cleaned condition, `status.cleand`, the state) and, for a
//! failure, a Warning Event and a metric.

use std::time::Instant;

use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use peerpods_runtime::status::apply_status;
use tracing::{debug, warn};

use super::FIELD_MANAGER;
use super::status::{Cleaned, cleaned_status};
use crate::Error;
use crate::cleanup::reminders;
use crate::context::{Context, publish};
use peerpods_api::peerpod::{CleanedReason, PeerPod};

/// Writes `status.cleand` and the Cleaned condition when they differ from what is there. Returns false when
/// the PeerPod no longer exists.
pub(crate) async fn set_cleaned(
    ctx: &Context,
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
    set_condition(ctx, peerpod, state, message).await
}

/// Writes `state` when it differs from what is there, within the reconciles' bound on API writes
/// ([`Context::write`]). Returns false when the PeerPod no longer exists.
pub(crate) async fn set_condition(
    ctx: &Context,
    peerpod: &PeerPod,
    state: Cleaned,
    message: &str,
) -> Result<bool, Error> {
    let Some(status) = cleaned_status(peerpod, state, message, jiff::Timestamp::now()) else {
        return Ok(true);
    };
    // Forced (see `apply_status`): state, reason and lastAttemptTime are shared with reverse collection's
    // field manager, the later write of the two wins by design, and PeerPods written by versions that
    // merge-patched their status have these fields under that older Update manager.
    let api: Api<PeerPod> =
        Api::namespaced(ctx.client.clone(), &peerpod.namespace().unwrap_or_default());
    let name = peerpod.name_any();
    match ctx
        .write(apply_status(&api, &name, FIELD_MANAGER, &status, None))
        .await
    {
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
    if reminders::same_failure_recorded(peerpod, error.reason()) {
        // The Event repeats (a series update, kube's aggregation) at most every reminders::EVENT_REPEAT.
        if ctx.reminders.due(&key, Instant::now()) {
            publish(
                ctx,
                peerpod,
                EventType::Warning,
                error.reason(),
                "DeleteInstance",
                message,
            );
        }
        return;
    }
    if let Err(e) = set_cleaned(ctx, peerpod, false, error.cleaned_reason(), &message).await {
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
    );
}
