//! capacityMode dra's pool: published (the kubelet plugin DaemonSet, the DeviceClass and the ResourceSlices of
//! [`crate::dra::pool`]), or withdrawn where it is not used (node mode, or the PeerPodConfig going away).

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use kube::ResourceExt;
use kube::api::Api;

use super::owned::{current, delete_owned, ensure, ensure_cluster};
use super::{Context, NODE_CACHE_WAIT};
use crate::name::FIELD_MANAGER;
use crate::status;
use crate::{Error, dra};
use peerpods_api::peerpodconfig::PeerPodConfig;

/// capacityMode dra: publishes the pool of `total` slots (never fewer than are allocated now), its DeviceClass and
/// the kubelet plugin DaemonSet; returns the pool's figures.
pub(super) async fn publish_pool(
    ctx: &Context,
    config: &PeerPodConfig,
    ns: &str,
    total: u64,
    written: &mut Vec<&'static str>,
) -> Result<(status::Pool, DaemonSet), Error> {
    // Without the claims listed, a shrink could drop a device a running pod holds.
    match tokio::time::timeout(NODE_CACHE_WAIT, ctx.owned.wait_until_dra_ready()).await {
        Ok(true) => {}
        Ok(false) | Err(_) => return Err(Error::DraCacheNotReady),
    }
    let plugin = ensure(ctx, written, dra::plugin_daemonset(config, ns)?).await?;
    ensure_cluster(ctx, written, dra::device_class(config)).await?;
    let allocated = dra::allocated(ctx.owned.resource_claims.state().iter().map(AsRef::as_ref));
    let pool = dra::pool(total, &allocated);
    let cached = our_slice_names(ctx);
    let wanted = pool.len().div_ceil(dra::MAX_DEVICES_PER_SLICE).max(1);
    // The slices as they are now: the cache, or this controller's last write where the cache is behind.
    let published: Vec<ResourceSlice> = cached
        .iter()
        .cloned()
        .chain((0..wanted).map(|i| format!("{}{i}", dra::SLICE_PREFIX)))
        .collect::<std::collections::BTreeSet<_>>()
        .iter()
        .filter_map(|name| current::<ResourceSlice>(ctx, None, name))
        .filter(dra::is_ours)
        .collect();
    let desired = dra::slices(config, &pool, &published);
    let keep: Vec<String> = desired.iter().map(ResourceExt::name_any).collect();
    // New generation first, then the slices it no longer has: the scheduler never sees fewer devices than both.
    for slice in desired {
        ensure_cluster(ctx, written, slice).await?;
    }
    for stale in published.iter().filter(|s| !keep.contains(&s.name_any())) {
        delete_owned(
            ctx,
            &Api::<ResourceSlice>::all(ctx.client.clone()),
            &stale.name_any(),
        )
        .await?;
    }
    let size = u64::try_from(pool.len()).unwrap_or(u64::MAX);
    let in_pool = pool.iter().filter(|d| allocated.contains(*d)).count();
    Ok((
        status::Pool {
            size,
            allocated: u64::try_from(in_pool).unwrap_or(u64::MAX),
        },
        plugin,
    ))
}

/// The names of this controller's ResourceSlices in the cache.
fn our_slice_names(ctx: &Context) -> Vec<String> {
    ctx.owned
        .resource_slices
        .state()
        .iter()
        .filter(|s| dra::is_ours(s))
        .map(|s| s.name_any())
        .collect()
}

/// Removes the pool (its ResourceSlices, DeviceClass and kubelet plugin DaemonSet) where this controller published
/// one: capacityMode node, or the PeerPodConfig going away. Costs no request when there is none. The plugin
/// DaemonSet stays while ResourceClaims of the driver are allocated (see [`dra::plugin_withdrawal`]); the
/// claims' watch reconciles again when they are released, and then it goes.
pub(super) async fn withdraw_pool(
    ctx: &Context,
    written: &mut Vec<&'static str>,
) -> Result<dra::PluginWithdrawal, Error> {
    // Not listed yet, or resource.k8s.io/v1 not served (a cluster before 1.34, node mode only): nothing to
    // withdraw that is known. The slices' and the DeviceClass's watch events reconcile again once they are.
    if futures::FutureExt::now_or_never(ctx.owned.wait_until_dra_ready()) != Some(true) {
        return Ok(dra::PluginWithdrawal::Delete);
    }
    let slices = our_slice_names(ctx);
    for name in slices {
        if delete_owned(ctx, &Api::<ResourceSlice>::all(ctx.client.clone()), &name).await? {
            written.push("ResourceSlice");
        }
    }
    let managed = |meta: &kube::api::ObjectMeta| {
        meta.labels
            .as_ref()
            .and_then(|l| l.get("app.kubernetes.io/managed-by"))
            .is_some_and(|m| m == FIELD_MANAGER)
    };
    if current::<DeviceClass>(ctx, None, dra::DEVICE_CLASS).is_some_and(|c| managed(&c.metadata))
        && delete_owned(
            ctx,
            &Api::<DeviceClass>::all(ctx.client.clone()),
            dra::DEVICE_CLASS,
        )
        .await?
    {
        written.push("DeviceClass");
    }
    let ns = ctx.namespace.clone();
    let plugin = current::<DaemonSet>(ctx, Some(&ns), dra::PLUGIN_DAEMONSET)
        .filter(|d| managed(&d.metadata) && d.metadata.deletion_timestamp.is_none());
    let claims = dra::claims_holding(ctx.owned.resource_claims.state().iter().map(AsRef::as_ref));
    let withdrawal = dra::plugin_withdrawal(claims);
    if plugin.is_none() {
        return Ok(dra::PluginWithdrawal::Delete);
    }
    if withdrawal != dra::PluginWithdrawal::Delete {
        return Ok(withdrawal);
    }
    if delete_owned(
        ctx,
        &Api::<DaemonSet>::namespaced(ctx.client.clone(), &ns),
        dra::PLUGIN_DAEMONSET,
    )
    .await?
    {
        written.push("DaemonSet");
    }
    Ok(dra::PluginWithdrawal::Delete)
}
