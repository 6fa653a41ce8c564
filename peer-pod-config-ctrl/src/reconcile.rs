//! The acting reconcile: applies what [`crate::validate`], [`crate::plan`] and [`crate::dra`] decided (node
//! capacity, or in capacityMode dra the pool's DeviceClass, ResourceSlices and kubelet plugin, withdrawing
//! whichever the mode does not use), records status, Events and metrics, and removes node capacity and its webhook from the webhook configuration when a PeerPodConfig is
//! deleted (finalizer). The webhook configuration itself is the chart's: this controller only patches it.
//! The only module of the controller that writes to the API or calls provider-service.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Secret};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Client, Resource, ResourceExt};
use peerpods_runtime::backoff::{self, Backoff, Failures};
use peerpods_runtime::status::apply_status;
use tracing::{Instrument, info, info_span, warn};

use crate::capacity::{ProviderCapacity, free_instances};
use crate::cert::{self, ServingCert};
use crate::crd::{CapacityMode, PeerPodConfig, PeerPodConfigStatus};
use crate::metrics::{KindLabels, Metrics, ResultLabels};
use crate::plan::{self, RESYNC};
use crate::status::{self, Observed};
use crate::validate::{self, AllowedServiceAccounts, InvalidReason};
use crate::{Error, FIELD_MANAGER, apply, caches, dra, hold, nodes, objects};

/// Finalizer on PeerPodConfigs: node capacity and the webhook's entry in the webhook configuration are removed
/// before the object goes.
pub const FINALIZER: &str = "confidentialcontainers.org/peerpodconfig-cleanup";

/// How long a reconcile waits for the first node list before retrying later.
const NODE_CACHE_WAIT: Duration = Duration::from_secs(10);
/// How often a PeerPodConfig that waits for another one (duplicate) looks again.
const DUPLICATE_RECHECK: Duration = Duration::from_secs(30);

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

async fn apply_config(config: Arc<PeerPodConfig>, ctx: &Context) -> Result<Action, Error> {
    // An empty cache would mean "no nodes" and strip capacity from every node: wait for the first list.
    node_cache_ready(ctx).await?;
    let mut observed = Observed {
        generation: config.metadata.generation,
        ..Observed::default()
    };
    let active = ctx.active_config();
    if let Some(invalid) = validate::validate(
        &config,
        &ctx.namespace,
        active.as_deref(),
        &ctx.service_accounts,
    ) {
        let recheck = invalid.reason == InvalidReason::DuplicateConfig;
        observed.invalid = Some(invalid);
        write_status(&config, config.status.as_ref(), &observed, ctx).await?;
        return Ok(if recheck {
            Action::requeue(DUPLICATE_RECHECK)
        } else {
            Action::await_change()
        });
    }
    let limit = config.spec.parsed_limit().map_err(Error::InvalidSpec)?;
    let ns = ctx.namespace.as_str();

    // Owned objects.
    let mut written = Vec::new();
    let cloud = caa_cloud(&config, ctx).await;
    let rendered = current::<DaemonSet>(ctx, Some(ns), objects::CAA_DAEMONSET)
        .filter(|ds| objects::labelled_for(&ds.metadata, &config))
        .map(|ds| objects::rendered_developer_mode(&ds));
    let daemonset = ensure(
        ctx,
        &mut written,
        objects::caa_daemonset(&config, ns, ctx.caa_provider_service.as_ref(), &cloud)?,
    )
    .await?;
    let existing = current::<Secret>(ctx, Some(ns), objects::WEBHOOK_CERT_SECRET)
        .filter(|s| objects::labelled_for(&s.metadata, &config))
        .as_ref()
        .and_then(ServingCert::from_secret);
    let (serving, renewed) = cert::ensure(
        existing,
        &objects::webhook_dns_names(ns),
        jiff::Timestamp::now(),
    )?;
    if let Some(why) = &renewed {
        info!(reason = %why, "issuing a new webhook serving certificate");
    }
    ensure(ctx, &mut written, serving.to_secret(&config, ns)?).await?;
    ensure(ctx, &mut written, objects::webhook_service(&config, ns)?).await?;
    let webhook = ensure(ctx, &mut written, objects::webhook_deployment(&config, ns)?).await?;
    // The chart creates the webhook configuration; this controller adds its webhook to it and never creates it:
    // absent (an install without the chart), the PeerPodConfig says so and the reconcile is retried with backoff
    // (the watch on the configuration also triggers one as soon as it is created).
    let chart_configuration =
        current::<MutatingWebhookConfiguration>(ctx, None, objects::WEBHOOK_CONFIGURATION);
    let missing = match chart_configuration.and_then(|c| c.metadata.uid) {
        Some(uid) => {
            ensure_cluster(
                ctx,
                &mut written,
                objects::webhook_configuration(&config, ns, serving.ca_pem.as_bytes(), &uid),
            )
            .await?;
            None
        }
        None => Some(Error::WebhookConfigurationMissing {
            name: objects::WEBHOOK_CONFIGURATION,
        }),
    };
    if let Some(missing) = &missing
        && !webhook_condition_is(&config, missing.reason())
    {
        warn!(error = %missing, "the webhook configuration is missing");
        publish(
            ctx,
            &config,
            EventType::Warning,
            missing.reason(),
            missing.to_string(),
        )
        .await;
    }
    // Capacity: the plan decides the total in both modes.
    // As last patched by this controller where the cache has not caught up yet: a reconcile right after a
    // patch never plans (and writes) the same value again.
    let all_nodes: Vec<Node> = ctx
        .nodes
        .state()
        .iter()
        .map(|node| ctx.written_nodes.newest(node))
        .collect();
    let (provider_free, provider_problem) = provider_free(&config, ctx).await;
    let planned = plan::capacity(
        limit,
        &config.spec.node_selector,
        all_nodes.iter(),
        provider_free,
        cloud.developer_mode,
    );
    // Said once, when the CAA pods are rendered for another mode than before (not on the first render: a new
    // install's mode is in the status).
    if let Some(note) =
        rendered.and_then(|was| status::developer_mode_change(was, cloud.developer_mode))
    {
        info!(%note, "cloud-api-adaptor's developer mode changed");
        let type_ = match planned.ceiling {
            Some(status::NodeCeiling::DeveloperModeUnknown) => EventType::Warning,
            Some(status::NodeCeiling::DeveloperMode) | None => EventType::Normal,
        };
        publish(ctx, &config, type_, status::DEVELOPER_MODE_CHANGED, note).await;
    }
    if !planned.invalid_overrides.is_empty() {
        warn!(
            nodes = ?planned.invalid_overrides,
            label = crate::spread::VM_LIMIT_LABEL,
            "node label is not a count; those nodes get a spread share"
        );
    }
    let mut capacity = planned.status();
    // In dra mode the pool replaces node capacity: the nodes lose what this controller advertised (a node that
    // still advertises the resource would be served from its own allocatable, never from the pool); in node mode
    // the pool's objects go.
    let node_changes = match config.spec.capacity_mode {
        CapacityMode::Node => {
            if let dra::PluginWithdrawal::Drain { claims } =
                withdraw_pool(ctx, &mut written).await?
            {
                observed.dra_plugin = Some(status::DraPlugin::Draining { claims });
            }
            planned.changes.clone()
        }
        CapacityMode::Dra => {
            let (pool, plugin) =
                publish_pool(ctx, &config, ns, planned.effective, &mut written).await?;
            observed.dra_plugin = Some(status::DraPlugin::Serving(Some(Box::new(plugin))));
            capacity.per_node_min = None;
            capacity.per_node_max = None;
            capacity.pool = Some(pool);
            plan::removal(all_nodes.iter())
        }
    };
    let pool = capacity.pool.unwrap_or_default();
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
    if !written.is_empty() {
        publish(
            ctx,
            &config,
            EventType::Normal,
            "Applied",
            format!("applied {}", written.join(", ")),
        )
        .await;
    }
    observed.capacity = Some(capacity);
    observed.provider_problem = provider_problem;
    observed.objects_applied = missing.is_none();
    observed.daemonset = Some(daemonset);
    observed.webhook = Some(webhook);
    observed.webhook_configuration_problem = missing.as_ref().map(|e| (e.reason(), e.to_string()));
    let node_api: Api<Node> = Api::all(ctx.client.clone());
    let (patched, shown) = apply_nodes(ctx, &config, &node_api, &node_changes, &observed).await;
    let patched = patched.map(|live| remember_nodes(ctx, &live));
    let patched_count = match &patched {
        Ok(n) => *n,
        Err(_) => 0,
    };
    ctx.metrics
        .node_writes
        .inc_by(u64::try_from(patched_count).unwrap_or(0));
    let patched = patched?;
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
        publish(ctx, &config, EventType::Normal, "CapacityChanged", note).await;
    }
    ctx.metrics
        .effective_limit
        .set(i64::try_from(effective).unwrap_or(i64::MAX));
    ctx.metrics
        .selected_nodes
        .set(i64::try_from(planned.selected_nodes).unwrap_or(i64::MAX));

    write_status(&config, shown.as_ref(), &observed, ctx).await?;

    match missing {
        // An error, so the retry backs off per object (error_policy), never a hot loop.
        Some(missing) => Err(missing),
        None => Ok(Action::requeue(plan::next_check(&config))),
    }
}

/// Whether the stored WebhookReady condition already has `reason` (its Warning Event was published then).
fn webhook_condition_is(config: &PeerPodConfig, reason: &str) -> bool {
    config.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == status::WEBHOOK_READY && c.reason == reason)
    })
}

/// The cloud the CAA DaemonSet is rendered for: `spec.caa.provider`, else the `CLOUD_PROVIDER` of CAA's ConfigMap
/// (whose `CACERT_FILE` also decides the agent TLS mount, and `PODVM_DEVELOPER_MODE` CAA's developer mode). A
/// ConfigMap that cannot be read leaves the per-cloud parts out, with a warning naming why, rather than blocking
/// the rest of the setup; its developer mode is then unknown, which caps node capacity as developer mode does.
async fn caa_cloud(config: &PeerPodConfig, ctx: &Context) -> objects::CaaCloud {
    let name = &config.spec.config_map_name;
    let read = if name == caches::CAA_CONFIG_MAP {
        // Watched (the RBAC grants only this name): from the cache.
        Ok(current::<ConfigMap>(ctx, Some(&ctx.namespace), name))
    } else {
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        api.get_opt(name).await
    };
    // Absent is an empty ConfigMap (developer mode off, CAA's default); unreadable is `None` (the mode unknown).
    let (data, exists) = match read {
        Ok(Some(cm)) => (Some(cm.data.unwrap_or_default()), true),
        Ok(None) => {
            warn!(configmap = %name, "CAA's ConfigMap does not exist; the DaemonSet gets no per-cloud parts");
            (Some(Default::default()), false)
        }
        Err(e) => {
            warn!(configmap = %name, error = %e, "reading CAA's ConfigMap failed; the DaemonSet gets no per-cloud parts and developer mode is assumed");
            (None, false)
        }
    };
    let cloud = objects::CaaCloud::resolve(config.spec.caa.provider, data.as_ref());
    if cloud.provider.is_none() && exists {
        warn!(configmap = %name, "CAA's ConfigMap names no known CLOUD_PROVIDER and spec.caa.provider is unset; the DaemonSet gets no per-cloud parts");
    }
    cloud
}

/// Free capacity for `capacityFromProvider`, or why it is unknown (then the limit alone decides).
async fn provider_free(config: &PeerPodConfig, ctx: &Context) -> (Option<u64>, Option<String>) {
    let Some(source) = &config.spec.capacity_from_provider else {
        return (None, None);
    };
    let Some(provider) = &ctx.provider else {
        return (
            None,
            Some("the controller runs without --provider-endpoint".into()),
        );
    };
    let max_age = Duration::from_secs(u64::from(source.refresh_seconds));
    match provider.figures(source.cloud_provider.as_str(), max_age).await {
        Ok(figures) => match free_instances(&figures, source) {
            Some(free) => (Some(free), None),
            None => (None, Some("the provider reports no usable figure (set vcpusPerInstance or memoryMiBPerInstance)".into())),
        },
        Err(e) => {
            warn!(error = %e, "provider capacity unknown; using the limit alone");
            (None, Some(e.to_string()))
        }
    }
}

/// Apply one owned object unless it already matches; returns the live object.
async fn ensure<K>(ctx: &Context, written: &mut Vec<&'static str>, desired: K) -> Result<K, Error>
where
    K: caches::Cached + std::fmt::Debug + Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_with(ctx, &api, written, desired).await
}

/// `name` as the cache has it, or as this controller last wrote it when the cache has not caught up.
fn current<K: caches::Cached>(ctx: &Context, namespace: Option<&str>, name: &str) -> Option<K> {
    let mut key = K::default();
    key.meta_mut().name = Some(name.to_owned());
    key.meta_mut().namespace = namespace.map(str::to_owned);
    ctx.written
        .newest(&key, caches::cached(&ctx.owned, namespace, name))
}

/// Remembers the nodes the patches returned; returns how many were written.
fn remember_nodes(ctx: &Context, live: &[Node]) -> usize {
    for node in live {
        ctx.written_nodes.remember(node);
    }
    live.len()
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

/// How often the status shows how far node patches that are still going are. A rebalance done sooner (at the
/// default pace, one of up to about 150 nodes) writes no progress, only its outcome.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Patches the nodes (`nodes::apply`, at the configured pace), and while they go writes every [`PROGRESS_EVERY`]
/// a status saying "applying capacity: n of m nodes". Returns the patched nodes and the status as stored now
/// (the one read, or the last progress written), which the final status write compares against.
async fn apply_nodes(
    ctx: &Context,
    config: &PeerPodConfig,
    api: &Api<Node>,
    changes: &[(String, nodes::CapacityChange)],
    observed: &Observed,
) -> (Result<Vec<Node>, Error>, Option<PeerPodConfigStatus>) {
    let (done, mut progress) = tokio::sync::watch::channel(0);
    let of = u32::try_from(changes.len()).unwrap_or(u32::MAX);
    let patches = async move {
        let result = nodes::apply(api, changes, &ctx.node_patches, &done).await;
        // Dropping the sender ends the progress reports.
        drop(done);
        result
    };
    let report = async {
        let mut shown = config.status.clone();
        loop {
            // A progress write in flight is finished, never cancelled: it must not land after the final one.
            tokio::select! {
                () = tokio::time::sleep(PROGRESS_EVERY) => {}
                () = async { while progress.changed().await.is_ok() {} } => return shown,
            }
            let applying = status::Applying {
                done: u32::try_from(*progress.borrow_and_update()).unwrap_or(u32::MAX),
                of,
            };
            let now = Observed {
                applying: Some(applying),
                ..observed.clone()
            };
            match write_status(config, shown.as_ref(), &now, ctx).await {
                Ok(status) => shown = Some(status),
                // The final write after the patches tells the outcome; a lost report only delays the news.
                Err(e) => warn!(error = %e, "could not show the progress of node patches"),
            }
        }
    };
    tokio::join!(patches, report)
}

/// Write the status when it differs from `previous`, what is stored (so an unchanged cluster costs no status
/// write), and announce an Invalid condition turning true with a Warning Event. Returns the status as it now is.
async fn write_status(
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

/// Deletion: remove node capacity and this controller's webhook from the chart's webhook configuration
/// (cluster-scoped, so no owner reference could cascade to it; and the object is the chart's, so it stays). The
/// namespaced objects go with the garbage collector through their owner references.
async fn cleanup(config: Arc<PeerPodConfig>, ctx: &Context) -> Result<Action, Error> {
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
    .map(|live| remember_nodes(ctx, &live))?;
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
    publish(ctx, &config, EventType::Normal, "CleanedUp", note).await;
    Ok(Action::await_change())
}

/// A PeerPodConfig being deleted (with our finalizer, not forced) while peer pods run: keeps the finalizer,
/// says why (condition, a Warning Event when the list changes) and looks again after [`hold::RECHECK`].
async fn hold_deletion(config: &PeerPodConfig, ctx: &Context) -> Result<Option<Action>, Error> {
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
            hold::DELETION_HELD,
            message,
        )
        .await;
    }
    Ok(Some(Action::requeue(hold::RECHECK)))
}

async fn publish(
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

/// Apply the webhook configuration (cluster-scoped) through the same write accounting.
async fn ensure_cluster<K>(
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

/// capacityMode dra: publishes the pool of `total` slots (never fewer than are allocated now), its DeviceClass and
/// the kubelet plugin DaemonSet; returns the pool's figures.
async fn publish_pool(
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
async fn withdraw_pool(
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

/// Deletes an object this controller wrote; returns whether it existed. A deletion counts as a write of its kind.
async fn delete_owned<K>(ctx: &Context, api: &Api<K>, name: &str) -> Result<bool, Error>
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
