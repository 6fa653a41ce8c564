//! Per-object retry policy of both controllers: capped exponential backoff, counted per object.
//!
//! kube's `Controller` calls the error policy once per failed reconcile; [`Failures`] counts those per object
//! (cleared on success or when the object is gone) and [`Backoff::delay`] turns the count into the requeue
//! delay.

use std::collections::HashMap;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;
use std::time::Duration;

/// Exponential from `base`, capped at `cap`; permanent errors wait the full cap so they never loop hot; a
/// server's retry hint is honoured (up to the cap) as the earliest retry. *Full jitter*: the delay is drawn from
/// the whole range up to the exponential value (the draw is `seed`, see [`jitter`]), with a floor of a tenth of
/// `base`, so many objects that failed together (an outage) come back spread over the whole window instead of
/// in step at 1, 2, 4, 8 s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Default for Backoff {
    /// 1 s doubling up to 5 min.
    fn default() -> Self {
        Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(300),
        }
    }
}

impl Backoff {
    /// Delay before the next attempt after `failures` consecutive failures (1 for the first).
    pub fn delay(
        &self,
        failures: u32,
        permanent: bool,
        retry_after: Option<Duration>,
        seed: u64,
    ) -> Duration {
        let exponential = if permanent {
            self.cap
        } else {
            let factor = 2u32.saturating_pow(failures.saturating_sub(1));
            self.base.saturating_mul(factor).min(self.cap)
        };
        let floor = self.base / 10;
        let drawn = exponential
            .mul_f64((seed % 1_000_001) as f64 / 1_000_000.0)
            .max(floor);
        drawn.max(retry_after.unwrap_or_default()).min(self.cap)
    }
}

/// A fresh random draw for [`Backoff::delay`]: from the process's random hash keys and a counter, so no
/// dependency on a random number crate and no two calls alike.
pub fn jitter() -> u64 {
    use std::hash::BuildHasher;
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    std::collections::hash_map::RandomState::new().hash_one(COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A stable hash of an object's identity.
pub fn seed(namespace: &str, name: &str) -> u64 {
    let mut hasher = DefaultHasher::new();
    (namespace, name).hash(&mut hasher);
    hasher.finish()
}

/// Consecutive failures per object. Only plain counters live behind the lock, so a poisoned lock is still
/// used (its counters are consistent enough).
#[derive(Debug)]
pub struct Failures<K> {
    counts: Mutex<HashMap<K, u32>>,
}

impl<K> Default for Failures<K> {
    fn default() -> Self {
        Failures {
            counts: Mutex::new(HashMap::new()),
        }
    }
}

impl<K: Eq + Hash> Failures<K> {
    /// Counts one more failure of `key`; returns the consecutive failures so far (1 for the first).
    pub fn record(&self, key: K) -> u32 {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        let n = counts.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    /// Forgets `key` (it succeeded, or it is gone).
    pub fn forget(&self, key: &K) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(key);
    }

    /// Keeps only the objects `keep` says still exist (after a re-list, whose Delete events were missed).
    pub fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        self.counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|key, _| keep(key));
    }

    /// Objects with at least one failure not yet forgotten.
    pub fn len(&self) -> usize {
        self.counts.lock().map_or(0, |c| c.len())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The draw that gives the whole exponential value.
    const TOP: u64 = 1_000_000;

    #[test]
    fn backoff_grows_and_caps() {
        let b = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        assert_eq!(b.delay(1, false, None, TOP), Duration::from_secs(1));
        assert_eq!(b.delay(2, false, None, TOP), Duration::from_secs(2));
        assert_eq!(b.delay(4, false, None, TOP), Duration::from_secs(8));
        assert_eq!(b.delay(40, false, None, TOP), Duration::from_secs(60));
        assert_eq!(b.delay(u32::MAX, false, None, TOP), Duration::from_secs(60));
    }

    #[test]
    fn permanent_errors_wait_up_to_the_cap_and_hints_are_honoured() {
        let b = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        assert_eq!(b.delay(1, true, None, TOP), Duration::from_secs(60));
        assert_eq!(
            b.delay(1, false, Some(Duration::from_secs(7)), TOP),
            Duration::from_secs(7)
        );
        assert_eq!(
            b.delay(1, false, Some(Duration::from_secs(7)), 0),
            Duration::from_secs(7),
            "a hint is the earliest retry, whatever the draw"
        );
        assert_eq!(
            b.delay(1, false, Some(Duration::from_secs(999)), TOP),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn full_jitter_spreads_over_the_whole_window_above_a_floor() {
        let b = Backoff::default();
        assert_eq!(b.delay(4, false, None, TOP / 2), Duration::from_secs(4));
        assert_eq!(
            b.delay(4, false, None, 0),
            Duration::from_millis(100),
            "never zero: a tenth of the base"
        );
        // 1,000 objects failing together at their 4th attempt: spread over (0, 8 s], not within 10 % of 8 s.
        let delays: Vec<Duration> = (0..1000)
            .map(|_| b.delay(4, false, None, jitter()))
            .collect();
        let early = delays
            .iter()
            .filter(|d| **d < Duration::from_secs(4))
            .count();
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(8)));
        assert!(
            (300..=700).contains(&early),
            "{early} of 1000 in the first half"
        );
    }

    #[test]
    fn seeds_are_stable_and_differ_between_objects() {
        assert_eq!(seed("ns", "a"), seed("ns", "a"));
        assert_ne!(seed("ns", "a"), seed("ns", "b"));
    }

    #[test]
    fn failures_count_per_object_until_forgotten() {
        let f = Failures::default();
        assert_eq!(f.record("a"), 1);
        assert_eq!(f.record("a"), 2);
        assert_eq!(f.record("b"), 1);
        f.forget(&"a");
        assert_eq!(f.record("a"), 1);
        assert_eq!(f.len(), 2);
        f.forget(&"a");
        f.forget(&"b");
        assert!(f.is_empty());
        f.record("gone");
        f.record("listed");
        f.retain(|k| *k == "listed");
        assert_eq!(f.record("listed"), 2);
        assert_eq!(f.record("gone"), 1, "forgotten by the re-list");
    }
}
