//! Load shedding: a bound on the calls the whole service runs at once, over every connection. A
//! call past it is answered at once with RESOURCE_EXHAUSTED (reason `Overloaded`) and a RetryInfo
//! saying when to try again, instead of queueing until callers time out. DeleteInstance has a
//! reserve above the bound, so cleanups still get in while polls fill the service. The health
//! service is never shed: a kubelet probe must see the service alive while it sheds.
//!
//! Refused calls are logged at most once per [`LOG_EVERY`], with how many were refused since, so
//! an overload or one misbehaving client cannot flood the logs.
//!
//! Shedding counts authenticated calls only: the server puts [`Shed`] inside authentication, so a
//! call whose token is still being reviewed (or is garbage) holds no slot, the delete reserve
//! included. Authentication has its own bounds (the TokenReview budget of [`crate::auth`]).
//!
//! [`Load::admit_connection`] bounds the established connections, per peer address and in all: each holds
//! HTTP/2 state and up to [`crate::server::MAX_STREAMS_PER_CONNECTION`] streams, so their number
//! bounds what a flood of connections can cost before any call is authenticated. The counting and
//! the decision are the services' shared ones ([`peerpods_runtime::tls::OpenConnections`]); only
//! the configuration keys that set the caps are this service's.

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use peerpods_runtime::tls::{ConnectionLimits, OpenConnections};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tonic_types::{ErrorDetails, StatusExt};

/// Where the rest of the service has always found them.
pub use peerpods_runtime::telemetry::RateLimitedLog;
pub use peerpods_runtime::tls::{CapLabels, ConnectionCap, ConnectionPermit};

/// How many calls run at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadLimits {
    /// Calls in flight at most (every method but the health service's).
    pub max_in_flight: usize,
    /// Further DeleteInstance calls allowed past `max_in_flight`.
    pub delete_reserve: usize,
    /// The wait suggested to a refused caller.
    pub retry_after: Duration,
    /// Established connections from one peer address at most.
    pub max_connections_per_peer: usize,
    /// Established connections at most.
    pub max_connections: usize,
}

/// Configuration keys of the limits (files of the config directories, or the environment).
pub const MAX_CALLS_IN_FLIGHT: &str = "MAX_CALLS_IN_FLIGHT";
pub const DELETE_CALLS_RESERVE: &str = "DELETE_CALLS_RESERVE";
pub const MAX_CONNECTIONS_PER_PEER: &str = "MAX_CONNECTIONS_PER_PEER";
pub const MAX_CONNECTIONS: &str = "MAX_CONNECTIONS";

impl LoadLimits {
    /// The defaults, with `MAX_CALLS_IN_FLIGHT`, `DELETE_CALLS_RESERVE`, `MAX_CONNECTIONS_PER_PEER`
    /// and `MAX_CONNECTIONS` from `config` where set.
    pub fn from_config(
        config: &peerpods_provider_core::ProviderConfig,
    ) -> Result<Self, peerpods_provider_core::Error> {
        let mut limits = LoadLimits::default();
        for (key, field, min) in [
            (MAX_CALLS_IN_FLIGHT, &mut limits.max_in_flight, 1),
            (DELETE_CALLS_RESERVE, &mut limits.delete_reserve, 0),
            (
                MAX_CONNECTIONS_PER_PEER,
                &mut limits.max_connections_per_peer,
                1,
            ),
            (MAX_CONNECTIONS, &mut limits.max_connections, 1),
        ] {
            if let Some(value) = config.get(key) {
                *field = value
                    .trim()
                    .parse::<usize>()
                    .ok()
                    .filter(|n| *n >= min)
                    .ok_or_else(|| {
                        peerpods_provider_core::Error::config(
                            key.to_owned(),
                            format!("{value:?} is not a whole number of at least {min}"),
                        )
                    })?;
            }
        }
        Ok(limits)
    }

    /// The connection caps, for the shared count ([`OpenConnections`]).
    pub fn connections(&self) -> ConnectionLimits {
        ConnectionLimits {
            per_peer: self.max_connections_per_peer,
            total: self.max_connections,
        }
    }
}

impl Default for LoadLimits {
    fn default() -> Self {
        LoadLimits {
            max_in_flight: 512,
            delete_reserve: 128,
            retry_after: Duration::from_secs(1),
            // A caller needs one connection (HTTP/2 multiplexes its calls); CAA on a node and the
            // controllers are a few. Behind a node's address (hostNetwork, SNAT) several callers
            // may share one, hence some room.
            max_connections_per_peer: 64,
            // Nodes of a large cluster, each with CAA, and the controllers.
            max_connections: 4096,
        }
    }
}

/// Path prefix of the standard health service, never shed.
const HEALTH_PREFIX: &str = "/grpc.health.v1.Health/";
/// DeleteInstance's path, the one method with a reserve.
const DELETE_PATH: &str = "/peerpods.provider.v1.ProviderService/DeleteInstance";
/// At most one log line about refused calls per this long.
pub const LOG_EVERY: Duration = Duration::from_secs(10);

/// The calls in flight and the refusals, shared by every connection.
#[derive(Clone, Debug)]
pub struct Load {
    limits: Arc<std::sync::RwLock<LoadLimits>>,
    in_flight: Arc<AtomicUsize>,
    /// `provider_service_grpc_in_flight`.
    pub in_flight_gauge: Gauge,
    /// `provider_service_grpc_shed`: calls refused as overloaded.
    pub shed: Counter,
    log: Arc<RateLimitedLog>,
    open: OpenConnections,
    /// `provider_service_grpc_connections`: established connections now.
    pub connections_gauge: Gauge,
    /// `provider_service_grpc_connections_refused{cap}`: connections closed at once, past a cap.
    pub connections_refused: Family<CapLabels, Counter>,
}

impl Load {
    pub fn new(limits: LoadLimits) -> Self {
        let open = OpenConnections::new(limits.connections());
        Load {
            limits: Arc::new(std::sync::RwLock::new(limits)),
            in_flight: Arc::new(AtomicUsize::new(0)),
            in_flight_gauge: Gauge::default(),
            shed: Counter::default(),
            log: Arc::new(RateLimitedLog::new(LOG_EVERY)),
            connections_gauge: open.gauge.clone(),
            connections_refused: open.refused.clone(),
            open,
        }
    }

    /// A place for a connection just established from `peer`, or `None` (counted and logged at
    /// most every [`LOG_EVERY`]) when it must be closed at once: its peer or the service holds as
    /// many as it may.
    pub fn admit_connection(&self, peer: IpAddr) -> Option<ConnectionPermit> {
        self.open
            .admit(peer)
            .inspect_err(|refusal| {
                if let Some(refused) = refusal.log_due {
                    let key = match refusal.cap {
                        ConnectionCap::PerPeer => MAX_CONNECTIONS_PER_PEER,
                        ConnectionCap::Total => MAX_CONNECTIONS,
                    };
                    tracing::warn!(
                        %peer,
                        from_peer = refusal.from_peer,
                        total = refusal.total,
                        limit = refusal.limit,
                        refused,
                        "closing a new gRPC connection: {key} reached; logged at most every 10 s"
                    );
                }
            })
            .ok()
    }

    /// Established connections now.
    pub fn connections(&self) -> usize {
        self.open.count()
    }

    /// Registers the gauge and the counter under `registry`'s prefix.
    pub fn register(&self, registry: &mut prometheus_client::registry::Registry) {
        registry.register(
            "grpc_in_flight",
            "gRPC calls running now (the health service's not counted)",
            self.in_flight_gauge.clone(),
        );
        registry.register(
            "grpc_shed",
            "gRPC calls refused with RESOURCE_EXHAUSTED because the service runs as many as it may",
            self.shed.clone(),
        );
        registry.register(
            "grpc_connections",
            "gRPC connections established now",
            self.connections_gauge.clone(),
        );
        registry.register(
            "grpc_connections_refused",
            "gRPC connections closed at once because their peer (cap=per_peer, MAX_CONNECTIONS_PER_PEER) or the service (cap=total, MAX_CONNECTIONS) holds as many as it may",
            self.connections_refused.clone(),
        );
    }

    /// Calls in flight now (the health service's not counted).
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// Puts other limits in place (the configuration's, once it is read).
    pub fn set_limits(&self, limits: LoadLimits) {
        self.open.set_limits(limits.connections());
        match self.limits.write() {
            Ok(mut l) => *l = limits,
            Err(poisoned) => *poisoned.into_inner() = limits,
        }
    }

    pub fn limits(&self) -> LoadLimits {
        match self.limits.read() {
            Ok(l) => *l,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    /// A slot for a call to `path`, or `None` when the service is full.
    fn admit(&self, path: &str) -> Option<Slot> {
        let limits = self.limits();
        let bound = if path == DELETE_PATH {
            limits.max_in_flight + limits.delete_reserve
        } else {
            limits.max_in_flight
        };
        let admitted = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < bound).then_some(n + 1)
            })
            .is_ok();
        admitted.then(|| {
            self.in_flight_gauge.inc();
            Slot { load: self.clone() }
        })
    }

    /// The answer to a refused call.
    fn refusal(&self, path: &str) -> tonic::Status {
        let limits = self.limits();
        self.shed.inc();
        if let Some(refused) = self.log.admit() {
            tracing::warn!(
                path,
                refused,
                limit = limits.max_in_flight,
                "overloaded: refusing calls (RESOURCE_EXHAUSTED); logged at most every 10 s"
            );
        }
        let mut details = ErrorDetails::with_error_info(
            peerpods_proto::ErrorReason::Overloaded.as_str(),
            crate::error::ERROR_DOMAIN,
            HashMap::new(),
        );
        details.set_retry_info(Some(limits.retry_after));
        tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            format!(
                "provider-service runs {} calls already; retry in {} s",
                limits.max_in_flight,
                limits.retry_after.as_secs().max(1)
            ),
            details,
        )
    }
}

/// A call's place among those in flight, given back when the call's answer is ready.
struct Slot {
    load: Load,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.load.in_flight.fetch_sub(1, Ordering::AcqRel);
        self.load.in_flight_gauge.dec();
    }
}

/// The tower layer that sheds load (see the module doc).
#[derive(Clone)]
pub struct Shed<S> {
    inner: S,
    load: Load,
}

impl<S> Shed<S> {
    pub fn new(inner: S, load: Load) -> Self {
        Shed { inner, load }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Shed<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tower::Service<http::Request<B>> for Shed<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>, Error = Infallible>,
    S::Future: Send + 'static,
    R: Default + Send + 'static,
{
    type Response = http::Response<R>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        if path.starts_with(HEALTH_PREFIX) {
            return Box::pin(self.inner.call(request));
        }
        match self.load.admit(path) {
            Some(slot) => {
                let answer = self.inner.call(request);
                Box::pin(async move {
                    let response = answer.await;
                    drop(slot);
                    response
                })
            }
            None => {
                let status = self.load.refusal(path);
                Box::pin(async move { Ok(status.into_http()) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deletes_have_a_reserve() {
        let load = Load::new(LoadLimits {
            max_in_flight: 2,
            delete_reserve: 1,
            retry_after: Duration::from_secs(2),
            ..LoadLimits::default()
        });
        let capacity = "/peerpods.provider.v1.ProviderService/GetCapacity";
        let a = load.admit(capacity).expect("first");
        let _b = load.admit(capacity).expect("second");
        assert!(load.admit(capacity).is_none(), "full");
        let d = load.admit(DELETE_PATH).expect("a delete uses the reserve");
        assert!(load.admit(DELETE_PATH).is_none(), "reserve used up");
        drop(a);
        drop(d);
        assert!(load.admit(capacity).is_some(), "a slot came back");
        let status = load.refusal(capacity);
        assert_eq!(status.code(), tonic::Code::ResourceExhausted);
        assert_eq!(
            status.get_details_retry_info().and_then(|r| r.retry_delay),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn connections_are_capped_per_peer_then_in_all() {
        let limits = LoadLimits {
            max_connections_per_peer: 2,
            max_connections: 3,
            ..LoadLimits::default()
        };
        let load = Load::new(limits);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let a1 = load.admit_connection(a).expect("first from a");
        let _a2 = load.admit_connection(a).expect("second from a");
        assert!(load.admit_connection(a).is_none(), "a holds its cap");
        let _b1 = load.admit_connection(b).expect("b has its own cap");
        assert!(
            load.admit_connection(b).is_none(),
            "the service holds its cap"
        );
        assert_eq!(load.connections(), 3);
        drop(a1);
        assert!(load.admit_connection(a).is_some(), "a place came back");
        let per_peer = load
            .connections_refused
            .get_or_create(&CapLabels { cap: "per_peer" })
            .get();
        let total = load
            .connections_refused
            .get_or_create(&CapLabels { cap: "total" })
            .get();
        assert_eq!((per_peer, total), (1, 1));
    }
}
