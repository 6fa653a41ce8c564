//! Caller authentication and authorization: the bearer token (a projected ServiceAccount token)
//! is validated with the Kubernetes TokenReview API for our audience, the ServiceAccount must be
//! in the allow-list, and the method called must be one it is granted ([`Grant`]); a path that
//! names no method is refused before any review. A grant marked `@node` binds its caller to the
//! node its token is bound to (see [`crate::placement`]). Answers are cached briefly so a cleanup
//! storm costs a handful of reviews.

use std::collections::{BTreeMap, BTreeSet};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;

use crate::error::{Error, status};
use crate::load::RateLimitedLog;
use crate::metrics::{Metrics, ResultLabels};
use crate::placement::{NodeBound, Placements, node_of};
use crate::token_cache::{InFlight, Lru, TokenKey, key_of, precheck};

/// An authenticated caller: the ServiceAccount behind the token.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Caller {
    pub namespace: String,
    pub name: String,
}

/// A caller as its token's review found it: the ServiceAccount, and the node the token is bound to
/// (the projected token of a Pod, or of a Node; `None` for a plain ServiceAccount token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    pub caller: Caller,
    pub node: Option<String>,
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

/// The path every method of `peerpods.provider.v1.ProviderService` starts with.
pub const SERVICE_PATH_PREFIX: &str = "/peerpods.provider.v1.ProviderService/";

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
    /// `None` for paths that are no method in this table (refused: see [`Authenticated`]).
    pub fn from_path(path: &str) -> Option<Self> {
        let name = path.strip_prefix(SERVICE_PATH_PREFIX)?;
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
///
/// `namespace/name@node=...` binds the caller to its node (cloud-api-adaptor, which runs on every
/// node under one ServiceAccount): its token must be bound to a node, and it may delete only what is
/// its node's ([`crate::placement`]). `@` cannot occur in a ServiceAccount name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub caller: Caller,
    pub methods: BTreeSet<Method>,
    pub node_bound: bool,
}

/// The suffix of a caller in a grant that binds it to its node.
const NODE_BOUND_SUFFIX: &str = "@node";

/// What the grants of one caller add up to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Granted {
    methods: BTreeSet<Method>,
    node_bound: bool,
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
            node_bound: false,
        }
    }
}

impl std::str::FromStr for Grant {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (caller, methods) = match s.split_once('=') {
            Some((caller, methods)) => (caller, Some(methods)),
            None => (s, None),
        };
        let (caller, node_bound) = match caller.trim().strip_suffix(NODE_BOUND_SUFFIX) {
            Some(caller) => (caller, true),
            None => (caller, false),
        };
        if caller.contains('@') {
            return Err(format!(
                "{s:?}: `@` marks what binds the caller, and only @node is known"
            ));
        }
        let caller = caller.parse::<Caller>()?;
        let Some(methods) = methods else {
            return Ok(Grant {
                node_bound,
                ..Grant::from(caller)
            });
        };
        let mut granted = BTreeSet::from([Method::ListProviders]);
        for method in methods.split('+') {
            granted.insert(method.parse::<Method>()?);
        }
        Ok(Grant {
            caller,
            methods: granted,
            node_bound,
        })
    }
}

impl std::fmt::Display for Grant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let methods: Vec<&str> = self.methods.iter().map(|m| m.as_str()).collect();
        let bound = if self.node_bound {
            NODE_BOUND_SUFFIX
        } else {
            ""
        };
        write!(f, "{}{bound}={}", self.caller, methods.join("+"))
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
/// TokenReviews running at once at most (one per distinct token not cached): a flood of tokens
/// that pass the local pre-check (a real token's payload with a forged signature) costs the API
/// server this many reviews at a time, not one per call. Past it, a new token is answered
/// UNAVAILABLE at once; a cached caller is not affected.
const MAX_REVIEWS_IN_FLIGHT: usize = 64;
/// The longest one TokenReview may take; an API server that does not answer holds no caller longer.
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

type Verdict = Result<Identity, Error>;

/// Validates tokens with TokenReview and checks the allow-list and each caller's methods.
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
    grants: BTreeMap<Caller, Granted>,
    /// Where instances' Pods run, for callers bound to their node; `None` when no grant binds one.
    placements: Option<Arc<Placements>>,
    // Keyed by the token's SHA-256, LRU-bounded, accepted and refused apart (see token_cache);
    // a caching crate (moka) would bring its own runtime and many dependencies for no gain here.
    allowed: Mutex<Lru<CachedVerdict>>,
    refused: Mutex<Lru<CachedVerdict>>,
    /// Reviews running now, one per token, shared by concurrent callers with that token.
    in_flight: InFlight<CachedVerdict>,
    /// A permit per review running, [`MAX_REVIEWS_IN_FLIGHT`] in all.
    review_slots: tokio::sync::Semaphore,
    /// Rejected calls are logged at most once per period, with how many there were.
    rejections: RateLimitedLog,
    metrics: Metrics,
}

#[derive(Clone, Debug)]
enum CachedVerdict {
    Allowed(Identity),
    Unauthenticated(String),
    NotAllowed(String),
    /// A node-bound caller (named) whose token names no node.
    NodeNotBound(String),
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
            Err(Error::NodeNotBound { caller }) => CachedVerdict::NodeNotBound(caller),
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
            CachedVerdict::NodeNotBound(caller) => Err(Error::NodeNotBound { caller }),
            CachedVerdict::Unavailable(message, source) => {
                Err(Error::AuthUnavailable { message, source })
            }
        }
    }
}

impl TokenReviewer {
    /// `grants` are [`Grant`]s, or plain [`Caller`]s granted every method. Two grants of one
    /// caller add up; if either binds it to its node, it is bound (the stricter wins).
    pub fn new<G: Into<Grant>>(
        client: kube::Client,
        audience: impl Into<String>,
        grants: impl IntoIterator<Item = G>,
        metrics: Metrics,
    ) -> Self {
        let mut merged: BTreeMap<Caller, Granted> = BTreeMap::new();
        for grant in grants.into_iter().map(Into::into) {
            let granted = merged.entry(grant.caller).or_default();
            granted.methods.extend(grant.methods);
            granted.node_bound |= grant.node_bound;
        }
        let placements = merged
            .values()
            .any(|g| g.node_bound)
            .then(|| Arc::new(Placements::new(client.clone())));
        TokenReviewer {
            client,
            audience: audience.into(),
            grants: merged,
            placements,
            allowed: Mutex::new(Lru::new(MAX_ALLOWED_ENTRIES)),
            refused: Mutex::new(Lru::new(MAX_REFUSED_ENTRIES)),
            in_flight: InFlight::default(),
            review_slots: tokio::sync::Semaphore::new(MAX_REVIEWS_IN_FLIGHT),
            rejections: RateLimitedLog::new(crate::load::LOG_EVERY),
            metrics,
        }
    }

    /// Whether `caller` (already authenticated and allow-listed) may call `method`.
    pub fn authorize(&self, caller: &Caller, method: Method) -> Result<(), Error> {
        if self
            .grants
            .get(caller)
            .is_some_and(|granted| granted.methods.contains(&method))
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

    /// What a caller bound to its node is held to (see [`crate::placement`]); `None` for a caller
    /// that is not. A node-bound caller without a node is refused (its review refuses it already;
    /// this does not rely on that).
    pub fn node_bound(&self, identity: &Identity) -> Result<Option<NodeBound>, Error> {
        if !self
            .grants
            .get(&identity.caller)
            .is_some_and(|granted| granted.node_bound)
        {
            return Ok(None);
        }
        let refused = || Error::NodeNotBound {
            caller: identity.caller.to_string(),
        };
        let node = identity.node.clone().ok_or_else(refused)?;
        let placements = self.placements.clone().ok_or_else(refused)?;
        Ok(Some(NodeBound {
            caller: identity.caller.to_string(),
            node,
            placements,
        }))
    }

    /// The caller behind an `authorization: Bearer <token>` header value.
    pub async fn authenticate(&self, header: Option<&http::HeaderValue>) -> Verdict {
        let token = bearer_token(header)?;
        // Not cached either way: refusing again costs less than remembering.
        if let Err(why) = precheck(token, &self.audience, SystemTime::now()) {
            self.count("refused_before_review");
            return Err(Error::Unauthenticated {
                message: why.to_string(),
            });
        }
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
                let Ok(_slot) = self.review_slots.try_acquire() else {
                    self.count("too_many_in_flight");
                    return CachedVerdict::Unavailable(
                        format!(
                            "{MAX_REVIEWS_IN_FLIGHT} TokenReviews are in flight already; ask again"
                        ),
                        None,
                    );
                };
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
            CachedVerdict::Unauthenticated(_)
            | CachedVerdict::NotAllowed(_)
            | CachedVerdict::NodeNotBound(_) => (&self.refused, DENY_TTL),
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
        let answer =
            match tokio::time::timeout(REVIEW_TIMEOUT, api.create(&PostParams::default(), &review))
                .await
            {
                Ok(Ok(a)) => a,
                Ok(Err(e)) => {
                    self.count("error");
                    return Err(Error::AuthUnavailable {
                        message: "TokenReview failed".into(),
                        source: Some(std::sync::Arc::new(e)),
                    });
                }
                Err(_) => {
                    self.count("timeout");
                    return Err(Error::AuthUnavailable {
                        message: format!(
                            "TokenReview did not answer within {} s",
                            REVIEW_TIMEOUT.as_secs()
                        ),
                        source: None,
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
        let user = status.user.unwrap_or_default();
        let username = user.username.unwrap_or_default();
        let Some(caller) = Caller::from_username(&username) else {
            self.count("not_allowed");
            return Err(Error::CallerNotAllowed { caller: username });
        };
        let Some(granted) = self.grants.get(&caller) else {
            self.count("not_allowed");
            return Err(Error::CallerNotAllowed {
                caller: caller.to_string(),
            });
        };
        let node = node_of(user.extra.as_ref());
        if granted.node_bound && node.is_none() {
            self.count("node_not_bound");
            return Err(Error::NodeNotBound {
                caller: caller.to_string(),
            });
        }
        self.count("allowed");
        Ok(Identity { caller, node })
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
/// request extensions, and a [`NodeBound`] for a caller bound to its node. A path that names no
/// method of the table is refused (PERMISSION_DENIED, reason UnknownMethod) before its token is
/// reviewed: a method the table does not know has no grant decision. With no reviewer
/// (`--auth=none`) calls pass unchanged.
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
                let verdict = match Method::from_path(request.uri().path()) {
                    None => Err(Error::UnknownMethod {
                        path: shortened(request.uri().path()),
                    }),
                    Some(method) => reviewer
                        .authenticate(request.headers().get(http::header::AUTHORIZATION))
                        .await
                        .and_then(|identity| {
                            reviewer.authorize(&identity.caller, method)?;
                            let bound = reviewer.node_bound(&identity)?;
                            Ok((identity.caller, bound))
                        }),
                };
                match verdict {
                    Ok((caller, bound)) => {
                        if let Some(bound) = bound {
                            request.extensions_mut().insert(bound);
                        }
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

/// The longest part of a refused path repeated in the answer (the path is the caller's input).
const MAX_PATH_SHOWN: usize = 128;

/// `path` cut at [`MAX_PATH_SHOWN`] bytes (on a character boundary), marked when cut.
fn shortened(path: &str) -> String {
    if path.len() <= MAX_PATH_SHOWN {
        return path.to_owned();
    }
    let mut end = MAX_PATH_SHOWN;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &path[..end])
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

    /// The method table is the service's: a method added to the proto without a grant decision here
    /// (and so a place in [`Method::ALL`]) fails this test instead of being refused at run time.
    #[test]
    fn the_method_table_is_the_services_descriptor() {
        use peerpods_proto::v1::provider_service_server::SERVICE_NAME;
        use prost::Message as _;
        let set = prost_types::FileDescriptorSet::decode(peerpods_proto::FILE_DESCRIPTOR_SET)
            .expect("the proto crate's descriptor set decodes");
        let services: Vec<(String, BTreeSet<String>)> = set
            .file
            .iter()
            .flat_map(|file| {
                file.service.iter().map(move |service| {
                    let name = format!("{}.{}", file.package(), service.name());
                    let methods = service.method.iter().map(|m| m.name().to_owned());
                    (name, methods.collect())
                })
            })
            .collect();
        let ours: Vec<&BTreeSet<String>> = services
            .iter()
            .filter(|(name, _)| name == SERVICE_NAME)
            .map(|(_, methods)| methods)
            .collect();
        assert_eq!(ours.len(), 1, "{services:?}");
        let table: BTreeSet<String> = Method::ALL.map(|m| m.as_str().to_owned()).into();
        assert_eq!(
            ours[0], &table,
            "every RPC needs a grant decision in Method"
        );
        assert_eq!(SERVICE_PATH_PREFIX, format!("/{SERVICE_NAME}/"));
        for method in Method::ALL {
            let path = format!("/{SERVICE_NAME}/{method}");
            assert_eq!(Method::from_path(&path), Some(method));
        }
    }

    #[test]
    fn grants_bind_a_caller_to_its_node_with_at_node() {
        let grant: Grant = "peerpods/caa@node=GetCapacity+DeleteInstance"
            .parse()
            .unwrap();
        assert_eq!(grant.caller.to_string(), "peerpods/caa");
        assert!(grant.node_bound);
        assert_eq!(
            grant.to_string(),
            "peerpods/caa@node=DeleteInstance+GetCapacity+ListProviders"
        );
        assert_eq!(grant.to_string().parse::<Grant>(), Ok(grant));
        let bare: Grant = "peerpods/caa@node".parse().unwrap();
        assert!(bare.node_bound && bare.is_unrestricted());
        let plain: Grant = "peerpods/caa=DeleteInstance".parse().unwrap();
        assert!(!plain.node_bound);
        assert!("peerpods/@node=DeleteInstance".parse::<Grant>().is_err());
        let err = "peerpods/caa@nodes=DeleteInstance"
            .parse::<Grant>()
            .unwrap_err();
        assert!(err.contains("only @node"), "{err}");
    }

    #[test]
    fn refused_paths_are_shown_shortened() {
        assert_eq!(shortened("/a/b"), "/a/b");
        let long = format!("/{}", "é".repeat(200));
        let shown = shortened(&long);
        assert!(
            shown.len() <= MAX_PATH_SHOWN + 3 && shown.ends_with("..."),
            "{shown}"
        );
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
