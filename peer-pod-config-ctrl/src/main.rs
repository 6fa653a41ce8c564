//! Wires flags and environment to the library. Every flag has an environment variable of the same meaning.

use std::process::ExitCode;

use clap::Parser;
use peer_pod_config_ctrl::controller::{self, Settings};
use peer_pod_config_ctrl::metrics::Metrics;
use peer_pod_config_ctrl::nodes;
use peerpods_provider_client::ProviderArgs;
use peerpods_runtime::args::ControllerArgs;
use peerpods_runtime::binary::{self, Wiring};

const COMPONENT: &str = "peer-pod-config-ctrl";

/// This binary as the runtime's [`binary::Controller::main`] runs it.
const CONTROLLER: binary::Controller<Metrics, peerpods_api::Error> = binary::Controller {
    component: COMPONENT,
    crd_yaml: peerpods_api::peerpodconfig::crd_yaml,
    register_metrics: Metrics::register,
};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Keeps a PeerPodConfig true: CAA DaemonSet, peer-pods webhook and kata.peerpods.io/vm on nodes"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<binary::Command>,
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
    shared: ControllerArgs,
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
    /// The only ServiceAccount CAA's DaemonSet may run as (the chart's caa.serviceAccount.name): a PeerPodConfig
    /// whose spec.caa.serviceAccountName names another one is invalid (ServiceAccountNotAllowed) and renders
    /// nothing.
    #[arg(long, env = "CAA_SERVICE_ACCOUNT", default_value = "cloud-api-adaptor")]
    caa_service_account: String,
    /// The only ServiceAccount the webhook Deployment may run as (the chart's webhook.serviceAccount.name), for
    /// spec.webhook.serviceAccountName likewise.
    #[arg(
        long,
        env = "WEBHOOK_SERVICE_ACCOUNT",
        default_value = "peer-pods-webhook"
    )]
    webhook_service_account: String,
    /// Node patches per second after the burst, when capacity changes on many nodes (a limit change, a node pool
    /// joining): 100 rebalances 1,000 nodes in about 10 s and 5,000 in about 50 s; kubelets' own status updates
    /// share the API server's priority level with these patches. Meanwhile the PeerPodConfig's CapacityAdvertised
    /// condition says "applying capacity: n of m nodes".
    #[arg(
        long,
        env = "NODE_PATCHES_PER_SECOND",
        default_value_t = nodes::PATCHES_PER_SECOND,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    node_patches_per_second: u32,
    /// Node patches that may go at once before --node-patches-per-second applies.
    #[arg(
        long,
        env = "NODE_PATCH_BURST",
        default_value_t = nodes::PATCH_BURST,
        value_parser = clap::value_parser!(u32).range(1..)
    )]
    node_patch_burst: u32,
}

impl binary::ControllerCli for Cli {
    fn parts(&self) -> (Option<binary::Command>, &ControllerArgs, &str) {
        (self.command, &self.shared, &self.namespace)
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    CONTROLLER.main(Cli::parse(), serve).await
}

async fn serve(cli: Cli, metrics: Metrics, wiring: Wiring) -> Result<(), binary::BoxError> {
    let provider = cli
        .provider
        .client_config()
        .map(|config| peerpods_provider_client::connect(&config))
        .transpose()?;
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
        instance: Some(wiring.identity.clone()),
        caa_provider_service,
        service_accounts: peer_pod_config_ctrl::validate::AllowedServiceAccounts {
            caa: cli.caa_service_account.clone(),
            webhook: cli.webhook_service_account.clone(),
        },
        node_patch_pace: nodes::Pace {
            per_second: cli.node_patches_per_second,
            burst: cli.node_patch_burst,
        },
    };
    tracing::info!(identity = wiring.identity, namespace = %cli.namespace, leader_elect = wiring.leader.is_some(), "starting");
    let Wiring {
        started,
        client,
        leader,
        ..
    } = wiring;
    controller::run(
        client,
        settings,
        metrics,
        leader,
        started.shutdown,
        Some(started.health),
    )
    .await
    .map_err(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use peerpods_runtime::args::unread_env;
    use std::time::Duration;

    /// Every flag and environment variable the chart (deploy/), the Tiltfile and mk/ pass keeps working (the
    /// shared groups' variables are checked where the groups are defined), and the flags fit together.
    #[test]
    fn the_flags_and_variables_deployments_use_are_accepted() {
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
            "--caa-service-account",
            "caa",
            "--webhook-service-account",
            "hook",
            "--node-patches-per-second",
            "20",
            "--node-patch-burst",
            "5",
        ])
        .unwrap();
        assert_eq!(cli.provider.client_config().unwrap().token_file, None);
        let lease = cli.shared.leader.config(COMPONENT, &cli.namespace).unwrap();
        assert_eq!(
            (lease.lease_name.as_str(), lease.namespace.as_str()),
            ("peer-pod-config-ctrl", "pp-system")
        );
        let unread = unread_env(
            &Cli::command(),
            "PEERPODS_NAMESPACE CAA_PROVIDER_ENDPOINT CAA_PROVIDER_CA_SECRET \
             CAA_PROVIDER_AUDIENCE CAA_PROVIDER_SERVER_NAME CAA_SERVICE_ACCOUNT WEBHOOK_SERVICE_ACCOUNT \
             NODE_PATCHES_PER_SECOND NODE_PATCH_BURST",
        );
        assert_eq!((cli.node_patches_per_second, cli.node_patch_burst), (20, 5));
        assert!(unread.is_empty(), "not read: {unread:?}");
        Cli::command().debug_assert();
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
        // The chart's and the PeerPodConfig's defaults.
        assert_eq!(
            peer_pod_config_ctrl::validate::AllowedServiceAccounts {
                caa: cli.caa_service_account.clone(),
                webhook: cli.webhook_service_account.clone(),
            },
            peer_pod_config_ctrl::validate::AllowedServiceAccounts::default()
        );
        assert_eq!(cli.shared.admin.admin_listen.to_string(), "0.0.0.0:8080");
        assert_eq!(
            nodes::Pace {
                per_second: cli.node_patches_per_second,
                burst: cli.node_patch_burst,
            },
            nodes::Pace::default()
        );
        assert!(
            Cli::try_parse_from(["peer-pod-config-ctrl", "--node-patches-per-second", "0"])
                .is_err(),
            "a pace of zero would never patch"
        );
        let cli = Cli::try_parse_from(["peer-pod-config-ctrl", "--leader-elect"]).unwrap();
        let lease = cli.shared.leader.config(COMPONENT, &cli.namespace).unwrap();
        assert_eq!(lease.lease_name, "peer-pod-config-ctrl");
        assert_eq!(
            (lease.lease_duration, lease.renew_before),
            (Duration::from_secs(15), Duration::from_secs(5))
        );
    }
}
