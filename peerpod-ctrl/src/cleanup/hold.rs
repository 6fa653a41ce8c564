//! Holds: a PeerPod being deleted keeps its VM and its finalizer (do-not-delete annotation, developer mode, a
//! release annotation not acted on), and the object says why.

use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::record::set_condition;
use super::status::Cleaned;
use crate::Error;
use crate::context::{Context, publish};
use crate::developer_mode;
use peerpods_api::peerpod::{CleanedReason, DO_NOT_DELETE, PeerPod};

/// A PeerPod annotated `peerpods.io/do-not-delete` is being deleted: its VM stays and so does the finalizer,
/// and the object says why. Nothing is retried: removing the annotation is a change that reconciles again.
pub(crate) async fn hold(peerpod: &PeerPod, ctx: &Context) -> Result<Action, Error> {
    let message = format!(
        "Annotation {DO_NOT_DELETE} is set: {} instance {} is not deleted and the finalizer stays; remove the \
         annotation (or set it to false) to let the cleanup proceed",
        peerpod.spec.cloud_provider, peerpod.spec.instance_id
    );
    warn!(
        provider = %peerpod.spec.cloud_provider,
        instance_id = %peerpod.spec.instance_id,
        "PeerPod marked do-not-delete; keeping its VM and finalizer"
    );
    let event = Some((EventType::Warning, "DeleteInstance"));
    keep_held(peerpod, ctx, CleanedReason::DoNotDelete, event, message).await
}

/// Keeps a PeerPod being deleted as it is, its VM and its finalizer, for `reason`: the condition says so and,
/// when `event` names its type and action, an Event too. Nothing is retried: what ends the hold is a change that
/// reconciles again.
pub(crate) async fn keep_held(
    peerpod: &PeerPod,
    ctx: &Context,
    reason: CleanedReason,
    event: Option<(EventType, &str)>,
    message: String,
) -> Result<Action, Error> {
    if !set_condition(ctx, peerpod, Cleaned::held(reason), &message).await? {
        return Ok(Action::await_change());
    }
    if let Some((event_type, action)) = event {
        publish(ctx, peerpod, event_type, reason.as_str(), action, message);
    }
    Ok(Action::await_change())
}

/// cloud-api-adaptor runs in developer mode: it keeps a failed pod's VM for debugging and holds the finalizer
/// on purpose. The VM and the finalizer stay; the condition (reason DeveloperMode, state Held) and a Normal Event
/// name the VM, the Event once when the hold begins. Nothing is retried: switching the mode off reconciles every
/// PeerPod (`developer_mode`), and this one's cleanup resumes.
pub(crate) async fn developer_hold(peerpod: &PeerPod, ctx: &Context) -> Result<Action, Error> {
    let (provider, instance_id) = (&peerpod.spec.cloud_provider, &peerpod.spec.instance_id);
    let message = format!(
        "cloud-api-adaptor runs in developer mode ({} in its ConfigMap): {provider} instance {instance_id} is \
         kept for debugging and the finalizer stays; switch the mode off to let the cleanup proceed",
        developer_mode::KEY
    );
    let entering = peerpod.cleaned_condition().is_none_or(|c| {
        CleanedReason::parse(&c.reason) != Some(CleanedReason::DeveloperMode)
            || c.message != message
    });
    if entering {
        info!(%provider, %instance_id, "developer mode: keeping the VM and the finalizer");
    }
    let event = entering.then_some((EventType::Normal, "DeleteInstance"));
    keep_held(peerpod, ctx, CleanedReason::DeveloperMode, event, message).await
}
