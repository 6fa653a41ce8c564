//! The admin HTTP server every service runs on its own port: `/healthz` (the process serves and, with a
//! [`Liveness`], every watch it tracks makes progress), `/readyz` (every registered component is ready, with a
//! line of detail each) and `/metrics` (Prometheus text from a prometheus-client registry).

use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;

use crate::Error;
use crate::health::Liveness;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Check {
    ready: bool,
    detail: String,
}

/// Readiness of a service, made of named components (e.g. `grpc`, `config`, `leader`). Ready when
/// at least one component is registered and every one is ready. Cheap to clone; clones share state.
#[derive(Debug, Clone, Default)]
pub struct Readiness {
    checks: Arc<RwLock<BTreeMap<String, Check>>>,
}

impl Readiness {
    /// Records the state of `component`; `detail` is shown on `/readyz`.
    pub fn set(&self, component: &str, ready: bool, detail: impl Into<String>) {
        if let Ok(mut checks) = self.checks.write() {
            checks.insert(
                component.to_owned(),
                Check {
                    ready,
                    detail: detail.into(),
                },
            );
        }
    }

    /// Forgets `component` (it no longer runs).
    pub fn remove(&self, component: &str) {
        if let Ok(mut checks) = self.checks.write() {
            checks.remove(component);
        }
    }

    /// Whether every registered component is ready (false when none is registered).
    pub fn is_ready(&self) -> bool {
        self.checks
            .read()
            .map(|c| !c.is_empty() && c.values().all(|c| c.ready))
            .unwrap_or(false)
    }

    /// One line per component: `name: ok|not ready[: detail]`.
    pub fn report(&self) -> String {
        let Ok(checks) = self.checks.read() else {
            return "readiness state unavailable\n".into();
        };
        checks
            .iter()
            .map(|(name, c)| {
                let state = if c.ready { "ok" } else { "not ready" };
                if c.detail.is_empty() {
                    format!("{name}: {state}\n")
                } else {
                    format!("{name}: {state}: {}\n", c.detail)
                }
            })
            .collect()
    }
}

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

    /// `/healthz` fails while `liveness` reports a stalled watch.
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
    let code = if state.readiness.is_ready() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, state.readiness.report())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_all_components_are() {
        let r = Readiness::default();
        assert!(!r.is_ready(), "nothing registered is not ready");
        r.set("grpc", true, "");
        r.set("config", false, "bad LIBVIRT_URI");
        assert!(!r.is_ready());
        assert_eq!(r.report(), "config: not ready: bad LIBVIRT_URI\ngrpc: ok\n");
        r.set("config", true, "");
        assert!(r.is_ready());
    }
}
