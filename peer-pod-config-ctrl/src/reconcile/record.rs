//! What a reconcile records: the PeerPodConfig's status, written only when it changed, its Events, and the
//! capacity metrics.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};
use peerpods_protocol::decide::DeveloperMode;
use peerpods_runtime::status::apply_status;
use tracing::{info, warn};

use super::Context;
use crate::Error;
use crate::name::FIELD_MANAGER;
use crate::plan::CapacityPlan;
use crate::status::{self, Observed};
use peerpods_api::peerpodconfig::{CapacityMode, EventReason, PeerPodConfig, PeerPodConfigStatus};

/// Write the status when it differs from `previous`, what is stored (so an unchanged cluster costs no status
/// write), and announce an Invalid condition turning true with a Warning Event. Returns the status as it now is.
pub(super) async fn write_status(
    config: &PeerPodConfig,
    previous: Option<&PeerPodConfigStatus>,
    observed: &Observed,
    ctx: &Context,
) -> Result<PeerPodConfigStatus, Error> {
    let next = status::compute(previous, observed, Time(jiff::Timestamp::now()));
    if previous == Some(&next) {
        return Ok(next);
    }
    let was_invalid = previous
        .map(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == status::INVALID && c.status == "True")
        })
        .unwrap_or(false);
    if let Some(invalid) = observed.invalid.as_ref().filter(|_| !was_invalid) {
        let reason = invalid.reason.as_str();
        warn!(reason, message = %invalid.message, "PeerPodConfig is invalid");
        publish(
            ctx,
            config,
            EventType::Warning,
            reason,
            invalid.message.clone(),
        )
        .await;
    }
    let name = config.name_any();
    let api: Api<PeerPodConfig> =
        Api::namespaced(ctx.client.clone(), &config.namespace().unwrap_or_default());
    apply_status(&api, &name, FIELD_MANAGER, &next, None)
        .await
        .map_err(|source| Error::Status { name, source })?;
    ctx.metrics.status_writes.inc();
    Ok(next)
}

pub(super) async fn publish(
    ctx: &Context,
    config: &PeerPodConfig,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: None,
    };
    if let Err(e) = ctx.recorder.publish(&event, &config.object_ref(&())).await {
        warn!(error = %e, reason, "publishing an Event failed");
    }
}

/// Said once, when the CAA pods are rendered for another developer mode (`now`) than before (`was`; not on the
/// first render, `None`: a new install's mode is in the status). A Warning while the mode is unknown.
pub(super) async fn developer_mode_changed(
    ctx: &Context,
    config: &PeerPodConfig,
    was: Option<DeveloperMode>,
    now: DeveloperMode,
    ceiling: Option<status::NodeCeiling>,
) {
    if let Some(note) = was.and_then(|was| status::developer_mode_change(was, now)) {
        info!(%note, "cloud-api-adaptor's developer mode changed");
        let type_ = match ceiling {
            Some(status::NodeCeiling::DeveloperModeUnknown) => EventType::Warning,
            Some(status::NodeCeiling::DeveloperMode) | None => EventType::Normal,
        };
        publish(
            ctx,
            config,
            type_,
            EventReason::DeveloperModeChanged.as_str(),
            note,
        )
        .await;
    }
}

/// The DRA pool's figures in the metrics (all zero without a pool).
pub(super) fn pool_metrics(ctx: &Context, pool: status::Pool) {
    for (gauge, value) in [
        (&ctx.metrics.pool_size, pool.size),
        (&ctx.metrics.pool_allocated, pool.allocated),
        (
            &ctx.metrics.pool_free,
            pool.size.saturating_sub(pool.allocated),
        ),
    ] {
        gauge.set(i64::try_from(value).unwrap_or(i64::MAX));
    }
}

/// The planned capacity in the metrics, and a CapacityChanged Event when `patched` nodes were written.
pub(super) async fn capacity_applied(
    ctx: &Context,
    config: &PeerPodConfig,
    planned: &CapacityPlan,
    patched: usize,
) {
    let effective = planned.effective;
    if patched > 0 {
        let note = match config.spec.capacity_mode {
            CapacityMode::Node => format!(
                "kata.peerpods.io/vm {effective} over {} nodes: {patched} nodes updated",
                planned.selected_nodes
            ),
            CapacityMode::Dra => {
                format!("kata.peerpods.io/vm removed from {patched} nodes: the DRA pool serves it")
            }
        };
        info!(%note, "node capacity changed");
        publish(
            ctx,
            config,
            EventType::Normal,
            EventReason::CapacityChanged.as_str(),
            note,
        )
        .await;
    }
    ctx.metrics
        .effective_limit
        .set(i64::try_from(effective).unwrap_or(i64::MAX));
    ctx.metrics
        .selected_nodes
        .set(i64::try_from(planned.selected_nodes).unwrap_or(i64::MAX));
}
