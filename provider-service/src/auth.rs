//! Caller authentication and authorization: the bearer token (a projected ServiceAccount token)
//! is validated with the Kubernetes TokenReview API for our audience, the ServiceAccount must be
//! in the allow-list, and the method called must be one it is granted ([`Grant`]). Answers are
//! cached briefly so a cleanup storm costs a handful of reviews.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;

use crate::error::{Error, status};
use crate::load::RateLimitedLog;
use crate::metrics::{Metrics, ResultLabels};
use crate::token_cache::{InFlight, Lru, TokenKey, key_of};

/// An authenticated caller: the ServiceAccount behind the token.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Caller {
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl std::str::FromStr for Caller {
    type Err = String;
    /// `namespace/name`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(Caller {
                    namespace: ns.to_owned(),
                    name: name.to_owned(),
                })
            }
            _ => Err(format!("{s:?} is not a ServiceAccount as namespace/name")),
        }
    }
}

/// A method of `peerpods.provider.v1.ProviderService` that a caller can be granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    DeleteInstance,
    GetCapacity,
    ListInstances,
    /// Names and health of the configured providers. Reveals nothing a caller could act on, so
    /// every allow-listed caller may call it.
    ListProviders,
}

impl Method {
    pub const ALL: [Method; 4] = [
        Method::DeleteInstance,
        Method::GetCapacity,
        Method::ListInstances,
        Method::ListProviders,
    ];

    /// The method's name as in the proto (and in the request path).
    pub fn as_str(self) -> &'static str {
        match self {
            Method::DeleteInstance => "DeleteInstance",
            Method::GetCapacity => "GetCapacity",
            Method::ListInstances => "ListInstances",
            Method::ListProviders => "ListProviders",
        }
    }

    /// The method a request path (`/peerpods.provider.v1.ProviderService/<Method>`) calls;
    /// `None` for paths that are no method of ours (tonic answers those with UNIMPLEMENTED).
    pub fn from_path(path: &str) -> Option<Self> {
        let name = path.strip_prefix("/peerpods.provider.v1.ProviderService/")?;
        Method::ALL.into_iter().find(|m| m.as_str() == name)
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Method::ALL
            .into_iter()
            .find(|m| m.as_str() == s.trim())
            .ok_or_else(|| {
                format!(
                    "{s:?} is not a ProviderService method (one of {})",
                    Method::ALL.map(Method::as_str).join(", ")
                )
            })
    }
}

/// What one caller may call: an allow-list entry.
///
/// Written `namespace/name=Method+Method` (e.g.
/// `peerpods/peer-pod-config-ctrl=GetCapacity`). A bare `namespace/name` grants every method, as
/// allow-list entries did before methods could be named; prefer naming them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub caller: Caller,
    pub methods: BTreeSet<Method>,
}

impl Grant {
    /// Whether the grant allows every method.
    pub fn is_unrestricted(&self) -> bool {
        self.methods.len() == Method::ALL.len()
    }
}

impl From<Caller> for Grant {
    /// Every method.
    fn from(caller: Caller) -> Self {
        Grant {
            caller,
            methods: Method::ALL.into_iter().collect(),
        }
    }
}

impl std::str::FromStr for Grant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let Some((caller, methods)) = s.split_once('=') else {
            return s.parse::<Caller>().map(Grant::from);
        };
        let caller = caller.parse::<Caller>()?;
        let mut granted = BTreeSet::from([Method::ListProviders]);
        for method in methods.split('+') {
            granted.insert(method.parse::<Method>()?);
        }
        Ok(Grant {
            caller,
            methods: granted,
        })
    }
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let methods: Vec<&str> = self.methods.iter().map(|m| m.as_str()).collect();
        write!(f, "{}={}", self.caller, methods.join("+"))
    }
}

impl Caller {
    /// The caller from a TokenReview username `system:serviceaccount:<ns>:<name>`.
    fn from_username(username: &str) -> Option<Self> {
        let rest = username.strip_prefix("system:serviceaccount:")?;
        let (namespace, name) = rest.split_once(':')?;
        Some(Caller {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// How long a review answer is reused. Short, so a deleted ServiceAccount loses access quickly.
const ALLOW_TTL: Duration = Duration::from_secs(30);
const DENY_TTL: Duration = Duration::from_secs(5);
/// Tokens longer than this are not sent to the API server.
const MAX_TOKEN_LEN: usize = 16 * 1024;
/// Accepted tokens kept at most (least recently used evicted first): far more callers than a
/// cluster has (CAA on every node, the controllers).
const MAX_ALLOWED_ENTRIES: usize = 16_384;
/// Refused tokens kept at most, apart from the accepted ones: a flood of distinct bad tokens must
/// neither grow memory without bound nor evict a good caller.
const MAX_REFUSED_ENTRIES: usize = 4096;

type Verdict = Result<Caller, Error>;

/// Validates tokens with TokenReview and checks the allow-list and each caller's methods.
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
    grants: BTreeMap<Caller, BTreeSet<Method>>,
    // Keyed by the token's SHA-256, LRU-bounded, accepted and refused apart (see token_cache);
    // a caching crate (moka) would bring its own runtime and many dependencies for no gain here.
    allowed: Mutex<Lru<CachedVerdict>>,
    refused: Mutex<Lru<CachedVerdict>>,
    /// Reviews running now, one per token, shared by concurrent callers with that token.
    in_flight: InFlight<CachedVerdict>,
    /// Rejected calls are logged at most once per period, with how many there were.
    rejections: RateLimitedLog,
    metrics: Metrics,
}

#[derive(Clone, Debug)]
enum CachedVerdict {
    Allowed(Caller),
    Unauthenticated(String),
    NotAllowed(String),
    /// The API server did not answer (what failed, and why); shared by the callers of one review, never
    /// kept.
    Unavailable(String, Option<crate::error::Cause>),
}

impl CachedVerdict {
    fn of(verdict: Verdict) -> Self {
        match verdict {
            Ok(c) => CachedVerdict::Allowed(c),
            Err(Error::Unauthenticated { message }) => CachedVerdict::Unauthenticated(message),
            Err(Error::CallerNotAllowed { caller }) => CachedVerdict::NotAllowed(caller),
            Err(Error::AuthUnavailable { message, source }) => {
                CachedVerdict::Unavailable(message, source)
            }
            Err(other) => {
                CachedVerdict::Unavailable(String::new(), Some(std::sync::Arc::new(other)))
            }
        }
    }

    fn verdict(self) -> Verdict {
        match self {
            CachedVerdict::Allowed(c) => Ok(c),
            CachedVerdict::Unauthenticated(message) => Err(Error::Unauthenticated { message }),
            CachedVerdict::NotAllowed(caller) => Err(Error::CallerNotAllowed { caller }),
            CachedVerdict::Unavailable(message, source) => {
                Err(Error::AuthUnavailable { message, source })
            }
        }
    }
}

impl TokenReviewer {
    /// `grants` are [`Grant`]s, or plain [`Caller`]s granted every method. Two grants of one
    /// caller add up.
    pub fn new<G: Into<Grant>>(
        client: kube::Client,
        audience: impl Into<String>,
        grants: impl IntoIterator<Item = G>,
        metrics: Metrics,
    ) -> Self {
        let mut merged: BTreeMap<Caller, BTreeSet<Method>> = BTreeMap::new();
        for grant in grants.into_iter().map(Into::into) {
            merged
                .entry(grant.caller)
                .or_default()
                .extend(grant.methods);
        }
        TokenReviewer {
            client,
            audience: audience.into(),
            grants: merged,
            allowed: Mutex::new(Lru::new(MAX_ALLOWED_ENTRIES)),
            refused: Mutex::new(Lru::new(MAX_REFUSED_ENTRIES)),
            in_flight: InFlight::default(),
            rejections: RateLimitedLog::new(crate::load::LOG_EVERY),
            metrics,
        }
    }

    /// Whether `caller` (already authenticated and allow-listed) may call `method`.
    pub fn authorize(&self, caller: &Caller, method: Method) -> Result<(), Error> {
        if self
            .grants
            .get(caller)
            .is_some_and(|methods| methods.contains(&method))
        {
            Ok(())
        } else {
            self.count("method_not_allowed");
            Err(Error::MethodNotAllowed {
                caller: caller.to_string(),
                method: method.as_str(),
            })
        }
    }

    /// The caller behind an `authorization: Bearer <token>` header value.
    pub async fn authenticate(&self, header: Option<&http::HeaderValue>) -> Verdict {
        let token = bearer_token(header)?;
        let key = key_of(token);
        if let Some(v) = self.cached(&key) {
            return v.verdict();
        }
        let flight = self.in_flight.join(key);
        let verdict = flight
            .get_or_init(|| async {
                // Another flight may have landed between the lookup and joining this one.
                if let Some(v) = self.cached(&key) {
                    return v;
                }
                let verdict = CachedVerdict::of(self.review(token).await);
                self.keep(key, &verdict);
                verdict
            })
            .await
            .clone();
        self.in_flight.land(&key, &flight);
        verdict.verdict()
    }

    /// Keeps a review's answer: accepted and refused tokens in their own maps; an unanswered
    /// review is not kept (ask again next time).
    fn keep(&self, key: TokenKey, verdict: &CachedVerdict) {
        let (map, ttl) = match verdict {
            CachedVerdict::Allowed(_) => (&self.allowed, ALLOW_TTL),
            CachedVerdict::Unauthenticated(_) | CachedVerdict::NotAllowed(_) => {
                (&self.refused, DENY_TTL)
            }
            CachedVerdict::Unavailable(..) => return,
        };
        if let Ok(mut map) = map.lock() {
            map.insert(key, Instant::now() + ttl, verdict.clone());
        }
    }

    fn cached(&self, key: &TokenKey) -> Option<CachedVerdict> {
        let now = Instant::now();
        for map in [&self.allowed, &self.refused] {
            if let Some(v) = map.lock().ok().and_then(|mut m| m.get(key, now)) {
                return Some(v);
            }
        }
        None
    }

    /// Reviews running now (for tests and figures).
    pub fn reviews_in_flight(&self) -> usize {
        self.in_flight.len()
    }

    async fn review(&self, token: &str) -> Verdict {
        let api: kube::Api<TokenReview> = kube::Api::all(self.client.clone());
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: Some(vec![self.audience.clone()]),
            },
            ..Default::default()
        };
        let answer = match api.create(&PostParams::default(), &review).await {
            Ok(a) => a,
            Err(e) => {
                self.count("error");
                return Err(Error::AuthUnavailable {
                    message: "TokenReview failed".into(),
                    source: Some(std::sync::Arc::new(e)),
                });
            }
        };
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            self.count("unauthenticated");
            // The API server's reason (expired, wrong audience, ...) never contains the token.
            return Err(Error::Unauthenticated {
                message: status
                    .error
                    .unwrap_or_else(|| "token not accepted".to_owned()),
            });
        }
        // Belt and braces: the API server must have confirmed our audience.
        if !status
            .audiences
            .as_ref()
            .is_some_and(|a| a.iter().any(|a| a == &self.audience))
        {
            self.count("unauthenticated");
            return Err(Error::Unauthenticated {
                message: format!("token is not for audience {:?}", self.audience),
            });
        }
        let username = status.user.and_then(|u| u.username).unwrap_or_default();
        let Some(caller) = Caller::from_username(&username) else {
            self.count("not_allowed");
            return Err(Error::CallerNotAllowed { caller: username });
        };
        if !self.grants.contains_key(&caller) {
            self.count("not_allowed");
            return Err(Error::CallerNotAllowed {
                caller: caller.to_string(),
            });
        }
        self.count("allowed");
        Ok(caller)
    }

    fn count(&self, result: &'static str) {
        self.metrics
            .auth_reviews
            .get_or_create(&ResultLabels { result })
            .inc();
    }
}

fn bearer_token(header: Option<&http::HeaderValue>) -> Result<&str, Error> {
    let Some(value) = header else {
        return Err(Error::Unauthenticated {
            message: "no authorization metadata (expected a Bearer ServiceAccount token)".into(),
        });
    };
    let value = value.to_str().map_err(|_| Error::Unauthenticated {
        message: "authorization metadata is not ASCII".into(),
    })?;
    // The scheme is case-insensitive (RFC 9110, section 11.1); the token is not.
    let token = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::Unauthenticated {
            message: "authorization metadata is not `Bearer <token>`".into(),
        })?;
    if token.len() > MAX_TOKEN_LEN {
        return Err(Error::Unauthenticated {
            message: format!("token is longer than {MAX_TOKEN_LEN} bytes"),
        });
    }
    Ok(token)
}

/// Wraps a gRPC service so every call is authenticated first; the [`Caller`] is put into the
/// request extensions. With no reviewer (`--auth=none`) calls pass unchanged.
#[derive(Clone)]
pub struct Authenticated<S> {
    inner: S,
    reviewer: Option<Arc<TokenReviewer>>,
}

impl<S> Authenticated<S> {
    pub fn new(inner: S, reviewer: Option<Arc<TokenReviewer>>) -> Self {
        Authenticated { inner, reviewer }
    }
}

impl<S, B> tower::Service<http::Request<B>> for Authenticated<S>
where
    S: tower::Service<
            http::Request<B>,
            Response = http::Response<tonic::body::Body>,
            Error = Infallible,
        > + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
    B: Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<B>) -> Self::Future {
        // The clone is the one that is ready (tower's usual swap).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let reviewer = self.reviewer.clone();
        Box::pin(async move {
            if let Some(reviewer) = reviewer {
                let verdict = reviewer
                    .authenticate(request.headers().get(http::header::AUTHORIZATION))
                    .await
                    .and_then(|caller| {
                        // Paths that are no method of ours go on to tonic, which answers
                        // UNIMPLEMENTED; they reach no provider.
                        match Method::from_path(request.uri().path()) {
                            Some(method) => reviewer.authorize(&caller, method).map(|()| caller),
                            None => Ok(caller),
                        }
                    });
                match verdict {
                    Ok(caller) => {
                        request.extensions_mut().insert(caller);
                    }
                    Err(e) => {
                        // Anyone who reaches the port can send garbage: a line per period.
                        if let Some(rejected) = reviewer.rejections.admit() {
                            tracing::warn!(error = %e, reason = e.reason(), path = %request.uri().path(), rejected, "call rejected; rejections are logged at most every 10 s");
                        }
                        return Ok(status(&e).into_http());
                    }
                }
            }
            inner.call(request).await
        })
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Authenticated<S> {
    const NAME: &'static str = S::NAME;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allow_list_entries_parse() {
        assert_eq!(
            "peerpods/peerpod-ctrl".parse::<Caller>(),
            Ok(Caller {
                namespace: "peerpods".into(),
                name: "peerpod-ctrl".into()
            })
        );
        assert!("peerpod-ctrl".parse::<Caller>().is_err());
        assert!("a/b/c".parse::<Caller>().is_err());
        assert!("/b".parse::<Caller>().is_err());
    }

    /// One review's failure answers every caller waiting on it: each gets the same text and the cause.
    #[test]
    fn an_unanswered_review_keeps_its_cause_for_every_caller() {
        use std::error::Error as _;
        let failed: Verdict = Err(Error::AuthUnavailable {
            message: "TokenReview failed".into(),
            source: Some(std::sync::Arc::new(std::io::Error::other(
                "connection refused",
            ))),
        });
        let shared = CachedVerdict::of(failed);
        for verdict in [shared.clone().verdict(), shared.verdict()] {
            let Err(e) = verdict else {
                panic!("an unanswered review allows nobody");
            };
            assert_eq!(
                e.to_string(),
                "cannot verify the caller's token now: TokenReview failed: connection refused"
            );
            assert_eq!(
                e.source().map(ToString::to_string).as_deref(),
                Some("connection refused")
            );
        }
    }

    #[test]
    fn service_account_usernames_only() {
        assert_eq!(
            Caller::from_username("system:serviceaccount:ns:sa").map(|c| c.to_string()),
            Some("ns/sa".to_owned())
        );
        assert_eq!(Caller::from_username("admin"), None);
    }

    #[test]
    fn grants_parse_with_and_without_methods() {
        let grant: Grant = "peerpods/caa=GetCapacity+DeleteInstance".parse().unwrap();
        assert_eq!(grant.caller.to_string(), "peerpods/caa");
        assert_eq!(
            grant.methods,
            BTreeSet::from([
                Method::DeleteInstance,
                Method::GetCapacity,
                Method::ListProviders
            ])
        );
        assert_eq!(
            grant.to_string(),
            "peerpods/caa=DeleteInstance+GetCapacity+ListProviders"
        );
        let bare: Grant = "peerpods/tools".parse().unwrap();
        assert_eq!(bare.methods.len(), Method::ALL.len());
        let err = "peerpods/caa=Delete".parse::<Grant>().unwrap_err();
        assert!(
            err.contains("\"Delete\" is not a ProviderService method"),
            "{err}"
        );
        assert!("caa=GetCapacity".parse::<Grant>().is_err());
    }

    #[test]
    fn methods_come_from_our_service_paths_only() {
        assert_eq!(
            Method::from_path("/peerpods.provider.v1.ProviderService/DeleteInstance"),
            Some(Method::DeleteInstance)
        );
        assert_eq!(
            Method::from_path("/peerpods.provider.v1.ProviderService/Nope"),
            None
        );
        assert_eq!(Method::from_path("/other.Service/DeleteInstance"), None);
    }

    #[test]
    fn bearer_header_shapes() {
        for ok in ["Bearer abc", "bearer abc", "BEARER abc", "bEaReR  abc "] {
            let ok = http::HeaderValue::from_static(ok);
            assert_eq!(bearer_token(Some(&ok)).ok(), Some("abc"));
        }
        for bad in ["abc", "Bearer ", "Basic abc", "Bearerabc"] {
            let v = http::HeaderValue::from_static(bad);
            assert!(matches!(
                bearer_token(Some(&v)),
                Err(Error::Unauthenticated { .. })
            ));
        }
        assert!(bearer_token(None).is_err());
    }
}
