//! Writes of owned objects: each applied only when it differs from what the caches (or this controller's last
//! write) show, deleted by name; every write counted in the metrics, named for the Applied Event and remembered
//! until the caches catch up.

use kube::Resource;
use kube::api::{Api, DeleteParams};

use super::Context;
use crate::metrics::KindLabels;
use crate::nodes::Node;
use crate::{Error, apply, caches};

/// Apply one owned object unless it already matches; returns the live object.
pub(super) async fn ensure<K>(
    ctx: &Context,
    written: &mut Vec<&'static str>,
    desired: K,
) -> Result<K, Error>
where
    K: caches::Cached + std::fmt::Debug + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_with(ctx, &api, written, desired).await
}

/// `name` as the cache has it, or as this controller last wrote it when the cache has not caught up.
pub(super) fn current<K: caches::Cached>(
    ctx: &Context,
    namespace: Option<&str>,
    name: &str,
) -> Option<K> {
    let mut key = K::default();
    key.meta_mut().name = Some(name.to_owned());
    key.meta_mut().namespace = namespace.map(str::to_owned);
    ctx.written
        .newest(&key, caches::cached(&ctx.owned, namespace, name))
}

/// Remembers the nodes the patches returned; returns how many were written.
pub(super) fn remember_nodes(ctx: &Context, live: Vec<Node>) -> usize {
    let written = live.len();
    for node in live {
        ctx.written_nodes.remember(node);
    }
    written
}

async fn apply_with<K>(
    ctx: &Context,
    api: &Api<K>,
    written: &mut Vec<&'static str>,
    desired: K,
) -> Result<K, Error>
where
    K: caches::Cached + std::fmt::Debug,
{
    let kind = apply::kind_of::<K>();
    let name = desired.meta().name.clone().unwrap_or_default();
    let cached = current::<K>(ctx, desired.meta().namespace.as_deref(), &name);
    let (was_written, live) = apply::ensure(api, desired, cached).await?;
    if was_written {
        ctx.written.remember(&live);
        ctx.metrics
            .object_writes
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
        written.push(kind);
    }
    Ok(live)
}

/// Apply the webhook configuration (cluster-scoped) through the same write accounting.
pub(super) async fn ensure_cluster<K>(
    ctx: &Context,
    written: &mut Vec<&'static str>,
    desired: K,
) -> Result<K, Error>
where
    K: caches::Cached + std::fmt::Debug + Resource<Scope = k8s_openapi::ClusterResourceScope>,
{
    let api: Api<K> = Api::all(ctx.client.clone());
    apply_with(ctx, &api, written, desired).await
}

/// Deletes an object this controller wrote; returns whether it existed. A deletion counts as a write of its kind.
pub(super) async fn delete_owned<K>(ctx: &Context, api: &Api<K>, name: &str) -> Result<bool, Error>
where
    K: caches::Cached + std::fmt::Debug,
{
    let kind = apply::kind_of::<K>();
    let mut key = K::default();
    key.meta_mut().name = Some(name.to_owned());
    key.meta_mut().namespace = api.namespace().map(str::to_owned);
    ctx.written.forget(&key);
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => {
            ctx.metrics
                .object_writes
                .get_or_create(&KindLabels { kind: kind.into() })
                .inc();
            Ok(true)
        }
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(false),
        Err(source) => Err(Error::Apply {
            kind,
            name: name.to_owned(),
            source,
        }),
    }
}
