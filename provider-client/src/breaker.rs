//! A circuit breaker in front of provider-service, a layer of [`ProviderService`](crate::ProviderService) that a
//! controller turns on ([`with_breaker`](crate::ProviderService::with_breaker)): while provider-service (or one
//! cloud behind it) is down, one call probes it and every other call waits in memory, instead of N reconciles
//! each failing, each writing a status and an Event, and each backing off on its own.
//!
//! Two scopes: provider-service itself (it cannot be reached, or refuses our credentials: every call would fail
//! the same way) and each cloud (provider-service answers, but the cloud behind it keeps failing).
//! provider-service opens on its first such failure; a cloud after [`CLOUD_THRESHOLD`] failures in a row, since one
//! cloud error may belong to one VM. Which [`Failure`] counts against which scope is [`Failure::scope`].
//!
//! Throttling is not an outage: a throttled answer shows the cloud is up and says how fast it may be asked, which
//! each caller's own retry honours (its `retry_after`). It counts as the cloud answering. Counting it as a failure
//! stalled cleanups under partial throttling: a delete makes several cloud requests, so with one request in ten
//! throttled most calls, and most probes, met one, and the scope stayed open for minutes while the cloud served.
//! An open scope lets no call through until its backoff has passed (1 s doubling with each failed probe, up to
//! 30 s, with jitter); then exactly one call goes through as the probe (half-open). Its success closes the scope,
//! its failure opens it again for longer. Calls held back are not failures of what they were made for: they come
//! back as [`CallError::Held`], for the caller to ask again after [`held_delay`] without recording a failure.
//!
//! Pure state behind a mutex, with the clock passed in, so the transitions are unit-tested without waiting.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use peerpods_runtime::backoff::{Backoff, jitter};
use tracing::{info, warn};

use crate::failure::{CallError, CloudFailure, Failure, Held, Scope};

/// Failures in a row of one cloud that open its scope.
pub const CLOUD_THRESHOLD: u32 = 3;

/// A probe whose outcome never came back (its caller was dropped) lets another probe through after this: longer
/// than the provider call's own deadline.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);

/// How long an open scope waits before its probe: doubling with each failed probe.
const OPEN_BACKOFF: Backoff = Backoff {
    base: Duration::from_secs(1),
    cap: Duration::from_secs(30),
};

impl Failure {
    /// Which scope this failure of a call to `cloud` counts against, if any: failures that say nothing about the
    /// service's health (a malformed request, a protected VM, a refusal or precondition of this one VM) count
    /// against none, and neither does throttling, by provider-service or the cloud (a rate, not an outage).
    pub fn scope(self, cloud: &str) -> Option<Scope> {
        match self {
            Failure::Unavailable | Failure::Unauthorized => Some(Scope::ProviderService),
            Failure::Cloud {
                failure: CloudFailure::Unavailable,
                ..
            }
            | Failure::Failed => Some(Scope::Cloud(cloud.to_owned())),
            Failure::Cloud {
                failure: CloudFailure::Throttled,
                ..
            }
            | Failure::Throttled { .. }
            | Failure::Protected
            | Failure::Refused(_)
            | Failure::Rejected
            | Failure::Precondition => None,
        }
    }

    /// Whether this failure shows the cloud answering: it throttled us, so it is up.
    fn cloud_answered(self) -> bool {
        matches!(
            self,
            Failure::Cloud {
                failure: CloudFailure::Throttled,
                ..
            }
        )
    }
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed {
        failures: u32,
    },
    Open {
        until: Instant,
        /// How many times it opened without a success in between.
        opened: u32,
        cause: Failure,
    },
    HalfOpen {
        probe_since: Instant,
        opened: u32,
        cause: Failure,
    },
}

/// Whether a call may go to provider-service now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Admission {
    /// Go ahead; `probe` when this call decides whether an open scope closes.
    Go { probe: bool },
    /// Held back.
    Wait(Held),
}

/// What a scope's state change means for logs and metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Opened {
        scope: Scope,
        cause: Failure,
        for_: Duration,
    },
    Closed {
        scope: Scope,
    },
}

/// The breakers of one client (a controller turns them on once per leadership term).
#[derive(Debug, Default)]
pub struct Breakers {
    scopes: Mutex<HashMap<Scope, State>>,
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
            let (opened, cause, wait) = match *state {
                State::Closed { .. } => continue,
                State::Open {
                    until,
                    opened,
                    cause,
                } => (opened, cause, (now < until).then(|| until - now)),
                // The probe's answer decides; ask again about when it should have come. A probe that never
                // answered is replaced.
                State::HalfOpen {
                    probe_since,
                    opened,
                    cause,
                } => (
                    opened,
                    cause,
                    (now.saturating_duration_since(probe_since) < PROBE_TIMEOUT)
                        .then_some(OPEN_BACKOFF.base),
                ),
            };
            if let Some(retry_in) = wait {
                return Admission::Wait(Held {
                    scope,
                    cause,
                    retry_in,
                });
            }
            *state = State::HalfOpen {
                probe_since: now,
                opened,
                cause,
            };
            probe = true;
        }
        Admission::Go { probe }
    }

    /// Records how a call to `cloud` went (`None`: it succeeded).
    pub fn record(&self, cloud: &str, failure: Option<Failure>, now: Instant) -> Vec<Transition> {
        let mut scopes = self.scopes();
        let mut transitions = Vec::new();
        let failed = failure.and_then(|f| f.scope(cloud).map(|s| (s, f)));
        let cloud_scope = Scope::Cloud(cloud.to_owned());
        // An answer from provider-service shows it is up; a success, or the cloud's throttling, also shows the
        // cloud is. Any other answer of provider-service's says nothing of the cloud.
        let (healthy, silent_on_cloud): (Vec<Scope>, bool) = match (&failed, failure) {
            (None, Some(f)) if !f.cloud_answered() => (vec![Scope::ProviderService], true),
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

    /// Makes `call` (a call about a VM of `cloud`) through the breakers: held back with [`CallError::Held`] while
    /// its scope is open, its outcome recorded otherwise. A failure of a call that went out while another one
    /// opened the scope is turned into [`CallError::Held`] too: the outage is already reported, by the call that
    /// opened the breaker, and this caller did nothing wrong.
    pub async fn guard<T>(
        &self,
        cloud: &str,
        call: impl Future<Output = Result<T, CallError>>,
    ) -> Result<T, CallError> {
        if let Admission::Wait(held) = self.admit(cloud, Instant::now()) {
            return Err(CallError::Held(held));
        }
        let result = call.await;
        let failure = result.as_ref().err().and_then(CallError::failure);
        let transitions = self.record(cloud, failure, Instant::now());
        let mut opened_here = false;
        for transition in &transitions {
            match transition {
                Transition::Opened { scope, cause, for_ } => {
                    opened_here = true;
                    warn!(
                        scope = %scope.label(),
                        %cause,
                        probe_in = ?for_,
                        "circuit breaker open: calls are held back until a probe succeeds"
                    );
                }
                Transition::Closed { scope } => {
                    info!(scope = %scope.label(), "circuit breaker closed: calls go through again");
                }
            }
        }
        match failure {
            Some(cause) if !opened_here && cause.scope(cloud).is_some() => {
                match self.admit_peek(cloud, Instant::now()) {
                    Some((scope, retry_in)) => Err(CallError::Held(Held {
                        scope,
                        cause,
                        retry_in,
                    })),
                    None => result,
                }
            }
            _ => result,
        }
    }
}

/// When a held caller asks again: after the scope's wait, spread over one more wait by `draw` (a [`jitter`]
/// value), so the callers held during an outage do not all return in the same instant.
pub fn held_delay(retry_in: Duration, draw: u64) -> Duration {
    let wait = retry_in.max(OPEN_BACKOFF.base / 2);
    wait + wait.mul_f64((draw % 1_000_001) as f64 / 1_000_000.0)
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::Refusal;

    const UNAVAILABLE: Failure = Failure::Unavailable;

    fn waits(a: &Admission) -> bool {
        matches!(a, Admission::Wait(_))
    }

    #[test]
    fn provider_service_down_opens_at_once_and_one_probe_closes_it() {
        let b = Breakers::default();
        let t0 = Instant::now();
        assert_eq!(b.admit("aws", t0), Admission::Go { probe: false });
        let opened = b.record("aws", Some(UNAVAILABLE), t0);
        assert!(
            matches!(
                &opened[..],
                [Transition::Opened {
                    scope: Scope::ProviderService,
                    cause: Failure::Unavailable,
                    ..
                }]
            ),
            "{opened:?}"
        );
        // Every other PeerPod, of any cloud, waits in memory.
        for cloud in ["aws", "azure", "libvirt"] {
            let a = b.admit(cloud, t0 + Duration::from_millis(100));
            assert!(
                matches!(&a, Admission::Wait(Held { scope: Scope::ProviderService, cause: Failure::Unavailable, retry_in }) if *retry_in <= Duration::from_secs(1)),
                "{a:?}"
            );
        }
        // A call that went out before it opened does not extend it.
        assert!(b.record("aws", Some(UNAVAILABLE), t0).is_empty());
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
        b.record("aws", Some(UNAVAILABLE), now);
        let mut longest = Duration::ZERO;
        for _ in 0..8 {
            now += Duration::from_secs(31);
            assert_eq!(b.admit("aws", now), Admission::Go { probe: true });
            let t = b.record("aws", Some(UNAVAILABLE), now);
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
        let failed = Failure::Failed;
        for _ in 1..CLOUD_THRESHOLD {
            assert!(b.record("azure", Some(failed), now).is_empty());
        }
        // A success in between starts the count again.
        b.record("azure", None, now);
        for _ in 1..CLOUD_THRESHOLD {
            assert!(b.record("azure", Some(failed), now).is_empty());
        }
        let t = b.record("azure", Some(failed), now);
        assert!(
            matches!(&t[..], [Transition::Opened { scope: Scope::Cloud(c),  cause: Failure::Failed, .. }] if c == "azure"),
            "{t:?}"
        );
        assert!(waits(&b.admit("azure", now)));
        assert_eq!(b.admit("aws", now), Admission::Go { probe: false });
    }

    fn shed() -> Failure {
        Failure::Throttled { retry_after: None }
    }

    fn cloud_throttled() -> Failure {
        Failure::Cloud {
            failure: CloudFailure::Throttled,
            retry_after: Some(Duration::from_secs(2)),
        }
    }

    fn cloud_unavailable() -> Failure {
        Failure::Cloud {
            failure: CloudFailure::Unavailable,
            retry_after: None,
        }
    }

    #[test]
    fn throttling_never_opens_a_scope_and_does_not_add_to_a_run_of_failures() {
        let b = Breakers::default();
        let now = Instant::now();
        let shed = shed();
        for _ in 0..100 {
            assert!(
                b.record("alibabacloud", Some(cloud_throttled()), now)
                    .is_empty()
            );
            assert!(b.record("alibabacloud", Some(shed), now).is_empty());
        }
        assert_eq!(b.admit("alibabacloud", now), Admission::Go { probe: false });
        // A throttled answer is the cloud answering: it breaks a run of server errors.
        for _ in 1..CLOUD_THRESHOLD {
            b.record("alibabacloud", Some(cloud_unavailable()), now);
        }
        b.record("alibabacloud", Some(cloud_throttled()), now);
        assert!(
            b.record("alibabacloud", Some(cloud_unavailable()), now)
                .is_empty()
        );
        assert_eq!(b.admit("alibabacloud", now), Admission::Go { probe: false });
    }

    #[test]
    fn a_probe_the_cloud_throttles_closes_the_cloud_scope() {
        let b = Breakers::default();
        let now = Instant::now();
        for _ in 0..CLOUD_THRESHOLD {
            b.record("gcp", Some(cloud_unavailable()), now);
        }
        assert!(waits(&b.admit("gcp", now)));
        let later = now + Duration::from_secs(31);
        assert_eq!(b.admit("gcp", later), Admission::Go { probe: true });
        let closed = b.record("gcp", Some(cloud_throttled()), later);
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
            b.record("azure", Some(cloud_unavailable()), now);
        }
        let later = now + Duration::from_secs(31);
        assert_eq!(b.admit("azure", later), Admission::Go { probe: true });
        assert!(waits(&b.admit("azure", later)), "one probe at a time");
        // provider-service shed the probe: nothing learnt about the cloud, which stays open, but the
        // probe's slot is free again, not held until the lost-probe timeout.
        assert!(b.record("azure", Some(shed()), later).is_empty());
        assert_eq!(b.open_scopes(), [Scope::Cloud("azure".into())]);
        let next = later + Duration::from_millis(1);
        assert_eq!(b.admit("azure", next), Admission::Go { probe: true });
        // So does an answer about the probe's own VM.
        assert!(b.record("azure", Some(Failure::Protected), next).is_empty());
        assert_eq!(b.admit("azure", next), Admission::Go { probe: true });
    }

    #[test]
    fn errors_of_one_vm_open_nothing() {
        let b = Breakers::default();
        let now = Instant::now();
        for failure in [
            Failure::Rejected,
            Failure::Protected,
            Failure::Precondition,
            Failure::Refused(Refusal::NotOwnedByCluster),
        ] {
            for _ in 0..10 {
                assert!(b.record("aws", Some(failure), now).is_empty());
            }
        }
        assert_eq!(b.admit("aws", now), Admission::Go { probe: false });
    }

    /// A status with provider-service's ErrorInfo reason.
    fn with_info(code: tonic::Code, reason: &str) -> tonic::Status {
        use tonic_types::{ErrorDetails, StatusExt};
        let details = ErrorDetails::with_error_info(
            reason,
            "provider.peerpods.io",
            std::collections::HashMap::new(),
        );
        tonic::Status::with_error_details(code, "from provider-service", details)
    }

    #[test]
    fn each_answer_counts_against_the_scope_that_failed() {
        use tonic::Code;
        let scope = |status: tonic::Status| Failure::read(&status).scope("aws");
        let cloud = Some(Scope::Cloud("aws".into()));
        // The cloud behind a working provider-service, and provider-service's own failure of a cloud call.
        assert_eq!(
            scope(with_info(Code::Unavailable, "CloudUnavailable")),
            cloud
        );
        assert_eq!(scope(with_info(Code::Internal, "Internal")), cloud);
        // provider-service itself: shutting down, not reachable, a cut transport, refusing our credentials.
        for status in [
            with_info(Code::Unavailable, "ShuttingDown"),
            tonic::Status::unavailable("tcp connect error"),
            tonic::Status::unknown("transport error: connection reset by peer"),
            with_info(Code::Unauthenticated, "Unauthenticated"),
            with_info(Code::PermissionDenied, "CallerNotAllowed"),
        ] {
            assert_eq!(
                scope(status.clone()),
                Some(Scope::ProviderService),
                "{status:?}"
            );
        }
        // Rates, refusals about one VM and the cloud's policy: no outage.
        for status in [
            with_info(Code::ResourceExhausted, "Throttled"),
            with_info(Code::ResourceExhausted, "Overloaded"),
            with_info(Code::PermissionDenied, "CloudPermissionDenied"),
            with_info(Code::FailedPrecondition, "NotOwnedByCluster"),
            with_info(Code::FailedPrecondition, "DoNotDelete"),
            with_info(Code::InvalidArgument, "InvalidArgument"),
            tonic::Status::out_of_range("instance_id: longer than 1024 bytes"),
        ] {
            assert_eq!(scope(status.clone()), None, "{status:?}");
        }
    }

    #[test]
    fn a_scope_is_labelled_by_the_clouds_canonical_name_and_unknown_names_share_one_label() {
        assert_eq!(Scope::ProviderService.label(), "provider-service");
        assert_eq!(Scope::Cloud("aws".into()).label(), "aws");
        assert_eq!(Scope::Cloud("no-such-cloud".into()).label(), "other");
    }

    fn failing(failure: Failure) -> Result<(), CallError> {
        Err(CallError::Failed {
            failure,
            message: "down".into(),
            status: None,
        })
    }

    #[tokio::test]
    async fn a_guarded_call_is_held_while_its_scope_is_open_and_made_once_it_may_probe() {
        let b = Breakers::default();
        let calls = std::sync::atomic::AtomicU32::new(0);
        let call = |failure: Option<Failure>| {
            let calls = &calls;
            async move {
                calls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                failure.map_or(Ok(()), failing)
            }
        };
        // The call that opens the breaker reports its own failure.
        let opened = b.guard("aws", call(Some(Failure::Unavailable))).await;
        assert!(
            matches!(
                opened,
                Err(CallError::Failed {
                    failure: Failure::Unavailable,
                    ..
                })
            ),
            "{opened:?}"
        );
        // The next is not made at all.
        let held = b.guard("azure", call(None)).await;
        let Err(CallError::Held(held)) = held else {
            panic!("{held:?}");
        };
        assert_eq!(held.scope, Scope::ProviderService);
        assert_eq!(held.cause, Failure::Unavailable);
        assert!(held.retry_in <= Duration::from_secs(1), "{held:?}");
        assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(
            held.to_string(),
            "provider-service is down (provider-service unreachable); the call waits for the circuit breaker's probe"
        );
    }

    #[tokio::test]
    async fn a_call_that_fails_into_a_scope_another_opened_is_held_not_failed() {
        let b = Breakers::default();
        let now = Instant::now();
        // Another call opened provider-service's scope while this one was out.
        let this = async {
            b.record("gcp", Some(Failure::Unavailable), now);
            failing(Failure::Unavailable)
        };
        let answer = b.guard("gcp", this).await;
        assert!(
            matches!(
                answer,
                Err(CallError::Held(Held {
                    scope: Scope::ProviderService,
                    ..
                }))
            ),
            "{answer:?}"
        );
        // A failure about its own VM stays its own.
        let b = Breakers::default();
        let answer = b
            .guard("gcp", std::future::ready(failing(Failure::Rejected)))
            .await;
        assert!(
            matches!(
                answer,
                Err(CallError::Failed {
                    failure: Failure::Rejected,
                    ..
                })
            ),
            "{answer:?}"
        );
    }

    #[test]
    fn a_held_call_asks_again_after_the_wait_spread_over_one_more_wait() {
        let two = Duration::from_secs(2);
        assert_eq!(held_delay(two, 0), two);
        assert_eq!(held_delay(two, 500_000), Duration::from_secs(3));
        assert_eq!(held_delay(two, 1_000_000), 2 * two);
        // Any draw spreads within the one more wait.
        assert_eq!(held_delay(two, 1_000_001 + 500_000), Duration::from_secs(3));
        // A scope about to close still spreads its callers over half the first backoff.
        assert_eq!(held_delay(Duration::ZERO, 0), Duration::from_millis(500));
    }

    #[test]
    fn a_scope_probing_holds_a_call_back_for_the_first_backoff_without_a_new_probe() {
        let b = Breakers::default();
        let now = Instant::now();
        b.record("aws", Some(UNAVAILABLE), now);
        let later = now + Duration::from_secs(31);
        assert_eq!(b.admit("aws", later), Admission::Go { probe: true });
        assert_eq!(
            b.admit_peek("aws", later),
            Some((Scope::ProviderService, OPEN_BACKOFF.base))
        );
        // Peeking starts no probe of its own: after the lost-probe timeout, admitting does.
        assert_eq!(
            b.admit_peek("aws", later + PROBE_TIMEOUT),
            Some((Scope::ProviderService, OPEN_BACKOFF.base))
        );
        assert_eq!(
            b.admit("aws", later + PROBE_TIMEOUT),
            Admission::Go { probe: true }
        );
    }
}
