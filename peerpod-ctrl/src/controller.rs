//! Wiring: what one leadership term runs (the reconciler, the orphan and reverse scans, the developer-mode and
//! in-use followers, the watchdog) and how it runs (directly, or under a Lease). Deciding is in the activity
//! modules' rules, acting in [`crate::reconcile`] and the scanners.

use std::sync::Arc;

use futures::{FutureExt, StreamExt};
use kube::api::Api;
use kube::runtime::controller::{Config as ControllerConfig, Controller};
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use peerpods_runtime::backoff::Backoff;
use peerpods_runtime::events::Events;
use peerpods_runtime::health::{self, Health};
use peerpods_runtime::leader::{self, LeaderConfig};
use peerpods_runtime::shutdown::CancellationToken;
use peerpods_runtime::watch;
use tracing::debug;

use crate::Error;
use crate::cache::{self, Cache};
use crate::context::Context;
use crate::developer_mode::Mode;
use crate::metrics::Metrics;
use crate::provider::Provider;
use crate::reconcile::{error_policy, reconcile};
use crate::{developer_mode, in_use, metrics, orphans, provider, reverse};
use peerpods_api::peerpod::PeerPod;

/// Everything one leadership term needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub reconciler: ReconcilerSettings,
    pub orphans: orphans::OrphanSettings,
    pub reverse: reverse::ReverseSettings,
    /// Which ConfigMap says whether cloud-api-adaptor runs in developer mode.
    pub developer_mode: developer_mode::DeveloperModeSettings,
    /// Where the count of PeerPods holding the finalizer is published; `None`: nowhere (no chart protection).
    pub in_use: Option<in_use::InUseSettings>,
    /// Reported as the Event source; the Pod name distinguishes replicas.
    pub reporter: Reporter,
}

/// Runs the reconciler and the orphan scan until the future is dropped. Called once per leadership term, so
/// a replica that lost the lease stops acting the moment this future is dropped. With `health`, the PeerPod
/// watch is tracked for `/healthz` and `/readyz` while the term lasts.
pub async fn run(
    client: kube::Client,
    provider: provider::Provider,
    metrics: metrics::Metrics,
    settings: Settings,
    health: Option<Health>,
    drain: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    // Events go through a queue and one writer, behind the work they describe (peerpods_runtime::events).
    let (events, event_writer) = peerpods_runtime::events::queue(
        Recorder::new(client.clone(), settings.reporter.clone()),
        peerpods_runtime::events::DEFAULT_QUEUED_EVENTS,
        metrics.events_dropped.clone(),
    );
    let client_for_in_use = client.clone();
    let watchdog = health
        .as_ref()
        .map(|h| h.liveness.track_loop(RECONCILE_LOOP));
    let (store_tx, store_rx) = tokio::sync::watch::channel(None);
    let (mode_tx, mode) = developer_mode::channel();
    let follow_mode =
        developer_mode::follow(client.clone(), settings.developer_mode.clone(), mode_tx);
    let reverse = reverse::ReverseScanner::new(
        client.clone(),
        provider.clone(),
        events.clone(),
        metrics.clone(),
        settings.reverse.clone(),
    );
    let reverse_stores = store_tx.subscribe();
    let terminating = metrics.terminating.clone();
    let terminating_stores = store_tx.subscribe();
    let in_use_stores = store_tx.subscribe();
    let publish_in_use = async move {
        match settings.in_use {
            Some(in_use) => in_use::follow(client_for_in_use, in_use, in_use_stores).await,
            None => std::future::pending().await,
        }
    };
    let scanner = orphans::Scanner {
        client: client.clone(),
        provider: provider.clone(),
        events: events.clone(),
        metrics: metrics.clone(),
        settings: settings.orphans,
        first_seen: orphans::FirstSeen::default(),
        developer_mode: mode.clone(),
    };
    let controller = async move {
        let mut mode = mode;
        // The first read of the mode (or its failure) comes before the first reconcile: started earlier, every
        // PeerPod being deleted would report the mode unknown on each start.
        mode.first_read().await;
        reconciler(
            client,
            provider,
            events,
            metrics,
            settings.reconciler,
            mode,
            Some(store_tx),
            health,
            drain,
        )
        .await
    };
    // The scan ends early when it is disabled; the controller decides how long the term lasts.
    let scan = async move {
        scanner.run(store_rx).await;
        std::future::pending::<()>().await
    };
    // In the controller's own task: a reconcile loop that stops being polled stops the watchdog too, and /healthz
    // fails (peerpods_runtime::health).
    let watchdog = async move {
        match watchdog {
            Some(progress) => peerpods_runtime::health::watchdog(progress).await,
            None => std::future::pending().await,
        }
    };
    let event_writer = event_writer.run();
    tokio::pin!(event_writer);
    tokio::select! {
        () = controller => {}
        // Ends only once every publisher is gone, after the select.
        () = &mut event_writer => {}
        () = scan => {}
        // Ends only with the term: the watch retries on its own.
        () = follow_mode => {}
        () = watchdog => {}
        () = terminating.follow(terminating_stores) => {}
        // Ends only with the term, like the mode's watch.
        () = publish_in_use => {}
        () = async move {
            // Like the orphan scan, it ends early when disabled; the controller decides the term.
            reverse.run(reverse_stores).await;
            std::future::pending::<()>().await
        } => {}
    }
    // The term's work is dropped, and with it every publisher: the Events it queued are written, for a moment
    // at most (a stopping controller has DRAIN_GRACE in all, a lost lease drops this future at once).
    if tokio::time::timeout(EVENTS_FLUSH, event_writer)
        .await
        .is_err()
    {
        tracing::warn!("Events still queued after {EVENTS_FLUSH:?}; dropped");
    }
}

/// How long a term that ended writes the Events it queued.
const EVENTS_FLUSH: std::time::Duration = std::time::Duration::from_secs(5);

/// How long a stopping controller lets its running reconciles finish: the same with leader election
/// ([`LeaderConfig::drain_grace`]'s default) and without.
pub use peerpods_runtime::leader::DRAIN_GRACE;

/// Name of the reconcile loop's watchdog on `/healthz`.
pub const RECONCILE_LOOP: &str = "loop/reconcile";

/// Runs until `shutdown` is cancelled: with a [`LeaderConfig`] only while holding the Lease (released on
/// shutdown for a quick handover), without one straight away.
pub async fn run_until(
    client: kube::Client,
    provider: provider::Provider,
    metrics: metrics::Metrics,
    settings: Settings,
    leader: Option<LeaderConfig>,
    shutdown: CancellationToken,
    health: Option<Health>,
) -> Result<(), Error> {
    let drain = shutdown.clone();
    let work = || {
        run(
            client.clone(),
            provider.clone(),
            metrics.clone(),
            settings.clone(),
            health.clone(),
            drain.clone().cancelled_owned(),
        )
    };
    let readiness = health.as_ref().map(|h| h.readiness.clone());
    match leader {
        Some(config) => leader::run_while_leader(client.clone(), config, shutdown, readiness, work)
            .await
            .map_err(Error::LeaderElection),
        None => {
            // Ready once the PeerPod watch has listed (see `reconciler`).
            let work = work();
            tokio::pin!(work);
            tokio::select! {
                () = &mut work => {}
                () = shutdown.cancelled() => {
                    // Drain: the reconciles running finish (a VM deleted gets its finalizer released), bounded
                    // below Kubernetes' default 30 s between SIGTERM and SIGKILL.
                    if tokio::time::timeout(DRAIN_GRACE, work).await.is_err() {
                        tracing::warn!("reconciles still running after {DRAIN_GRACE:?}; dropped");
                    }
                }
            }
            Ok(())
        }
    }
}

/// The default of [`ReconcilerSettings::concurrency`]: as many calls as provider-service serves at once on the
/// one connection this controller holds to it (its streams per connection); more would only queue in the
/// client.
pub const DEFAULT_CONCURRENCY: u16 = 256;
pub use crate::context::DEFAULT_API_WRITES;

/// Settings of the reconciler.
#[derive(Debug, Clone)]
pub struct ReconcilerSettings {
    /// Reconciles in flight at once. Most of a cleanup is a wait for provider-service's answer, which costs
    /// a reconcile only its place: this bound is high, and the API writes are bounded apart.
    pub concurrency: u16,
    /// Writes to the API server (finalizer releases, status) in flight at once across reconciles. Events are
    /// queued and written apart, one at a time (peerpods_runtime::events).
    pub api_writes: u16,
    pub backoff: Backoff,
}

/// Watches PeerPods in all namespaces and reconciles them until the future is dropped (leadership lost), or
/// `drain` completes and the reconciles running then have finished.
#[expect(
    clippy::too_many_arguments,
    reason = "what one leadership term is made of, each passed on once by controller::run"
)]
pub async fn reconciler(
    client: kube::Client,
    provider: Provider,
    events: Events,
    metrics: Metrics,
    settings: ReconcilerSettings,
    developer_mode: Mode,
    store_out: Option<tokio::sync::watch::Sender<Option<Store<PeerPod>>>>,
    health: Option<Health>,
    drain: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<PeerPod> = Api::all(client.clone());
    // Liveness and readiness follow this watch (peerpods_runtime::health); the heartbeat shows an idle one is
    // still connected.
    let progress = health.map(|h| h.track(WATCH));
    let heartbeat = match &progress {
        Some(p) => health::heartbeat(api.clone(), p.clone()).left_future(),
        None => std::future::pending().right_future(),
    };
    let mut cache = Cache::default();
    let store = cache.store();
    let ctx = Arc::new(
        Context::new(
            client,
            provider,
            events,
            metrics,
            settings.backoff,
            (store.clone(), cache.index()),
            developer_mode.clone(),
        )
        .with_api_writes(settings.api_writes),
    );
    if let Some(tx) = store_out {
        // The orphan scanner reads the same cache instead of keeping a second copy of every PeerPod.
        tx.send_replace(Some(store.clone()));
    }
    let forget = ctx.clone();
    let listed = store.clone();
    // A streaming list (watch with initial events) instead of paged LISTs: the objects arrive one by one, so
    // no page of hundreds of full PeerPods (managedFields included) is ever held at once. 10,000 PeerPods:
    // 43 MiB → 41.5 MiB peak RSS (make bench).
    // Backoff that only progress resets (an `Init` before a failing start is none: peerpods_runtime::watch).
    let trigger = watch::backoff(watcher(api, watcher::Config::default().streaming_lists()))
        .modify(cache::rules::keep_what_is_read)
        .filter_map(move |event| {
            if let Some(p) = &progress {
                p.observe(&event);
            }
            let request = match event {
                Ok(event) => {
                    if let watcher::Event::Delete(p) = &event {
                        forget.forget_object(&ObjectRef::from_obj(p));
                    }
                    let request = cache.apply(&event).map(Ok);
                    if let watcher::Event::InitDone = &event {
                        // The cache now holds exactly the new list.
                        forget.forget_absent(|key| listed.get(key).is_some());
                    }
                    request
                }
                Err(error) => Some(Err(error)),
            };
            std::future::ready(request)
        });
    // A change of developer mode changes the plan of every PeerPod being deleted, and of no other: switched
    // off, the held cleanups resume; switched on, the ones failing meanwhile turn into holds. kube's
    // `reconcile_all_on` would queue every cached PeerPod, 10,000 live ones for a handful being deleted.
    let deleting = store.clone();
    let mode_changed = developer_mode.changes().flat_map(move |()| {
        futures::stream::iter(
            deleting
                .state()
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_some())
                .map(|p| cache::key(&p))
                .collect::<Vec<_>>(),
        )
    });
    let controller = Controller::for_stream(trigger, store)
        .with_config(ControllerConfig::default().concurrency(settings.concurrency))
        .reconcile_on(mode_changed)
        // Once `drain` completes: no new reconcile starts, and the run ends when the running ones are done (a
        // DeleteInstance answered is then also recorded and its finalizer released, not abandoned).
        .graceful_shutdown_on(drain)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                // Reconcile errors were recorded in reconcile(); these are watch/queue errors.
                debug!(%error, "controller stream");
            }
        });
    // The heartbeat never ends; the controller decides how long this runs.
    tokio::select! {
        () = controller => {}
        () = heartbeat => {}
    }
}

/// Name of the PeerPod watch on `/healthz` and `/readyz`.
pub const WATCH: &str = "watch/peerpods";
