//! How often a PeerPod that keeps failing the same way says so again: its Warning Event repeats at most every
//! [`EVENT_REPEAT`], and a retry failing the way its condition already records writes nothing.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use peerpods_api::peerpod::PeerPod;

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
}
