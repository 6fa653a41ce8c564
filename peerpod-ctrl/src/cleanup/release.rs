//! Releases of the finalizer without a delete: a live PeerPod still names the VM, or the operator asked
//! (`peerpods.io/release`); and the release patch itself, which removes exactly our finalizer.

use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use tracing::{info, warn};

use super::hold::keep_held;
use super::record::set_condition;
use super::rules;
use super::status::Cleaned;
use crate::Error;
use crate::context::{Context, publish};
use peerpods_api::peerpod::EventReason;
use peerpods_api::peerpod::{CleanedReason, PeerPod};
use rules::RELEASE;

/// A live PeerPod naming the same instance, read from the API server with a consistent read (never from
/// the cache): `namespace/name`, if any. The field selector is served by the CRD's selectable field
/// `spec.instanceID`; the kernel then compares by instance identity.
pub(crate) async fn live_namesake_by_quorum(
    peerpod: &PeerPod,
    ctx: &Context,
    instance_id: &str,
) -> Result<Option<String>, Error> {
    let api: Api<PeerPod> = Api::all(ctx.client.clone());
    // No resourceVersion: the API server answers from its latest state (a consistent read), not a cache.
    let params = kube::api::ListParams::default().fields(&format!("spec.instanceID={instance_id}"));
    let listed = api.list(&params).await?;
    let facts = rules::facts(peerpod);
    Ok(listed
        .items
        .iter()
        .map(rules::facts)
        .find(|other| peerpods_protocol::decide::is_live_namesake(&facts, other))
        .map(|other| other.name))
}

/// Another PeerPod that is not being deleted names the same VM: deleting it would take the VM from under
/// that one. The PeerPod being deleted is released without a DeleteInstance call; the condition (written
/// first, so it is there while the object still is) and the Event name the live PeerPod.
pub(crate) async fn release_still_referenced(
    peerpod: &PeerPod,
    ctx: &Context,
    provider: &str,
    instance_id: &str,
    by: &str,
) -> Result<Action, Error> {
    let message = format!(
        "{provider} instance {instance_id} is not deleted: PeerPod {by} still names it and is not being \
         deleted; releasing the finalizer without deleting the VM"
    );
    info!(
        provider,
        instance_id,
        referenced_by = by,
        "instance still referenced; releasing finalizer without deleting it"
    );
    release_without_delete(
        peerpod,
        ctx,
        CleanedReason::InstanceStillReferenced,
        EventType::Normal,
        message,
    )
    .await
}

/// The operator asked (annotation `peerpods.io/release: operator`) to release a PeerPod being deleted without
/// deleting its VM, and answers for the VM. The VM is left as it is; the condition (written first) and a Warning
/// Event name the operator's choice and the VM, and a log line records it.
pub(crate) async fn release_by_operator(
    peerpod: &PeerPod,
    ctx: &Context,
    provider: &str,
    instance_id: &str,
) -> Result<Action, Error> {
    let message = format!(
        "Annotation {RELEASE}: operator: releasing the finalizer WITHOUT deleting {provider} instance \
         {instance_id}; the operator answers for that VM"
    );
    warn!(
        provider,
        instance_id, "released by the operator; the VM is not deleted"
    );
    release_without_delete(
        peerpod,
        ctx,
        CleanedReason::ReleasedByOperator,
        EventType::Warning,
        message,
    )
    .await
}

/// Releases the finalizer of a PeerPod being deleted whose VM is deliberately not deleted (`reason`): the
/// condition first (so the reason outlives a failed release), then the Event, then the release.
pub(crate) async fn release_without_delete(
    peerpod: &PeerPod,
    ctx: &Context,
    reason: CleanedReason,
    event_type: EventType,
    message: String,
) -> Result<Action, Error> {
    if !set_condition(ctx, peerpod, Cleaned::done_without_delete(reason), &message).await? {
        return Ok(Action::await_change());
    }
    publish(
        ctx,
        peerpod,
        event_type,
        reason.as_str(),
        "ReleaseFinalizer",
        message,
    );
    release_finalizer(ctx, peerpod).await?;
    ctx.deletion_seen().remove(&ObjectRef::from_obj(peerpod));
    Ok(Action::await_change())
}

/// The `peerpods.io/release` annotation asks for what cannot be done safely (`reason`): nothing is deleted or
/// released, and the condition and a Warning Event say why. Nothing is retried: changing the annotation
/// reconciles again.
pub(crate) async fn release_refused(
    peerpod: &PeerPod,
    ctx: &Context,
    reason: CleanedReason,
    why: &str,
) -> Result<Action, Error> {
    let (provider, instance_id) = (&peerpod.spec.cloud_provider, &peerpod.spec.instance_id);
    let message = format!(
        "Annotation {RELEASE}: {why}: {provider} instance {instance_id} is neither deleted nor released and \
         the finalizer stays; set it to operator to release without a delete, or remove it"
    );
    warn!(%provider, %instance_id, reason = reason.as_str(), "release annotation not acted on");
    let event = Some((EventType::Warning, "ReleaseFinalizer"));
    keep_held(peerpod, ctx, reason, event, message).await
}

/// `peerpods.io/release` on a PeerPod that is not being deleted: ignored (it never deletes the PeerPod), said by
/// a Warning Event and a log line, so that a release asked too early is not mistaken for one done.
pub(crate) async fn release_ignored(peerpod: &PeerPod, ctx: &Context) {
    let message = format!(
        "Annotation {RELEASE} is ignored: the PeerPod is not being deleted; it takes effect once it is"
    );
    warn!("release annotation on a live PeerPod ignored");
    publish(
        ctx,
        peerpod,
        EventType::Warning,
        EventReason::ReleaseIgnored.as_str(),
        "ReleaseFinalizer",
        message,
    );
}

/// Removes exactly our finalizer, failing (not guessing) when the list changed since we read it; within the
/// reconciles' bound on API writes ([`Context::write`]).
pub(crate) async fn release_finalizer(ctx: &Context, peerpod: &PeerPod) -> Result<(), Error> {
    let Some(patch) = rules::release_finalizer_patch(peerpod.finalizers()) else {
        return Ok(());
    };
    let api: Api<PeerPod> =
        Api::namespaced(ctx.client.clone(), &peerpod.namespace().unwrap_or_default());
    let name = peerpod.name_any();
    let patch = Patch::Json::<()>(patch);
    match ctx
        .write(api.patch(&name, &PatchParams::default(), &patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        // A failed `test` op is 422 Invalid; a resourceVersion race is 409.
        Err(kube::Error::Api(status)) if status.is_invalid() || status.is_conflict() => {
            Err(Error::FinalizerConflict)
        }
        Err(e) => Err(e.into()),
    }
}
