//! The acting reconcile: applies what [`crate::validate`], [`crate::plan`] and [`crate::dra`] decided, records
//! status, Events and metrics, and undoes this controller's writes when a PeerPodConfig is deleted (finalizer).
//!
//! - Here: the [`Context`] of a controller run, [`reconcile`] (hold a deletion, else apply or clean up under the
//!   finalizer; its duration and result in the metrics) and [`error_policy`].
//! - `apply_config`: one PeerPodConfig applied: owned objects, the webhook's entry in the chart's webhook
//!   configuration, node capacity or in capacityMode dra the pool, then the status.
//! - `pool`: capacityMode dra's pool published (its DeviceClass, ResourceSlices and kubelet plugin), or withdrawn
//!   where the mode does not use it.
//! - `cleanup`: a deleted PeerPodConfig: held while peer pods run, then node capacity, the pool and the webhook's
//!   entry removed. The webhook configuration itself is the chart's: this controller only patches it.
//! - `owned`: writes of owned objects (server-side apply when they differ, deletion), counted and remembered until
//!   the caches show them.
//! - `record`: the status write and Events.

mod apply_config;
mod cleanup;
mod owned;
mod pool;
mod record;

pub use apply_config::PROGRESS_EVERY;

use apply_config::apply_config;
use cleanup::{cleanup, hold_deletion};

use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::Recorder;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, ResourceExt};
use peerpods_runtime::backoff::{self, Backoff, Failures};
use tracing::{Instrument, info_span, warn};

use crate::capacity::ProviderCapacity;
use crate::metrics::{Metrics, ResultLabels};
use crate::nodes::Node;
use crate::plan::RESYNC;
use crate::validate::{self, AllowedServiceAccounts};
use crate::{Error, caches, nodes, objects};
use peerpods_api::peerpodconfig::PeerPodConfig;

/// Finalizer on PeerPodConfigs: node capacity and the webhook's entry in the webhook configuration are removed
/// before the object goes.
pub const FINALIZER: &str = "confidentialcontainers.org/peerpodconfig-cleanup";

/// How long a reconcile waits for the first node list before retrying later.
const NODE_CACHE_WAIT: Duration = Duration::from_secs(10);

/// Failed reconciles retry with a per-object exponential backoff, 5 s doubling to the resync period (5 min),
/// never a hot loop.
pub const BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(5),
    cap: RESYNC,
};

/// Shared state of one controller run.
pub struct Context {
    pub client: Client,
    pub namespace: String,
    pub nodes: Store<Node>,
    pub configs: Store<PeerPodConfig>,
    pub metrics: Metrics,
    pub(crate) recorder: Recorder,
    pub(crate) provider: Option<ProviderCapacity>,
    pub(crate) caa_provider_service: Option<objects::ProviderServiceWiring>,
    /// The ServiceAccounts the rendered DaemonSet and Deployment may run as.
    pub(crate) service_accounts: AllowedServiceAccounts,
    /// Consecutive failures per PeerPodConfig; the watch forgets the ones that are gone (see `controller`).
    pub(crate) failures: Arc<Failures<ObjectRef<PeerPodConfig>>>,
    /// The owned objects and CAA's ConfigMap, as the watches have them: compared instead of read.
    pub owned: caches::Owned,
    /// Owned objects this controller wrote and the caches may not show yet.
    pub(crate) written: Arc<caches::Written>,
    /// Node values this controller patched and the node cache may not show yet.
    pub(crate) written_nodes: caches::WrittenNodes,
    /// The client-side bound on node patches.
    pub(crate) node_patches: Arc<nodes::PatchRate>,
}

impl Context {
    /// The PeerPodConfig acted on, from the cache (see [`validate::active_config`]).
    fn active_config(&self) -> Option<Arc<PeerPodConfig>> {
        validate::active_config(self.configs.state(), &self.namespace)
    }
}

/// One reconcile of one PeerPodConfig. Public so tests can run a reconcile and count its writes.
pub async fn reconcile(config: Arc<PeerPodConfig>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    let ns = config
        .namespace()
        .ok_or(Error::MissingMetadata("namespace"))?;
    let name = config.name_any();
    let api: Api<PeerPodConfig> = Api::namespaced(ctx.client.clone(), &ns);
    let span = info_span!("reconcile", peerpodconfig = %format!("{ns}/{name}"));
    // Before the finalizer helper sees a deletion (it releases the finalizer once cleanup returns): hold it
    // while peer pods still run.
    if let Some(action) = hold_deletion(&config, &ctx)
        .instrument(span.clone())
        .await?
    {
        return Ok(action);
    }
    let result = finalizer(&api, FINALIZER, config, |event| async {
        match event {
            Finalizer::Apply(config) => apply_config(config, &ctx).await,
            Finalizer::Cleanup(config) => cleanup(config, &ctx).await,
        }
    })
    .instrument(span)
    .await
    .map_err(|e| Error::Finalizer(Box::new(e)));
    ctx.metrics
        .reconcile_duration
        .observe(started.elapsed().as_secs_f64());
    let label = match &result {
        Ok(_) => "ok".to_owned(),
        Err(e) => e.reason().to_owned(),
    };
    ctx.metrics
        .reconciles
        .get_or_create(&ResultLabels { result: label })
        .inc();
    if result.is_ok() {
        ctx.failures.forget(&ObjectRef::new(&name).within(&ns));
    }
    result
}

/// Retries a failed reconcile after [`BACKOFF`] for this object's consecutive failures.
pub fn error_policy(config: Arc<PeerPodConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    let failures = ctx.failures.record(ObjectRef::from_obj(config.as_ref()));
    let namespace = config.namespace().unwrap_or_default();
    let name = config.name_any();
    let delay = BACKOFF.delay(failures, false, None, backoff::jitter());
    warn!(
        peerpodconfig = %format!("{namespace}/{name}"),
        reason = error.reason(), error = %error, retry_in = ?delay, "reconcile failed"
    );
    Action::requeue(delay)
}

/// Waits a bounded time for the first node list. Bounded, because the cache fills only while the controller polls
/// its watches: a reconcile waiting forever would block a graceful shutdown that waits for running reconciles.
async fn node_cache_ready(ctx: &Context) -> Result<(), Error> {
    let ready =
        async { ctx.nodes.wait_until_ready().await.is_ok() && ctx.owned.wait_until_ready().await };
    // The caches of the owned objects too: compared against an empty cache, every object would be written.
    match tokio::time::timeout(NODE_CACHE_WAIT, ready).await {
        Ok(true) => Ok(()),
        Ok(false) | Err(_) => Err(Error::NodeCacheNotReady),
    }
}
