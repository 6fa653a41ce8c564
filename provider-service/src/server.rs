//! The gRPC server: ProviderService behind authentication, plus the standard health service
//! and server reflection (v1 and v1alpha, so every grpcurl version can list and describe, the
//! `google.rpc` error details included).
//!
//! Every accepted connection has TCP_NODELAY set: gRPC writes a response as several small
//! frames, and with Nagle's algorithm on, the last one waits for the client's delayed ACK
//! (40 ms on Linux) before it leaves.
//!
//! What anyone who reaches the port can hold is bounded before any call is authenticated:
//! established connections per peer address and in all ([`Load::admit_connection`], a connection
//! past a cap is closed at once), HTTP/2 streams per connection, reset streams (tonic leaves
//! hyper's stream and local-reset limits off unless they are set; hyper's docs cite
//! RUSTSEC-2024-0003), header lists, and a connection's life (HTTP/2 keepalive, a maximum age).
//! Load shedding ([`crate::load`]) sits inside authentication: a call holds a slot only once its
//! caller is known. Reflection, which needs no token, has a small budget of its own.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use peerpods_proto::ErrorReason;
use peerpods_proto::v1::provider_service_server::ProviderServiceServer;
use peerpods_runtime::admin::Readiness;
use peerpods_runtime::tls::Established;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic_types::{ErrorDetails, StatusExt};

use crate::Error;
use crate::auth::{Authenticated, TokenReviewer};
use crate::deletes::Deletes;
use crate::grpc::ProviderApi;
use crate::load::{Load, LoadLimits, Shed};
use crate::tls::ReloadingCert;

/// Readiness component name of the gRPC server.
pub const READINESS_GRPC: &str = "grpc";

/// The longest any call may take here. Below the callers' deadline
/// (`peerpods_provider_client::DEFAULT_PROVIDER_TIMEOUT`), so a caller hears this service's answer
/// rather than its own timeout, and above the backends' per-call timeouts of reads (AWS 60 s per
/// operation). A delete is never cut by it: the call answers within its answer window and the
/// delete runs on detached (see [`crate::deletes`] and the README's "Deadlines").
pub const CALL_TIMEOUT: Duration = Duration::from_secs(75);

/// HTTP/2 streams one connection may have open (SETTINGS_MAX_CONCURRENT_STREAMS; tonic's default is
/// none). A caller multiplexes its calls on one connection; a controller's cleanup storm runs
/// far fewer at once than this, and more wait in the caller's HTTP/2 client.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Streams a client may open and reset before the server answers them, per connection, before
/// the connection is closed with GOAWAY (the "rapid reset" attack, CVE-2023-44487). h2's default,
/// set here so it never depends on a dependency's.
const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// Streams the server may reset for a client's protocol errors, per connection, before it closes
/// the connection (RUSTSEC-2024-0003). hyper's own default, which tonic turns off unless set.
const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;
/// The largest header list a call may send: a bearer token (a projected ServiceAccount token is a
/// few KiB) and gRPC's few headers fit with room.
const MAX_HEADER_LIST_SIZE: u32 = 32 * 1024;
/// HTTP/2 PING every so often on a connection; one unanswered within
/// [`HTTP2_KEEPALIVE_TIMEOUT`] closes it, so a peer that vanished frees its place.
const HTTP2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const HTTP2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
/// A connection older than this is asked to go (GOAWAY; callers reconnect transparently), so a
/// peer cannot hold a place for ever and callers spread over new replicas.
pub const MAX_CONNECTION_AGE: Duration = Duration::from_secs(30 * 60);
/// How long calls of a connection past its age may still run: longer than any call
/// ([`CALL_TIMEOUT`]), so age never cuts one.
pub const MAX_CONNECTION_AGE_GRACE: Duration = Duration::from_secs(90);
/// Reflection calls (no token needed: grpcurl lists and describes) in flight at once, apart from
/// the callers' budget so they can never take its slots.
const REFLECTION_CALLS: usize = 16;

/// What [`serve`] needs.
pub struct GrpcServer {
    pub listener: TcpListener,
    pub api: ProviderApi,
    /// `None` only with `--auth=none`.
    pub reviewer: Option<Arc<TokenReviewer>>,
    /// `None` serves plaintext (local development).
    pub tls: Option<Arc<ReloadingCert>>,
    pub readiness: Readiness,
    /// The detached deletes: closed to new ones when shutdown begins.
    pub deletes: Deletes,
    /// The bound on calls in flight over every connection (load shedding, see [`crate::load`]).
    pub load: Load,
}

/// Serves until `shutdown` is cancelled, then lets calls in flight finish. Shutdown first turns the
/// service not ready (`/readyz` and the gRPC health service) and refuses new deletes, then stops
/// accepting calls; the deletes still running are the caller's to wait for ([`Deletes::drain`]).
pub async fn serve(server: GrpcServer, shutdown: CancellationToken) -> Result<(), Error> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ProviderServiceServer<ProviderApi>>()
        .await;
    // The error details (google.rpc.ErrorInfo, RetryInfo) are registered too, so grpcurl and
    // other reflection clients can decode the details every error carries.
    let reflection = || {
        tonic_reflection::server::Builder::configure()
            .register_encoded_file_descriptor_set(peerpods_proto::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
            .register_encoded_file_descriptor_set(tonic_types::pb::FILE_DESCRIPTOR_SET)
    };
    let reflection_error =
        |e: tonic_reflection::server::Error| Error::internal_from("reflection", e);
    let reflection_v1 = reflection().build_v1().map_err(reflection_error)?;
    let reflection_v1alpha = reflection().build_v1alpha().map_err(reflection_error)?;
    let reflection_load = Load::new(LoadLimits {
        max_in_flight: REFLECTION_CALLS,
        delete_reserve: 0,
        ..LoadLimits::default()
    });
    let router = Server::builder()
        // A stuck cloud call must not hold a caller forever; callers retry.
        .timeout(CALL_TIMEOUT)
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        // hyper already refuses streams past the maximum; this only keeps tonic from queueing.
        .concurrency_limit_per_connection(MAX_STREAMS_PER_CONNECTION as usize)
        .http2_max_pending_accept_reset_streams(Some(MAX_PENDING_ACCEPT_RESET_STREAMS))
        .http2_max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESET_STREAMS))
        .http2_max_header_list_size(MAX_HEADER_LIST_SIZE)
        .http2_keepalive_interval(Some(HTTP2_KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(HTTP2_KEEPALIVE_TIMEOUT))
        .max_connection_age(MAX_CONNECTION_AGE)
        .max_connection_age_grace(MAX_CONNECTION_AGE_GRACE)
        // TCP keepalive and TCP_NODELAY are set where connections are accepted
        // (`plaintext_incoming`, the runtime's TLS listener): tonic ignores its own settings with
        // an incoming stream.
        .layer(tower::layer::layer_fn(|inner| WithErrorInfo { inner }))
        .trace_fn(|request| {
            let span = tracing::info_span!("grpc", path = %request.uri().path());
            peerpods_runtime::telemetry::set_parent_from_headers(&span, request.headers());
            span
        })
        // Never shed: a kubelet probe must see the service alive while it sheds.
        .add_service(health)
        .add_service(Shed::new(reflection_v1, reflection_load.clone()))
        .add_service(Shed::new(reflection_v1alpha, reflection_load))
        // Authentication first, then load shedding: an unauthenticated call, or one whose token is
        // still being reviewed, holds none of the callers' slots (the delete reserve included).
        .add_service(Authenticated::new(
            Shed::new(server.api.into_service(), server.load.clone()),
            server.reviewer,
        ));
    let local = server
        .listener
        .local_addr()
        .map_err(|e| Error::io("gRPC listener address", e))?;
    server
        .readiness
        .set(READINESS_GRPC, true, format!("listening on {local}"));
    tracing::info!(%local, tls = server.tls.is_some(), "gRPC server listening");
    let stop = {
        let shutdown = shutdown.clone();
        let readiness = server.readiness.clone();
        let deletes = server.deletes.clone();
        async move {
            shutdown.cancelled().await;
            // Not ready first, so no new caller is sent here while the deletes drain.
            readiness.set(
                READINESS_GRPC,
                false,
                format!(
                    "shutting down: finishing {} delete(s), starting none",
                    deletes.in_flight()
                ),
            );
            deletes.close();
            health_reporter
                .set_not_serving::<ProviderServiceServer<ProviderApi>>()
                .await;
        }
    };
    let served = match server.tls {
        Some(tls) => {
            let config = tls.server_config()?;
            router
                .serve_with_incoming_shutdown(
                    capped(
                        crate::tls::incoming(server.listener, config, shutdown.clone()),
                        server.load.clone(),
                    ),
                    stop,
                )
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(
                    capped(plaintext_incoming(server.listener), server.load.clone()),
                    stop,
                )
                .await
        }
    };
    server.readiness.set(READINESS_GRPC, false, "shutting down");
    served.map_err(|e| Error::internal_from("gRPC server", e))
}

/// TCP keepalive of accepted connections: a caller that vanished without a FIN is noticed.
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Plaintext connections from `listener`, each with TCP_NODELAY (see the module doc).
pub fn plaintext_incoming(listener: TcpListener) -> TcpIncoming {
    TcpIncoming::from(listener)
        .with_nodelay(Some(true))
        .with_keepalive(Some(TCP_KEEPALIVE))
}

/// A connection's peer address, to count it against its peer's cap.
pub trait PeerAddr {
    fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr>;
}

impl PeerAddr for tokio::net::TcpStream {
    fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        tokio::net::TcpStream::peer_addr(self)
    }
}

impl PeerAddr for tokio_rustls::server::TlsStream<tokio::net::TcpStream> {
    fn peer_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.get_ref().0.peer_addr()
    }
}

/// The connections of `incoming` that fit under `load`'s connection caps
/// ([`Load::admit_connection`]); each holds its place until it closes. One past a cap is closed
/// at once (dropped), before any byte of it is read: the cost of a flood stays one accept each.
pub fn capped<S, IO>(
    incoming: S,
    load: Load,
) -> impl futures::Stream<Item = Result<Established<IO>, std::io::Error>> + Send + 'static
where
    S: futures::Stream<Item = Result<IO, std::io::Error>> + Send + 'static,
    IO: PeerAddr + Send + 'static,
{
    use futures::StreamExt;
    incoming.filter_map(move |accepted| {
        let admitted = match accepted {
            Err(e) => Some(Err(e)),
            // A socket whose peer is already gone has nothing to serve.
            Ok(io) => match io.peer_addr() {
                Err(_) => None,
                Ok(peer) => load
                    .admit_connection(peer.ip())
                    .map(|permit| Ok(Established::new(io, permit))),
            },
        };
        std::future::ready(admitted)
    })
}

/// Adds `google.rpc.ErrorInfo` to errors that tonic itself answers before a handler runs (an
/// unknown method, a request over the size limit or undecodable, a timeout), so every error a
/// caller sees carries a stable reason, like the ones [`crate::error::status`] builds.
#[derive(Clone)]
struct WithErrorInfo<S> {
    inner: S,
}

impl<S, B, R> tower::Service<http::Request<B>> for WithErrorInfo<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let answer = self.inner.call(request);
        Box::pin(async move {
            let mut response = answer.await?;
            add_error_info(response.headers_mut());
            Ok(response)
        })
    }
}

/// Header name of the binary google.rpc.Status that carries error details.
const STATUS_DETAILS: &str = "grpc-status-details-bin";

/// For a trailers-only error answer without details: the same code and message, plus an
/// ErrorInfo whose reason names what the framework refused.
fn add_error_info(headers: &mut http::HeaderMap) {
    if headers.contains_key(STATUS_DETAILS) {
        return;
    }
    let Some(status) = tonic::Status::from_header_map(headers) else {
        return;
    };
    if status.code() == tonic::Code::Ok {
        return;
    }
    let reason = framework_reason(status.code(), status.message());
    let detailed = tonic::Status::with_error_details(
        status.code(),
        status.message(),
        ErrorDetails::with_error_info(
            reason.as_str(),
            crate::error::ERROR_DOMAIN,
            std::collections::HashMap::new(),
        ),
    );
    if let Err(e) = detailed.add_header(headers) {
        tracing::debug!(error = %e, "could not add ErrorInfo to a framework error");
    }
}

/// Stable reasons of the errors tonic answers itself.
fn framework_reason(code: tonic::Code, message: &str) -> ErrorReason {
    use tonic::Code;
    match code {
        Code::Unimplemented => ErrorReason::MethodNotFound,
        // tonic's answer to bytes that are not the method's request message.
        Code::Internal if message.starts_with("failed to decode") => ErrorReason::MalformedRequest,
        // tonic's answer to a request over `max_decoding_message_size`.
        Code::OutOfRange => ErrorReason::MessageTooLarge,
        Code::Cancelled | Code::DeadlineExceeded => ErrorReason::Timeout,
        Code::ResourceExhausted => ErrorReason::Overloaded,
        Code::InvalidArgument => ErrorReason::MalformedRequest,
        Code::Unavailable => ErrorReason::ShuttingDown,
        _ => ErrorReason::Internal,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_calls_bound_sits_between_the_delete_answer_window_and_the_callers_deadline() {
        // The caller's deadline > this service's bound of any call > a delete call's answer window:
        // the caller always hears this service's answer, never its own timeout.
        let deletes = crate::deletes::DeleteSettings::default();
        assert!(deletes.answer_within < CALL_TIMEOUT);
        assert!(CALL_TIMEOUT < peerpods_provider_client::DEFAULT_PROVIDER_TIMEOUT);
    }

    #[test]
    fn framework_errors_get_an_error_info() {
        let mut headers = tonic::Status::unimplemented("")
            .into_http::<()>()
            .into_parts()
            .0
            .headers;
        add_error_info(&mut headers);
        let status = tonic::Status::from_header_map(&headers).unwrap();
        assert_eq!(status.code(), tonic::Code::Unimplemented);
        let info = status.get_details_error_info().expect("ErrorInfo");
        assert_eq!(info.reason, "MethodNotFound");
        assert_eq!(info.domain, crate::error::ERROR_DOMAIN);
    }

    #[test]
    fn details_already_there_are_kept() {
        let ours = crate::error::status(
            &crate::error::ProviderError::UnknownProvider { name: "x".into() }.into(),
        );
        let mut headers = ours.into_http::<()>().into_parts().0.headers;
        let before = headers.get(STATUS_DETAILS).cloned();
        add_error_info(&mut headers);
        assert_eq!(headers.get(STATUS_DETAILS).cloned(), before);
        let status = tonic::Status::from_header_map(&headers).unwrap();
        assert_eq!(
            status.get_details_error_info().map(|i| i.reason),
            Some("UnknownProvider".to_owned())
        );
    }

    #[test]
    fn success_is_left_alone() {
        let mut headers = http::HeaderMap::new();
        add_error_info(&mut headers);
        assert!(headers.is_empty());
    }
}
