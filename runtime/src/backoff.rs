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
/// server's retry hint is honoured (up to the cap). The `seed` (a hash of the object, see [`seed`]) spreads
/// retries of many objects that failed together by up to 10 %.
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
        let wanted = exponential
            .max(retry_after.unwrap_or_default())
            .min(self.cap);
        let jitter = wanted.mul_f64((seed % 1000) as f64 / 10_000.0);
        wanted + jitter
    }
}

/// A stable hash of an object's identity, used as jitter seed.
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

    #[test]
    fn backoff_grows_and_caps() {
        let b = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        assert_eq!(b.delay(1, false, None, 0), Duration::from_secs(1));
        assert_eq!(b.delay(2, false, None, 0), Duration::from_secs(2));
        assert_eq!(b.delay(4, false, None, 0), Duration::from_secs(8));
        assert_eq!(b.delay(40, false, None, 0), Duration::from_secs(60));
        assert_eq!(b.delay(u32::MAX, false, None, 0), Duration::from_secs(60));
    }

    #[test]
    fn permanent_errors_wait_the_cap_and_hints_are_honoured() {
        let b = Backoff {
            base: Duration::from_secs(1),
            cap: Duration::from_secs(60),
        };
        assert_eq!(b.delay(1, true, None, 0), Duration::from_secs(60));
        assert_eq!(
            b.delay(1, false, Some(Duration::from_secs(7)), 0),
            Duration::from_secs(7)
        );
        assert_eq!(
            b.delay(1, false, Some(Duration::from_secs(999)), 0),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn jitter_adds_at_most_ten_percent() {
        let b = Backoff::default();
        let d = b.delay(3, false, None, 999);
        assert!(
            d >= Duration::from_secs(4) && d <= Duration::from_millis(4400),
            "{d:?}"
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
    }
}
