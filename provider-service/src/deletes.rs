//! Every delete runs to its end in a task of its own, detached from the call that asked for it.
//!
//! A cloud delete takes from milliseconds (libvirt) to minutes (an Azure VM and its parts). Bound to
//! one gRPC call, it would stop wherever the caller gave up, its deadline passed or the connection
//! dropped: a VM left `Deleting`, its disks and interfaces never deleted. Here the call only
//! starts the delete, or joins the one already running for the same instance (one cloud delete
//! however many callers ask), and waits for it at most for its answer window: it answers the
//! result once the backend confirmed the instance gone, the backend's error, or "still in
//! progress" with retry advice. The task goes on after the call has answered; the next call for
//! the instance joins it, or, once it ended, starts a new delete that confirms the end with a
//! fresh lookup (no result is kept: gone is always a later lookup's answer). A delete that ends
//! because the cloud does not show the instance yet, inside its consistency window
//! ([`DeleteOutcome::NotYetVisible`]), ends its task like any other and is answered "in progress"
//! too, saying it waits for the instance to show ([`Wait`]); the next call looks again.
//!
//! A delete waits for one of its cloud's delete slots (the call budget, 32 at once unless the
//! backend batches its calls, see [`crate::backends::guarded`]) before it asks the cloud anything; while it waits it is "in
//! progress" to its callers, as a running one is. It gives the slot back while it waits between
//! two asks (the cloud still deleting, a lookup to confirm later) and takes one again for the next:
//! slots bound the calls the cloud sees at once, not the deletes waiting for it.
//!
//! Deadlines nest, innermost first (provider-service/README.md, "Deadlines"): a backend's own wait
//! (Azure 300 s by default, the slowest) < [`DELETE_BOUND`], counted from when the delete holds its
//! slot, not while it waits for one (a delete still running then is answered retryably; the
//! backends resume a partial delete on the next call) < the shutdown drain ([`DEFAULT_DRAIN_GRACE`]:
//! every delete running when shutdown begins ends within it; one still waiting for a slot then may
//! start during the drain and is abandoned at its end) < the chart's
//! `terminationGracePeriodSeconds`. A call's answer comes within [`DEFAULT_ANSWER_WITHIN`] or 90 %
//! of the caller's deadline, whichever is shorter, so the caller always hears an answer, never its
//! own deadline.
//!
//! A call answered "in progress" leaves its delete running, so a caller could pile up deletes
//! without bound, each a task and a place in the queue for the cloud's delete slots. The deletes
//! one caller started and that still run are capped ([`DeleteCaps::per_caller`]), and so are all
//! of them ([`DeleteCaps::total`]); a new delete past a cap is refused with RESOURCE_EXHAUSTED
//! (reason `TooManyDeletes`) and retry advice, counted in `provider_service_deletes_refused`.
//! Joining a delete that runs is never refused: it costs nothing.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use tokio::sync::watch;
use tracing::Instrument;

use crate::auth::Caller;
use crate::error::Error;
use crate::provider::{DeleteOutcome, Provider};
use peerpods_provider_core::InstanceKey;

/// How long a DeleteInstance call waits for its delete before it answers "in progress": long
/// enough for the clouds that confirm a delete in seconds (AWS, libvirt, most GCP deletes) to
/// answer in one call, short against every caller's deadline.
pub const DEFAULT_ANSWER_WITHIN: Duration = Duration::from_secs(20);
/// The retry advice of an "in progress" answer.
pub const DEFAULT_RETRY_AFTER: Duration = Duration::from_secs(5);
/// The default of the slowest backend's own wait for a delete (Azure's
/// `AZURE_DELETE_TIMEOUT_SECONDS`; GCP waits 180 s, IBM Cloud 120 s, AWS 60 s per call).
pub const SLOWEST_BACKEND_WAIT: Duration = Duration::from_secs(300);
/// The longest one detached delete runs once it holds its delete slot (the wait for the slot does
/// not count): the slowest backend's wait plus the calls after its last poll. Only a backend that
/// hangs reaches it; the next call resumes what it left. The call budget applies it
/// ([`crate::backends::guarded`]).
pub const DELETE_BOUND: Duration = Duration::from_secs(330);
/// How long shutdown waits for detached deletes: every delete running when shutdown begins ends
/// by its own bound within it.
pub const DEFAULT_DRAIN_GRACE: Duration = Duration::from_secs(340);

/// How deletes are run and answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteSettings {
    /// The longest a call waits for its delete before answering "in progress" (the caller's
    /// deadline shortens it).
    pub answer_within: Duration,
    /// The retry advice sent with "in progress".
    pub retry_after: Duration,
    /// How long shutdown waits for the deletes still running.
    pub drain_grace: Duration,
}

impl Default for DeleteSettings {
    fn default() -> Self {
        DeleteSettings {
            answer_within: DEFAULT_ANSWER_WITHIN,
            retry_after: DEFAULT_RETRY_AFTER,
            drain_grace: DEFAULT_DRAIN_GRACE,
        }
    }
}

impl DeleteSettings {
    /// How long a call with `caller_deadline` (its `grpc-timeout`, if any) waits for its delete:
    /// the answer window, shortened to 90 % of the caller's deadline so the answer arrives before
    /// the caller gives up.
    pub fn answer_window(&self, caller_deadline: Option<Duration>) -> Duration {
        match caller_deadline {
            Some(deadline) => {
                let margin = (deadline / 10).max(Duration::from_millis(50));
                self.answer_within.min(deadline.saturating_sub(margin))
            }
            None => self.answer_within,
        }
    }
}

/// Configuration keys of the caps (files of the config directories, or the environment).
pub const MAX_DETACHED_DELETES: &str = "MAX_DETACHED_DELETES";
pub const MAX_DETACHED_DELETES_PER_CALLER: &str = "MAX_DETACHED_DELETES_PER_CALLER";

/// How many deletes may run at once (started and not ended, waiting for a delete slot included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeleteCaps {
    /// Deletes one caller started that still run, at most.
    pub per_caller: usize,
    /// Deletes running at most.
    pub total: usize,
}

impl Default for DeleteCaps {
    fn default() -> Self {
        DeleteCaps {
            // Far more than a node's CAA has, and more than a controller's cleanup storm starts
            // before its first deletes end (each waits for one of the cloud's 32 delete slots).
            per_caller: 1024,
            // A few such callers at once.
            total: 4096,
        }
    }
}

impl DeleteCaps {
    /// The defaults, with `MAX_DETACHED_DELETES_PER_CALLER` and `MAX_DETACHED_DELETES` from
    /// `config` where set (whole numbers of at least 1).
    pub fn from_config(
        config: &peerpods_provider_core::ProviderConfig,
    ) -> Result<Self, peerpods_provider_core::Error> {
        let mut caps = DeleteCaps::default();
        for (key, field) in [
            (MAX_DETACHED_DELETES_PER_CALLER, &mut caps.per_caller),
            (MAX_DETACHED_DELETES, &mut caps.total),
        ] {
            if let Some(value) = config.get(key) {
                *field = value
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| {
                        peerpods_provider_core::Error::config(
                            key.to_owned(),
                            format!("{value:?} is not a whole number of at least 1"),
                        )
                    })?;
            }
        }
        Ok(caps)
    }

    /// Whether a new delete fits for a caller that runs `by_caller` deletes, with `total` running.
    pub fn check(&self, by_caller: usize, total: usize) -> Result<(), DeleteCap> {
        if by_caller >= self.per_caller {
            Err(DeleteCap::PerCaller)
        } else if total >= self.total {
            Err(DeleteCap::Total)
        } else {
            Ok(())
        }
    }

    /// The value and configuration key of `cap`.
    pub fn of(&self, cap: DeleteCap) -> (usize, &'static str) {
        match cap {
            DeleteCap::PerCaller => (self.per_caller, MAX_DETACHED_DELETES_PER_CALLER),
            DeleteCap::Total => (self.total, MAX_DETACHED_DELETES),
        }
    }
}

/// Which cap refused a new delete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeleteCap {
    PerCaller,
    Total,
}

impl DeleteCap {
    pub fn as_str(self) -> &'static str {
        match self {
            DeleteCap::PerCaller => "per_caller",
            DeleteCap::Total => "total",
        }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeleteCapLabels {
    /// `per_caller` or `total` ([`DeleteCap`]).
    pub cap: &'static str,
}

/// What a finished delete ended with. The error is shared by every caller that waited for it.
pub type Finished = Result<DeleteOutcome, Arc<Error>>;

/// What a call hears within its answer window.
#[derive(Debug, Clone)]
pub enum Answer {
    /// The instance is confirmed gone, or the delete failed. Never [`DeleteOutcome::NotYetVisible`]
    /// nor [`DeleteOutcome::InProgress`]: those are [`Answer::InProgress`].
    Finished(Finished),
    /// Not confirmed gone, not failed: ask again.
    InProgress(Wait),
}

/// What an [`Answer::InProgress`] waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// The delete goes on (or waits for a delete slot).
    CloudDeleting,
    /// The delete ended without the cloud showing the instance, inside its consistency window
    /// ([`DeleteOutcome::NotYetVisible`]): nothing is remembered of it, the next call looks again.
    NotYetVisible {
        unknown_for: Duration,
        window: Duration,
        setting: &'static str,
    },
}

/// The detached deletes of one provider-service. Cheap to clone: clones share the running set.
#[derive(Clone)]
pub struct Deletes {
    inner: Arc<Inner>,
}

struct Inner {
    settings: DeleteSettings,
    state: Mutex<State>,
    /// How many deletes run or wait for a delete slot; shutdown waits for 0.
    running_count: watch::Sender<usize>,
    next_id: AtomicU64,
    /// `provider_service_deletes_refused{cap}`.
    refused: Family<DeleteCapLabels, Counter>,
}

#[derive(Default)]
struct State {
    running: HashMap<Key, Running>,
    /// Deletes running per caller that started them (`None`: unauthenticated, `--auth=none`).
    by_caller: HashMap<Option<Caller>, usize>,
    caps: DeleteCaps,
    /// Shutting down: no new delete starts (running ones may still be joined).
    closed: bool,
}

/// One instance of one provider: the cloud's canonical id ([`InstanceKey`]), so that two spellings of
/// one instance (an Azure id in another case) share one delete, and two instances never do (ids stay
/// case-sensitive where the cloud's are).
type Key = InstanceKey;

struct Running {
    id: u64,
    caller: Option<Caller>,
    done: watch::Receiver<Option<Finished>>,
}

/// A call's handle on the delete it started or joined.
pub struct Job {
    done: watch::Receiver<Option<Finished>>,
    /// Whether the call joined a delete that was already running.
    pub joined: bool,
}

impl Job {
    /// The delete's end if it comes within `window`, else [`Answer::InProgress`] (as is an end
    /// where the cloud did not show the instance yet). Dropping the call (the caller cancelled)
    /// never stops the delete.
    pub async fn answer(mut self, window: Duration) -> Answer {
        match tokio::time::timeout(window, self.done.wait_for(Option::is_some)).await {
            Ok(Ok(finished)) => match finished.as_ref() {
                Some(Ok(DeleteOutcome::NotYetVisible {
                    unknown_for,
                    window,
                    setting,
                })) => Answer::InProgress(Wait::NotYetVisible {
                    unknown_for: *unknown_for,
                    window: *window,
                    setting,
                }),
                // The backend's bound passed with the cloud still deleting: the next call resumes.
                Some(Ok(DeleteOutcome::InProgress)) | None => {
                    Answer::InProgress(Wait::CloudDeleting)
                }
                Some(finished) => Answer::Finished(finished.clone()),
            },
            // The task ended without an answer: it panicked.
            Ok(Err(_)) => Answer::Finished(Err(Arc::new(Error::internal(
                "the delete ended without an answer",
            )))),
            Err(_elapsed) => Answer::InProgress(Wait::CloudDeleting),
        }
    }
}

impl Deletes {
    pub fn new(settings: DeleteSettings) -> Self {
        Deletes {
            inner: Arc::new(Inner {
                settings,
                state: Mutex::default(),
                running_count: watch::Sender::new(0),
                next_id: AtomicU64::new(0),
                refused: Family::default(),
            }),
        }
    }

    /// Puts other caps in place (the configuration's, once it is read); deletes running past them
    /// go on.
    pub fn set_caps(&self, caps: DeleteCaps) {
        self.inner.state().caps = caps;
    }

    pub fn caps(&self) -> DeleteCaps {
        self.inner.state().caps
    }

    /// Registers the refusal counter under `registry`'s prefix.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "deletes_refused",
            "DeleteInstance calls refused with RESOURCE_EXHAUSTED because their caller (cap=per_caller, MAX_DETACHED_DELETES_PER_CALLER) or the service (cap=total, MAX_DETACHED_DELETES) runs as many deletes as it may",
            self.inner.refused.clone(),
        );
    }

    /// New deletes refused past `cap` so far.
    pub fn refused(&self, cap: DeleteCap) -> u64 {
        self.inner
            .refused
            .get_or_create(&DeleteCapLabels { cap: cap.as_str() })
            .get()
    }

    pub fn settings(&self) -> DeleteSettings {
        self.inner.settings
    }

    /// [`Deletes::delete_for`] no known caller (the unauthenticated one of `--auth=none`).
    pub fn delete(
        &self,
        provider: Arc<dyn Provider>,
        instance_id: &str,
        span: tracing::Span,
    ) -> Result<Job, Error> {
        self.delete_for(provider, instance_id, None, span)
    }

    /// Joins the delete running for `instance_id` of `provider`, or starts one for `caller` in a
    /// task of its own (traced in `span`), if the caps allow ([`DeleteCaps`]). Once shutdown
    /// began, only joining is allowed. `provider` bounds the delete itself (its call budget,
    /// [`crate::backends::guarded`]): the task has no deadline of its own, so the time it waits for
    /// a delete slot is never held against it.
    pub fn delete_for(
        &self,
        provider: Arc<dyn Provider>,
        instance_id: &str,
        caller: Option<&Caller>,
        span: tracing::Span,
    ) -> Result<Job, Error> {
        let key = InstanceKey::new(provider.name(), instance_id);
        let mut state = self.inner.state();
        if let Some(running) = state.running.get(&key) {
            return Ok(Job {
                done: running.done.clone(),
                joined: true,
            });
        }
        if state.closed {
            return Err(Error::ShuttingDown);
        }
        let caller = caller.cloned();
        let by_caller = state.by_caller.get(&caller).copied().unwrap_or(0);
        if let Err(cap) = state.caps.check(by_caller, state.running.len()) {
            let (limit, setting) = state.caps.of(cap);
            let running = match cap {
                DeleteCap::PerCaller => by_caller,
                DeleteCap::Total => state.running.len(),
            };
            drop(state);
            self.inner
                .refused
                .get_or_create(&DeleteCapLabels { cap: cap.as_str() })
                .inc();
            return Err(Error::TooManyDeletes {
                by: match (cap, caller) {
                    (DeleteCap::PerCaller, Some(caller)) => caller.to_string(),
                    (DeleteCap::PerCaller, None) => "unauthenticated callers".to_owned(),
                    (DeleteCap::Total, _) => "all callers".to_owned(),
                },
                running,
                limit,
                setting,
                retry_after: self.inner.settings.retry_after,
            });
        }
        *state.by_caller.entry(caller.clone()).or_insert(0) += 1;
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (finished, done) = watch::channel(None);
        state.running.insert(
            key.clone(),
            Running {
                id,
                caller,
                done: done.clone(),
            },
        );
        let count = state.running.len();
        drop(state);
        self.inner.running_count.send_replace(count);
        let ends = Ends {
            inner: self.inner.clone(),
            key,
            id,
        };
        let instance_id = instance_id.to_owned();
        tokio::spawn(
            async move {
                let outcome = provider
                    .delete_instance(&instance_id)
                    .await
                    .map_err(Error::from);
                match &outcome {
                    // A wait, not an end to remember: the next call looks again.
                    Ok(DeleteOutcome::NotYetVisible { unknown_for, .. }) => {
                        tracing::Span::current().record("outcome", "not_yet_visible");
                        tracing::info!(
                            unknown_for_ms = unknown_for.as_millis() as u64,
                            "the cloud does not show the instance yet; the next call looks again"
                        );
                    }
                    Ok(DeleteOutcome::InProgress) => {
                        tracing::Span::current().record("outcome", "in_progress");
                        tracing::info!(
                            "the cloud is still deleting the instance past the backend's bound; the next call resumes"
                        );
                    }
                    Ok(outcome) => {
                        tracing::Span::current().record("outcome", outcome.as_str());
                        tracing::info!(outcome = outcome.as_str(), "instance delete finished");
                    }
                    Err(e) => {
                        tracing::Span::current().record("outcome", e.reason());
                        tracing::warn!(error = %e, reason = e.reason(), "instance delete failed");
                    }
                }
                // Leave the running set before answering: a call that comes once a caller has this answer
                // starts a delete of its own and is told what the cloud says then (`AlreadyGone`), rather
                // than joining this one and being told `Deleted` a second time.
                drop(ends);
                finished.send_replace(Some(outcome.map_err(Arc::new)));
            }
            .instrument(span),
        );
        Ok(Job {
            done,
            joined: false,
        })
    }

    /// How many deletes are running or waiting for a delete slot.
    pub fn in_flight(&self) -> usize {
        *self.inner.running_count.borrow()
    }

    /// Refuses new deletes from now on; the running ones go on.
    pub fn close(&self) {
        self.inner.state().closed = true;
    }

    /// Waits until no delete runs, at most `grace`; returns how many still run then.
    pub async fn drain(&self, grace: Duration) -> usize {
        let mut count = self.inner.running_count.subscribe();
        let _ = tokio::time::timeout(grace, count.wait_for(|n| *n == 0)).await;
        self.in_flight()
    }
}

impl Inner {
    fn state(&self) -> MutexGuard<'_, State> {
        // Only the running set is behind the lock; a panic elsewhere cannot leave it torn.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Removes a delete from the running set when its task ends, however it ends (a panic included).
struct Ends {
    inner: Arc<Inner>,
    key: Key,
    id: u64,
}

impl Drop for Ends {
    fn drop(&mut self) {
        let mut state = self.inner.state();
        if state
            .running
            .get(&self.key)
            .is_some_and(|r| r.id == self.id)
            && let Some(ended) = state.running.remove(&self.key)
            && let Some(n) = state.by_caller.get_mut(&ended.caller)
        {
            *n = n.saturating_sub(1);
            if *n == 0 {
                state.by_caller.remove(&ended.caller);
            }
        }
        let count = state.running.len();
        drop(state);
        self.inner.running_count.send_replace(count);
    }
}

/// The caller's deadline from its `grpc-timeout` header (gRPC over HTTP/2: at most 8 digits and a
/// unit, `H`, `M`, `S`, `m`, `u` or `n`). `None` when absent or malformed.
pub fn caller_deadline(metadata: &tonic::metadata::MetadataMap) -> Option<Duration> {
    let value = metadata.get("grpc-timeout")?.to_str().ok()?;
    parse_grpc_timeout(value)
}

fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    let split = value.len().checked_sub(1)?;
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() || digits.len() > 8 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_timeouts_parse_in_every_unit() {
        assert_eq!(parse_grpc_timeout("2H"), Some(Duration::from_secs(7200)));
        assert_eq!(parse_grpc_timeout("3M"), Some(Duration::from_secs(180)));
        assert_eq!(parse_grpc_timeout("60S"), Some(Duration::from_secs(60)));
        assert_eq!(
            parse_grpc_timeout("1500m"),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(parse_grpc_timeout("7u"), Some(Duration::from_micros(7)));
        assert_eq!(parse_grpc_timeout("9n"), Some(Duration::from_nanos(9)));
        for bad in ["", "S", "123456789S", "10s", "-1S", "1.5S", "10"] {
            assert_eq!(parse_grpc_timeout(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_answer_comes_before_the_callers_deadline() {
        let settings = DeleteSettings::default();
        assert_eq!(settings.answer_window(None), DEFAULT_ANSWER_WITHIN);
        assert_eq!(
            settings.answer_window(Some(Duration::from_secs(60))),
            DEFAULT_ANSWER_WITHIN
        );
        assert_eq!(
            settings.answer_window(Some(Duration::from_secs(2))),
            Duration::from_millis(1800)
        );
        assert_eq!(
            settings.answer_window(Some(Duration::from_millis(100))),
            Duration::from_millis(50)
        );
        assert_eq!(
            settings.answer_window(Some(Duration::from_millis(10))),
            Duration::ZERO
        );
    }

    #[test]
    fn deletes_are_capped_per_caller_then_in_all() {
        let caps = DeleteCaps {
            per_caller: 2,
            total: 3,
        };
        assert_eq!(caps.check(1, 2), Ok(()));
        assert_eq!(caps.check(2, 2), Err(DeleteCap::PerCaller));
        assert_eq!(caps.check(0, 3), Err(DeleteCap::Total));
        assert_eq!(caps.of(DeleteCap::Total), (3, MAX_DETACHED_DELETES));
    }

    #[test]
    fn deadlines_nest_from_the_backends_out() {
        let d = DeleteSettings::default();
        // A detached delete outlives the slowest backend's own wait, so that wait's retryable
        // answer (and its resumable state) comes first; shutdown outlives every detached delete
        // running when it begins.
        assert!(SLOWEST_BACKEND_WAIT < DELETE_BOUND);
        assert!(DELETE_BOUND < d.drain_grace);
        // The server's bound of any call comes next (`server`'s tests).
        assert!(d.retry_after < d.answer_within);
    }
}
