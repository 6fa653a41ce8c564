//! provider-service: wires flags (each also an environment variable) to the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use peerpods_runtime::admin::{AdminServer, Readiness};
use peerpods_runtime::telemetry::LogFormat;
use provider_service::auth::{Grant, TokenReviewer};
use provider_service::grpc::ProviderApi;
use provider_service::metrics::Metrics;
use provider_service::reload::ConfigReloader;
use provider_service::server::{GrpcServer, serve};
use provider_service::tls::ReloadingCert;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AuthMode {
    /// Validate callers' ServiceAccount tokens with the TokenReview API.
    Tokenreview,
    /// No caller authentication. Local development only.
    None,
}

/// The gRPC service that alone holds cloud credentials and deletes peer-pod VMs.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// gRPC address.
    #[arg(long, env = "LISTEN", default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    /// Address of /healthz, /readyz and /metrics.
    #[arg(long, env = "ADMIN_LISTEN", default_value = "0.0.0.0:8081")]
    admin_listen: SocketAddr,
    /// Directories whose files are configuration keys (CLOUD_PROVIDER, AWS_REGION, LIBVIRT_URI,
    /// ...), e.g. the mounted peer-pods-cm ConfigMap and peer-pods-secret Secret. Later ones win;
    /// the environment fills in keys no file sets. Without any, the embedded defaults
    /// (CLOUD_PROVIDER=libvirt, LIBVIRT_URI=test:///default) apply.
    #[arg(long, env = "CONFIG_DIR", value_delimiter = ',')]
    config_dir: Vec<PathBuf>,
    /// How often the configuration and TLS files are checked for changes.
    #[arg(long, env = "RELOAD_INTERVAL_SECONDS", default_value_t = 5)]
    reload_interval_seconds: u64,
    /// PEM certificate (chain) of the gRPC port. Without it the port speaks plaintext.
    #[arg(long, env = "TLS_CERT", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// PEM private key of the gRPC port.
    #[arg(long, env = "TLS_KEY", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// How callers are authenticated.
    #[arg(long, env = "AUTH", value_enum, default_value = "tokenreview")]
    auth: AuthMode,
    /// ServiceAccounts allowed to call and the methods each may call, comma-separated:
    /// `namespace/name=Method+Method` (DeleteInstance, GetCapacity, ListInstances; ListProviders
    /// is implied). A bare `namespace/name` may call every method.
    #[arg(long, env = "ALLOWED_CALLERS", value_delimiter = ',')]
    allowed_callers: Vec<Grant>,
    /// Audience callers' tokens must be issued for.
    #[arg(long, env = "AUDIENCE", default_value = "provider-service")]
    audience: String,
    /// Log format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let telemetry = match peerpods_runtime::telemetry::init("provider-service", args.log_format) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("provider-service: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = run(args).await;
    if let Err(e) = &result {
        tracing::error!(error = %e, reason = e.reason(), "provider-service stopped");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::FAILURE
    }
}

async fn run(args: Args) -> Result<(), provider_service::Error> {
    let shutdown = peerpods_runtime::shutdown::on_signal();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let readiness = Readiness::default();

    let reloader =
        ConfigReloader::start(args.config_dir.clone(), metrics.clone(), readiness.clone()).await?;
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some(ReloadingCert::load(cert, key)?),
        _ => {
            tracing::warn!("no --tls-cert/--tls-key: the gRPC port speaks plaintext");
            None
        }
    };
    let reviewer = match args.auth {
        AuthMode::None => {
            tracing::warn!(
                "--auth=none: callers are NOT authenticated; use this for local development only"
            );
            None
        }
        AuthMode::Tokenreview => {
            if args.allowed_callers.is_empty() {
                tracing::warn!("--allowed-callers is empty: every call will be refused");
            }
            for grant in args.allowed_callers.iter().filter(|g| g.is_unrestricted()) {
                tracing::warn!(caller = %grant.caller, "caller may call every method; name its methods (namespace/name=Method+Method)");
            }
            let client = kube::Client::try_default().await.map_err(|e| {
                provider_service::Error::AuthUnavailable {
                    message: format!("no Kubernetes client for TokenReview: {e}"),
                }
            })?;
            Some(Arc::new(TokenReviewer::new(
                client,
                args.audience.clone(),
                args.allowed_callers.clone(),
                metrics.clone(),
            )))
        }
    };

    let admin = AdminServer::bind(args.admin_listen, readiness.clone(), Arc::new(registry))
        .await
        .map_err(|e| provider_service::Error::Internal {
            message: e.to_string(),
        })?;
    let admin_task = tokio::spawn(admin.serve({
        let shutdown = shutdown.clone();
        async move { shutdown.cancelled().await }
    }));

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .map_err(|e| provider_service::Error::io(format!("binding {}", args.listen), e))?;
    let api = ProviderApi::new(reloader.registry(), metrics.clone());
    let reload_task = tokio::spawn(reloader.run(
        Duration::from_secs(args.reload_interval_seconds.max(1)),
        tls.clone(),
        shutdown.clone(),
    ));
    let served = serve(
        GrpcServer {
            listener,
            api,
            reviewer,
            tls,
            readiness,
        },
        shutdown.clone(),
    )
    .await;
    shutdown.cancel();
    let _ = reload_task.await;
    if let Ok(Err(e)) = admin_task.await {
        tracing::warn!(error = %e, "admin server stopped with an error");
    }
    served
}
