//! Caller authentication: the bearer token (a projected ServiceAccount token) is validated with
//! the Kubernetes TokenReview API for our audience, and the ServiceAccount must be in the
//! allow-list. Answers are cached briefly so a cleanup storm costs a handful of reviews.

use std::collections::{BTreeSet, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use kube::api::PostParams;

use crate::Error;
use crate::metrics::{Metrics, ResultLabels};

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
/// Entries kept at most; a flood of distinct bad tokens must not grow memory without bound.
const MAX_CACHE_ENTRIES: usize = 4096;

type Verdict = Result<Caller, Error>;

/// Validates tokens with TokenReview and checks the allow-list.
pub struct TokenReviewer {
    client: kube::Client,
    audience: String,
    allowed: BTreeSet<Caller>,
    // A map with expiry is all this needs for a handful of callers; a caching crate (moka)
    // would bring its own runtime and many dependencies for no gain here.
    cache: Mutex<HashMap<String, (Instant, CachedVerdict)>>,
    metrics: Metrics,
}

#[derive(Clone)]
enum CachedVerdict {
    Allowed(Caller),
    Unauthenticated(String),
    NotAllowed(String),
}

impl TokenReviewer {
    pub fn new(
        client: kube::Client,
        audience: impl Into<String>,
        allowed: impl IntoIterator<Item = Caller>,
        metrics: Metrics,
    ) -> Self {
        TokenReviewer {
            client,
            audience: audience.into(),
            allowed: allowed.into_iter().collect(),
            cache: Mutex::new(HashMap::new()),
            metrics,
        }
    }

    /// The caller behind an `authorization: Bearer <token>` header value.
    pub async fn authenticate(&self, header: Option<&http::HeaderValue>) -> Verdict {
        let token = bearer_token(header)?;
        if let Some(v) = self.cached(token) {
            return v;
        }
        let verdict = self.review(token).await;
        let cached = match &verdict {
            Ok(c) => Some((ALLOW_TTL, CachedVerdict::Allowed(c.clone()))),
            Err(Error::Unauthenticated { message }) => {
                Some((DENY_TTL, CachedVerdict::Unauthenticated(message.clone())))
            }
            Err(Error::CallerNotAllowed { caller }) => {
                Some((DENY_TTL, CachedVerdict::NotAllowed(caller.clone())))
            }
            // The API server did not answer: ask again next time.
            Err(_) => None,
        };
        if let (Some((ttl, v)), Ok(mut cache)) = (cached, self.cache.lock()) {
            if cache.len() >= MAX_CACHE_ENTRIES {
                let now = Instant::now();
                cache.retain(|_, (expires, _)| *expires > now);
                if cache.len() >= MAX_CACHE_ENTRIES {
                    cache.clear();
                }
            }
            cache.insert(token.to_owned(), (Instant::now() + ttl, v));
        }
        verdict
    }

    fn cached(&self, token: &str) -> Option<Verdict> {
        let cache = self.cache.lock().ok()?;
        let (expires, v) = cache.get(token)?;
        if *expires <= Instant::now() {
            return None;
        }
        Some(match v.clone() {
            CachedVerdict::Allowed(c) => Ok(c),
            CachedVerdict::Unauthenticated(message) => Err(Error::Unauthenticated { message }),
            CachedVerdict::NotAllowed(caller) => Err(Error::CallerNotAllowed { caller }),
        })
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
                    message: format!("TokenReview failed: {e}"),
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
        if !self.allowed.contains(&caller) {
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
    let token = value
        .strip_prefix("Bearer ")
        .map(str::trim)
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
                match reviewer
                    .authenticate(request.headers().get(http::header::AUTHORIZATION))
                    .await
                {
                    Ok(caller) => {
                        request.extensions_mut().insert(caller);
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, reason = e.reason(), path = %request.uri().path(), "call rejected");
                        return Ok(crate::grpc::status(&e).into_http());
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

    #[test]
    fn service_account_usernames_only() {
        assert_eq!(
            Caller::from_username("system:serviceaccount:ns:sa").map(|c| c.to_string()),
            Some("ns/sa".to_owned())
        );
        assert_eq!(Caller::from_username("admin"), None);
    }

    #[test]
    fn bearer_header_shapes() {
        let ok = http::HeaderValue::from_static("Bearer abc");
        assert_eq!(bearer_token(Some(&ok)).ok(), Some("abc"));
        for bad in ["abc", "Bearer ", "Basic abc"] {
            let v = http::HeaderValue::from_static(bad);
            assert!(matches!(
                bearer_token(Some(&v)),
                Err(Error::Unauthenticated { .. })
            ));
        }
        assert!(bearer_token(None).is_err());
    }
}
