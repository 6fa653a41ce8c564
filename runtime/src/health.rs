//! Health of a controller: `/readyz` is false until each watch's first list is in the cache and while a watch
//! makes no progress for longer than a bound; `/healthz` (liveness) fails only when a local loop of the process
//! stops running (a deadlock or a task blocked inside the controller), never because the API server is away.
//!
//! **Why a stalled watch is not a liveness failure.** When the API server is down or unreachable for a few
//! minutes, a restart cannot help: the new process finds the same API server, starts with empty caches, and
//! loses the retry state (backoffs, circuit breakers) of the old one; every replica of every controller would
//! restart at once into CrashLoopBackOff. Kept alive and marked not ready, the controller resumes within seconds
//! of the API server's return (its watches back off and re-list on their own), and the not-ready state still
//! shows the outage to anyone looking.
//!
//! **What counts as watch progress.** Every event a watch yields (`Init`, `InitApply`, `InitDone`, `Apply`,
//! `Delete`; errors are not progress) and every sign of life of a small *heartbeat watch* on the same resource
//! ([`heartbeat`]): a watch request the API server accepted, or a bookmark it sent. The heartbeat exists
//! because kube's watcher consumes bookmarks and re-watches silently, so a watch that is connected but has
//! nothing to report yields nothing a caller could see, while such a watch is healthy. The heartbeat selects an
//! object name that never exists and asks for a short server-side timeout, so it costs one idle connection, no
//! objects, and shows at least three times per bound (at most every [`HEARTBEAT_WATCH_TIMEOUT`]) that the API
//! server still serves watches of that resource to this client.
//!
//! **What counts as a local deadlock.** A *loop* ([`Liveness::track_loop`]) is ticked by [`watchdog`], which a
//! controller runs inside the same task as its reconcile loop: when that task stops being polled (a blocking
//! call or a lock held forever inside the controller), the watchdog stops too and liveness fails after the
//! bound. The admin server itself answering shows that the runtime still schedules tasks.
//!
//! [`Readiness`] is what `/readyz` reports for any service (controllers and provider-service alike); the admin
//! server (`admin`) serves this module's state, and this module knows nothing of it.
//!
//! A [`Progress`] is registered only while its watch or loop runs: a standby replica (no Lease) has neither,
//! and is neither stalled nor waiting for a list. Dropping the last clone of a `Progress` unregisters it.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
use kube::runtime::watcher;
use serde::de::DeserializeOwned;

/// Default bound on a watch or loop making no progress: three heartbeat periods, so one slow or lost heartbeat
/// never marks a healthy controller.
pub const DEFAULT_MAX_STALL: Duration = Duration::from_secs(180);

/// Longest server-side timeout of the heartbeat watch: it ends (and is made again) at least this often, and
/// more often for a short bound (three times per bound, at least once a second).
pub const HEARTBEAT_WATCH_TIMEOUT: Duration = Duration::from_secs(60);

/// Name the heartbeat watch selects; no object has it, so the watch carries only bookmarks.
const HEARTBEAT_NAME: &str = "peerpods-heartbeat-never-created";

/// Pause before the heartbeat watch is made again after it failed.
const HEARTBEAT_RETRY: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    ready: bool,
    detail: String,
}

/// Readiness of a service, made of named components (e.g. `grpc`, `config`, `leader`). Ready when
/// at least one component is registered and every one is ready. Cheap to clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    checks: Arc<RwLock<BTreeMap<String, Check>>>,
}

impl Readiness {
    /// Records the state of `component`; `detail` is shown on `/readyz`.
    pub fn set(&self, component: &str, ready: bool, detail: impl Into<String>) {
        if let Ok(mut checks) = self.checks.write() {
            checks.insert(
                component.to_owned(),
                Check {
                    ready,
                    detail: detail.into(),
                },
            );
        }
    }

    /// The detail `component` was last set with, if it is registered.
    pub fn detail(&self, component: &str) -> Option<String> {
        self.checks
            .read()
            .ok()
            .and_then(|c| c.get(component).map(|c| c.detail.clone()))
    }

    /// Forgets `component` (it no longer runs).
    pub fn remove(&self, component: &str) {
        if let Ok(mut checks) = self.checks.write() {
            checks.remove(component);
        }
    }

    /// Whether every registered component is ready (false when none is registered).
    pub fn is_ready(&self) -> bool {
        self.checks
            .read()
            .map(|c| !c.is_empty() && c.values().all(|c| c.ready))
            .unwrap_or(false)
    }

    /// One line per component: `name: ok|not ready[: detail]`.
    pub fn report(&self) -> String {
        let Ok(checks) = self.checks.read() else {
            return "readiness state unavailable\n".into();
        };
        checks
            .iter()
            .map(|(name, c)| {
                let state = if c.ready { "ok" } else { "not ready" };
                if c.detail.is_empty() {
                    format!("{name}: {state}\n")
                } else {
                    format!("{name}: {state}: {}\n", c.detail)
                }
            })
            .collect()
    }
}

/// Readiness detail while the initial list runs.
const LISTING: &str = "waiting for the initial list";

/// Where "now" comes from; tests inject a clock they move by hand.
pub trait Clock: Send + Sync + Debug {
    fn now(&self) -> Instant;
}

/// The monotonic clock.
#[derive(Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// What a registration follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A watch of the API server: a stall makes the process not ready.
    Watch,
    /// A local loop of the process: a stall makes it not live.
    Loop,
}

#[derive(Debug)]
struct Watched {
    kind: Kind,
    last_progress: Instant,
    /// Why the last event was not progress, if it was an error.
    last_error: Option<String>,
}

/// Progress of a process's watches and local loops: live while every registered loop made progress within
/// `max_stall`; a watch without progress for longer makes the process not ready (see the module doc). Cheap to
/// clone; clones share state.
#[derive(Debug, Clone)]
pub struct Liveness {
    max_stall: Duration,
    clock: Arc<dyn Clock>,
    watches: Arc<Mutex<BTreeMap<String, Watched>>>,
}

impl Default for Liveness {
    fn default() -> Self {
        Liveness::new(DEFAULT_MAX_STALL)
    }
}

impl Liveness {
    pub fn new(max_stall: Duration) -> Self {
        Liveness::with_clock(max_stall, Arc::new(SystemClock))
    }

    /// With the given clock instead of the system's.
    pub fn with_clock(max_stall: Duration, clock: Arc<dyn Clock>) -> Self {
        Liveness {
            max_stall,
            clock,
            watches: Arc::default(),
        }
    }

    /// The bound on no progress.
    pub fn max_stall(&self) -> Duration {
        self.max_stall
    }

    /// How often a heartbeat watch is renewed: three times per bound, between 1 s and
    /// [`HEARTBEAT_WATCH_TIMEOUT`], in whole seconds (the API counts watch timeouts so).
    pub fn heartbeat_period(&self) -> Duration {
        Duration::from_secs((self.max_stall / 3).as_secs())
            .clamp(Duration::from_secs(1), HEARTBEAT_WATCH_TIMEOUT)
    }

    fn watches(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Watched>> {
        // Only timestamps live behind this lock; a poisoned one is still consistent.
        self.watches.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers the watch `name` (progress counts from now) and, with `readiness`, a readiness component of
    /// the same name that is false until [`Progress::synced`]. Both go away with the last clone of the result.
    pub fn track(&self, name: &str, readiness: Option<Readiness>) -> Progress {
        if let Some(r) = &readiness {
            r.set(name, false, LISTING);
        }
        self.register(name, Kind::Watch, readiness)
    }

    /// Registers the local loop `name` (progress counts from now), ticked by [`watchdog`]; liveness fails when
    /// it makes no progress for longer than the bound. It goes away with the last clone of the result.
    pub fn track_loop(&self, name: &str) -> Progress {
        self.register(name, Kind::Loop, None)
    }

    fn register(&self, name: &str, kind: Kind, readiness: Option<Readiness>) -> Progress {
        self.watches().insert(
            name.to_owned(),
            Watched {
                kind,
                last_progress: self.clock.now(),
                last_error: None,
            },
        );
        Progress {
            inner: Arc::new(Registration {
                name: name.to_owned(),
                liveness: self.clone(),
                readiness,
            }),
        }
    }

    fn stalled_of(&self, kind: Kind) -> Vec<(String, Duration)> {
        let now = self.clock.now();
        self.watches()
            .iter()
            .filter(|(_, w)| w.kind == kind)
            .filter_map(|(name, w)| {
                let idle = now.saturating_duration_since(w.last_progress);
                (idle > self.max_stall).then(|| (name.clone(), idle))
            })
            .collect()
    }

    /// Local loops that made no progress for longer than the bound, with how long: a deadlock.
    pub fn deadlocked(&self) -> Vec<(String, Duration)> {
        self.stalled_of(Kind::Loop)
    }

    /// Watches that made no progress for longer than the bound, with how long: the API server is away or does
    /// not serve them.
    pub fn stalled_watches(&self) -> Vec<(String, Duration)> {
        self.stalled_of(Kind::Watch)
    }

    /// Whether every registered local loop made progress within the bound (true when none is registered).
    /// Watches do not count: see the module doc.
    pub fn is_live(&self) -> bool {
        self.deadlocked().is_empty()
    }

    /// Whether every registered watch made progress within the bound (true when none is registered).
    pub fn watches_progress(&self) -> bool {
        self.stalled_watches().is_empty()
    }

    /// `/healthz`'s body: one line per local loop, `name: ok` or `name: stalled: ...`; `ok` when none runs.
    pub fn report(&self) -> String {
        let lines = self.lines(Kind::Loop, true);
        if lines.is_empty() {
            "ok\n".into()
        } else {
            lines
        }
    }

    /// For `/readyz`: one line per watch that is stalled, `name: stalled: ...` (nothing while all progress).
    pub fn watch_report(&self) -> String {
        self.lines(Kind::Watch, false)
    }

    fn lines(&self, kind: Kind, with_ok: bool) -> String {
        let now = self.clock.now();
        let watches = self.watches();
        watches
            .iter()
            .filter(|(_, w)| w.kind == kind)
            .filter_map(|(name, w)| {
                let idle = now.saturating_duration_since(w.last_progress);
                if idle <= self.max_stall {
                    return with_ok.then(|| format!("{name}: ok\n"));
                }
                let why = w
                    .last_error
                    .as_deref()
                    .map(|e| format!("; last error: {e}"))
                    .unwrap_or_default();
                Some(format!(
                    "{name}: stalled: no progress for {}s (limit {}s){why}\n",
                    idle.as_secs(),
                    self.max_stall.as_secs()
                ))
            })
            .collect()
    }
}

#[derive(Debug)]
struct Registration {
    name: String,
    liveness: Liveness,
    readiness: Option<Readiness>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.liveness.watches().remove(&self.name);
        if let Some(r) = &self.readiness {
            r.remove(&self.name);
        }
    }
}

/// What a controller reports to the admin server: its readiness components and its watches' liveness. Cheap to
/// clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct Health {
    pub readiness: Readiness,
    pub liveness: Liveness,
}

impl Health {
    /// [`Liveness::track`] with this readiness.
    pub fn track(&self, name: &str) -> Progress {
        self.liveness.track(name, Some(self.readiness.clone()))
    }
}

/// The progress clock of one watch (see the module doc). Cheap to clone; clones share the registration.
#[derive(Debug, Clone)]
pub struct Progress {
    inner: Arc<Registration>,
}

impl Progress {
    /// The watch made progress now.
    pub fn tick(&self) {
        let liveness = &self.inner.liveness;
        let now = liveness.clock.now();
        if let Some(w) = liveness.watches().get_mut(&self.inner.name) {
            w.last_progress = now;
            w.last_error = None;
        }
    }

    /// The initial list is in the cache: ready from now on (a later re-list keeps the old cache until it is
    /// done, so readiness stays).
    pub fn synced(&self) {
        self.tick();
        if let Some(r) = &self.inner.readiness {
            r.set(&self.inner.name, true, "initial list done");
        }
    }

    /// Counts a watcher event: any event is progress, `InitDone` also means synced; an error is not progress
    /// and is kept for the liveness report.
    pub fn observe<K>(&self, event: &Result<watcher::Event<K>, watcher::Error>) {
        match event {
            Ok(watcher::Event::InitDone) => self.synced(),
            Ok(_) => self.tick(),
            Err(e) => {
                if let Some(w) = self.inner.liveness.watches().get_mut(&self.inner.name) {
                    w.last_error = Some(e.to_string());
                }
            }
        }
    }

    /// The name it is registered under.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// How often its heartbeat watch is renewed ([`Liveness::heartbeat_period`]).
    pub fn heartbeat_period(&self) -> Duration {
        self.inner.liveness.heartbeat_period()
    }
}

/// Ticks `progress`, a local loop ([`Liveness::track_loop`]), for as long as the task running this future is
/// polled. Run it in the same task as the loop it vouches for (`tokio::select!` or `join`), never spawned on its
/// own: then a stuck loop stops it too. Runs until dropped.
pub async fn watchdog(progress: Progress) {
    let period = progress.heartbeat_period();
    loop {
        progress.tick();
        tokio::time::sleep(period).await;
    }
}

/// Ticks `progress` for as long as the API server serves watches of `api`'s resource (see the module doc).
/// Runs until dropped.
pub async fn heartbeat<K>(api: Api<K>, progress: Progress)
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let period = progress.heartbeat_period();
    let params = WatchParams::default()
        .fields(&format!("metadata.name={HEARTBEAT_NAME}"))
        .timeout(u32::try_from(period.as_secs()).unwrap_or(60));
    // The server ends the watch after its timeout; a connection that died silently ends it here.
    let idle = period + Duration::from_secs(10);
    loop {
        match tokio::time::timeout(idle, api.watch_metadata(&params, "0")).await {
            Ok(Ok(stream)) => {
                progress.tick();
                let mut stream = std::pin::pin!(stream);
                while let Ok(Some(item)) = tokio::time::timeout(idle, stream.next()).await {
                    match item {
                        Ok(WatchEvent::Error(e)) => {
                            tracing::debug!(error = %e, watch = progress.name(), "heartbeat watch error");
                            break;
                        }
                        Ok(_) => progress.tick(),
                        Err(e) => {
                            tracing::debug!(error = %e, watch = progress.name(), "heartbeat watch failed");
                            break;
                        }
                    }
                }
            }
            Ok(Err(e)) => {
                tracing::debug!(error = %e, watch = progress.name(), "heartbeat watch refused");
                tokio::time::sleep(HEARTBEAT_RETRY).await;
            }
            Err(_) => {
                tracing::debug!(watch = progress.name(), "heartbeat watch got no answer");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_all_components_are() {
        let r = Readiness::default();
        assert!(!r.is_ready(), "nothing registered is not ready");
        r.set("grpc", true, "");
        r.set("config", false, "bad LIBVIRT_URI");
        assert!(!r.is_ready());
        assert_eq!(r.report(), "config: not ready: bad LIBVIRT_URI\ngrpc: ok\n");
        r.set("config", true, "");
        assert!(r.is_ready());
    }

    /// A clock moved by hand.
    #[derive(Debug)]
    struct Manual(Mutex<Instant>);

    impl Manual {
        fn advance(&self, by: Duration) {
            let mut now = self.0.lock().unwrap();
            *now += by;
        }
    }

    impl Clock for Manual {
        fn now(&self) -> Instant {
            *self.0.lock().unwrap()
        }
    }

    fn liveness() -> (Liveness, Arc<Manual>) {
        let clock = Arc::new(Manual(Mutex::new(Instant::now())));
        (
            Liveness::with_clock(Duration::from_secs(60), clock.clone()),
            clock,
        )
    }

    #[test]
    fn a_loop_stalls_liveness_only_after_the_bound_without_progress() {
        let (live, clock) = liveness();
        let progress = live.track_loop("reconcile");
        clock.advance(Duration::from_secs(60));
        assert!(live.is_live(), "exactly the bound is not a stall");
        clock.advance(Duration::from_secs(1));
        assert!(!live.is_live());
        assert!(
            live.report().contains("reconcile: stalled"),
            "{}",
            live.report()
        );
        assert!(live.watches_progress(), "a loop is not a watch");
        progress.tick();
        assert!(live.is_live());
        assert_eq!(live.report(), "reconcile: ok\n");
    }

    #[test]
    fn a_stalled_watch_is_not_ready_but_live() {
        let (live, clock) = liveness();
        let _loop = live.track_loop("reconcile");
        let progress = live.track("peerpods", None);
        clock.advance(Duration::from_secs(61));
        _loop.tick();
        assert!(live.is_live(), "the API server away is no deadlock");
        assert!(!live.watches_progress());
        assert!(
            live.watch_report()
                .contains("peerpods: stalled: no progress for 61s"),
            "{}",
            live.watch_report()
        );
        assert_eq!(
            live.report(),
            "reconcile: ok\n",
            "liveness names loops only"
        );
        progress.tick();
        assert!(live.watches_progress());
        assert_eq!(live.watch_report(), "");
    }

    #[test]
    fn errors_are_not_progress_and_show_in_the_report() {
        let (live, clock) = liveness();
        let progress = live.track("nodes", None);
        clock.advance(Duration::from_secs(50));
        let failed: Result<watcher::Event<()>, watcher::Error> =
            Err(watcher::Error::NoResourceVersion);
        progress.observe(&failed);
        clock.advance(Duration::from_secs(20));
        assert!(!live.watches_progress());
        assert!(
            live.watch_report().contains("last error"),
            "{}",
            live.watch_report()
        );
        progress.observe(&Ok(watcher::Event::<()>::Apply(())));
        assert!(live.watches_progress());
    }

    #[tokio::test]
    async fn the_watchdog_ticks_while_its_task_runs() {
        let (live, clock) = liveness();
        let progress = live.track_loop("reconcile");
        clock.advance(Duration::from_secs(61));
        assert!(!live.is_live());
        let dog = tokio::spawn(watchdog(progress.clone()));
        // Its first tick comes as soon as the task runs.
        while !live.is_live() {
            tokio::task::yield_now().await;
        }
        dog.abort();
        let _ = dog.await;
        clock.advance(Duration::from_secs(61));
        assert!(!live.is_live(), "a loop no longer polled is a deadlock");
    }

    #[test]
    fn heartbeats_come_three_times_per_bound_within_limits() {
        let period = |secs| Liveness::new(Duration::from_secs(secs)).heartbeat_period();
        assert_eq!(period(180), Duration::from_secs(60));
        assert_eq!(period(3600), Duration::from_secs(60));
        assert_eq!(period(9), Duration::from_secs(3));
        assert_eq!(period(1), Duration::from_secs(1));
    }

    #[test]
    fn ready_after_the_initial_list_and_unregistered_when_dropped() {
        let (live, clock) = liveness();
        let readiness = Readiness::default();
        let progress = live.track("peerpods", Some(readiness.clone()));
        assert!(!readiness.is_ready());
        assert!(readiness.report().contains(LISTING));
        progress.observe(&Ok(watcher::Event::<()>::Init));
        progress.observe(&Ok(watcher::Event::<()>::InitApply(())));
        assert!(!readiness.is_ready(), "not before InitDone");
        progress.observe(&Ok(watcher::Event::<()>::InitDone));
        assert!(readiness.is_ready());
        // A re-list keeps the cache, and readiness, until it is done.
        progress.observe(&Ok(watcher::Event::<()>::Init));
        assert!(readiness.is_ready());

        let clone = progress.clone();
        drop(progress);
        clock.advance(Duration::from_secs(3600));
        assert!(!live.watches_progress(), "a clone keeps the registration");
        drop(clone);
        assert!(live.watches_progress(), "no watch, nothing stalled");
        assert_eq!(readiness.report(), "");
    }
}
