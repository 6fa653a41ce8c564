//! Wiring: what one leadership term runs (the reconciler, the orphan and reverse scans, the developer-mode and
//! in-use followers, the watchdog) and how it runs (directly, or under a Lease). Deciding is in the activity
//! modules' rules, acting in [`crate::reconcile`] and the scanners.

use kube::runtime::events::{Recorder, Reporter};
use peerpods_runtime::health::Health;
use peerpods_runtime::leader::{self, LeaderConfig};
use peerpods_runtime::shutdown::CancellationToken;

use crate::Error;
use crate::{developer_mode, in_use, metrics, orphans, provider, reconcile, reverse};

/// Everything one leadership term needs.
#[derive(Debug, Clone)]
pub struct Settings {
    pub reconciler: reconcile::ReconcilerSettings,
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
    let recorder = Recorder::new(client.clone(), settings.reporter.clone());
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
        recorder.clone(),
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
        recorder: recorder.clone(),
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
        reconcile::run(
            client,
            provider,
            recorder,
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
    tokio::select! {
        () = controller => {}
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
}

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
            // Ready once the PeerPod watch has listed (see reconcile::run).
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
