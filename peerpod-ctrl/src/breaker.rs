//! A controller-wide circuit breaker in front of provider-service: while provider-service (or one cloud behind
//! it) is down, one call probes it and every other PeerPod waits in memory, instead of N reconciles each failing,
//! each writing a status and an Event, and each backing off on its own.
//!
//! Two scopes: provider-service itself (it cannot be reached, or refuses our credentials: every call would fail
//! the same way) and each cloud (provider-service answers, but the cloud behind it keeps failing).
//! provider-service opens on its first such failure; a cloud after [`CLOUD_THRESHOLD`] failures in a row, since one
//! cloud error may belong to one VM.
//!
//! Throttling is not an outage: a throttled answer shows the cloud is up and says how fast it may be asked, which
//! each PeerPod's own retry honours (its `retry_after`). It counts as the cloud answering. Counting it as a failure
//! stalled cleanups under partial throttling: a delete makes several cloud requests, so with one request in ten
//! throttled most calls, and most probes, met one, and the scope stayed open for minutes while the cloud served. An open scope lets no call through until its backoff has passed (1 s doubling
//! with each failed probe, up to 30 s, with jitter); then exactly one call goes through as the probe (half-open).
//! Its success closes the scope, its failure opens it again for longer. Calls held back are not failures of their
//! PeerPods: nothing is written for them (see `cleanup::record`), they are counted and retried after the scope's backoff.
//!
//! Pure state behind a mutex, with the clock passed in, so the transitions are unit-tested without waiting.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use peerpods_runtime::backoff::{Backoff, jitter};
use tracing::{info, warn};

use crate::Error;
use peerpods_api::peerpod::PeerPod;

/// Failures in a row of one cloud that open its scope.
pub const CLOUD_THRESHOLD: u32 = 3;

/// A probe whose outcome never came back (its reconcile was dropped) lets another probe through after this: longer
/// than the provider call's own deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long an open scope waits before its probe: doubling with each failed probe.
const OPEN_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(30),
};

/// What a breaker guards.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Scope {
    /// provider-service itself.
    ProviderService,
    /// One cloud, by its provider name.
    Cloud(String),
}

impl Scope {
    /// For logs and the metric's label.
    pub fn label(&self) -> String {
        match self {
            Scope::ProviderService => "provider-service".to_owned(),
            Scope::Cloud(name) => crate::metrics::provider_label(name),
        }
    }
}

#[derive(Debug, Clone)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        /// How many times it opened without a success in between.
        opened: u32,
        cause: &'static str,
    },
    HalfOpen {
        probe_since: Instant,
        opened: u32,
        cause: &'static str,
    },
}

/// Whether a call may go to provider-service now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Go ahead; `probe` when this call decides whether an open scope closes.
    Go { probe: bool },
    /// Held back: `scope` is open because of failures of reason `cause`; ask again in `retry_in`.
    Wait {
        scope: Scope,
        cause: &'static str,
        retry_in: Duration,
    },
}

/// What a scope's state change means for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Opened {
        scope: Scope,
        cause: &'static str,
        for_: Duration,
    },
    Closed {
        scope: Scope,
    },
}

/// The breakers of one controller (one leadership term).
#[derive(Debug, Default)]
pub struct Breakers {
    scopes: Mutex<HashMap<Scope, State>>,
}

/// Which scope a failure of a call to `cloud` counts against, if any: errors that say nothing about the
/// service's health (a malformed request, a protected VM, a precondition of this one VM) count against none, and
/// neither does throttling, by provider-service or the cloud (a rate, not an outage).
pub fn scope_of(cloud: &str, error: &Error) -> Option<Scope> {
    match error {
        Error::ProviderUnavailable { .. } | Error::ProviderUnauthorized { .. } => {
            Some(Scope::ProviderService)
        }
        Error::CloudFailed { .. } if error.is_throttling() => None,
        Error::ProviderFailed { .. } | Error::CloudFailed { .. } => {
            Some(Scope::Cloud(cloud.to_owned()))
        }
        _ => None,
    }
}

/// Whether a failure shows the cloud answering: it throttled us, so it is up.
fn cloud_answered(error: &Error) -> bool {
    matches!(error, Error::CloudFailed { .. }) && error.is_throttling()
}

impl Breakers {
    fn scopes(&self) -> std::sync::MutexGuard<'_, HashMap<Scope, State>> {
        // Only small state values live here; a poisoned lock still holds consistent ones.
        self.scopes.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a call to `cloud` may go now: provider-service's scope first, then the cloud's.
    pub fn admit(&self, cloud: &str, now: Instant) -> Admission {
        let mut scopes = self.scopes();
        let mut probe = false;
        for scope in [Scope::ProviderService, Scope::Cloud(cloud.to_owned())] {
            let Some(state) = scopes.get_mut(&scope) else {
                continue;
            };
            match state.clone() {
                State::Closed { .. } => {}
                State::Open {
                    until,
                    opened,
                    cause,
                } => {
                    if now < until {
                        return Admission::Wait {
                            retry_in: until - now,
                            scope,
                            cause,
                        };
                    }
                    *state = State::HalfOpen {
                        probe_since: now,
                        opened,
                        cause,
                    };
                    probe = true;
                }
                State::HalfOpen {
                    probe_since,
                    opened,
                    cause,
                } => {
                    if now.saturating_duration_since(probe_since) < PROBE_TIMEOUT {
                        // The probe's answer decides; ask again about when it should have come.
                        return Admission::Wait {
                            retry_in: OPEN_BACKOFF.base,
                            scope,
                            cause,
                        };
                    }
                    *state = State::HalfOpen {
                        probe_since: now,
                        opened,
                        cause,
                    };
                    probe = true;
                }
            }
        }
        Admission::Go { probe }
    }

    /// Records how a call to `cloud` went (`None`: it succeeded, or failed for a reason of its own VM).
    pub fn record(&self, cloud: &str, failure: Option<&Error>, now: Instant) -> Vec<Transition> {
        let mut scopes = self.scopes();
        let mut transitions = Vec::new();
        let failed = failure.and_then(|e| scope_of(cloud, e).map(|s| (s, e.reason())));
        let cloud_scope = Scope::Cloud(cloud.to_owned());
        // An answer from provider-service shows it is up; a success, or the cloud's throttling, also shows the
        // cloud is. Any other answer of provider-service's says nothing of the cloud.
        let (healthy, silent_on_cloud): (Vec<Scope>, bool) = match (&failed, failure) {
            (None, Some(e)) if !cloud_answered(e) => (vec![Scope::ProviderService], true),
            (None, _) => (vec![Scope::ProviderService, cloud_scope.clone()], false),
            (Some((Scope::Cloud(_), _)), _) => (vec![Scope::ProviderService], false),
            (Some((Scope::ProviderService, _)), _) => (vec![], false),
        };
        if silent_on_cloud
            && let Some(state) = scopes.get_mut(&cloud_scope)
            && let State::HalfOpen { opened, cause, .. } = *state
        {
            // The probe's answer says nothing of the cloud (provider-service shed it, or it was about this one
            // VM): the next call probes at once, rather than all waiting out the lost-probe timeout.
            *state = State::Open {
                until: now,
                opened,
                cause,
            };
        }
        for scope in healthy {
            if let Some(state) = scopes.get_mut(&scope) {
                let was_open = !matches!(state, State::Closed { .. });
                *state = State::Closed { failures: 0 };
                if was_open {
                    transitions.push(Transition::Closed { scope });
                }
            }
        }
        let Some((scope, cause)) = failed else {
            return transitions;
        };
        let threshold = match scope {
            Scope::ProviderService => 1,
            Scope::Cloud(_) => CLOUD_THRESHOLD,
        };
        let state = scopes
            .entry(scope.clone())
            .or_insert(State::Closed { failures: 0 });
        let opened = match state {
            State::Closed { failures } => {
                *failures += 1;
                (*failures >= threshold).then_some(1)
            }
            // A call that went out before the scope opened: the probe decides, not this one.
            State::Open { .. } => None,
            State::HalfOpen { opened, .. } => Some(opened.saturating_add(1)),
        };
        if let Some(opened) = opened {
            let for_ = OPEN_BACKOFF
                .delay(opened, false, None, jitter())
                .max(OPEN_BACKOFF.base / 2);
            *state = State::Open {
                until: now + for_,
                opened,
                cause,
            };
            transitions.push(Transition::Opened { scope, cause, for_ });
        }
        transitions
    }

    /// The scope that would hold a call to `cloud` back now, without starting a probe.
    fn admit_peek(&self, cloud: &str, now: Instant) -> Option<(Scope, Duration)> {
        let scopes = self.scopes();
        [Scope::ProviderService, Scope::Cloud(cloud.to_owned())]
            .into_iter()
            .find_map(|scope| match scopes.get(&scope) {
                Some(State::Open { until, .. }) => {
                    Some((scope, until.saturating_duration_since(now)))
                }
                Some(State::HalfOpen { .. }) => Some((scope, OPEN_BACKOFF.base)),
                _ => None,
            })
    }

    /// Scopes open or probing now, for the metric.
    pub fn open_scopes(&self) -> Vec<Scope> {
        self.scopes()
            .iter()
            .filter(|(_, s)| !matches!(s, State::Closed { .. }))
            .map(|(scope, _)| scope.clone())
            .collect()
    }
}

/// Makes `call` (a provider-service call for a VM of `cloud`) through `breakers`: held back with
/// [`Error::CircuitOpen`] while its scope is open, its outcome recorded otherwise. A failure of a call that went
/// out while another one opened the scope is turned into [`Error::CircuitOpen`] too: the outage is already
/// reported, by the call that opened the breaker, and this PeerPod did nothing wrong.
pub async fn guarded<T>(
    breakers: &Breakers,
    cloud: &str,
    call: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    if let Admission::Wait {
        scope,
        cause,
        retry_in,
    } = breakers.admit(cloud, Instant::now())
    {
        return Err(Error::CircuitOpen {
            scope: scope.label(),
            cause,
            retry_in,
        });
    }
    let result = call.await;
    let failure = result.as_ref().err();
    let transitions = breakers.record(cloud, failure, Instant::now());
    let mut opened_here = false;
    for transition in &transitions {
        match transition {
            Transition::Opened { scope, cause, for_ } => {
                opened_here = true;
                warn!(
                    scope = %scope.label(),
                    cause,
                    probe_in = ?for_,
                    "circuit breaker open: calls are held back until a probe succeeds"
                );
            }
            Transition::Closed { scope } => {
                info!(scope = %scope.label(), "circuit breaker closed: calls go through again");
            }
        }
    }
    match (result, failure_scope_open(breakers, cloud, opened_here)) {
        (Err(error), Some((scope, retry_in))) if scope_of(cloud, &error).is_some() => {
            Err(Error::CircuitOpen {
                scope: scope.label(),
                cause: error.reason(),
                retry_in,
            })
        }
        (result, _) => result,
    }
}

/// The open scope a failure fell into when it did not open it itself, with the wait left.
fn failure_scope_open(
    breakers: &Breakers,
    cloud: &str,
    opened_here: bool,
) -> Option<(Scope, Duration)> {
    if opened_here {
        return None;
    }
    breakers.admit_peek(cloud, Instant::now())
}

/// When a held PeerPod asks again: after the scope's wait, spread over one more wait by `draw` (a
/// [`jitter`] value), so the PeerPods held during an outage do not all return in the same instant.
pub fn held_delay(retry_in: Duration, draw: u64) -> Duration {
    let wait = retry_in.max(OPEN_BACKOFF.base / 2);
    wait + wait.mul_f64((draw % 1_000_001) as f64 / 1_000_000.0)
}

/// How often the Warning Event of a PeerPod that keeps failing the same way is repeated (one more occurrence of
/// the same Event: a series update) while calls go out and fail: still failing shows, without a write per attempt.
pub const EVENT_REPEAT: Duration = Duration::from_secs(10);

/// When each PeerPod's failure Event was last published, for [`EVENT_REPEAT`].
#[derive(Debug)]
pub struct Reminders<K> {
    last: Mutex<HashMap<K, Instant>>,
}

impl<K> Default for Reminders<K> {
    fn default() -> Self {
        Reminders {
            last: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + std::hash::Hash + Clone> Reminders<K> {
    fn last(&self) -> std::sync::MutexGuard<'_, HashMap<K, Instant>> {
        // Instants only; a poisoned lock still holds usable ones.
        self.last.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The Event for `key` was published now.
    pub fn published(&self, key: &K, now: Instant) {
        self.last().insert(key.clone(), now);
    }

    /// Whether the Event for `key` is due again (then it counts as published now).
    pub fn due(&self, key: &K, now: Instant) -> bool {
        let mut last = self.last();
        match last.get(key) {
            Some(at) if now.saturating_duration_since(*at) < EVENT_REPEAT => false,
            _ => {
                last.insert(key.clone(), now);
                true
            }
        }
    }

    /// Keeps only the keys `keep` says still exist.
    pub fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        self.last().retain(|key, _| keep(key));
    }
}

/// Whether the PeerPod's Cleaned condition already records a failure of `reason`: then a retry failing the same
/// way writes nothing.
pub fn same_failure_recorded(peerpod: &PeerPod, reason: &str) -> bool {
    peerpod
        .cleaned_condition()
        .is_some_and(|c| c.status == "False" && c.reason == reason)
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_api::peerpod::FailureReason;

    fn unavailable() -> Error {
        Error::ProviderUnavailable {
            message: "connection refused".into(),
            source: None,
        }
    }

    fn waits(a: &Admission) -> bool {
        matches!(a, Admission::Wait { .. })
    }

    #[test]
    fn provider_service_down_opens_at_once_and_one_probe_closes_it() {
        let b = Breakers::default();
        let t0 = Instant::now();
        assert_eq!(b.admit("aws", t0), Admission::Go { probe: false });
        let opened = b.record("aws", Some(&unavailable()), t0);
        assert!(
            matches!(
                &opened[..],
                [Transition::Opened {
                    scope: Scope::ProviderService,
                    cause: "ProviderUnavailable",
                    ..
                }]
            ),
            "{opened:?}"
        );
        // Every other PeerPod, of any cloud, waits in memory.
        for cloud in ["aws", "azure", "libvirt"] {
            let a = b.admit(cloud, t0 + Duration::from_millis(100));
            assert!(
                matches!(&a, Admission::Wait { scope: Scope::ProviderService, cause: "ProviderUnavailable", retry_in } if *retry_in <= Duration::from_secs(1)),
                "{a:?}"
            );
        }
        // A call that went out before it opened does not extend it.
        assert!(b.record("aws", Some(&unavailable()), t0).is_empty());
        // After the backoff exactly one probe goes; the rest wait for its answer.
        let later = t0 + Duration::from_secs(2);
        assert_eq!(b.admit("aws", later), Admission::Go { probe: true });
        assert!(waits(&b.admit("azure", later)));
        assert!(waits(&b.admit("aws", later)));
        let closed = b.record("aws", None, later);
        assert_eq!(
            closed,
            [Transition::Closed {
                scope: Scope::ProviderService
            }]
        );
        assert_eq!(b.admit("azure", later), Admission::Go { probe: false });
        assert!(b.open_scopes().is_empty());
    }

    #[test]
    fn a_failed_probe_opens_for_longer_and_a_lost_probe_is_replaced() {
        let b = Breakers::default();
        let mut now = Instant::now();
        b.record("aws", Some(&unavailable()), now);
        let mut longest = Duration::ZERO;
        for _ in 0..8 {
            now += Duration::from_secs(31);
            assert_eq!(b.admit("aws", now), Admission::Go { probe: true });
            let t = b.record("aws", Some(&unavailable()), now);
            let [Transition::Opened { for_, .. }] = &t[..] else {
                panic!("{t:?}");
            };
            assert!(*for_ <= Duration::from_secs(30));
            longest = longest.max(*for_);
        }
        assert!(longest > Duration::from_secs(2), "{longest:?}");
        now += Duration::from_secs(31);
        assert_eq!(b.admit("aws", now), Admission::Go { probe: true });
        // The probe's reconcile was dropped: no answer ever comes; another probe goes after the timeout.
        assert!(waits(&b.admit("aws", now + Duration::from_secs(60))));
        assert_eq!(
            b.admit("aws", now + PROBE_TIMEOUT),
            Admission::Go { probe: true }
        );
    }

    #[test]
    fn a_cloud_opens_after_failures_in_a_row_and_alone() {
        let b = Breakers::default();
        let now = Instant::now();
        let failed = Error::ProviderFailed {
            message: "500 from the cloud".into(),
            source: None,
        };
        for _ in 1..CLOUD_THRESHOLD {
            assert!(b.record("azure", Some(&failed), now).is_empty());
        }
        // A success in between starts the count again.
        b.record("azure", None, now);
        for _ in 1..CLOUD_THRESHOLD {
            assert!(b.record("azure", Some(&failed), now).is_empty());
        }
        let t = b.record("azure", Some(&failed), now);
        assert!(
            matches!(&t[..], [Transition::Opened { scope: Scope::Cloud(c), cause: "ProviderFailed", .. }] if c == "azure"),
            "{t:?}"
        );
        assert!(waits(&b.admit("azure", now)));
        assert_eq!(b.admit("aws", now), Admission::Go { probe: false });
    }

    fn shed() -> Error {
        Error::ProviderThrottled {
            message: "too many calls".into(),
            retry_after: None,
            source: None,
        }
    }

    fn cloud_throttled() -> Error {
        Error::CloudFailed {
            reason: FailureReason::CloudThrottled,
            message: "429 Throttling.User".into(),
            retry_after: Some(Duration::from_secs(2)),
            source: None,
        }
    }

    fn cloud_unavailable() -> Error {
        Error::CloudFailed {
            reason: FailureReason::CloudUnavailable,
            message: "503 ServiceUnavailable".into(),
            retry_after: None,
            source: None,
        }
    }

    #[test]
    fn throttling_never_opens_a_scope_and_does_not_add_to_a_run_of_failures() {
        let b = Breakers::default();
        let now = Instant::now();
        let shed = shed();
        for _ in 0..100 {
            assert!(
                b.record("alibabacloud", Some(&cloud_throttled()), now)
                    .is_empty()
            );
            assert!(b.record("alibabacloud", Some(&shed), now).is_empty());
        }
        assert_eq!(b.admit("alibabacloud", now), Admission::Go { probe: false });
        // A throttled answer is the cloud answering: it breaks a run of server errors.
        for _ in 1..CLOUD_THRESHOLD {
            b.record("alibabacloud", Some(&cloud_unavailable()), now);
        }
        b.record("alibabacloud", Some(&cloud_throttled()), now);
        assert!(
            b.record("alibabacloud", Some(&cloud_unavailable()), now)
                .is_empty()
        );
        assert_eq!(b.admit("alibabacloud", now), Admission::Go { probe: false });
    }

    #[test]
    fn a_probe_the_cloud_throttles_closes_the_cloud_scope() {
        let b = Breakers::default();
        let now = Instant::now();
        for _ in 0..CLOUD_THRESHOLD {
            b.record("gcp", Some(&cloud_unavailable()), now);
        }
        assert!(waits(&b.admit("gcp", now)));
        let later = now + Duration::from_secs(31);
        assert_eq!(b.admit("gcp", later), Admission::Go { probe: true });
        let closed = b.record("gcp", Some(&cloud_throttled()), later);
        assert_eq!(
            closed,
            [Transition::Closed {
                scope: Scope::Cloud("gcp".into())
            }]
        );
        assert_eq!(b.admit("gcp", later), Admission::Go { probe: false });
    }

    #[test]
    fn a_probe_whose_answer_says_nothing_of_the_cloud_lets_the_next_call_probe_at_once() {
        let b = Breakers::default();
        let now = Instant::now();
        for _ in 0..CLOUD_THRESHOLD {
            b.record("azure", Some(&cloud_unavailable()), now);
        }
        let later = now + Duration::from_secs(31);
        assert_eq!(b.admit("azure", later), Admission::Go { probe: true });
        assert!(waits(&b.admit("azure", later)), "one probe at a time");
        // provider-service shed the probe: nothing learnt about the cloud, which stays open, but the
        // probe's slot is free again, not held until the lost-probe timeout.
        assert!(b.record("azure", Some(&shed()), later).is_empty());
        assert_eq!(b.open_scopes(), [Scope::Cloud("azure".into())]);
        let next = later + Duration::from_millis(1);
        assert_eq!(b.admit("azure", next), Admission::Go { probe: true });
        // So does an answer about the probe's own VM.
        let protected = Error::InstanceProtected {
            message: "tagged".into(),
            source: None,
        };
        assert!(b.record("azure", Some(&protected), next).is_empty());
        assert_eq!(b.admit("azure", next), Admission::Go { probe: true });
    }

    #[test]
    fn a_failure_event_repeats_at_most_every_event_repeat() {
        let r = Reminders::default();
        let t0 = Instant::now();
        r.published(&"a", t0);
        assert!(!r.due(&"a", t0 + Duration::from_secs(1)));
        assert!(r.due(&"a", t0 + EVENT_REPEAT));
        assert!(!r.due(&"a", t0 + EVENT_REPEAT + Duration::from_secs(1)));
        assert!(r.due(&"b", t0), "never published: due");
        r.retain(|k| *k == "b");
        assert!(r.due(&"a", t0), "forgotten");
    }

    #[test]
    fn errors_of_one_vm_open_nothing() {
        let b = Breakers::default();
        let now = Instant::now();
        for error in [
            Error::ProviderRejected {
                message: "bad id".into(),
                source: None,
            },
            Error::InstanceProtected {
                message: "tagged".into(),
                source: None,
            },
            Error::ProviderPrecondition {
                message: "not configured".into(),
                source: None,
            },
        ] {
            for _ in 0..10 {
                assert!(b.record("aws", Some(&error), now).is_empty());
            }
        }
        assert_eq!(b.admit("aws", now), Admission::Go { probe: false });
    }
}
