//! A deleted PeerPodConfig: its deletion held while peer pods run ([`crate::hold`]), then node capacity, the pool
//! and this controller's webhook entry removed before the finalizer is released.

use std::sync::Arc;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::{info, warn};

use super::owned::{current, remember_nodes};
use super::pool::withdraw_pool;
use super::record::publish;
use super::{Context, FINALIZER, node_cache_ready};
use crate::name::FIELD_MANAGER;
use crate::plan;
use crate::validate;
use crate::{Error, hold, nodes, objects};
use peerpods_api::peerpodconfig::{EventReason, PeerPodConfig};

/// Deletion: remove node capacity and this controller's webhook from the chart's webhook configuration
/// (cluster-scoped, so no owner reference could cascade to it; and the object is the chart's, so it stays). The
/// namespaced objects go with the garbage collector through their owner references.
pub(super) async fn cleanup(config: Arc<PeerPodConfig>, ctx: &Context) -> Result<Action, Error> {
    let active = ctx.active_config();
    if !validate::may_have_written(&config, &ctx.namespace, active.as_deref()) {
        return Ok(Action::await_change());
    }
    node_cache_ready(ctx).await?;
    let changes = plan::removal(ctx.nodes.state().iter().map(AsRef::as_ref));
    // Going away: no status to show progress in.
    let unreported = tokio::sync::watch::Sender::new(0);
    let removed = nodes::apply(
        &Api::all(ctx.client.clone()),
        &changes,
        &ctx.node_patches,
        &unreported,
    )
    .await
    .map(|live| remember_nodes(ctx, live))?;
    ctx.metrics
        .node_writes
        .inc_by(u64::try_from(removed).unwrap_or(0));
    // The pool's cluster-scoped objects have no owner reference to cascade from (the plugin DaemonSet has one).
    // The plugin kept for allocated claims is not deleted here, but goes with the garbage collector once the
    // finalizer is released: the deletion itself is held while peer pods (the pods holding those claims) run
    // (`hold`), and forcing it tears the runtime down under them anyway.
    withdraw_pool(ctx, &mut Vec::new()).await?;
    let mwc_api: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
    let mwc = current::<MutatingWebhookConfiguration>(ctx, None, objects::WEBHOOK_CONFIGURATION);
    if let Some(uid) = mwc
        .filter(|m| objects::labelled_for(&m.metadata, &config))
        .and_then(|m| m.metadata.uid)
    {
        // Everything this field manager set goes (the webhook, its labels, the hash); not the object.
        match mwc_api
            .patch(
                objects::WEBHOOK_CONFIGURATION,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&objects::webhook_configuration_released(&uid)),
            )
            .await
        {
            Ok(live) => ctx.written.remember(&live),
            // Deleted meanwhile (the uid precondition found no object): nothing of ours is left in it.
            Err(kube::Error::Api(status)) if status.code == 404 || status.code == 409 => {}
            Err(source) => {
                return Err(Error::Apply {
                    kind: "MutatingWebhookConfiguration",
                    name: objects::WEBHOOK_CONFIGURATION.into(),
                    source,
                });
            }
        }
    }
    let note = format!(
        "removed kata.peerpods.io/vm from {removed} nodes and the webhook from the webhook configuration"
    );
    info!(%note, "cleaned up");
    publish(
        ctx,
        &config,
        EventType::Normal,
        EventReason::CleanedUp.as_str(),
        note,
    )
    .await;
    Ok(Action::await_change())
}

/// A PeerPodConfig being deleted (with our finalizer, not forced) while peer pods run: keeps the finalizer,
/// says why (condition, a Warning Event when the list changes) and looks again after [`hold::RECHECK`].
pub(super) async fn hold_deletion(
    config: &PeerPodConfig,
    ctx: &Context,
) -> Result<Option<Action>, Error> {
    if config.metadata.deletion_timestamp.is_none()
        || !config.finalizers().iter().any(|f| f == FINALIZER)
        || hold::forced(config)
    {
        return Ok(None);
    }
    // Only the PeerPodConfig that set up the runtime holds anything; another one's cleanup touches nothing.
    let active = ctx.active_config();
    if !validate::may_have_written(config, &ctx.namespace, active.as_deref()) {
        return Ok(None);
    }
    let running = hold::running_peer_pods(&ctx.client).await?;
    if running.is_empty() {
        return Ok(None);
    }
    let message = hold::message(&running);
    if hold::write(&ctx.client, config, &message).await? {
        warn!(
            running = running.len(),
            "PeerPodConfig deletion held: peer pods still run"
        );
        publish(
            ctx,
            config,
            EventType::Warning,
            EventReason::DeletionHeld.as_str(),
            message,
        )
        .await;
    }
    Ok(Some(Action::requeue(hold::RECHECK)))
}
