//! Wires flags and environment to the library. Every flag has an environment variable of the same meaning.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, ValueEnum};
use kube::runtime::events::Reporter;
use peerpod_ctrl::controller::{DEFAULT_API_WRITES, DEFAULT_CONCURRENCY, ReconcilerSettings};
use peerpod_ctrl::developer_mode::{self, DeveloperModeSettings};
use peerpod_ctrl::orphans::{OrphanCap, OrphanPolicy, OrphanSettings, parse_tag};
use peerpod_ctrl::provider::Provider;
use peerpod_ctrl::reverse::ReverseSettings;
use peerpod_ctrl::{Settings, metrics::Metrics};
use peerpods_provider_client::ProviderArgs;
use peerpods_runtime::args::{ControllerArgs, duration};
use peerpods_runtime::backoff::Backoff;
use peerpods_runtime::binary::{self, Wiring};

/// Where provider-service listens in local development; this controller cannot work without one.
const LOCAL_PROVIDER: &str = "http://127.0.0.1:50051";

const COMPONENT: &str = "peerpod-ctrl";

/// This binary as the runtime's [`binary::Controller::main`] runs it.
const CONTROLLER: binary::Controller<Metrics, peerpods_api::Error> = binary::Controller {
    component: COMPONENT,
    crd_yaml: peerpods_api::peerpod::crd_yaml,
    register_metrics: Metrics::register,
};

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Deletes the cloud VMs of deleted PeerPods, stale PeerPods of the same Pod, and orphan VMs",
    mut_arg("provider_endpoint", |a| a.default_value(LOCAL_PROVIDER))
)]
struct Cli {
    #[command(subcommand)]
    command: Option<binary::Command>,
    #[command(flatten)]
    provider: ProviderArgs,
    #[command(flatten)]
    shared: ControllerArgs,
    /// PeerPod reconciles in flight at once. Most of a cleanup waits for provider-service's answer, which
    /// costs a reconcile nothing but its place, so this is high; the API writes are bounded by --api-writes.
    #[arg(long, env = "CONCURRENCY", default_value_t = DEFAULT_CONCURRENCY)]
    concurrency: u16,
    /// Writes to the API server (finalizer releases, status) in flight at once across reconciles. Events are
    /// written apart, one at a time, behind the work they describe.
    #[arg(long, env = "API_WRITES", default_value_t = DEFAULT_API_WRITES,
          value_parser = clap::value_parser!(u16).range(1..))]
    api_writes: u16,
    /// Longest wait between retries of a failing PeerPod (the backoff cap).
    #[arg(long, env = "RETRY_MAX_DELAY", default_value = "5m", value_parser = duration)]
    retry_max_delay: Duration,
    /// This controller's namespace: holds the Lease and the orphan-VM Events (about its Namespace object).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
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
    /// With the delete policy: a scan of a provider finding more orphans than this deletes none of them.
    #[arg(long, env = "ORPHAN_DELETE_MAX", default_value_t = OrphanCap::default().max)]
    orphan_delete_max: usize,
    /// With the delete policy: a scan of a provider finding more orphans than this percentage of the VMs it
    /// listed deletes none of them (100 turns this check off).
    #[arg(long, env = "ORPHAN_DELETE_MAX_PERCENT", default_value_t = OrphanCap::default().max_percent,
          value_parser = clap::value_parser!(u8).range(0..=100))]
    orphan_delete_max_percent: u8,
    /// How often to check that the VMs of live PeerPods still exist (one ListInstances per provider in use);
    /// 0 turns the check off.
    #[arg(long, env = "REVERSE_SCAN_INTERVAL", default_value = "2m", value_parser = duration)]
    reverse_scan_interval: Duration,
    /// How long a live PeerPod's VM must stay unlisted before it is reported missing (covers a cloud's
    /// eventual consistency after create).
    #[arg(long, env = "REVERSE_GRACE", default_value = "5m", value_parser = duration)]
    reverse_grace: Duration,
    /// cloud-api-adaptor's ConfigMap, whose PODVM_DEVELOPER_MODE says whether CAA keeps failed pods' VMs for
    /// debugging: while it is on, those VMs are held, not deleted. Only this one ConfigMap is read.
    #[arg(long, env = "CAA_CONFIG_MAP", default_value = developer_mode::CAA_CONFIG_MAP)]
    caa_config_map: String,
    /// The namespace of that ConfigMap: cloud-api-adaptor's.
    #[arg(long, env = "CAA_NAMESPACE", default_value = developer_mode::CAA_NAMESPACE)]
    caa_namespace: String,
    /// The ConfigMap (in --namespace) where the number of PeerPods holding peer.pod/finalizer is published for
    /// the chart's uninstall protection, named as the ValidatingAdmissionPolicyBinding that reads it and owns
    /// it. Unset: not published.
    #[arg(long, env = "IN_USE_CONFIG_MAP")]
    in_use_config_map: Option<String>,
}

impl binary::ControllerCli for Cli {
    fn parts(&self) -> (Option<binary::Command>, &ControllerArgs, &str) {
        (self.command, &self.shared, &self.namespace)
    }
}

#[derive(ValueEnum, Clone, Copy, Debug)]
enum Policy {
    Report,
    Delete,
}

#[tokio::main]
async fn main() -> ExitCode {
    CONTROLLER.main(Cli::parse(), serve).await
}

async fn serve(cli: Cli, metrics: Metrics, wiring: Wiring) -> Result<(), binary::BoxError> {
    let provider_config = cli
        .provider
        .client_config()
        .ok_or("--provider-endpoint is required")?;
    let provider = Provider::connect(&provider_config)?;
    let settings = Settings {
        reconciler: ReconcilerSettings {
            concurrency: cli.concurrency,
            api_writes: cli.api_writes,
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
            cap: OrphanCap {
                max: cli.orphan_delete_max,
                max_percent: cli.orphan_delete_max_percent,
            },
        },
        reverse: ReverseSettings {
            interval: cli.reverse_scan_interval,
            grace: cli.reverse_grace,
        },
        developer_mode: DeveloperModeSettings {
            namespace: cli.caa_namespace.clone(),
            name: cli.caa_config_map.clone(),
        },
        in_use: cli
            .in_use_config_map
            .clone()
            .map(|name| peerpod_ctrl::in_use::InUseSettings {
                namespace: cli.namespace.clone(),
                name,
            }),
        reporter: Reporter {
            controller: COMPONENT.into(),
            instance: Some(wiring.identity.clone()),
        },
    };
    tracing::info!(identity = wiring.identity, endpoint = %provider_config.endpoint, leader_elect = wiring.leader.is_some(), "starting");
    peerpod_ctrl::run_until(
        wiring.client,
        provider,
        metrics,
        settings,
        wiring.leader,
        wiring.started.shutdown,
        Some(wiring.started.health),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use peerpods_runtime::args::unread_env;

    /// Every flag and environment variable the chart (deploy/), the Tiltfile and mk/ pass keeps working (the
    /// shared groups' variables are checked where the groups are defined), and the flags fit together.
    #[test]
    fn the_flags_and_variables_deployments_use_are_accepted() {
        let cli = Cli::try_parse_from([
            "peerpod-ctrl",
            "--provider-endpoint",
            "http://127.0.0.1:50051",
            "--provider-auth",
            "none",
            "--admin-listen",
            "127.0.0.1:18081",
            "--orphan-scan-interval",
            "30s",
            "--orphan-grace",
            "1m",
            "--retry-max-delay",
            "30s",
            "--leader-elect",
            "--lease-name",
            "peerpod-ctrl",
            "--lease-duration",
            "15s",
            "--lease-renew-before",
            "5s",
            "--namespace",
            "ns",
            "--identity",
            "pod-0",
            "--log-format",
            "json",
            "--caa-namespace",
            "caa",
            "--caa-config-map",
            "cm",
        ])
        .unwrap();
        assert_eq!(cli.retry_max_delay, Duration::from_secs(30));
        assert_eq!(
            (cli.caa_namespace.as_str(), cli.caa_config_map.as_str()),
            ("caa", "cm")
        );
        let lease = cli.shared.leader.config(COMPONENT, &cli.namespace).unwrap();
        assert_eq!(
            (lease.namespace.as_str(), lease.identity.as_str()),
            ("ns", "pod-0")
        );
        let unread = unread_env(
            &Cli::command(),
            "POD_NAMESPACE CONCURRENCY API_WRITES RETRY_MAX_DELAY ORPHAN_SCAN_INTERVAL \
             ORPHAN_GRACE ORPHAN_POLICY CLUSTER_TAG ORPHAN_DELETE_MAX \
             ORPHAN_DELETE_MAX_PERCENT CAA_NAMESPACE CAA_CONFIG_MAP",
        );
        assert!(unread.is_empty(), "not read: {unread:?}");
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["peerpod-ctrl"]).unwrap();
        let provider = cli.provider.client_config().unwrap();
        assert_eq!(provider.endpoint, LOCAL_PROVIDER);
        assert_eq!(provider.timeout, Some(Duration::from_secs(90)));
        assert_eq!(cli.shared.admin.admin_listen.to_string(), "0.0.0.0:8080");
        assert!(
            cli.shared
                .leader
                .config(COMPONENT, &cli.namespace)
                .is_none()
        );
        assert_eq!(
            (cli.orphan_delete_max, cli.orphan_delete_max_percent),
            (10, 50)
        );
        assert_eq!(
            (cli.concurrency, cli.api_writes),
            (DEFAULT_CONCURRENCY, DEFAULT_API_WRITES)
        );
        assert!(Cli::try_parse_from(["peerpod-ctrl", "--api-writes", "0"]).is_err());
        // cloud-api-adaptor's own defaults.
        assert_eq!(
            (cli.caa_namespace.as_str(), cli.caa_config_map.as_str()),
            ("confidential-containers-system", "peer-pods-cm")
        );
        assert!(
            Cli::try_parse_from(["peerpod-ctrl", "--orphan-delete-max-percent", "101"]).is_err()
        );
        let cli = Cli::try_parse_from(["peerpod-ctrl", "--leader-elect"]).unwrap();
        let lease = cli.shared.leader.config(COMPONENT, &cli.namespace).unwrap();
        assert_eq!(
            (lease.lease_name.as_str(), lease.namespace.as_str()),
            ("peerpod-ctrl", "default")
        );
    }
}
