//! The admin HTTP server every service runs on its own port: `/healthz` (the process serves and, with a
//! [`Liveness`], every local loop it tracks runs), `/readyz` (every registered component is ready, with a line of
//! detail each, and with a [`Liveness`] every watch it tracks makes progress) and `/metrics` (Prometheus text from
//! a prometheus-client registry). The state it serves lives in [`crate::health`]. With secure metrics
//! ([`AdminServer::with_secure_metrics`]) `/metrics` moves to a TLS port of its own behind authentication and
//! authorization ([`crate::secure_metrics`]); the probes stay here.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::Error;
use crate::health::Liveness;
use crate::secure_metrics::{Reviewer, SecureMetrics, Verdict};
use crate::tls::TlsListener;
// Where the services have always found it. It lives with the rest of a service's health state, which this server
// only serves: `admin` depends on `health`, never the other way.
pub use crate::health::Readiness;

#[derive(Clone)]
struct AdminState {
    readiness: Readiness,
    liveness: Option<Liveness>,
    registry: Arc<Registry>,
}

/// A bound, not yet serving admin server.
pub struct AdminServer {
    listener: tokio::net::TcpListener,
    state: AdminState,
    secure: Option<SecureMetrics>,
}

impl AdminServer {
    /// Binds `addr` (port 0 picks a free port; see [`AdminServer::local_addr`]).
    pub async fn bind(
        addr: SocketAddr,
        readiness: Readiness,
        registry: Arc<Registry>,
    ) -> Result<Self, Error> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| Error::io(format!("binding admin server to {addr}"), e))?;
        Ok(Self::on(listener, readiness, registry))
    }

    /// Serves on `listener`, already bound.
    pub fn on(
        listener: tokio::net::TcpListener,
        readiness: Readiness,
        registry: Arc<Registry>,
    ) -> Self {
        AdminServer {
            listener,
            state: AdminState {
                readiness,
                liveness: None,
                registry,
            },
            secure: None,
        }
    }

    /// With `Some`, `/metrics` is served only on the secure metrics port, to callers the API server
    /// authenticates and allows to `get` `/metrics`; this port keeps `/healthz` and `/readyz`.
    pub fn with_secure_metrics(mut self, secure: Option<SecureMetrics>) -> Self {
        self.secure = secure;
        self
    }

    /// The secure metrics port's address, when it has one.
    pub fn metrics_addr(&self) -> Result<Option<SocketAddr>, Error> {
        self.secure
            .as_ref()
            .map(SecureMetrics::local_addr)
            .transpose()
    }

    /// `/healthz` fails while `liveness` reports a stalled local loop; `/readyz` while it reports a stalled watch.
    pub fn with_liveness(mut self, liveness: Liveness) -> Self {
        self.state.liveness = Some(liveness);
        self
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> Result<SocketAddr, Error> {
        self.listener
            .local_addr()
            .map_err(|e| Error::io("admin server address", e))
    }

    /// Serves until `shutdown` completes.
    pub async fn serve(
        self,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> Result<(), Error> {
        let probes = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz));
        let Some(secure) = self.secure else {
            let router = probes
                .route("/metrics", get(metrics))
                .with_state(self.state);
            return axum::serve(self.listener, router)
                .with_graceful_shutdown(shutdown)
                .await
                .map_err(|e| Error::io("admin server", e));
        };
        let SecureMetrics {
            listener,
            tls,
            reviewer,
        } = secure;
        let listener =
            TlsListener::new(listener, tls).map_err(|e| Error::io("metrics port address", e))?;
        let secured = Router::new()
            .route("/metrics", get(reviewed_metrics))
            .with_state(SecureState {
                admin: self.state.clone(),
                reviewer,
            });
        let stop = tokio_util::sync::CancellationToken::new();
        let metrics = tokio::spawn(
            axum::serve(listener, secured)
                .with_graceful_shutdown(stop.clone().cancelled_owned())
                .into_future(),
        );
        let served = axum::serve(self.listener, probes.with_state(self.state))
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| Error::io("admin server", e));
        stop.cancel();
        let metrics = metrics
            .await
            .map_err(|e| Error::io("metrics server task", std::io::Error::other(e)))
            .and_then(|served| served.map_err(|e| Error::io("metrics server", e)));
        served.and(metrics)
    }
}

#[derive(Clone)]
struct SecureState {
    admin: AdminState,
    reviewer: Reviewer,
}

/// `/metrics` on the secure port: 401 without a token the API server authenticates, 403 for a user it does not
/// allow to `get` the path, 503 when it cannot tell (the next scrape asks again).
async fn reviewed_metrics(
    State(state): State<SecureState>,
    headers: HeaderMap,
    uri: Uri,
) -> axum::response::Response {
    match state.reviewer.check(&headers, uri.path()).await {
        Ok(Verdict::Allowed) => metrics(State(state.admin)).await.into_response(),
        Ok(verdict @ Verdict::Unauthenticated) => {
            (verdict.status(), "Unauthorized\n").into_response()
        }
        Ok(ref verdict @ Verdict::Forbidden { ref user }) => (
            verdict.status(),
            format!("Forbidden: {user} may not get {}\n", uri.path()),
        )
            .into_response(),
        Err(failed) => {
            tracing::warn!(reason = %failed.0, "a metrics scrape could not be reviewed");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot review the caller now\n",
            )
                .into_response()
        }
    }
}

async fn healthz(State(state): State<AdminState>) -> impl IntoResponse {
    match &state.liveness {
        Some(liveness) if !liveness.is_live() => {
            (StatusCode::SERVICE_UNAVAILABLE, liveness.report())
        }
        Some(liveness) => (StatusCode::OK, liveness.report()),
        None => (StatusCode::OK, "ok\n".to_owned()),
    }
}

async fn readyz(State(state): State<AdminState>) -> impl IntoResponse {
    let watches_progress = state
        .liveness
        .as_ref()
        .is_none_or(Liveness::watches_progress);
    let code = if state.readiness.is_ready() && watches_progress {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let mut report = state.readiness.report();
    if let Some(liveness) = &state.liveness {
        report.push_str(&liveness.watch_report());
    }
    (code, report)
}

async fn metrics(State(state): State<AdminState>) -> impl IntoResponse {
    let mut body = String::new();
    match prometheus_client::encoding::text::encode(&mut body, &state.registry) {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        ),
        Err(e) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
            format!("encoding metrics failed: {e}\n"),
        ),
    }
}
