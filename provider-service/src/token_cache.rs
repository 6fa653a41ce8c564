//! The TokenReview answers [`crate::auth::TokenReviewer`] reuses: keyed by the SHA-256 of the
//! token (the cache never holds a credential), bounded with least-recently-used eviction, and
//! with accepted and refused tokens in separate maps, so a burst of garbage tokens from anyone who
//! reaches the port evicts only other refusals, never a caller that was let in. Concurrent calls
//! with one token that is not cached share one review (single flight).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use sha2::{Digest, Sha256};

/// A token's cache key: its SHA-256.
pub type TokenKey = [u8; 32];

/// The key of `token`.
pub fn key_of(token: &str) -> TokenKey {
    let digest = Sha256::digest(token.as_bytes());
    let mut key = [0u8; 32];
    key.copy_from_slice(&digest);
    key
}

/// A map with a size bound that evicts the least recently used entry, and entries that expire.
/// Small on purpose: a `HashMap` for lookups and a `BTreeMap` from use order to key for eviction.
#[derive(Debug)]
pub struct Lru<V> {
    capacity: usize,
    tick: u64,
    entries: HashMap<TokenKey, (u64, Instant, V)>,
    order: BTreeMap<u64, TokenKey>,
}

impl<V: Clone> Lru<V> {
    pub fn new(capacity: usize) -> Self {
        Lru {
            capacity: capacity.max(1),
            tick: 0,
            entries: HashMap::new(),
            order: BTreeMap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The value of `key` unless expired; a hit counts as a use.
    pub fn get(&mut self, key: &TokenKey, now: Instant) -> Option<V> {
        let (used, expires, value) = self.entries.get_mut(key)?;
        if *expires <= now {
            let used = *used;
            self.entries.remove(key);
            self.order.remove(&used);
            return None;
        }
        self.tick += 1;
        self.order.remove(used);
        *used = self.tick;
        self.order.insert(self.tick, *key);
        Some(value.clone())
    }

    /// Keeps `value` until `expires`, evicting the least recently used entry when full.
    pub fn insert(&mut self, key: TokenKey, expires: Instant, value: V) {
        if let Some((used, _, _)) = self.entries.remove(&key) {
            self.order.remove(&used);
        }
        while self.entries.len() >= self.capacity {
            let Some((_, oldest)) = self.order.pop_first() else {
                break;
            };
            self.entries.remove(&oldest);
        }
        self.tick += 1;
        self.entries.insert(key, (self.tick, expires, value));
        self.order.insert(self.tick, key);
    }
}

/// One review shared by every caller that asks for the same token while it runs.
pub type Flight<T> = Arc<tokio::sync::OnceCell<T>>;

/// The reviews running now, by token key.
#[derive(Debug)]
pub struct InFlight<T> {
    flights: Mutex<HashMap<TokenKey, Flight<T>>>,
}

impl<T> Default for InFlight<T> {
    fn default() -> Self {
        InFlight {
            flights: Mutex::new(HashMap::new()),
        }
    }
}

impl<T> InFlight<T> {
    /// The flight of `key`: the running one, or a new one the caller starts.
    pub fn join(&self, key: TokenKey) -> Flight<T> {
        match self.flights.lock() {
            Ok(mut flights) => flights.entry(key).or_default().clone(),
            // Nothing to share with: a review of its own.
            Err(_) => Flight::default(),
        }
    }

    /// Forgets `flight` once it has landed (a later review of the key starts afresh).
    pub fn land(&self, key: &TokenKey, flight: &Flight<T>) {
        if let Ok(mut flights) = self.flights.lock()
            && flights.get(key).is_some_and(|f| Arc::ptr_eq(f, flight))
        {
            flights.remove(key);
        }
    }

    pub fn len(&self) -> usize {
        self.flights.lock().map(|f| f.len()).unwrap_or(0)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn evicts_the_least_recently_used() {
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut lru = Lru::new(2);
        let (a, b, c) = (key_of("a"), key_of("b"), key_of("c"));
        lru.insert(a, later, 1);
        lru.insert(b, later, 2);
        assert_eq!(lru.get(&a, now), Some(1), "a is now the most recent");
        lru.insert(c, later, 3);
        assert_eq!(lru.get(&b, now), None, "b was the least recently used");
        assert_eq!(lru.get(&a, now), Some(1));
        assert_eq!(lru.get(&c, now), Some(3));
        assert_eq!(lru.len(), 2);
        assert_eq!(lru.get(&a, later), None, "expired");
        assert_eq!(lru.len(), 1);
    }

    #[test]
    fn keys_are_digests_not_tokens() {
        let key = key_of("secret-token");
        assert_eq!(key.len(), 32);
        assert_ne!(&key[..12], b"secret-token");
        assert_eq!(key, key_of("secret-token"));
        assert_ne!(key, key_of("secret-token2"));
    }
}
