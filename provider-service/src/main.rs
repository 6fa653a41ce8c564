//! provider-service: wires flags (each also an environment variable) to the library.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use peerpods_runtime::args::{AdminArgs, duration};
use provider_service::auth::Grant;
use provider_service::deletes::DeleteSettings;
use provider_service::service::{CallerAuth, Listen, Options};

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum AuthMode {
    /// Validate callers' ServiceAccount tokens with the TokenReview API.
    Tokenreview,
    /// No caller authentication. Local development only.
    None,
}

/// The gRPC service that alone holds cloud credentials and deletes peer-pod VMs.
#[derive(Debug, Parser)]
#[command(version, mut_arg("admin_listen", |a| a.default_value("0.0.0.0:8081")))]
struct Args {
    /// gRPC address.
    #[arg(long, env = "LISTEN", default_value = "0.0.0.0:50051")]
    listen: SocketAddr,
    // Admin server (/healthz, /readyz, /metrics; port 8081 here), log format and OTLP export, as every service.
    #[command(flatten)]
    admin: AdminArgs,
    /// Directories whose files are configuration keys (CLOUD_PROVIDER, AWS_REGION, LIBVIRT_URI,
    /// ...), e.g. the mounted peer-pods-cm ConfigMap and peer-pods-secret Secret. Later ones win;
    /// the environment fills in keys no file sets. Without CLOUD_PROVIDER the service serves
    /// nothing and is not ready (unless --development).
    #[arg(long, env = "CONFIG_DIR", value_delimiter = ',')]
    config_dir: Vec<PathBuf>,
    /// Local development only: without CLOUD_PROVIDER, serve the embedded default (libvirt's
    /// in-memory test driver, LIBVIRT_URI=test:///default), and accept test: libvirt URIs. Off,
    /// an unconfigured service is not ready and refuses every call (ProviderNotConfigured).
    #[arg(long, env = "PROVIDER_SERVICE_DEVELOPMENT")]
    development: bool,
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
    /// How long a DeleteInstance call waits for its delete before answering "in progress" (the
    /// caller's deadline shortens it); the delete runs on either way.
    #[arg(long, env = "DELETE_ANSWER_WITHIN", default_value = "20s", value_parser = duration)]
    delete_answer_within: Duration,
    /// On SIGTERM: how long to wait for the deletes still running, after turning not ready and
    /// refusing new ones. The chart's terminationGracePeriodSeconds must exceed it.
    #[arg(long, env = "SHUTDOWN_GRACE", default_value = "340s", value_parser = duration)]
    shutdown_grace: Duration,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let telemetry = args.admin.init_telemetry("provider-service");
    peerpods_runtime::service::run("provider-service", telemetry, run(args)).await
}

async fn run(args: Args) -> Result<(), provider_service::Error> {
    let tls = match (args.tls_cert, args.tls_key) {
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => None,
    };
    let auth = match args.auth {
        AuthMode::None => CallerAuth::None,
        AuthMode::Tokenreview => CallerAuth::TokenReview {
            client: None,
            audience: args.audience,
            grants: args.allowed_callers,
        },
    };
    let options = Options {
        grpc: Listen::Addr(args.listen),
        admin: Some(Listen::Addr(args.admin.admin_listen)),
        secure_metrics: args
            .admin
            .secure_metrics()
            .await
            .map_err(|e| provider_service::Error::internal_from("secure metrics port", e))?,
        config_dirs: args.config_dir,
        development: args.development,
        reload_interval: Duration::from_secs(args.reload_interval_seconds.max(1)),
        tls,
        auth,
    };
    let deletes = DeleteSettings {
        answer_within: args.delete_answer_within,
        drain_grace: args.shutdown_grace,
        ..DeleteSettings::default()
    };
    provider_service::service::start_with(options, deletes, peerpods_runtime::shutdown::on_signal())
        .await?
        .wait()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_admin_port_stays_8081() {
        Args::command().debug_assert();
        let args = Args::try_parse_from(["provider-service", "--log-format", "json"]).unwrap();
        assert_eq!(args.admin.admin_listen.to_string(), "0.0.0.0:8081");
        assert!(!args.development, "development mode is never the default");
        let defaults = DeleteSettings::default();
        assert_eq!(args.delete_answer_within, defaults.answer_within);
        assert_eq!(args.shutdown_grace, defaults.drain_grace);
        let dev = Args::try_parse_from(["provider-service", "--development"]).unwrap();
        assert!(dev.development);
    }
}
