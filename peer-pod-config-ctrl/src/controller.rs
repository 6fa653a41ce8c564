//! The reconciler: keeps each PeerPodConfig's DaemonSet, webhook objects and node capacity true, and removes
//! node capacity and the webhook configuration when the PeerPodConfig is deleted (finalizer).
//!
//! Watches: PeerPodConfigs (all namespaces, so a misplaced one is reported instead of ignored); the owned
//! DaemonSet, Deployment, Service and Secret (owner references); the cluster-scoped webhook configuration (by
//! name); Nodes, through one watch that both fills the node cache and triggers reconciles, filtered to changes
//! that matter (labels, our capacity value, nodes coming and going) so node heartbeats cost nothing.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, Resource, ResourceExt};
use tracing::{Instrument, info, info_span, warn};

use crate::capacity::{ProviderCapacity, free_instances};
use crate::cert::{self, ServingCert};
use crate::crd::{Limit, PeerPodConfig, PeerPodConfigStatus, node_selector_problem};
use crate::metrics::{KindLabels, Metrics, ResultLabels};
use crate::status::{self, Capacity, Invalid, Observed};
use crate::{Error, FIELD_MANAGER, apply, nodes, objects, spread};

/// Finalizer on PeerPodConfigs: node capacity and the webhook configuration are removed before the object goes.
pub const FINALIZER: &str = "confidentialcontainers.org/peerpodconfig-cleanup";

/// Resync period without changes: reads only, so it costs no writes, and it repairs anything a missed watch
/// event left behind.
const RESYNC: Duration = Duration::from_secs(300);
/// How long a stopping controller may take to finish its running reconciles.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);
/// How long a reconcile waits for the first node list before retrying later.
const NODE_CACHE_WAIT: Duration = Duration::from_secs(10);
/// How often a PeerPodConfig that waits for another one (duplicate) looks again.
const DUPLICATE_RECHECK: Duration = Duration::from_secs(30);

/// What the controller needs besides the API client.
#[derive(Clone, Default)]
pub struct Settings {
    /// Namespace of the owned objects (`PEERPODS_NAMESPACE`); PeerPodConfigs elsewhere are reported as invalid,
    /// because owner references cannot cross namespaces.
    pub namespace: String,
    /// provider-service, for `capacityFromProvider`.
    pub provider: Option<peerpods_runtime::client::ProviderClient>,
    /// Identity for Events (the Pod name).
    pub instance: Option<String>,
    /// How the CAA DaemonSet reaches provider-service; `None` leaves CAA without it.
    pub caa_provider_service: Option<objects::ProviderServiceWiring>,
}

/// Shared state of one controller run.
pub struct Context {
    pub client: Client,
    pub namespace: String,
    pub nodes: Store<Node>,
    pub configs: Store<PeerPodConfig>,
    pub metrics: Metrics,
    recorder: Recorder,
    provider: Option<ProviderCapacity>,
    caa_provider_service: Option<objects::ProviderServiceWiring>,
    failures: Mutex<HashMap<ObjectRef<PeerPodConfig>, u32>>,
}

/// A controller ready to run: its context (tests reconcile through it directly) and the future that runs it.
pub struct Running {
    pub context: Arc<Context>,
    pub run: BoxFuture<'static, ()>,
}

/// Builds the controller. `run` ends when `shutdown` completes.
pub fn new(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Running {
    let ns = settings.namespace.clone();
    let managed = format!("app.kubernetes.io/managed-by={FIELD_MANAGER}");
    let owned = || watcher::Config::default().labels(&managed);

    let (node_cache, node_writer) = reflector::store::<Node>();
    let node_events = watcher(Api::<Node>::all(client.clone()), watcher::Config::default())
        .default_backoff()
        .modify(nodes::keep_what_is_read)
        .reflect(node_writer);

    let controller = Controller::new(
        Api::<PeerPodConfig>::all(client.clone()),
        watcher::Config::default(),
    );
    let configs = controller.store();
    let all_configs = {
        let configs = configs.clone();
        move || {
            configs
                .state()
                .iter()
                .map(|c| ObjectRef::from_obj(c.as_ref()))
                .collect::<Vec<_>>()
        }
    };
    let on_node = all_configs.clone();
    let context = Arc::new(Context {
        client: client.clone(),
        namespace: ns.clone(),
        nodes: node_cache,
        configs,
        metrics,
        recorder: Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: settings.instance.clone(),
            },
        ),
        provider: settings.provider.map(ProviderCapacity::new),
        caa_provider_service: settings.caa_provider_service.clone(),
        failures: Mutex::new(HashMap::new()),
    });
    let run = controller
        .owns(Api::<DaemonSet>::namespaced(client.clone(), &ns), owned())
        .owns(Api::<Deployment>::namespaced(client.clone(), &ns), owned())
        .owns(Api::<Service>::namespaced(client.clone(), &ns), owned())
        // By name: the Secret RBAC covers only the serving certificate (the cloud credentials Secret lives in the
        // same namespace and stays out of reach), and list/watch under resourceNames needs this field selector.
        .owns(
            Api::<Secret>::namespaced(client.clone(), &ns),
            watcher::Config::default()
                .fields(&format!("metadata.name={}", objects::WEBHOOK_CERT_SECRET)),
        )
        .watches(
            Api::<MutatingWebhookConfiguration>::all(client.clone()),
            watcher::Config::default()
                .fields(&format!("metadata.name={}", objects::WEBHOOK_CONFIGURATION)),
            |mwc| owner_of(&mwc.metadata),
        )
        .watches_stream(relevant_node_changes(node_events), move |_| on_node())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "controller event");
            }
        })
        .boxed();
    Running { context, run }
}

/// Runs the controller until `shutdown`: directly, or, with `leader`, only while this replica holds the Lease (a
/// fresh controller with fresh caches on every term).
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    leader: Option<peerpods_runtime::leader::LeaderConfig>,
    shutdown: peerpods_runtime::shutdown::CancellationToken,
    readiness: Option<peerpods_runtime::admin::Readiness>,
) -> Result<(), peerpods_runtime::Error> {
    let work = || {
        new(
            client.clone(),
            settings.clone(),
            metrics.clone(),
            shutdown.clone().cancelled_owned(),
        )
        .run
    };
    match leader {
        Some(lease) => {
            peerpods_runtime::leader::run_while_leader(
                client.clone(),
                lease,
                shutdown.clone(),
                readiness,
                work,
            )
            .await
        }
        None => {
            let mut work = work();
            tokio::select! {
                () = &mut work => {}
                () = shutdown.cancelled() => {
                    // Let running reconciles finish, but bounded: a controller stopped during its very first list
                    // has been seen to wait on watches that are no longer polled.
                    if tokio::time::timeout(SHUTDOWN_GRACE, work).await.is_err() {
                        warn!("controller did not stop within {SHUTDOWN_GRACE:?}; dropped");
                    }
                }
            }
            Ok(())
        }
    }
}

/// The PeerPodConfig named by the owner labels of a cluster-scoped object.
fn owner_of(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<ObjectRef<PeerPodConfig>> {
    let labels = meta.labels.as_ref()?;
    let name = labels.get(objects::OWNER_LABEL)?;
    let ns = labels.get(objects::OWNER_NAMESPACE_LABEL)?;
    Some(ObjectRef::new(name).within(ns))
}

/// Node events that can change what a PeerPodConfig wants: a node appearing or leaving, its labels, or the
/// capacity value this controller owns. Status heartbeats and other updates are dropped here.
fn relevant_node_changes(
    events: impl Stream<Item = Result<watcher::Event<Node>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<Node, watcher::Error>> + Send + 'static {
    let mut seen: HashMap<String, u64> = HashMap::new();
    events.filter_map(move |event| {
        let out = match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                (node.labels(), nodes::current(&node)).hash(&mut hasher);
                let fingerprint = hasher.finish();
                (seen.insert(node.name_any(), fingerprint) != Some(fingerprint)).then_some(Ok(node))
            }
            Ok(watcher::Event::Delete(node)) => {
                seen.remove(&node.name_any());
                Some(Ok(node))
            }
            // A re-list (after a watch expired) may hide deletions that happened meanwhile: forget what was seen
            // so every listed node counts as a change and the configs are reconciled against the fresh list.
            Ok(watcher::Event::Init) => {
                seen.clear();
                None
            }
            Ok(watcher::Event::InitDone) => None,
            Err(e) => Some(Err(e)),
        };
        std::future::ready(out)
    })
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
    if result.is_ok()
        && let Ok(mut failures) = ctx.failures.lock()
    {
        failures.remove(&ObjectRef::new(&name).within(&ns));
    }
    result
}

/// Failed reconciles retry with a per-object exponential backoff (5 s doubling to 5 min), never a hot loop.
fn error_policy(config: Arc<PeerPodConfig>, error: &Error, ctx: Arc<Context>) -> Action {
    let attempts = ctx
        .failures
        .lock()
        .map(|mut f| {
            let n = f.entry(ObjectRef::from_obj(config.as_ref())).or_insert(0);
            *n = n.saturating_add(1);
            *n
        })
        .unwrap_or(1);
    let delay = Duration::from_secs(5u64.saturating_mul(1 << attempts.min(6).saturating_sub(1)))
        .min(RESYNC);
    warn!(
        peerpodconfig = %format!("{}/{}", config.namespace().unwrap_or_default(), config.name_any()),
        reason = error.reason(), error = %error, retry_in = ?delay, "reconcile failed"
    );
    Action::requeue(delay)
}

/// Why this PeerPodConfig cannot be acted on, if it cannot.
fn validate(config: &PeerPodConfig, ctx: &Context) -> Option<Invalid> {
    let ns = config.namespace().unwrap_or_default();
    if ns != ctx.namespace {
        return Some(Invalid {
            reason: "WrongNamespace",
            message: format!(
                "PeerPodConfigs are acted on only in namespace {}, where the DaemonSet and webhook live \
                 (owner references cannot cross namespaces)",
                ctx.namespace
            ),
        });
    }
    if let Some(first) = active_config(ctx).filter(|first| first.uid() != config.uid()) {
        return Some(Invalid {
            reason: "DuplicateConfig",
            message: format!(
                "PeerPodConfig {} already configures peer pods on this cluster; only the oldest one is acted on",
                first.name_any()
            ),
        });
    }
    if let Err(message) = config.spec.parsed_limit() {
        return Some(Invalid {
            reason: "InvalidLimit",
            message,
        });
    }
    if let Some(message) = node_selector_problem(&config.spec.node_selector) {
        return Some(Invalid {
            reason: "InvalidNodeSelector",
            message,
        });
    }
    None
}

/// The PeerPodConfig acted on: the oldest one in the controller's namespace that is not being deleted. One
/// cluster has one CAA DaemonSet and one webhook, so two configs would fight over them and over node capacity.
fn active_config(ctx: &Context) -> Option<Arc<PeerPodConfig>> {
    ctx.configs
        .state()
        .into_iter()
        .filter(|c| {
            c.namespace().as_deref() == Some(ctx.namespace.as_str())
                && c.metadata.deletion_timestamp.is_none()
        })
        .min_by(|a, b| {
            (a.creation_timestamp().map(|t| t.0), a.name_any())
                .cmp(&(b.creation_timestamp().map(|t| t.0), b.name_any()))
        })
}

/// Waits a bounded time for the first node list. Bounded, because the cache fills only while the controller polls
/// its watches: a reconcile waiting forever would block a graceful shutdown that waits for running reconciles.
async fn node_cache_ready(ctx: &Context) -> Result<(), Error> {
    match tokio::time::timeout(NODE_CACHE_WAIT, ctx.nodes.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(_)) | Err(_) => Err(Error::NodeCacheNotReady),
    }
}

async fn apply_config(config: Arc<PeerPodConfig>, ctx: &Context) -> Result<Action, Error> {
    // An empty cache would mean "no nodes" and strip capacity from every node: wait for the first list.
    node_cache_ready(ctx).await?;
    let mut observed = Observed {
        generation: config.metadata.generation,
        ..Observed::default()
    };
    if let Some(invalid) = validate(&config, ctx) {
        let recheck = invalid.reason == "DuplicateConfig";
        observed.invalid = Some(invalid);
        write_status(&config, &observed, ctx).await?;
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
    let daemonset = ensure(
        ctx,
        &mut written,
        objects::caa_daemonset(&config, ns, ctx.caa_provider_service.as_ref())?,
    )
    .await?;
    let secret_api: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let existing = secret_api
        .get_opt(objects::WEBHOOK_CERT_SECRET)
        .await
        .map_err(|source| Error::Read {
            kind: "Secret",
            name: objects::WEBHOOK_CERT_SECRET.into(),
            source,
        })?
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
    ensure_cluster(
        ctx,
        &mut written,
        objects::webhook_configuration(&config, ns, serving.ca_pem.as_bytes()),
    )
    .await?;
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

    // Node capacity.
    let all_nodes = ctx.nodes.state();
    let selected: Vec<&str> = all_nodes
        .iter()
        .filter(|n| nodes::selects(&config.spec.node_selector, n))
        .map(|n| n.metadata.name.as_deref().unwrap_or_default())
        .collect();
    let count = u64::try_from(selected.len()).unwrap_or(u64::MAX);
    let requested = match limit {
        Limit::Total(total) => u64::from(total),
        Limit::PerNode(each) => u64::from(each).saturating_mul(count),
    };
    let (provider_free, provider_problem) = provider_free(&config, ctx).await;
    let effective = provider_free.map_or(requested, |free| free.min(requested));
    let desired: BTreeMap<String, u32> = match limit {
        Limit::PerNode(each) if effective == requested => {
            spread::per_node(each, selected.iter().copied())
        }
        _ => spread::spread(
            u32::try_from(effective).unwrap_or(u32::MAX),
            selected.iter().copied(),
        ),
    };
    let changes = nodes::plan(all_nodes.iter().map(AsRef::as_ref), &desired);
    let node_api: Api<Node> = Api::all(ctx.client.clone());
    let patched = nodes::apply(&node_api, &changes).await;
    let patched_count = match &patched {
        Ok(n) => *n,
        Err(_) => 0,
    };
    ctx.metrics
        .node_writes
        .inc_by(u64::try_from(patched_count).unwrap_or(0));
    let patched = patched?;
    if patched > 0 {
        let note = format!(
            "kata.peerpods.io/vm {effective} over {} nodes: {patched} nodes updated",
            selected.len()
        );
        info!(%note, "node capacity changed");
        publish(ctx, &config, EventType::Normal, "CapacityChanged", note).await;
    }
    ctx.metrics
        .effective_limit
        .set(i64::try_from(effective).unwrap_or(i64::MAX));
    ctx.metrics
        .selected_nodes
        .set(i64::try_from(count).unwrap_or(i64::MAX));

    observed.capacity = Some(Capacity {
        requested,
        provider_free,
        effective,
        selected_nodes: u32::try_from(count).unwrap_or(u32::MAX),
        per_node_min: desired.values().min().copied(),
        per_node_max: desired.values().max().copied(),
    });
    observed.provider_problem = provider_problem;
    observed.objects_applied = true;
    observed.daemonset = Some(daemonset);
    observed.webhook = Some(webhook);
    write_status(&config, &observed, ctx).await?;

    Ok(match &config.spec.capacity_from_provider {
        Some(source) => Action::requeue(Duration::from_secs(u64::from(source.refresh_seconds))),
        None => Action::requeue(RESYNC),
    })
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
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
{
    let api: Api<K> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
    apply_with(ctx, &api, written, desired).await
}

async fn apply_with<K>(
    ctx: &Context,
    api: &Api<K>,
    written: &mut Vec<&'static str>,
    desired: K,
) -> Result<K, Error>
where
    K: Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let kind = apply::kind_of::<K>();
    let (was_written, live) = apply::ensure(api, desired).await?;
    if was_written {
        ctx.metrics
            .object_writes
            .get_or_create(&KindLabels { kind: kind.into() })
            .inc();
        written.push(kind);
    }
    Ok(live)
}

/// Write the status when it differs from what is stored (so an unchanged cluster costs no status write), and
/// announce an Invalid condition turning true with a Warning Event.
async fn write_status(
    config: &PeerPodConfig,
    observed: &Observed,
    ctx: &Context,
) -> Result<(), Error> {
    let previous = config.status.as_ref();
    let next = status::compute(previous, observed, Time(jiff::Timestamp::now()));
    if previous == Some(&next) {
        return Ok(());
    }
    let was_invalid = previous
        .map(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == status::INVALID && c.status == "True")
        })
        .unwrap_or(false);
    if let Some(invalid) = observed.invalid.as_ref().filter(|_| !was_invalid) {
        warn!(reason = invalid.reason, message = %invalid.message, "PeerPodConfig is invalid");
        publish(
            ctx,
            config,
            EventType::Warning,
            invalid.reason,
            invalid.message.clone(),
        )
        .await;
    }
    let name = config.name_any();
    let api: Api<PeerPodConfig> =
        Api::namespaced(ctx.client.clone(), &config.namespace().unwrap_or_default());
    let body = serde_json::json!({
        "apiVersion": PeerPodConfig::api_version(&()),
        "kind": PeerPodConfig::kind(&()),
        "status": status_body(&next),
    });
    api.patch_status(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await
    .map_err(|source| Error::Status { name, source })?;
    ctx.metrics.status_writes.inc();
    Ok(())
}

fn status_body(status: &PeerPodConfigStatus) -> serde_json::Value {
    serde_json::to_value(status).unwrap_or_default()
}

/// Deletion: remove node capacity and the webhook configuration (cluster-scoped, so no owner reference can
/// cascade to it). The namespaced objects go with the garbage collector through their owner references.
async fn cleanup(config: Arc<PeerPodConfig>, ctx: &Context) -> Result<Action, Error> {
    // Only the acted-on PeerPodConfig ever wrote capacity or the webhook configuration; a duplicate or misplaced
    // one must not remove what the acted-on one owns.
    let wrote_anything = config.namespace().as_deref() == Some(ctx.namespace.as_str())
        && active_config(ctx).is_none_or(|active| {
            active.creation_timestamp().map(|t| t.0) >= config.creation_timestamp().map(|t| t.0)
        });
    if !wrote_anything {
        return Ok(Action::await_change());
    }
    node_cache_ready(ctx).await?;
    let changes = nodes::plan(
        ctx.nodes.state().iter().map(AsRef::as_ref),
        &BTreeMap::new(),
    );
    let removed = nodes::apply(&Api::all(ctx.client.clone()), &changes).await?;
    ctx.metrics
        .node_writes
        .inc_by(u64::try_from(removed).unwrap_or(0));
    let mwc_api: Api<MutatingWebhookConfiguration> = Api::all(ctx.client.clone());
    let mwc = mwc_api
        .get_opt(objects::WEBHOOK_CONFIGURATION)
        .await
        .map_err(|source| Error::Read {
            kind: "MutatingWebhookConfiguration",
            name: objects::WEBHOOK_CONFIGURATION.into(),
            source,
        })?;
    if let Some(mwc) = mwc.filter(|m| objects::labelled_for(&m.metadata, &config)) {
        match mwc_api
            .delete(&mwc.name_any(), &DeleteParams::default())
            .await
        {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 404 => {}
            Err(source) => {
                return Err(Error::Delete {
                    kind: "MutatingWebhookConfiguration",
                    name: objects::WEBHOOK_CONFIGURATION.into(),
                    source,
                });
            }
        }
    }
    let note =
        format!("removed kata.peerpods.io/vm from {removed} nodes and the webhook configuration");
    info!(%note, "cleaned up");
    publish(ctx, &config, EventType::Normal, "CleanedUp", note).await;
    Ok(Action::await_change())
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
    K: Resource<Scope = k8s_openapi::ClusterResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(ctx.client.clone());
    apply_with(ctx, &api, written, desired).await
}
