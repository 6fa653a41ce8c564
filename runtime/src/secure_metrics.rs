//! `/metrics` behind TLS, authentication and authorization, as kubebuilder's
//! `filters.WithAuthenticationAndAuthorization` and cloud-api-adaptor's metrics serve them: a port of its own
//! (TLS only), where a scrape's bearer token must pass a TokenReview and its user a SubjectAccessReview for
//! `get` on the non-resource URL `/metrics`. `/healthz` and `/readyz` stay on the plain admin port for the
//! kubelet's probes, and `/metrics` leaves it ([`crate::admin::AdminServer::with_secure_metrics`]).
//!
//! The reviews are bounded: at most [`MAX_REVIEWS`] in flight (a scrape past them is answered 503 at once,
//! not queued), each with [`REVIEW_TIMEOUT`], and a request without a bearer token costs no review at all.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::api::PostParams;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, pem::PemObject};
use tokio_rustls::rustls::sign::{CertifiedKey, SingleCertAndKey};

use crate::Error;
use crate::tls::TlsPolicy;

/// The path a scrape must be allowed to `get` (the SubjectAccessReview's non-resource URL).
pub const METRICS_PATH: &str = "/metrics";
/// Reviews in flight at most; a scrape past them is answered 503.
pub const MAX_REVIEWS: usize = 16;
/// How long a TokenReview or SubjectAccessReview may take.
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(5);
/// The certificate and key files of `--metrics-cert-dir` (a `kubernetes.io/tls` Secret's keys).
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// What a scrape gets, decided from the reviews' answers ([`verdict`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Allowed,
    /// No bearer token, or one the API server does not authenticate: 401.
    Unauthenticated,
    /// Authenticated, but not allowed to `get` `/metrics`: 403, naming the user.
    Forbidden {
        user: String,
    },
}

impl Verdict {
    pub fn status(&self) -> StatusCode {
        match self {
            Verdict::Allowed => StatusCode::OK,
            Verdict::Unauthenticated => StatusCode::UNAUTHORIZED,
            Verdict::Forbidden { .. } => StatusCode::FORBIDDEN,
        }
    }
}

/// The bearer token of `Authorization: Bearer <token>`, if any (the scheme is case-insensitive, RFC 7235).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, token) = value.split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The user a TokenReview authenticated, or `None`.
pub fn authenticated(
    status: Option<&TokenReviewStatus>,
) -> Option<&k8s_openapi::api::authentication::v1::UserInfo> {
    let status = status?;
    if status.authenticated != Some(true) {
        return None;
    }
    status
        .user
        .as_ref()
        .filter(|u| u.username.as_deref().is_some_and(|n| !n.is_empty()))
}

/// The verdict for a user the TokenReview authenticated, from the SubjectAccessReview's answer.
pub fn verdict(user: &str, access: Option<&SubjectAccessReviewStatus>) -> Verdict {
    match access {
        Some(status) if status.allowed && status.denied != Some(true) => Verdict::Allowed,
        _ => Verdict::Forbidden {
            user: user.to_owned(),
        },
    }
}

/// Why a scrape could not be judged: the API server did not answer in time or failed (503, retried by the
/// next scrape).
#[derive(Debug)]
pub struct ReviewFailed(pub String);

/// Checks scrapes with the API server.
#[derive(Clone)]
pub struct Reviewer {
    client: kube::Client,
    in_flight: Arc<Semaphore>,
}

impl Reviewer {
    pub fn new(client: kube::Client) -> Self {
        Reviewer {
            client,
            in_flight: Arc::new(Semaphore::new(MAX_REVIEWS)),
        }
    }

    /// The verdict for a request with `headers` for `path`.
    pub async fn check(&self, headers: &HeaderMap, path: &str) -> Result<Verdict, ReviewFailed> {
        let Some(token) = bearer_token(headers) else {
            return Ok(Verdict::Unauthenticated);
        };
        let Ok(_permit) = self.in_flight.clone().try_acquire_owned() else {
            return Err(ReviewFailed("too many reviews in flight".into()));
        };
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let reviewed = timed(
            kube::Api::<TokenReview>::all(self.client.clone())
                .create(&PostParams::default(), &review),
            "TokenReview",
        )
        .await?;
        let Some(user) = authenticated(reviewed.status.as_ref()) else {
            return Ok(Verdict::Unauthenticated);
        };
        let name = user.username.clone().unwrap_or_default();
        let access = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(name.clone()),
                groups: user.groups.clone(),
                uid: user.uid.clone(),
                extra: user.extra.clone(),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_owned()),
                    verb: Some("get".to_owned()),
                }),
                resource_attributes: None,
            },
            ..SubjectAccessReview::default()
        };
        let answered = timed(
            kube::Api::<SubjectAccessReview>::all(self.client.clone())
                .create(&PostParams::default(), &access),
            "SubjectAccessReview",
        )
        .await?;
        Ok(verdict(&name, answered.status.as_ref()))
    }
}

async fn timed<T>(
    call: impl Future<Output = Result<T, kube::Error>>,
    what: &str,
) -> Result<T, ReviewFailed> {
    match tokio::time::timeout(REVIEW_TIMEOUT, call).await {
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(e)) => Err(ReviewFailed(format!("{what} failed: {e}"))),
        Err(_) => Err(ReviewFailed(format!(
            "{what} not answered within {REVIEW_TIMEOUT:?}"
        ))),
    }
}

/// The bound metrics port, its TLS configuration and its reviewer, ready for the admin server to serve.
pub struct SecureMetrics {
    pub(crate) listener: TcpListener,
    pub(crate) tls: Arc<rustls::ServerConfig>,
    pub(crate) reviewer: Reviewer,
}

impl SecureMetrics {
    /// Binds `addr` (port 0: a free port) serving the pair in `cert_dir` ([`CERT_FILE`], [`KEY_FILE`]) or, without
    /// one, a self-signed certificate made now (as controller-runtime does: scrapers then skip verification, or
    /// the chart gives a certificate).
    pub async fn bind(
        addr: SocketAddr,
        cert_dir: Option<&Path>,
        client: kube::Client,
    ) -> Result<Self, Error> {
        let key = match cert_dir {
            Some(dir) => certified_key_from(dir)?,
            None => self_signed()?,
        };
        let tls = TlsPolicy::default()
            .server_config(Arc::new(SingleCertAndKey::from(key)), &[b"http/1.1"])?;
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::io(format!("binding the metrics port to {addr}"), e))?;
        Ok(SecureMetrics {
            listener,
            tls,
            reviewer: Reviewer::new(client),
        })
    }

    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        self.listener
            .local_addr()
            .map_err(|e| Error::io("metrics port address", e))
    }
}

fn tls_error(
    message: impl Into<String>,
    source: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    Error::Tls {
        message: message.into(),
        source: Some(Box::new(source)),
    }
}

fn certified_key_from(dir: &Path) -> Result<Arc<CertifiedKey>, Error> {
    let read = |name: &str| {
        let path = dir.join(name);
        std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))
    };
    let (cert, key) = (read(CERT_FILE)?, read(KEY_FILE)?);
    let chain = CertificateDer::pem_slice_iter(&cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| tls_error(CERT_FILE, e))?;
    // Never echo key material: the PEM and rustls errors quote none.
    let key = PrivateKeyDer::from_pem_slice(&key).map_err(|e| tls_error(KEY_FILE, e))?;
    certified(chain, &key)
}

fn certified(
    chain: Vec<CertificateDer<'static>>,
    key: &PrivateKeyDer<'_>,
) -> Result<Arc<CertifiedKey>, Error> {
    if chain.is_empty() {
        return Err(Error::Tls {
            message: format!("{CERT_FILE} holds no certificate"),
            source: None,
        });
    }
    let signing =
        rustls::crypto::ring::sign::any_supported_type(key).map_err(|e| tls_error(KEY_FILE, e))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| tls_error(format!("{CERT_FILE} and {KEY_FILE} do not match"), e))?;
    Ok(Arc::new(certified))
}

/// A certificate for `localhost` signed by its own key, made at start.
fn self_signed() -> Result<Arc<CertifiedKey>, Error> {
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()])
        .map_err(|e| tls_error("making a self-signed certificate", e))?;
    let key =
        PrivateKeyDer::try_from(made.signing_key.serialize_der()).map_err(|e| Error::Tls {
            message: format!("the self-signed certificate's key: {e}"),
            source: None,
        })?;
    certified(vec![made.cert.der().clone()], &key)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn with_authorization(value: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(value).unwrap());
        headers
    }

    #[test]
    fn only_a_non_empty_bearer_token_is_taken() {
        assert_eq!(bearer_token(&with_authorization("Bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&with_authorization("bearer abc")), Some("abc"));
        assert_eq!(bearer_token(&with_authorization("Basic abc")), None);
        assert_eq!(bearer_token(&with_authorization("Bearer ")), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn only_an_explicit_allow_without_a_deny_is_allowed() {
        let status = |allowed, denied| SubjectAccessReviewStatus {
            allowed,
            denied,
            ..SubjectAccessReviewStatus::default()
        };
        assert_eq!(verdict("u", Some(&status(true, None))), Verdict::Allowed);
        assert_eq!(
            verdict("u", Some(&status(true, Some(true)))).status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(
            verdict("u", Some(&status(false, None))).status(),
            StatusCode::FORBIDDEN
        );
        assert_eq!(verdict("u", None).status(), StatusCode::FORBIDDEN);
    }

    #[test]
    fn an_unauthenticated_or_nameless_review_is_no_user() {
        use k8s_openapi::api::authentication::v1::UserInfo;
        let status = |authenticated, name: &str| TokenReviewStatus {
            authenticated: Some(authenticated),
            user: Some(UserInfo {
                username: Some(name.to_owned()),
                ..UserInfo::default()
            }),
            ..TokenReviewStatus::default()
        };
        assert!(authenticated(Some(&status(true, "system:serviceaccount:m:prometheus"))).is_some());
        assert!(authenticated(Some(&status(false, "x"))).is_none());
        assert!(authenticated(Some(&status(true, ""))).is_none());
        assert!(authenticated(None).is_none());
    }

    #[test]
    fn a_self_signed_certificate_is_made() {
        assert!(self_signed().is_ok());
    }
}
