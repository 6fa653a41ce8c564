//! The admin HTTP server every service runs on its own port: `/healthz` (the process serves and, with a
//! [`Liveness`], every local loop it tracks runs), `/readyz` (every registered component is ready, with a line of
//! detail each, and with a [`Liveness`] every watch it tracks makes progress) and `/metrics` (Prometheus text from
//! a prometheus-client registry). The state it serves lives in [`crate::health`].

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::Error;
use crate::health::Liveness;
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
        }
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
        let router = Router::new()
            .route("/healthz", get(healthz))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self.state);
        axum::serve(self.listener, router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(|e| Error::io("admin server", e))
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
