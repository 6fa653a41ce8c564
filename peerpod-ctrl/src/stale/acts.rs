//! Deletes the stale PeerPods of a live PeerPod's Pod, each with its UID as precondition, an Event and a metric.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use tracing::info;

use super::rules;
use crate::Error;
use crate::context::{Context, publish};
use peerpods_api::peerpod::EventReason;
use peerpods_api::peerpod::PeerPod;

/// Deletes PeerPods of the same Pod that are older than this one: they belong to a sandbox that is gone.
pub(crate) async fn reap_stale(peerpod: &PeerPod, ctx: &Context) -> Result<Action, Error> {
    let Some(owner) = rules::controlling_owner_uid(peerpod) else {
        info!("PeerPod has no controlling owner; not comparing it with other PeerPods");
        return Ok(Action::await_change());
    };
    let siblings: Vec<Arc<PeerPod>> = ctx
        .index
        .owned_by(owner)
        .iter()
        .filter_map(|key| ctx.store.get(key))
        .filter(|p| p.uid() != peerpod.uid())
        .collect();
    if siblings.is_empty() {
        return Ok(Action::await_change());
    }
    let mut group: Vec<&PeerPod> = siblings.iter().map(Arc::as_ref).collect();
    group.push(peerpod);
    for stale in rules::stale_peerpods(&group) {
        let api: Api<PeerPod> =
            Api::namespaced(ctx.client.clone(), &stale.namespace().unwrap_or_default());
        // The UID precondition makes sure we delete the object we compared, never a namesake created since.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: stale.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&stale.name_any(), &params).await {
            Ok(_) => {
                ctx.metrics.stale_peerpods_deleted.inc();
                info!(stale = %stale.name_any(), "deleted older PeerPod of the same Pod");
                let note = format!(
                    "A newer PeerPod of the same Pod exists ({}); deleting this one so its VM is reaped",
                    peerpod.name_any()
                );
                publish(
                    ctx,
                    stale,
                    EventType::Normal,
                    EventReason::StalePeerPodDeleted.as_str(),
                    "DeletePeerPod",
                    note,
                );
            }
            Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}
