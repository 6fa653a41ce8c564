//! The TokenReview answers [`crate::auth::TokenReviewer`] reuses: keyed by the SHA-256 of the
//! token (the cache never holds a credential), bounded with least-recently-used eviction, and
//! with accepted and refused tokens in separate maps, so a burst of garbage tokens from anyone who
//! reaches the port evicts only other refusals, never a caller that was let in. Concurrent calls
//! with one token that is not cached share one review (single flight).
//!
//! Before any of that, [`precheck`] refuses locally what no review could accept: a token that is
//! not a JWT, or whose payload says it expired or is for another audience. Forging a payload is
//! easy, so this only spares the API server garbage; the review alone lets a token in.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use base64::alphabet::URL_SAFE;
use base64::engine::DecodePaddingMode;
use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use k8s_openapi::serde_json::{self, Value};

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

/// How far past its `exp` a token is still sent for review: the API server's clock, not ours,
/// decides, and the two may differ by this much.
const EXPIRY_LEEWAY: Duration = Duration::from_secs(60);

/// Why a token is refused without a review.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotAToken {
    /// Not three dot-separated base64url segments.
    NotAJwt,
    /// The payload is not a JSON object.
    PayloadNotJson,
    /// No numeric `exp` claim (every projected ServiceAccount token expires).
    NoExpiry,
    /// `exp` is past (by more than the leeway), in seconds since the epoch.
    Expired { exp: u64 },
    /// The `aud` claim does not name this service's audience.
    OtherAudience,
}

impl std::fmt::Display for NotAToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NotAToken::NotAJwt => f.write_str("token is not a JWT (three base64url segments)"),
            NotAToken::PayloadNotJson => f.write_str("token's payload is not a JSON object"),
            NotAToken::NoExpiry => f.write_str("token has no expiry (exp)"),
            NotAToken::Expired { exp } => write!(f, "token expired (exp {exp})"),
            NotAToken::OtherAudience => f.write_str("token is not for this service's audience"),
        }
    }
}

/// Whether `token` may be worth a review for `audience` at `now` (see the module doc).
pub fn precheck(token: &str, audience: &str, now: SystemTime) -> Result<(), NotAToken> {
    let segments: Vec<&str> = token.split('.').collect();
    let [header, payload, signature] = segments.as_slice() else {
        return Err(NotAToken::NotAJwt);
    };
    if [header, signature].iter().any(|s| !is_base64url(s)) {
        return Err(NotAToken::NotAJwt);
    }
    let payload = decode_base64url(payload).ok_or(NotAToken::NotAJwt)?;
    let claims: Value = serde_json::from_slice(&payload).map_err(|_| NotAToken::PayloadNotJson)?;
    let Value::Object(claims) = claims else {
        return Err(NotAToken::PayloadNotJson);
    };
    let exp = claims
        .get("exp")
        .and_then(Value::as_u64)
        .ok_or(NotAToken::NoExpiry)?;
    let now = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs();
    if exp.saturating_add(EXPIRY_LEEWAY.as_secs()) < now {
        return Err(NotAToken::Expired { exp });
    }
    let for_us = match claims.get("aud") {
        Some(Value::String(aud)) => aud == audience,
        Some(Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !for_us {
        return Err(NotAToken::OtherAudience);
    }
    Ok(())
}

fn is_base64url(segment: &str) -> bool {
    !segment.is_empty()
        && segment
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

/// Unpadded base64url (RFC 4648, section 5), as JWT segments are written. Trailing bits are not
/// judged: the pre-check asks only whether a review could accept the token, and the API server
/// verifies the signature over the segments as sent.
pub const JWT_SEGMENT: GeneralPurpose = GeneralPurpose::new(
    &URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::RequireNone)
        .with_decode_allow_trailing_bits(true),
);

/// A JWT segment's bytes; `None` if it is not one (empty, padded, or not base64url).
fn decode_base64url(segment: &str) -> Option<Vec<u8>> {
    if !is_base64url(segment) {
        return None;
    }
    JWT_SEGMENT.decode(segment).ok()
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

    fn jwt(claims: &str) -> String {
        let encode = |bytes: &[u8]| JWT_SEGMENT.encode(bytes);
        format!(
            "{}.{}.{}",
            encode(br#"{"alg":"RS256","kid":"k"}"#),
            encode(claims.as_bytes()),
            encode(b"not a signature")
        )
    }

    #[test]
    fn base64url_decodes_every_length() {
        assert_eq!(decode_base64url("YQ"), Some(b"a".to_vec()));
        assert_eq!(decode_base64url("YWI"), Some(b"ab".to_vec()));
        assert_eq!(decode_base64url("YWJj"), Some(b"abc".to_vec()));
        assert_eq!(decode_base64url("-_8"), Some(vec![0xfb, 0xff]));
        assert_eq!(decode_base64url("YWJjZ"), None, "a lone sextet is no byte");
        assert_eq!(decode_base64url("YW=="), None, "JWT segments are unpadded");
        assert_eq!(decode_base64url(""), None);
    }

    #[test]
    fn only_an_unexpired_jwt_for_our_audience_is_worth_a_review() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let check = |token: &str| precheck(token, "provider-service", now);
        assert_eq!(
            check(&jwt(r#"{"aud":["provider-service"],"exp":1000100}"#)),
            Ok(())
        );
        assert_eq!(
            check(&jwt(r#"{"aud":"provider-service","exp":1000000}"#)),
            Ok(())
        );
        // Within the leeway of clocks that differ.
        assert_eq!(
            check(&jwt(r#"{"aud":"provider-service","exp":999950}"#)),
            Ok(())
        );
        assert_eq!(
            check(&jwt(r#"{"aud":"provider-service","exp":999000}"#)),
            Err(NotAToken::Expired { exp: 999000 })
        );
        assert_eq!(
            check(&jwt(r#"{"aud":["other"],"exp":1000100}"#)),
            Err(NotAToken::OtherAudience)
        );
        assert_eq!(
            check(&jwt(r#"{"exp":1000100}"#)),
            Err(NotAToken::OtherAudience)
        );
        assert_eq!(
            check(&jwt(r#"{"aud":"provider-service"}"#)),
            Err(NotAToken::NoExpiry)
        );
        assert_eq!(
            check(&jwt(r#"{"aud":"provider-service","exp":"soon"}"#)),
            Err(NotAToken::NoExpiry)
        );
        assert_eq!(check(&jwt("[1,2]")), Err(NotAToken::PayloadNotJson));
        assert_eq!(check(&jwt("{not json")), Err(NotAToken::PayloadNotJson));
        for garbage in [
            "garbage", "a.b", "a.b.c.d", "a..c", "a.b!.c", "..", "a.b.c=",
        ] {
            assert_eq!(check(garbage), Err(NotAToken::NotAJwt), "{garbage}");
        }
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
