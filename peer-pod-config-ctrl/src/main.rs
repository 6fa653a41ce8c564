//! Wires flags and environment to the library. Every flag has an environment variable of the same meaning.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use peer_pod_config_ctrl::controller::{self, Settings};
use peer_pod_config_ctrl::metrics::Metrics;
use peerpods_runtime::admin::{AdminServer, Readiness};
use peerpods_runtime::client::ProviderClientConfig;
use peerpods_runtime::leader::LeaderConfig;
use peerpods_runtime::telemetry::{self, LogFormat};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Keeps a PeerPodConfig true: CAA DaemonSet, peer-pods webhook and kata.peerpods.io/vm on nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// Namespace of the owned objects (DaemonSet, webhook, Lease); PeerPodConfigs are acted on only here.
    #[arg(
        long,
        env = "PEERPODS_NAMESPACE",
        default_value = "confidential-containers-system"
    )]
    namespace: String,
    /// provider-service address, needed only for capacityFromProvider: https://host:port (TLS, needs
    /// --provider-ca) or http://host:port (local only).
    #[arg(long, env = "PROVIDER_ENDPOINT")]
    provider_endpoint: Option<String>,
    /// How to authenticate to provider-service: a projected ServiceAccount token, or nothing (local only).
    #[arg(long, env = "PROVIDER_AUTH", value_enum, default_value_t = Auth::Token)]
    provider_auth: Auth,
    /// PEM file with the CA of provider-service's certificate.
    #[arg(long, env = "PROVIDER_CA")]
    provider_ca: Option<PathBuf>,
    /// Name to verify provider-service's certificate against, when it differs from the endpoint host.
    #[arg(long, env = "PROVIDER_SERVER_NAME")]
    provider_server_name: Option<String>,
    /// Projected ServiceAccount token (audience provider-service); re-read when rotated.
    #[arg(
        long,
        env = "TOKEN_FILE",
        default_value = "/var/run/secrets/provider-service/token"
    )]
    token_file: PathBuf,
    /// provider-service as the CAA DaemonSet should call it (https://<service>.<namespace>.svc:<port>): CAA
    /// gets the endpoint, the CA and a projected token in PROVIDER_SERVICE_* variables. Unset: CAA is not wired.
    #[arg(long, env = "CAA_PROVIDER_ENDPOINT")]
    caa_provider_endpoint: Option<String>,
    /// Secret (in --namespace) whose ca.crt CAA trusts for provider-service; only that key is projected.
    #[arg(long, env = "CAA_PROVIDER_CA_SECRET")]
    caa_provider_ca_secret: Option<String>,
    /// Audience of the token CAA presents to provider-service.
    #[arg(
        long,
        env = "CAA_PROVIDER_AUDIENCE",
        default_value = "provider-service"
    )]
    caa_provider_audience: String,
    /// Name CAA verifies provider-service's certificate against, when it differs from the endpoint host.
    #[arg(long, env = "CAA_PROVIDER_SERVER_NAME")]
    caa_provider_server_name: Option<String>,
    /// Deadline of each provider-service call.
    #[arg(long, env = "PROVIDER_TIMEOUT", default_value = "30s", value_parser = duration)]
    provider_timeout: Duration,
    /// Only the replica holding the Lease acts (run 2 replicas with this on).
    #[arg(long, env = "LEADER_ELECT", default_value_t = false)]
    leader_elect: bool,
    /// Name of the Lease used for leader election.
    #[arg(long, env = "LEASE_NAME", default_value = "peer-pod-config-ctrl")]
    lease_name: String,
    /// Name of this replica (Lease holder, Event reporter); the Pod name in a cluster.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Address of the /healthz, /readyz and /metrics server.
    #[arg(long, env = "ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    admin_listen: SocketAddr,
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the PeerPodConfig CustomResourceDefinition as YAML and exit.
    Crd,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Auth {
    Token,
    None,
}

fn duration(text: &str) -> Result<Duration, String> {
    let signed: jiff::SignedDuration = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    Duration::try_from(signed).map_err(|_| format!("{text:?} is negative"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return match peer_pod_config_ctrl::crd::crd_yaml() {
            Ok(yaml) => {
                print!("{yaml}");
                ExitCode::SUCCESS
            }
            Err(error) => {
                eprintln!("{error}");
                ExitCode::FAILURE
            }
        };
    }
    let telemetry = match telemetry::init("peer-pod-config-ctrl", cli.log_format) {
        Ok(t) => t,
        Err(error) => {
            eprintln!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let result = serve(cli).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "peer-pod-config-ctrl failed");
            ExitCode::FAILURE
        }
    }
}

async fn serve(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let shutdown = peerpods_runtime::shutdown::on_signal();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::default();
    metrics.register(&mut registry);
    let readiness = Readiness::default();
    let admin = AdminServer::bind(cli.admin_listen, readiness.clone(), Arc::new(registry)).await?;
    let admin = tokio::spawn(admin.serve(shutdown.clone().cancelled_owned()));

    let client = kube::Client::try_default().await?;
    let provider = cli
        .provider_endpoint
        .as_ref()
        .map(|endpoint| {
            peerpods_runtime::client::connect(&ProviderClientConfig {
                endpoint: endpoint.clone(),
                ca_file: cli.provider_ca.clone(),
                tls_server_name: cli.provider_server_name.clone(),
                token_file: matches!(cli.provider_auth, Auth::Token)
                    .then(|| cli.token_file.clone()),
                timeout: Some(cli.provider_timeout),
            })
        })
        .transpose()?;
    let identity = cli
        .identity
        .clone()
        .unwrap_or_else(|| format!("peer-pod-config-ctrl-{}", std::process::id()));
    if cli
        .caa_provider_endpoint
        .as_deref()
        .is_some_and(|e| e.starts_with("https://"))
        && cli.caa_provider_ca_secret.is_none()
    {
        return Err(
            "--caa-provider-endpoint is https:// but --caa-provider-ca-secret is not set".into(),
        );
    }
    let caa_provider_service = cli.caa_provider_endpoint.clone().map(|endpoint| {
        peer_pod_config_ctrl::objects::ProviderServiceWiring {
            endpoint,
            ca_secret: cli.caa_provider_ca_secret.clone(),
            audience: cli.caa_provider_audience.clone(),
            server_name: cli.caa_provider_server_name.clone(),
        }
    });
    let settings = Settings {
        namespace: cli.namespace.clone(),
        provider,
        instance: Some(identity.clone()),
        caa_provider_service,
    };
    tracing::info!(identity, namespace = %cli.namespace, leader_elect = cli.leader_elect, "starting");
    readiness.set("controller", true, "running");
    let leader = cli
        .leader_elect
        .then(|| LeaderConfig::new(&cli.lease_name, &cli.namespace, &identity));
    let result = controller::run(
        client,
        settings,
        metrics,
        leader,
        shutdown.clone(),
        Some(readiness),
    )
    .await
    .map_err(Into::into);
    shutdown.cancel();
    admin.await??;
    result
}
