//! The gRPC server: ProviderService behind authentication, plus the standard health service
//! and server reflection (v1 and v1alpha, so every grpcurl version can list and describe).

use std::sync::Arc;
use std::time::Duration;

use peerpods_proto::v1::provider_service_server::ProviderServiceServer;
use peerpods_runtime::admin::Readiness;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;

use crate::Error;
use crate::auth::{Authenticated, TokenReviewer};
use crate::grpc::ProviderApi;
use crate::tls::ReloadingCert;

/// Readiness component name of the gRPC server.
pub const READINESS_GRPC: &str = "grpc";

/// What [`serve`] needs.
pub struct GrpcServer {
    pub listener: TcpListener,
    pub api: ProviderApi,
    /// `None` only with `--auth=none`.
    pub reviewer: Option<Arc<TokenReviewer>>,
    /// `None` serves plaintext (local development).
    pub tls: Option<Arc<ReloadingCert>>,
    pub readiness: Readiness,
}

/// Serves until `shutdown` is cancelled, then lets calls in flight finish.
pub async fn serve(server: GrpcServer, shutdown: CancellationToken) -> Result<(), Error> {
    let (health_reporter, health) = tonic_health::server::health_reporter();
    health_reporter
        .set_serving::<ProviderServiceServer<ProviderApi>>()
        .await;
    let reflection_v1 = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(peerpods_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1()
        .map_err(|e| Error::Internal {
            message: format!("reflection: {e}"),
        })?;
    let reflection_v1alpha = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(peerpods_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        .build_v1alpha()
        .map_err(|e| Error::Internal {
            message: format!("reflection: {e}"),
        })?;
    let router = Server::builder()
        // A stuck cloud call must not hold a caller forever; callers retry.
        .timeout(Duration::from_secs(120))
        .concurrency_limit_per_connection(1024)
        .trace_fn(|request| {
            let span = tracing::info_span!("grpc", path = %request.uri().path());
            peerpods_runtime::telemetry::set_parent_from_headers(&span, request.headers());
            span
        })
        .add_service(health)
        .add_service(reflection_v1)
        .add_service(reflection_v1alpha)
        .add_service(Authenticated::new(
            server.api.into_service(),
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
        async move { shutdown.cancelled().await }
    };
    let served = match server.tls {
        Some(tls) => {
            let config = tls.server_config()?;
            router
                .serve_with_incoming_shutdown(
                    crate::tls::incoming(server.listener, config, shutdown.clone()),
                    stop,
                )
                .await
        }
        None => {
            router
                .serve_with_incoming_shutdown(TcpListenerStream::new(server.listener), stop)
                .await
        }
    };
    server.readiness.set(READINESS_GRPC, false, "shutting down");
    served.map_err(|e| Error::Internal {
        message: format!("gRPC server: {e}"),
    })
}
