//! Watch and wiring: which objects the controller watches, what each change triggers, and how it runs (directly
//! or under a Lease). Deciding is in [`crate::validate`] and [`crate::plan`], acting in [`crate::reconcile`].
//!
//! Watches: PeerPodConfigs (all namespaces, so a misplaced one is reported instead of ignored); the owned
//! DaemonSet, Deployment, Service and Secret (owner references); the cluster-scoped webhook configuration the
//! chart creates (by name: its creation starts a reconcile); for capacityMode dra the DeviceClass (by name), the
//! pool's ResourceSlices (by label) and every ResourceClaim, filtered to allocations from the pool; Nodes, through one watch that both fills the node cache and triggers reconciles, filtered to changes
//! that matter (labels, our capacity value, nodes coming and going) so node heartbeats cost nothing.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::Api;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Client, ResourceExt};
use peerpods_runtime::backoff::Failures;
use peerpods_runtime::health::{self, Health, Progress};
use peerpods_runtime::watch;
use tracing::warn;

use crate::capacity::ProviderCapacity;
use crate::metrics::Metrics;
use crate::name::FIELD_MANAGER;
use crate::reconcile::error_policy;
use crate::{caches, dra, nodes, objects};
use peerpods_api::peerpodconfig::PeerPodConfig;
use peerpods_provider_client::ProviderService;

pub use crate::reconcile::{Context, FINALIZER, reconcile};

/// How long a stopping controller may take to finish its running reconciles.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// Names of the watches on `/healthz` and `/readyz`.
pub const CONFIG_WATCH: &str = "watch/peerpodconfigs";
pub const NODE_WATCH: &str = "watch/nodes";
/// Name of the reconcile loop's watchdog on `/healthz`.
pub const RECONCILE_LOOP: &str = "loop/reconcile";

/// What the controller needs besides the API client.
#[derive(Clone, Default)]
pub struct Settings {
    /// Namespace of the owned objects (`PEERPODS_NAMESPACE`); PeerPodConfigs elsewhere are reported as invalid,
    /// because owner references cannot cross namespaces.
    pub namespace: String,
    /// provider-service, for `capacityFromProvider`.
    pub provider: Option<peerpods_provider_client::ProviderClient>,
    /// Identity for Events (the Pod name).
    pub instance: Option<String>,
    /// How the CAA DaemonSet reaches provider-service; `None` leaves CAA without it.
    pub caa_provider_service: Option<objects::ProviderServiceWiring>,
    /// The ServiceAccounts CAA's DaemonSet and the webhook may run as; a PeerPodConfig naming others is invalid.
    pub service_accounts: crate::validate::AllowedServiceAccounts,
    /// How fast node patches go (`--node-patches-per-second`, `--node-patch-burst`).
    pub node_patch_pace: nodes::Pace,
}

/// A controller ready to run: its context (tests reconcile through it directly) and the future that runs it.
pub struct Running {
    pub context: Arc<Context>,
    pub run: BoxFuture<'static, ()>,
}

/// Builds the controller, without health tracking. `run` ends when `shutdown` completes.
pub fn new(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> Running {
    build(client, settings, metrics, shutdown, None)
}

/// Builds the controller; with `health`, the PeerPodConfig and Node watches are tracked (each with a heartbeat)
/// until `run` ends. `run` ends when `shutdown` completes.
pub fn build(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
    health: Option<&Health>,
) -> Running {
    let ns = settings.namespace.clone();
    let managed = format!("app.kubernetes.io/managed-by={FIELD_MANAGER}");
    let owned = || watcher::Config::default().labels(&managed);
    let config_api = Api::<PeerPodConfig>::all(client.clone());
    let node_api = Api::<nodes::Node>::all(client.clone());
    let config_progress = health.map(|h| h.track(CONFIG_WATCH));
    let node_progress = health.map(|h| h.track(NODE_WATCH));
    let heartbeats = futures::future::join(
        heartbeat(config_api.clone(), config_progress.clone()),
        heartbeat(node_api.clone(), node_progress.clone()),
    );

    let (node_cache, node_writer) = reflector::store::<nodes::Node>();
    // A streaming list, as peerpod-ctrl's PeerPod watch: nodes arrive one by one and are trimmed as they come,
    // so no page of 500 whole Nodes (about 10 KiB of JSON each, most of it images) is held at once.
    let node_events = watch::backoff(watcher(
        node_api,
        watcher::Config::default().streaming_lists(),
    ))
    .map(observed_by(node_progress))
    .modify(nodes::keep_what_is_read)
    .reflect(node_writer);

    // As Controller::new builds its own watch, with the events counted on the way.
    let (configs, config_writer) = reflector::store::<PeerPodConfig>();
    // Backoff on a failing watch (the CRD not installed yet, a forbidden list, the API server away), reset only by
    // progress: without it the watcher re-lists about every second, a request loop with a warning each time.
    let forget_failures = Arc::new(Failures::<ObjectRef<PeerPodConfig>>::default());
    let config_events = watch::backoff(watcher(config_api, watcher::Config::default()))
        .map(observed_by(config_progress))
        .map(forget_gone(forget_failures.clone()))
        .modify(caches::keep_what_is_read)
        .reflect(config_writer)
        .applied_objects();
    let controller = Controller::for_stream(config_events, configs.clone());
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
    // The owned objects (and CAA's ConfigMap), each cached by the watch that triggers reconciles: a reconcile
    // compares against these instead of reading them (crate::caches).
    let written = Arc::new(caches::Written::default());
    let (daemonset_cache, daemonsets) = cached_watch(
        Api::<DaemonSet>::namespaced(client.clone(), &ns),
        owned(),
        &written,
    );
    let (deployment_cache, deployments) = cached_watch(
        Api::<Deployment>::namespaced(client.clone(), &ns),
        owned(),
        &written,
    );
    let (service_cache, services) = cached_watch(
        Api::<Service>::namespaced(client.clone(), &ns),
        owned(),
        &written,
    );
    // By name: the Secret RBAC covers only the serving certificate (the cloud credentials Secret lives in the
    // same namespace and stays out of reach), and list/watch under resourceNames needs this field selector.
    let (secret_cache, secrets) = cached_watch(
        Api::<Secret>::namespaced(client.clone(), &ns),
        watcher::Config::default()
            .fields(&format!("metadata.name={}", objects::WEBHOOK_CERT_SECRET)),
        &written,
    );
    let (webhook_cache, webhooks) = cached_watch(
        Api::<MutatingWebhookConfiguration>::all(client.clone()),
        watcher::Config::default()
            .fields(&format!("metadata.name={}", objects::WEBHOOK_CONFIGURATION)),
        &written,
    );
    let (config_map_cache, config_maps) = cached_watch(
        Api::<ConfigMap>::namespaced(client.clone(), &ns),
        watcher::Config::default().fields(&format!("metadata.name={}", caches::CAA_CONFIG_MAP)),
        &written,
    );
    // capacityMode dra: the pool's DeviceClass (by name) and ResourceSlices (ours by label), and every
    // ResourceClaim, whose allocations keep slots in the pool. Watched in node mode too: a leftover pool is
    // removed, and a claim watch costs nothing while no claim changes.
    let (device_class_cache, device_classes) = cached_watch(
        Api::<DeviceClass>::all(client.clone()),
        watcher::Config::default().fields(&format!("metadata.name={}", dra::DEVICE_CLASS)),
        &written,
    );
    let (resource_slice_cache, resource_slices) =
        cached_watch(Api::<ResourceSlice>::all(client.clone()), owned(), &written);
    let (claim_cache, claim_writer) = reflector::store::<ResourceClaim>();
    let claims = watch::backoff(watcher(
        Api::<ResourceClaim>::all(client.clone()),
        watcher::Config::default(),
    ))
    .modify(dra::keep_allocation)
    .reflect(claim_writer);
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
        provider: settings
            .provider
            .map(|client| ProviderCapacity::new(ProviderService::new(client, FIELD_MANAGER))),
        caa_provider_service: settings.caa_provider_service.clone(),
        service_accounts: settings.service_accounts.clone(),
        failures: forget_failures,
        owned: caches::Owned {
            daemonsets: daemonset_cache,
            deployments: deployment_cache,
            services: service_cache,
            secrets: secret_cache,
            webhooks: webhook_cache,
            config_maps: config_map_cache,
            device_classes: device_class_cache,
            resource_slices: resource_slice_cache,
            resource_claims: claim_cache,
        },
        written,
        written_nodes: caches::WrittenNodes::default(),
        node_patches: Arc::new(nodes::PatchRate::from(settings.node_patch_pace)),
    });
    let on_config_map = all_configs.clone();
    let on_webhook_configuration = all_configs.clone();
    let on_claim = all_configs.clone();
    let controller = controller
        .owns_stream(daemonsets)
        .owns_stream(deployments)
        .owns_stream(services)
        .owns_stream(secrets)
        // Once it carries the webhook, its PeerPodConfig; before (the chart just created it), every one: the
        // PeerPodConfig waiting for it goes on.
        .watches_stream(webhooks, move |mwc| match owner_of(&mwc.metadata) {
            Some(owner) => vec![owner],
            None => on_webhook_configuration(),
        })
        // CAA's ConfigMap decides the per-cloud parts of the DaemonSet: a change re-renders it.
        .watches_stream(config_maps, move |_| on_config_map())
        .watches_stream(relevant_node_changes(node_events), move |_| on_node())
        .watches_stream(device_classes, move |c| {
            owner_of(&c.metadata).into_iter().collect::<Vec<_>>()
        })
        .watches_stream(resource_slices, move |s| {
            owner_of(&s.metadata).into_iter().collect::<Vec<_>>()
        })
        // An allocation of a pool device made or released: the pool's figures (and what a shrink keeps) change.
        .watches_stream(pool_allocation_changes(claims), move |_| on_claim())
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, context.clone())
        .for_each(|result| async move {
            if let Err(e) = result {
                warn!(error = %e, "controller event");
            }
        });
    // In the controller's own task: a reconcile loop that stops being polled stops the watchdog too.
    let watchdog = match health {
        Some(h) => health::watchdog(h.liveness.track_loop(RECONCILE_LOOP)).left_future(),
        None => std::future::pending().right_future(),
    };
    let run = async move {
        // The heartbeats and the watchdog never end; the controller decides how long this runs.
        tokio::select! {
            () = controller => {}
            _ = heartbeats => {}
            () = watchdog => {}
        }
    }
    .boxed();
    Running { context, run }
}

/// A watch of `api` (with backoff) that fills a cache, and the stream of the objects it saw change, for a
/// controller trigger. managedFields are dropped before caching: nothing compares them, and they are most of a
/// DaemonSet's size.
fn cached_watch<K>(
    api: Api<K>,
    config: watcher::Config,
    written: &Arc<caches::Written>,
) -> (
    reflector::Store<K>,
    impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
)
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug
        + Send
        + Sync
        + 'static,
{
    let (cache, writer) = reflector::store::<K>();
    let written = written.clone();
    let stream = watch::backoff(watcher(api, config))
        // Deleted (by someone else): a write of ours no longer stands for it, the next reconcile creates it anew.
        .map(move |event| {
            if let Ok(watcher::Event::Delete(object)) = &event {
                written.forget(object);
            }
            event
        })
        .modify(caches::keep_what_is_read)
        .reflect(writer)
        .touched_objects();
    (cache, stream)
}

/// Forgets the retry state of PeerPodConfigs that are gone: on their Delete event, and on a re-list (after a
/// watch expired or the API server was away) of every one the new list did not bring back, whose Delete event was
/// never seen.
fn forget_gone(
    failures: Arc<Failures<ObjectRef<PeerPodConfig>>>,
) -> impl FnMut(
    Result<watcher::Event<PeerPodConfig>, watcher::Error>,
) -> Result<watcher::Event<PeerPodConfig>, watcher::Error> {
    let mut listed: Option<std::collections::HashSet<ObjectRef<PeerPodConfig>>> = None;
    move |event| {
        match &event {
            Ok(watcher::Event::Delete(config)) => failures.forget(&ObjectRef::from_obj(config)),
            Ok(watcher::Event::Init) => listed = Some(Default::default()),
            Ok(watcher::Event::InitApply(config)) => {
                if let Some(listed) = &mut listed {
                    listed.insert(ObjectRef::from_obj(config));
                }
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(listed) = listed.take() {
                    failures.retain(|key| listed.contains(key));
                }
            }
            Ok(watcher::Event::Apply(_)) | Err(_) => {}
        }
        event
    }
}

/// Counts watch events as progress of `progress`, when tracked.
fn observed_by<K>(
    progress: Option<Progress>,
) -> impl FnMut(Result<watcher::Event<K>, watcher::Error>) -> Result<watcher::Event<K>, watcher::Error>
{
    move |event| {
        if let Some(p) = &progress {
            p.observe(&event);
        }
        event
    }
}

/// The heartbeat of a tracked watch; pending forever when untracked.
async fn heartbeat<K>(api: Api<K>, progress: Option<Progress>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    match progress {
        Some(p) => health::heartbeat(api, p).await,
        None => std::future::pending().await,
    }
}

/// Runs the controller until `shutdown`: directly, or, with `leader`, only while this replica holds the Lease (a
/// fresh controller with fresh caches on every term). With `health`, its watches are tracked for `/healthz` and
/// `/readyz` while a term lasts.
pub async fn run(
    client: Client,
    settings: Settings,
    metrics: Metrics,
    leader: Option<peerpods_runtime::leader::LeaderConfig>,
    shutdown: peerpods_runtime::shutdown::CancellationToken,
    health: Option<Health>,
) -> Result<(), peerpods_runtime::Error> {
    let work = || {
        build(
            client.clone(),
            settings.clone(),
            metrics.clone(),
            shutdown.clone().cancelled_owned(),
            health.as_ref(),
        )
        .run
    };
    let readiness = health.as_ref().map(|h| h.readiness.clone());
    match leader {
        Some(lease) => {
            let lease = peerpods_runtime::leader::LeaderConfig {
                drain_grace: SHUTDOWN_GRACE,
                ..lease
            };
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
/// capacity value and owner annotation this controller owns. Status heartbeats and other updates are dropped here.
fn relevant_node_changes(
    events: impl Stream<Item = Result<watcher::Event<nodes::Node>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<nodes::Node, watcher::Error>> + Send + 'static {
    let mut seen: HashMap<String, u64> = HashMap::new();
    events.filter_map(move |event| {
        let out = match event {
            Ok(watcher::Event::Apply(node) | watcher::Event::InitApply(node)) => {
                let mut hasher = std::collections::hash_map::DefaultHasher::new();
                (node.labels(), nodes::current(&node), nodes::owner(&node)).hash(&mut hasher);
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

/// ResourceClaim events that change which pool devices are allocated: a claim whose pool devices differ from what
/// was last seen of it, or that goes away holding some. Other claims (other drivers, status updates) are dropped.
fn pool_allocation_changes(
    events: impl Stream<Item = Result<watcher::Event<ResourceClaim>, watcher::Error>> + Send + 'static,
) -> impl Stream<Item = Result<ResourceClaim, watcher::Error>> + Send + 'static {
    let mut seen: HashMap<(String, String), std::collections::BTreeSet<String>> = HashMap::new();
    events.filter_map(move |event| {
        let key = |c: &ResourceClaim| (c.namespace().unwrap_or_default(), c.name_any());
        let out = match event {
            Ok(watcher::Event::Apply(claim) | watcher::Event::InitApply(claim)) => {
                let devices = dra::allocated([&claim]);
                let before = if devices.is_empty() {
                    seen.remove(&key(&claim))
                } else {
                    seen.insert(key(&claim), devices.clone())
                };
                (before.unwrap_or_default() != devices).then_some(Ok(claim))
            }
            Ok(watcher::Event::Delete(claim)) => seen.remove(&key(&claim)).map(|_| Ok(claim)),
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
