//! Wires flags and environment to the library. Every flag has an environment variable of the same meaning.

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use peer_pod_config_ctrl::controller::{self, Settings};
use peer_pod_config_ctrl::metrics::Metrics;
use peerpods_provider_client::ProviderArgs;
use peerpods_runtime::args::{AdminArgs, HealthArgs, LeaderArgs};
use peerpods_runtime::binary::{self, Started};

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
    // provider-service, needed only for capacityFromProvider: without --provider-endpoint the limit alone decides.
    #[command(flatten)]
    provider: ProviderArgs,
    #[command(flatten)]
    leader: LeaderArgs,
    #[command(flatten)]
    admin: AdminArgs,
    #[command(flatten)]
    health: HealthArgs,
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
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print the PeerPodConfig CustomResourceDefinition as YAML and exit.
    Crd,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(Command::Crd) = cli.command {
        return binary::print_crd(peer_pod_config_ctrl::crd::crd_yaml());
    }
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut registry);
    let (admin, health) = (cli.admin.clone(), cli.health.clone());
    binary::run_controller(COMPONENT, &admin, &health, registry, |started| {
        serve(cli, metrics, started)
    })
    .await
}

async fn serve(
    cli: Cli,
    metrics: Metrics,
    Started { shutdown, health }: Started,
) -> Result<(), Box<dyn std::error::Error>> {
    let client = kube::Client::try_default().await?;
    let provider = cli
        .provider
        .client_config()
        .map(|config| peerpods_provider_client::connect(&config))
        .transpose()?;
    let identity = cli.leader.identity(COMPONENT);
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
    let leader = cli.leader.config(COMPONENT, &cli.namespace);
    tracing::info!(identity, namespace = %cli.namespace, leader_elect = leader.is_some(), "starting");
    controller::run(client, settings, metrics, leader, shutdown, Some(health))
        .await
        .map_err(Into::into)
}

const COMPONENT: &str = "peer-pod-config-ctrl";

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use std::time::Duration;

    #[test]
    fn flags_fit_together() {
        Cli::command().debug_assert();
    }

    /// Every flag and environment variable the chart (deploy/), the Tiltfile and mk/ pass keeps working.
    #[test]
    fn the_flags_and_variables_deployments_use_are_accepted() {
        let command = Cli::command();
        let envs: Vec<String> = command
            .get_arguments()
            .filter_map(|a| a.get_env())
            .map(|e| e.to_string_lossy().into_owned())
            .collect();
        for env in [
            "PEERPODS_NAMESPACE",
            "PROVIDER_ENDPOINT",
            "PROVIDER_AUTH",
            "PROVIDER_CA",
            "PROVIDER_SERVER_NAME",
            "TOKEN_FILE",
            "PROVIDER_TIMEOUT",
            "CAA_PROVIDER_ENDPOINT",
            "CAA_PROVIDER_CA_SECRET",
            "CAA_PROVIDER_AUDIENCE",
            "CAA_PROVIDER_SERVER_NAME",
            "ADMIN_LISTEN",
            "LEADER_ELECT",
            "LEASE_NAME",
            "LOG_FORMAT",
            "POD_NAME",
        ] {
            assert!(envs.iter().any(|e| e == env), "{env} is not read");
        }
        let cli = Cli::try_parse_from([
            "peer-pod-config-ctrl",
            "--admin-listen",
            "127.0.0.1:18082",
            "--provider-endpoint",
            "http://127.0.0.1:50051",
            "--provider-auth",
            "none",
            "--caa-provider-endpoint",
            "http://127.0.0.1:50051",
            "--leader-elect",
            "--lease-name",
            "peer-pod-config-ctrl",
            "--identity",
            "pod-0",
            "--namespace",
            "pp-system",
        ])
        .unwrap();
        assert_eq!(cli.provider.client_config().unwrap().token_file, None);
        let lease = cli.leader.config(COMPONENT, &cli.namespace).unwrap();
        assert_eq!(
            (lease.lease_name.as_str(), lease.namespace.as_str()),
            ("peer-pod-config-ctrl", "pp-system")
        );
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["peer-pod-config-ctrl"]).unwrap();
        assert!(
            cli.provider.client_config().is_none(),
            "provider-service only when asked for"
        );
        assert_eq!(cli.provider.provider_timeout, Duration::from_secs(90));
        assert_eq!(cli.namespace, "confidential-containers-system");
        assert_eq!(cli.admin.admin_listen.to_string(), "0.0.0.0:8080");
        let cli = Cli::try_parse_from(["peer-pod-config-ctrl", "--leader-elect"]).unwrap();
        let lease = cli.leader.config(COMPONENT, &cli.namespace).unwrap();
        assert_eq!(lease.lease_name, "peer-pod-config-ctrl");
        assert_eq!(
            (lease.lease_duration, lease.renew_before),
            (Duration::from_secs(15), Duration::from_secs(5))
        );
    }
}
