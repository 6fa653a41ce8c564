//! Wires flags and environment to the library. Every flag has an environment variable of the same meaning.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand, ValueEnum};
use kube::runtime::events::Reporter;
use peerpod_ctrl::decide::Backoff;
use peerpod_ctrl::orphans::{OrphanPolicy, OrphanSettings, parse_tag};
use peerpod_ctrl::provider::{Provider, ProviderClientConfig};
use peerpod_ctrl::reconcile::ReconcilerSettings;
use peerpod_ctrl::{Settings, metrics::Metrics};
use peerpods_runtime::admin::{AdminServer, Readiness};
use peerpods_runtime::leader::LeaderConfig;
use peerpods_runtime::telemetry::{self, LogFormat};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Deletes the cloud VMs of deleted PeerPods, stale PeerPods of the same Pod, and orphan VMs"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    /// provider-service address: https://host:port (TLS, needs --provider-ca) or http://host:port (local only).
    #[arg(
        long,
        env = "PROVIDER_ENDPOINT",
        default_value = "http://127.0.0.1:50051"
    )]
    provider_endpoint: String,
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
    /// Deadline of each provider-service call.
    #[arg(long, env = "PROVIDER_TIMEOUT", default_value = "60s", value_parser = duration)]
    provider_timeout: Duration,
    /// PeerPod reconciles in flight at once.
    #[arg(long, env = "CONCURRENCY", default_value_t = 32)]
    concurrency: u16,
    /// Longest wait between retries of a failing PeerPod (the backoff cap).
    #[arg(long, env = "RETRY_MAX_DELAY", default_value = "5m", value_parser = duration)]
    retry_max_delay: Duration,
    /// Only the replica holding the Lease acts (run 2 replicas with this on).
    #[arg(long, env = "LEADER_ELECT", default_value_t = false)]
    leader_elect: bool,
    /// Name of the Lease used for leader election.
    #[arg(long, env = "LEASE_NAME", default_value = "peerpod-ctrl")]
    lease_name: String,
    /// Validity of the Lease after the last renewal (how long a crashed leader blocks the other replica).
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = duration)]
    lease_duration: Duration,
    /// How long before expiry the leader renews the Lease.
    #[arg(long, env = "LEASE_RENEW_BEFORE", default_value = "5s", value_parser = duration)]
    lease_renew_before: Duration,
    /// This controller's namespace: holds the Lease, and its Namespace object receives orphan-VM Events.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Name of this replica (Lease holder, Event reporter); the Pod name in a cluster.
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// How often to look for VMs without a PeerPod.
    #[arg(long, env = "ORPHAN_SCAN_INTERVAL", default_value = "10m", value_parser = duration)]
    orphan_scan_interval: Duration,
    /// How old an untracked VM must be before it counts as an orphan (covers CAA's create window).
    #[arg(long, env = "ORPHAN_GRACE", default_value = "30m", value_parser = duration)]
    orphan_grace: Duration,
    /// What to do with orphan VMs.
    #[arg(long, env = "ORPHAN_POLICY", value_enum, default_value_t = Policy::Report)]
    orphan_policy: Policy,
    /// KEY=VALUE tag carried by this cluster's VMs. Without it no orphan scan runs.
    #[arg(long, env = "CLUSTER_TAG")]
    cluster_tag: Option<String>,
    /// Address of the /healthz, /readyz and /metrics server.
    #[arg(long, env = "ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    admin_listen: SocketAddr,
    /// Log line format.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the PeerPod CustomResourceDefinition as YAML and exit.
    Crd,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Auth {
    Token,
    None,
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Policy {
    Report,
    Delete,
}

fn duration(text: &str) -> Result<Duration, String> {
    let signed: jiff::SignedDuration = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    Duration::try_from(signed).map_err(|_| format!("{text:?} is negative"))
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return match peerpod_ctrl::crd::crd_yaml() {
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
    let telemetry = match telemetry::init("peerpod-ctrl", cli.log_format) {
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
            tracing::error!(%error, "peerpod-ctrl failed");
            ExitCode::FAILURE
        }
    }
}

async fn serve(cli: Cli) -> Result<(), Box<dyn std::error::Error>> {
    let shutdown = peerpods_runtime::shutdown::on_signal();
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let readiness = Readiness::default();
    let admin = AdminServer::bind(cli.admin_listen, readiness.clone(), Arc::new(registry)).await?;
    let admin = tokio::spawn(admin.serve(shutdown.clone().cancelled_owned()));

    let client = kube::Client::try_default().await?;
    let provider = Provider::connect(&ProviderClientConfig {
        endpoint: cli.provider_endpoint.clone(),
        ca_file: cli.provider_ca.clone(),
        tls_server_name: cli.provider_server_name.clone(),
        token_file: matches!(cli.provider_auth, Auth::Token).then(|| cli.token_file.clone()),
        timeout: Some(cli.provider_timeout),
    })?;
    let identity = cli
        .identity
        .clone()
        .unwrap_or_else(|| format!("peerpod-ctrl-{}", std::process::id()));
    let settings = Settings {
        reconciler: ReconcilerSettings {
            concurrency: cli.concurrency,
            backoff: Backoff {
                cap: cli.retry_max_delay,
                ..Backoff::default()
            },
        },
        orphans: OrphanSettings {
            interval: cli.orphan_scan_interval,
            grace: cli.orphan_grace,
            policy: match cli.orphan_policy {
                Policy::Report => OrphanPolicy::Report,
                Policy::Delete => OrphanPolicy::Delete,
            },
            cluster_tag: cli.cluster_tag.as_deref().map(parse_tag).transpose()?,
            event_namespace: cli.namespace.clone(),
        },
        reporter: Reporter {
            controller: "peerpod-ctrl".into(),
            instance: Some(identity.clone()),
        },
    };
    let leader = cli.leader_elect.then(|| LeaderConfig {
        lease_duration: cli.lease_duration,
        renew_before: cli.lease_renew_before,
        ..LeaderConfig::new(&cli.lease_name, &cli.namespace, &identity)
    });
    tracing::info!(identity, endpoint = %cli.provider_endpoint, leader_elect = cli.leader_elect, "starting");
    let result = peerpod_ctrl::run_until(
        client,
        provider,
        metrics,
        settings,
        leader,
        shutdown.clone(),
        Some(readiness),
    )
    .await;
    shutdown.cancel();
    admin.await??;
    Ok(result?)
}
