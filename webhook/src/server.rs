//! The one way to start the webhook: the serving certificate (read, then polled), the HTTPS port with
//! `/mutate-v1-pod`, and the health port (`/healthz`, `/readyz`, and `/metrics` unless secure metrics move it to a
//! TLS port of its own behind TokenReview and SubjectAccessReview), wired once. `main.rs` turns flags into
//! [`Options`] and calls [`run`]; tests call [`start`] and keep the [`Running`] handle for its addresses.
//!
//! What anyone who reaches the HTTPS port can hold is bounded per peer address, so a flood from one address
//! leaves room for the API server: established connections ([`WEBHOOK_CONNECTIONS_PER_PEER`], in all
//! [`WEBHOOK_CONNECTIONS`]; one past a cap is closed at once) and the admission budget
//! ([`ADMISSION_PEER_SHARE_BYTES`] of [`ADMISSION_BUDGET_BYTES`]).

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{ConnectInfo, DefaultBodyLimit, FromRequest, Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::core::DynamicObject;
use kube::core::admission::AdmissionReview;
use peerpods_runtime::admin::{AdminServer, Readiness};
use peerpods_runtime::secure_metrics::SecureMetrics;
use peerpods_runtime::shutdown::CancellationToken;
use peerpods_runtime::tls::{ConnectionCap, ConnectionLimits, OpenConnections};
use prometheus_client::registry::Registry;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::Error;
use crate::admission;
use crate::listen::ListenAddr;
use crate::metrics::Metrics;
use crate::mutation::Target;
use crate::tls::{ServingCert, TlsListener, TlsPolicy, TlsVersion};

/// Path the API server posts AdmissionReviews to.
pub use peerpods_api::keys::WEBHOOK_PATH;
/// Where the serving certificate Secret is mounted (controller-runtime's default, which the Deployment uses).
pub const DEFAULT_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
/// How often the certificate files are checked for changes (and, before the first pair, for appearing).
pub const CERT_POLL_INTERVAL: Duration = Duration::from_secs(5);
/// Readiness component that is ready once a serving certificate is loaded.
pub const READINESS_CERTIFICATE: &str = "certificate";
/// Largest AdmissionReview read, as controller-runtime's webhook server: a Pod and its old version fit well.
pub const MAX_REVIEW_BYTES: usize = 7 * 1024 * 1024;
/// Request bytes being read and decided at once, over all connections. Each admission takes its body's size
/// (its `Content-Length`, at least [`ADMISSION_MIN_SHARE`]) from this budget before its body is read, and gives
/// it back once its answer is encoded, so the memory admissions take together follows this budget (a decision
/// takes a small multiple of its body: see `tests/it/memory.rs`), whatever the number or size of requests. One
/// largest review fits with room for small ones beside it.
pub const ADMISSION_BUDGET_BYTES: usize = 12 * 1024 * 1024;
/// The least share of the budget an admission takes: it also bounds how many are decided at once (192).
pub const ADMISSION_MIN_SHARE: usize = 64 * 1024;
/// The most of the budget the admissions of one peer address hold at once: a quarter. The API server calls from
/// one address per replica (an HA control plane has three), so a flood from any one address, the API server's
/// own included, leaves three quarters of the budget to the others, where a shared budget let about 192 slow
/// connections from one client refuse every peer pod. A single admission larger than the share (up to
/// [`MAX_REVIEW_BYTES`]) still fits when its peer holds nothing else ([`peer_share_kib`]), so one largest review
/// is decided as before and one address never holds more than that. 48 admissions of the least share at once
/// from one address is well above what an API server sends a webhook in a burst of pod creations; one past it
/// waits for its peer's share, then is shed (HTTP 429, which the API server retries).
pub const ADMISSION_PEER_SHARE_BYTES: usize = ADMISSION_BUDGET_BYTES / 4;
/// Established connections to the HTTPS port from one peer address at most. The API server's webhook client
/// opens a connection per admission in flight (HTTP/1.1) and keeps some idle: this is well above the admissions
/// one address may have decided at once (48 of the least share, see [`ADMISSION_PEER_SHARE_BYTES`]) plus those
/// waiting for a share.
pub const WEBHOOK_CONNECTIONS_PER_PEER: usize = 128;
/// Established connections to the HTTPS port at most (as many as TLS handshakes in progress): each holds a TLS
/// session and HTTP/1.1 buffers, tens of KiB, so this bounds them to tens of MiB.
pub const WEBHOOK_CONNECTIONS: usize = 1024;
/// How long a request waits for its share before it is shed. Well within the API server's webhook timeout (10 s
/// unless the configuration says otherwise), so the answer is the webhook's refusal, not the API server's
/// time-out.
pub const ADMISSION_WAIT: Duration = Duration::from_secs(5);
/// How long reading a body may take once its share is held: a client sending slowly must not keep budget.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// `Retry-After` of a shed request, in seconds.
const SHED_RETRY_AFTER_SECS: u64 = 1;

/// Everything the webhook needs to run.
pub struct Options {
    /// The HTTPS port the API server calls.
    pub webhook: ListenAddr,
    /// `/healthz`, `/readyz` and (without [`Options::secure_metrics`]) `/metrics` over plain HTTP;
    /// [`ListenAddr::Off`] runs without them, secure metrics included.
    pub health: ListenAddr,
    /// `/metrics` on a TLS port of its own, to callers the API server authenticates and allows to `get`
    /// `/metrics` (`--metrics-secure`); `None` keeps it on the health port.
    pub secure_metrics: Option<SecureMetrics>,
    /// Directory with `tls.crt` and `tls.key`.
    pub cert_dir: PathBuf,
    pub cert_poll_interval: Duration,
    pub tls_min_version: TlsVersion,
    /// TLS 1.2 cipher suites allowed, by Go's names (upstream's `TLS_CIPHER_SUITES`); empty allows every one.
    pub tls_cipher_suites: Vec<String>,
    /// Which pods are peer pods and what they request instead.
    pub target: Target,
    /// How much admission work is taken on at once.
    pub admission: AdmissionLimits,
}

/// How much admission work the webhook takes on at once, and how long a request may wait for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AdmissionLimits {
    /// Request bytes read and decided at once ([`ADMISSION_BUDGET_BYTES`]).
    pub budget_bytes: usize,
    /// Of those, the most the admissions of one peer address hold ([`ADMISSION_PEER_SHARE_BYTES`]).
    pub peer_share_bytes: usize,
    /// How long a request waits for its share before it is shed ([`ADMISSION_WAIT`]).
    pub wait: Duration,
    /// How long reading a body may take once its share is held ([`BODY_READ_TIMEOUT`]).
    pub body_read_timeout: Duration,
    /// Established connections per peer address and in all ([`WEBHOOK_CONNECTIONS_PER_PEER`],
    /// [`WEBHOOK_CONNECTIONS`]).
    pub connections: ConnectionLimits,
}

impl Default for AdmissionLimits {
    fn default() -> Self {
        AdmissionLimits {
            budget_bytes: ADMISSION_BUDGET_BYTES,
            peer_share_bytes: ADMISSION_PEER_SHARE_BYTES,
            wait: ADMISSION_WAIT,
            body_read_timeout: BODY_READ_TIMEOUT,
            connections: ConnectionLimits {
                per_peer: WEBHOOK_CONNECTIONS_PER_PEER,
                total: WEBHOOK_CONNECTIONS,
            },
        }
    }
}

/// A started webhook.
pub struct Running {
    pub webhook_addr: SocketAddr,
    pub health_addr: Option<SocketAddr>,
    /// The secure metrics port, with [`Options::secure_metrics`] (and a health port).
    pub metrics_addr: Option<SocketAddr>,
    pub readiness: Readiness,
    pub metrics: Metrics,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Running {
    /// Waits until the webhook has stopped (after the shutdown token is cancelled, or a server failed).
    pub async fn wait(self) -> Result<(), Error> {
        self.task
            .await
            .map_err(|e| Error::io("webhook task", std::io::Error::other(e)))?
    }
}

/// Runs until `shutdown` is cancelled.
pub async fn run(options: Options, shutdown: CancellationToken) -> Result<(), Error> {
    start(options, shutdown).await?.wait().await
}

/// Binds both ports and starts serving; fails (before serving) when a port cannot be bound. A missing
/// certificate is not a failure: the webhook waits for it, not ready, as the Secret may be created later.
pub async fn start(options: Options, shutdown: CancellationToken) -> Result<Running, Error> {
    let mut registry = Registry::default();
    let metrics = Metrics::register(&mut registry);
    let connections = OpenConnections::new(options.admission.connections);
    Metrics::register_connections(&mut registry, &connections);
    let readiness = Readiness::default();

    let mut certificate =
        CertificateWatch::new(ServingCert::in_dir(&options.cert_dir), readiness.clone());
    certificate.check();
    let (policy, left_out) = TlsPolicy::new(options.tls_min_version, &options.tls_cipher_suites)?;
    if !left_out.is_empty() {
        tracing::warn!(
            suites = %left_out.join(","),
            "TLS_CIPHER_SUITES names cipher suites this webhook does not implement; they are left out"
        );
    }
    let tls = certificate.cert.server_config(&policy)?;

    let health = options.health.bind("health probe").await?.map(|listener| {
        AdminServer::on(listener, readiness.clone(), Arc::new(registry))
            .with_secure_metrics(options.secure_metrics)
    });
    let health_addr = health.as_ref().map(AdminServer::local_addr).transpose()?;
    let metrics_addr = match &health {
        Some(health) => health.metrics_addr()?,
        None => None,
    };
    let webhook = options
        .webhook
        .bind("webhook")
        .await?
        .ok_or_else(|| Error::ListenAddress {
            address: options.webhook.to_string(),
            problem: "the webhook port cannot be turned off",
        })?;
    let listener = TlsListener::with_caps(webhook, tls, connections, "webhook")
        .map_err(|e| Error::io("webhook listener address", e))?;
    let webhook_addr = axum::serve::Listener::local_addr(&listener)
        .map_err(|e| Error::io("webhook listener address", e))?;
    let app = Router::new()
        .route(WEBHOOK_PATH, post(mutate))
        .layer(DefaultBodyLimit::max(MAX_REVIEW_BYTES))
        .with_state(AppState {
            target: Arc::new(options.target.clone()),
            metrics: metrics.clone(),
            budget: Arc::new(Budget::new(&options.admission)),
            limits: options.admission,
        });
    tracing::info!(
        webhook = %webhook_addr,
        health = %health_addr.map_or_else(|| "off".to_owned(), |a| a.to_string()),
        runtime_class = %options.target.runtime_class,
        extended_resource = %options.target.extended_resource,
        "serving the peer-pods webhook"
    );

    // A child token: a server that fails stops the others without cancelling the caller's token.
    let stop = shutdown.child_token();
    let interval = options.cert_poll_interval.max(Duration::from_millis(10));
    let task = tokio::spawn(async move {
        let health = health.map(|h| tokio::spawn(h.serve(stop.clone().cancelled_owned())));
        let polling = tokio::spawn(certificate.poll(interval, stop.clone()));
        let served = axum::serve(listener, app.into_make_service_with_connect_info::<Peer>())
            .with_graceful_shutdown(stop.clone().cancelled_owned())
            .await
            .map_err(|e| Error::io("webhook server", e));
        stop.cancel();
        let _ = polling.await;
        let health = match health {
            Some(task) => task
                .await
                .map_err(|e| Error::io("health server task", std::io::Error::other(e)))
                .and_then(|served| served.map_err(Error::from)),
            None => Ok(()),
        };
        served.and(health)
    });
    Ok(Running {
        webhook_addr,
        health_addr,
        metrics_addr,
        readiness,
        metrics,
        task,
    })
}

/// The address of the connection an admission came over: its share of the budget is its peer's.
#[derive(Debug, Clone, Copy)]
struct Peer(SocketAddr);

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        Peer(*stream.remote_addr())
    }
}

#[derive(Clone)]
struct AppState {
    target: Arc<Target>,
    metrics: Metrics,
    budget: Arc<Budget>,
    limits: AdmissionLimits,
}

/// The admission budget, in KiB permits: [`AdmissionLimits::budget_bytes`] in all, and of it
/// [`AdmissionLimits::peer_share_bytes`] per peer address. Both are fair (first come, first served) semaphores:
/// an admission waits for its peer's share first, then for the budget, so one that waits behind its own peer's
/// flood never holds up another peer's.
struct Budget {
    total: Arc<Semaphore>,
    peer_kib: u32,
    /// The peers with an admission holding or waiting for a share; an idle peer's entry is removed.
    peers: Mutex<HashMap<IpAddr, Arc<Semaphore>>>,
}

/// A share of the budget, given back (to its peer's and the total) when dropped.
struct Share {
    budget: Arc<Budget>,
    peer: IpAddr,
    of_peer: Option<OwnedSemaphorePermit>,
    _of_total: OwnedSemaphorePermit,
}

impl Drop for Share {
    fn drop(&mut self) {
        drop(self.of_peer.take());
        self.budget.forget_if_idle(self.peer);
    }
}

impl Budget {
    fn new(limits: &AdmissionLimits) -> Self {
        Budget {
            total: Arc::new(Semaphore::new(limits.budget_bytes / 1024)),
            peer_kib: kib(limits.peer_share_bytes).max(1),
            peers: Mutex::default(),
        }
    }

    fn peers(&self) -> std::sync::MutexGuard<'_, HashMap<IpAddr, Arc<Semaphore>>> {
        // Only the map of semaphores is behind the lock; a panic elsewhere cannot leave it torn.
        self.peers.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `share` KiB for an admission from `peer`, waiting at most `wait` in all; or the cap that was full.
    async fn take(
        self: &Arc<Self>,
        peer: IpAddr,
        share: u32,
        wait: Duration,
    ) -> Result<Share, ConnectionCap> {
        let deadline = tokio::time::Instant::now() + wait;
        let of_peer = self
            .peers()
            .entry(peer)
            .or_insert_with(|| Arc::new(Semaphore::new(self.peer_kib as usize)))
            .clone();
        let of_peer = tokio::time::timeout_at(
            deadline,
            of_peer.acquire_many_owned(peer_share_kib(share, self.peer_kib)),
        )
        .await;
        // Timed out; or closed, which never happens: the semaphores are never closed.
        let Ok(Ok(of_peer)) = of_peer else {
            self.forget_if_idle(peer);
            return Err(ConnectionCap::PerPeer);
        };
        let of_total =
            tokio::time::timeout_at(deadline, self.total.clone().acquire_many_owned(share)).await;
        let Ok(Ok(of_total)) = of_total else {
            drop(of_peer);
            self.forget_if_idle(peer);
            return Err(ConnectionCap::Total);
        };
        Ok(Share {
            budget: self.clone(),
            peer,
            of_peer: Some(of_peer),
            _of_total: of_total,
        })
    }

    /// Removes `peer`'s semaphore when no admission holds or waits for it (each holds a clone).
    fn forget_if_idle(&self, peer: IpAddr) {
        let mut peers = self.peers();
        if peers.get(&peer).is_some_and(|s| Arc::strong_count(s) == 1) {
            peers.remove(&peer);
        }
    }
}

/// Every decided answer is an AdmissionReview, a body that cannot be read (larger than [`MAX_REVIEW_BYTES`],
/// cut off) included: the API server then reports the reason instead of an HTTP status.
///
/// A request that finds no room in the budget within [`AdmissionLimits::wait`] is shed, before its body
/// is read, with HTTP 429 and `Retry-After`: the API server's client retries that within the webhook's timeout,
/// and otherwise, the configuration's `failurePolicy: Fail` refuses the Pod with the reason, which its creator
/// retries. Allowing it instead would let a peer pod through unmutated (asking the node for its full size), and
/// an AdmissionReview refusal would need the request's uid, that is reading the body the budget is there to
/// bound.
async fn mutate(
    State(state): State<AppState>,
    ConnectInfo(Peer(peer)): ConnectInfo<Peer>,
    request: Request,
) -> Response {
    let declared = request
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    // Larger than the limit: refused by the body's extractor without being read, so it needs no share.
    let _share = match declared {
        Some(length) if length > MAX_REVIEW_BYTES => None,
        _ => match state
            .budget
            .take(peer.ip(), share_kib(declared), state.limits.wait)
            .await
        {
            Ok(share) => Some(share),
            Err(cap) => {
                // Counted when decided, answered once the body is read.
                let answer = shed(&state.metrics, &state.limits, peer.ip(), cap);
                drain(request.into_body(), state.limits.body_read_timeout).await;
                return answer;
            }
        },
    };
    let body = match tokio::time::timeout(
        state.limits.body_read_timeout,
        Bytes::from_request(request, &state),
    )
    .await
    {
        Ok(body) => body,
        Err(_) => {
            let error = Error::malformed(format!(
                "the request body: not read within {} s",
                state.limits.body_read_timeout.as_secs()
            ));
            let (outcome, review) = admission::unreadable(&error, 408);
            state.metrics.count(outcome);
            return axum::Json(review).into_response();
        }
    };
    let (outcome, review) = match body {
        Ok(body) => admission::review(&body, &state.target),
        Err(rejection) => {
            let status = rejection.status().as_u16();
            // A rejection's text is its body text, so the message reads as it always has.
            let error = Error::malformed_from("the request body", rejection);
            admission::unreadable(&error, status)
        }
    };
    state.metrics.count(outcome);
    // Encoded while the share is held: the answer (a patch per container) is part of what the share bounds.
    axum::Json::<AdmissionReview<DynamicObject>>(review).into_response()
}

/// Reads `body` to its end (at most [`MAX_REVIEW_BYTES`], `within` the body read timeout) keeping nothing: a shed
/// request's answer then reaches its client, which may still be writing the body, instead of a reset connection.
async fn drain(mut body: axum::body::Body, within: Duration) {
    use axum::body::HttpBody;
    let read = async {
        let mut read = 0usize;
        while read <= MAX_REVIEW_BYTES {
            match std::future::poll_fn(|cx| std::pin::Pin::new(&mut body).poll_frame(cx)).await {
                Some(Ok(frame)) => read += frame.data_ref().map_or(0, Bytes::len),
                Some(Err(_)) | None => return,
            }
        }
    };
    let _ = tokio::time::timeout(within, read).await;
}

/// The budget share of a request of `declared` bytes, in KiB: unknown (chunked) counts as the largest.
fn share_kib(declared: Option<usize>) -> u32 {
    kib(declared
        .unwrap_or(MAX_REVIEW_BYTES)
        .clamp(ADMISSION_MIN_SHARE, MAX_REVIEW_BYTES))
}

/// What an admission of `share` KiB takes from its peer's share of `peer_kib`: all of it at most, so one larger
/// than a peer's share is decided when its peer holds nothing else, and a peer never holds more of the budget
/// than its share or one admission.
pub fn peer_share_kib(share: u32, peer_kib: u32) -> u32 {
    share.min(peer_kib)
}

fn kib(bytes: usize) -> u32 {
    u32::try_from(bytes.div_ceil(1024)).unwrap_or(u32::MAX)
}

/// HTTP 429 with `Retry-After` and a Kubernetes Status saying why.
fn shed(metrics: &Metrics, limits: &AdmissionLimits, peer: IpAddr, cap: ConnectionCap) -> Response {
    metrics.count(admission::Outcome::Shed);
    metrics.count_shed(cap);
    // Not a warning per request: a burst sheds hundreds, and the metrics (the `shed` outcome, and
    // `admissions_shed` by cap) count them.
    tracing::debug!(
        %peer,
        cap = cap.as_str(),
        budget_bytes = limits.budget_bytes,
        peer_share_bytes = limits.peer_share_bytes,
        wait_ms = limits.wait.as_millis(),
        "shed an admission request: the webhook is deciding as many as it may at once{}",
        match cap {
            ConnectionCap::PerPeer => " for this peer address",
            ConnectionCap::Total => "",
        }
    );
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "status": "Failure",
        "reason": "TooManyRequests",
        "code": 429,
        "message": format!(
            "the peer-pods webhook is deciding as many admissions as it may at once; retry in {SHED_RETRY_AFTER_SECS} s"
        ),
        "details": {"retryAfterSeconds": SHED_RETRY_AFTER_SECS},
    });
    (
        StatusCode::TOO_MANY_REQUESTS,
        [(header::RETRY_AFTER, SHED_RETRY_AFTER_SECS.to_string())],
        axum::Json(status),
    )
        .into_response()
}

/// The serving certificate and what `/readyz` says about it; a problem is logged when it first appears, not on
/// every poll.
struct CertificateWatch {
    cert: Arc<ServingCert>,
    readiness: Readiness,
    problem: Option<String>,
}

impl CertificateWatch {
    fn new(cert: Arc<ServingCert>, readiness: Readiness) -> Self {
        CertificateWatch {
            cert,
            readiness,
            problem: None,
        }
    }

    fn check(&mut self) {
        let serving = format!("serving {}", self.cert.describe());
        match self.cert.reload() {
            Ok(true) => {
                tracing::info!(files = %self.cert.describe(), "serving certificate loaded");
                self.readiness.set(READINESS_CERTIFICATE, true, serving);
                self.problem = None;
            }
            Ok(false) => {
                // A rejected pair was put back to the one served.
                if self.problem.take().is_some() {
                    self.readiness.set(READINESS_CERTIFICATE, true, serving);
                }
            }
            Err(error) => {
                let problem = error.to_string();
                if self.problem.as_ref() != Some(&problem) {
                    tracing::warn!(%error, "no usable serving certificate");
                }
                if self.cert.is_loaded() {
                    let detail = format!("serving the previous pair; new one rejected: {problem}");
                    self.readiness.set(READINESS_CERTIFICATE, true, detail);
                } else {
                    self.readiness
                        .set(READINESS_CERTIFICATE, false, problem.clone());
                }
                self.problem = Some(problem);
            }
        }
    }

    async fn poll(mut self, interval: Duration, stop: CancellationToken) {
        let mut ticker = tokio::time::interval(interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = ticker.tick() => self.check(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_takes_its_size_from_the_budget_within_bounds() {
        // At least the least share, so the number decided at once is bounded too.
        assert_eq!(share_kib(Some(10)), 64);
        assert_eq!(share_kib(Some(3 * 1024 * 1024)), 3 * 1024);
        // Unknown (chunked) counts as the largest; one larger than the limit is refused unread and never asks.
        assert_eq!(share_kib(None), 7 * 1024);
        // One largest request fits, two do not.
        let budget = u32::try_from(ADMISSION_BUDGET_BYTES / 1024).unwrap();
        assert!(share_kib(None) <= budget && 2 * share_kib(None) > budget);
    }

    #[test]
    fn a_peer_holds_a_quarter_of_the_budget_or_one_admission() {
        let peer = kib(ADMISSION_PEER_SHARE_BYTES);
        let budget = kib(ADMISSION_BUDGET_BYTES);
        assert_eq!(4 * peer, budget);
        // Small admissions take their own size from their peer's share: 48 of the least share fit at once.
        assert_eq!(peer_share_kib(share_kib(Some(10)), peer), 64);
        assert_eq!(peer / peer_share_kib(share_kib(Some(10)), peer), 48);
        // One larger than the share takes all of it: it waits until its peer holds nothing else.
        assert_eq!(peer_share_kib(share_kib(None), peer), peer);
        // So one address holds at most one largest admission, and the others keep the rest.
        let most = share_kib(None).max(peer);
        assert!(budget - most >= 5 * 1024, "{} KiB left", budget - most);
    }

    #[tokio::test]
    async fn a_peer_waits_for_its_own_share_not_the_others() {
        let limits = AdmissionLimits {
            budget_bytes: 4 * 64 * 1024,
            peer_share_bytes: 64 * 1024,
            ..AdmissionLimits::default()
        };
        let budget = Arc::new(Budget::new(&limits));
        let (a, b): (IpAddr, IpAddr) = ([10, 0, 0, 1].into(), [10, 0, 0, 2].into());
        let held = budget.take(a, 64, Duration::ZERO).await.expect("a's share");
        let refused = budget.take(a, 64, Duration::ZERO).await.err();
        assert_eq!(refused, Some(ConnectionCap::PerPeer), "a holds its share");
        let _b = budget
            .take(b, 64, Duration::ZERO)
            .await
            .expect("b has its own");
        assert_eq!(budget.peers().len(), 2);
        drop(held);
        assert_eq!(budget.peers().len(), 1, "an idle peer is forgotten");
        let _a = budget
            .take(a, 64, Duration::ZERO)
            .await
            .expect("a's share came back");
        // Past the total: three peers hold 4 x 64 KiB.
        let _c = budget.take([10, 0, 0, 3].into(), 128, Duration::ZERO).await;
        let refused = budget
            .take([10, 0, 0, 4].into(), 64, Duration::ZERO)
            .await
            .err();
        assert_eq!(refused, Some(ConnectionCap::Total));
        assert_eq!(budget.peers().len(), 3, "a refused peer is forgotten");
    }
}
