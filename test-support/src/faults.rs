//! The fault layer every cloud emulator (`emulators/<cloud>`) puts in front of its API, so that
//! the emulators behave like clouds rather than flatter the backends: each request may be slow,
//! hang, fail with a 5xx or be throttled at a rate, and a new instance may be unknown for its
//! first seconds (EC2-style eventual consistency). Long-running operations that take N polls are
//! each emulator's own (its operation resource), configured from [`Faults::operation_polls`].
//!
//! The layer decides; the emulator answers, with its cloud's own status and error body for a
//! throttled request, a server error and an unknown instance (each emulator's README names them).
//! Tests set the knobs through [`crate::cloud::CloudEmulator::set_faults`]; a started emulator
//! takes its first knobs from the environment ([`Faults::from_env`]), so a bench or a manual run
//! can turn them on without code. moto's side has the same knobs in [`crate::moto::Faults`].

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The knobs, all off by default. Environment variables (read by [`Faults::from_env`]):
///
/// | knob | variable |
/// |---|---|
/// | `latency` | `PEERPODS_EMULATOR_LATENCY_MS` |
/// | `hang_rate`, `hang_for` | `PEERPODS_EMULATOR_HANG_RATE`, `PEERPODS_EMULATOR_HANG_SECS` (default 600) |
/// | `server_error_rate` | `PEERPODS_EMULATOR_SERVER_ERROR_RATE` |
/// | `throttle_rate` | `PEERPODS_EMULATOR_THROTTLE_RATE` |
/// | `invisible_after_create` | `PEERPODS_EMULATOR_INVISIBLE_SECS` |
/// | `operation_polls` | `PEERPODS_EMULATOR_OPERATION_POLLS` |
/// | `seed` | `PEERPODS_EMULATOR_SEED` |
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Added to every API request before it is answered.
    pub latency: Duration,
    /// Share of requests (0 to 1) that hang: the answer comes only after `hang_for`, as a 5xx,
    /// long after any sane client deadline.
    pub hang_rate: f64,
    /// How long a hung request is held. Zero means 600 s.
    pub hang_for: Duration,
    /// Share of requests (0 to 1) answered with the cloud's 5xx.
    pub server_error_rate: f64,
    /// Share of requests (0 to 1) answered with the cloud's throttling answer.
    pub throttle_rate: f64,
    /// An instance created less than this long ago is unknown (the cloud's not-found answer) to
    /// every request that names it.
    pub invisible_after_create: Duration,
    /// Long-running operations (a VM's deletion) finish after this many polls or looks; `None`
    /// leaves the emulator's own setting.
    pub operation_polls: Option<u32>,
    /// Seed of the rates' draws, so a run can be repeated.
    pub seed: u64,
}

impl Faults {
    /// The knobs from the environment (see the table on [`Faults`]); unset or unparsable
    /// variables leave a knob off.
    pub fn from_env() -> Self {
        fn var<T: std::str::FromStr>(name: &str) -> Option<T> {
            std::env::var(name).ok()?.trim().parse().ok()
        }
        Faults {
            latency: Duration::from_millis(var("PEERPODS_EMULATOR_LATENCY_MS").unwrap_or(0)),
            hang_rate: var("PEERPODS_EMULATOR_HANG_RATE").unwrap_or(0.0),
            hang_for: Duration::from_secs(var("PEERPODS_EMULATOR_HANG_SECS").unwrap_or(0)),
            server_error_rate: var("PEERPODS_EMULATOR_SERVER_ERROR_RATE").unwrap_or(0.0),
            throttle_rate: var("PEERPODS_EMULATOR_THROTTLE_RATE").unwrap_or(0.0),
            invisible_after_create: Duration::from_secs_f64(
                var("PEERPODS_EMULATOR_INVISIBLE_SECS").unwrap_or(0.0),
            ),
            operation_polls: var("PEERPODS_EMULATOR_OPERATION_POLLS"),
            seed: var("PEERPODS_EMULATOR_SEED").unwrap_or(0),
        }
    }

    /// The mix of the fault storm (`make bench`, its reduced test): 20% server errors, 10%
    /// throttling, 5% hangs of `hang_for`.
    pub fn storm(hang_for: Duration, seed: u64) -> Self {
        Faults {
            server_error_rate: 0.20,
            throttle_rate: 0.10,
            hang_rate: 0.05,
            hang_for,
            seed,
            ..Faults::default()
        }
    }
}

/// What the layer decided for one request (after its latency).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Serve it.
    None,
    /// Answer the cloud's 5xx.
    ServerError,
    /// Answer the cloud's throttling answer.
    Throttled,
    /// Hold it for this long, then answer the cloud's 5xx.
    Hang(Duration),
}

/// How many faults the layer answered since the knobs were last set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub requests: u64,
    pub server_errors: u64,
    pub throttled: u64,
    pub hangs: u64,
    pub not_found: u64,
}

#[derive(Debug, Default)]
struct Inner {
    faults: Faults,
    rng: u64,
    injected: Injected,
    created: HashMap<String, Instant>,
}

/// One emulator's fault layer.
#[derive(Debug)]
pub struct FaultLayer {
    inner: Mutex<Inner>,
}

impl Default for FaultLayer {
    fn default() -> Self {
        Self::new(Faults::default())
    }
}

impl FaultLayer {
    pub fn new(faults: Faults) -> Self {
        let layer = FaultLayer {
            inner: Mutex::new(Inner::default()),
        };
        layer.set(faults);
        layer
    }

    /// A layer with the knobs of the environment ([`Faults::from_env`]).
    pub fn from_env() -> Self {
        Self::new(Faults::from_env())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Replaces the knobs and restarts the count of injected faults (instances already created
    /// keep their creation time).
    pub fn set(&self, faults: Faults) {
        let mut inner = self.lock();
        inner.rng = faults.seed ^ 0x9e37_79b9_7f4a_7c15;
        inner.faults = faults;
        inner.injected = Injected::default();
    }

    pub fn faults(&self) -> Faults {
        self.lock().faults.clone()
    }

    pub fn injected(&self) -> Injected {
        self.lock().injected
    }

    /// Draws the fault of one API request: throttling first, then a server error, then a hang.
    pub fn draw(&self) -> (Duration, Fault) {
        let mut inner = self.lock();
        inner.injected.requests += 1;
        let faults = inner.faults.clone();
        let fault = if next_unit(&mut inner.rng) < faults.throttle_rate {
            inner.injected.throttled += 1;
            Fault::Throttled
        } else if next_unit(&mut inner.rng) < faults.server_error_rate {
            inner.injected.server_errors += 1;
            Fault::ServerError
        } else if next_unit(&mut inner.rng) < faults.hang_rate {
            inner.injected.hangs += 1;
            let hang_for = if faults.hang_for.is_zero() {
                Duration::from_secs(600)
            } else {
                faults.hang_for
            };
            Fault::Hang(hang_for)
        } else {
            Fault::None
        };
        (faults.latency, fault)
    }

    /// [`Self::draw`], waiting out the latency and a hang. What comes back is what to answer:
    /// a hang ends in [`Fault::ServerError`] (the client has given up long before).
    pub async fn before_request(&self) -> Fault {
        let (latency, fault) = self.draw();
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match fault {
            Fault::Hang(hang_for) => {
                tokio::time::sleep(hang_for).await;
                Fault::ServerError
            }
            other => other,
        }
    }

    /// Records that the instance `id` was created now (for `invisible_after_create`).
    pub fn created(&self, id: &str) {
        self.lock().created.insert(id.to_owned(), Instant::now());
    }

    /// Whether a request naming instance `id` is answered "not found" because it was created
    /// less than `invisible_after_create` ago (counted as injected).
    pub fn invisible(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let window = inner.faults.invisible_after_create;
        let hidden = !window.is_zero()
            && inner
                .created
                .get(id)
                .is_some_and(|at| at.elapsed() < window);
        if hidden {
            inner.injected.not_found += 1;
        }
        hidden
    }

    /// The knob for long-running operations, if set.
    pub fn operation_polls(&self) -> Option<u32> {
        self.lock().faults.operation_polls
    }
}

/// A uniform draw in [0, 1) from a splitmix64 sequence: repeatable from the seed, no dependency.
fn next_unit(state: &mut u64) -> f64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_are_drawn_at_about_their_share_and_repeat_with_the_seed() {
        let draws = |seed| {
            let layer = FaultLayer::new(Faults::storm(Duration::from_secs(1), seed));
            let faults: Vec<Fault> = (0..10_000).map(|_| layer.draw().1).collect();
            (faults, layer.injected())
        };
        let (first, injected) = draws(7);
        assert_eq!(first, draws(7).0);
        assert_ne!(first, draws(8).0);
        // 10% throttled; 20% of the other 90% server errors; 5% of the remaining 72% hangs.
        assert!((800..1200).contains(&injected.throttled), "{injected:?}");
        assert!(
            (1600..2000).contains(&injected.server_errors),
            "{injected:?}"
        );
        assert!((250..470).contains(&injected.hangs), "{injected:?}");
        assert_eq!(injected.requests, 10_000);
    }

    #[test]
    fn no_knob_no_fault() {
        let layer = FaultLayer::default();
        assert!((0..1000).all(|_| layer.draw() == (Duration::ZERO, Fault::None)));
        layer.created("vm-1");
        assert!(!layer.invisible("vm-1"));
    }

    #[test]
    fn an_instance_is_invisible_only_during_its_first_seconds() {
        let layer = FaultLayer::new(Faults {
            invisible_after_create: Duration::from_secs(3600),
            ..Faults::default()
        });
        layer.created("new");
        assert!(layer.invisible("new"));
        assert!(!layer.invisible("never-created-here"));
        layer.set(Faults {
            invisible_after_create: Duration::from_nanos(1),
            ..Faults::default()
        });
        std::thread::sleep(Duration::from_millis(2));
        assert!(!layer.invisible("new"));
        assert_eq!(layer.injected().not_found, 0);
    }

    #[tokio::test]
    async fn a_hang_holds_the_request_then_answers_a_server_error() {
        let layer = FaultLayer::new(Faults {
            hang_rate: 1.0,
            hang_for: Duration::from_millis(50),
            ..Faults::default()
        });
        let started = Instant::now();
        assert_eq!(layer.before_request().await, Fault::ServerError);
        assert!(started.elapsed() >= Duration::from_millis(50));
    }
}
