//! Command-line argument groups shared by the binaries, each flattened into a binary's clap `Parser`
//! (`#[command(flatten)]`), so every service reads the same flag and environment variable the same way. Every
//! flag has an environment variable of the same meaning (the Helm chart sets those).
//!
//! - [`AdminArgs`]: admin server address, log format, OTLP endpoint and [`SecureMetricsArgs`] (every service but
//!   the webhook, which keeps upstream's flags for the others and takes [`SecureMetricsArgs`] alone).
//! - [`LeaderArgs`]: leader election on a Lease (the controllers; feature `controller`).
//! - [`HealthArgs`]: how long a controller's watch may make no progress before `/healthz` fails.
//! - [`ControllerArgs`]: the three above, as every controller takes them.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::Error;
use crate::health::Liveness;
#[cfg(feature = "controller")]
use crate::leader::LeaderConfig;
use crate::secure_metrics::SecureMetrics;
use crate::telemetry::{self, LogFormat, Telemetry};

/// Parses `30s`, `5m`, `1h30m` or ISO 8601 (`PT5M`); negative durations are refused.
pub fn duration(text: &str) -> Result<Duration, String> {
    let signed: jiff::SignedDuration = text.parse().map_err(|e| format!("{text:?}: {e}"))?;
    Duration::try_from(signed).map_err(|_| format!("{text:?} is negative"))
}

/// Admin server and telemetry. The admin port defaults to 8080; provider-service moves it to 8081 with
/// `#[command(mut_arg("admin_listen", ...))]` so both keep the port they always had.
#[derive(clap::Args, Debug, Clone)]
pub struct AdminArgs {
    /// Address of the /healthz, /readyz and /metrics server.
    #[arg(long, env = "ADMIN_LISTEN", default_value = "0.0.0.0:8080")]
    pub admin_listen: SocketAddr,
    /// Log line format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    pub log_format: LogFormat,
    /// OTLP/gRPC collector to export trace spans to (e.g. http://otel-collector:4317); unset: no export.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    #[command(flatten)]
    pub metrics: SecureMetricsArgs,
}

/// `/metrics` behind TLS, TokenReview and SubjectAccessReview ([`crate::secure_metrics`]).
#[derive(clap::Args, Debug, Clone)]
pub struct SecureMetricsArgs {
    /// Serve /metrics only over TLS on --metrics-listen, to callers whose bearer token passes a TokenReview
    /// and a SubjectAccessReview for `get` on `/metrics`; /healthz and /readyz stay on the admin port.
    #[arg(long, env = "METRICS_SECURE", default_value_t = false)]
    pub metrics_secure: bool,
    /// Address of the secure metrics port (with --metrics-secure).
    #[arg(long, env = "METRICS_LISTEN", default_value = "0.0.0.0:8443")]
    pub metrics_listen: SocketAddr,
    /// Directory holding tls.crt and tls.key for the secure metrics port; unset: a self-signed certificate
    /// made at start.
    #[arg(long, env = "METRICS_CERT_DIR")]
    pub metrics_cert_dir: Option<PathBuf>,
}

impl AdminArgs {
    /// Installs logging and, with an OTLP endpoint, span export for `service_name`.
    pub fn init_telemetry(&self, service_name: &'static str) -> Result<Telemetry, Error> {
        telemetry::init_with(
            service_name,
            self.log_format,
            self.otlp_endpoint.as_deref().filter(|e| !e.is_empty()),
        )
    }

    /// The secure metrics port ([`SecureMetricsArgs::secure_metrics`]).
    pub async fn secure_metrics(&self) -> Result<Option<SecureMetrics>, Error> {
        self.metrics.secure_metrics().await
    }
}

impl SecureMetricsArgs {
    /// The secure metrics port, bound, with `--metrics-secure` (its callers reviewed through the in-cluster or
    /// kubeconfig client); `None` without it.
    pub async fn secure_metrics(&self) -> Result<Option<SecureMetrics>, Error> {
        if !self.metrics_secure {
            return Ok(None);
        }
        let client = kube::Client::try_default()
            .await
            .map_err(|e| Error::MetricsAuth {
                message: "no Kubernetes client to review scrapes with".into(),
                source: Some(Box::new(e)),
            })?;
        SecureMetrics::bind(
            self.metrics_listen,
            self.metrics_cert_dir.as_deref(),
            client,
        )
        .await
        .map(Some)
    }
}

/// Leader election (see [`crate::leader`]).
#[cfg(feature = "controller")]
#[derive(clap::Args, Debug, Clone)]
pub struct LeaderArgs {
    /// Only the replica holding the Lease acts (run 2 replicas with this on).
    #[arg(long, env = "LEADER_ELECT", default_value_t = false)]
    pub leader_elect: bool,
    /// Name of the Lease used for leader election [default: the controller's name].
    #[arg(long, env = "LEASE_NAME")]
    pub lease_name: Option<String>,
    /// Namespace of the Lease [default: the controller's namespace].
    #[arg(long, env = "LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,
    /// Validity of the Lease after the last renewal (how long a crashed leader blocks the other replica).
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = duration)]
    pub lease_duration: Duration,
    /// How long before expiry the leader renews the Lease.
    #[arg(long, env = "LEASE_RENEW_BEFORE", default_value = "5s", value_parser = duration)]
    pub lease_renew_before: Duration,
    /// Name of this replica (Lease holder, Event reporter); the Pod name in a cluster
    /// [default: <controller>-<process id>].
    #[arg(long, env = "POD_NAME")]
    pub identity: Option<String>,
}

#[cfg(feature = "controller")]
impl LeaderArgs {
    /// This replica's name.
    pub fn identity(&self, component: &str) -> String {
        self.identity
            .clone()
            .unwrap_or_else(|| format!("{component}-{}", std::process::id()))
    }

    /// The Lease to compete for, or `None` without `--leader-elect`. `namespace` is the controller's own, used
    /// unless `--lease-namespace` is set.
    pub fn config(&self, component: &str, namespace: &str) -> Option<LeaderConfig> {
        self.leader_elect.then(|| LeaderConfig {
            lease_duration: self.lease_duration,
            renew_before: self.lease_renew_before,
            ..LeaderConfig::new(
                self.lease_name.as_deref().unwrap_or(component),
                self.lease_namespace.as_deref().unwrap_or(namespace),
                self.identity(component),
            )
        })
    }
}

/// The flags every controller shares, flattened into each controller's `Cli` in one piece.
#[cfg(feature = "controller")]
#[derive(clap::Args, Debug, Clone)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub leader: LeaderArgs,
    #[command(flatten)]
    pub admin: AdminArgs,
    #[command(flatten)]
    pub health: HealthArgs,
}

/// Of `names` (separated by white space), those no flag of `command` reads from the environment: a binary's
/// tests check against it that every variable its deployments set is still read.
pub fn unread_env<'a>(command: &clap::Command, names: &'a str) -> Vec<&'a str> {
    let read: Vec<_> = command
        .get_arguments()
        .filter_map(|a| a.get_env())
        .collect();
    names
        .split_whitespace()
        .filter(|name| !read.iter().any(|env| env == name))
        .collect()
}

/// Liveness of a controller's watches (see [`crate::health`]).
#[derive(clap::Args, Debug, Clone)]
pub struct HealthArgs {
    /// /readyz turns false when a watch made no progress (no event, no heartbeat from the API server) for this
    /// long, and /healthz fails when a local loop (the reconcile loop's watchdog) made none for this long.
    #[arg(long, env = "WATCH_STALL_TIMEOUT", default_value = "3m", value_parser = duration)]
    pub watch_stall_timeout: Duration,
}

impl HealthArgs {
    pub fn liveness(&self) -> Liveness {
        Liveness::new(self.watch_stall_timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    #[cfg(feature = "controller")]
    use clap::Parser;

    #[cfg(feature = "controller")]
    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        shared: ControllerArgs,
    }

    #[cfg(feature = "controller")]
    #[test]
    fn the_groups_fit_together() {
        use clap::CommandFactory;
        Cli::command().debug_assert();
    }

    /// Every variable the chart (deploy/), the Tiltfile and mk/ set for a controller's shared flags is read.
    #[cfg(feature = "controller")]
    #[test]
    fn the_variables_deployments_set_are_read() {
        use clap::CommandFactory;
        let unread = unread_env(
            &Cli::command(),
            "ADMIN_LISTEN LOG_FORMAT LEADER_ELECT LEASE_NAME LEASE_DURATION \
             LEASE_RENEW_BEFORE POD_NAME",
        );
        assert!(unread.is_empty(), "not read: {unread:?}");
        assert_eq!(
            unread_env(&Cli::command(), "ADMIN_LISTEN NOT_A_FLAG"),
            ["NOT_A_FLAG"]
        );
    }

    #[cfg(feature = "controller")]
    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.shared.admin.admin_listen.to_string(), "0.0.0.0:8080");
        assert_eq!(cli.shared.admin.log_format, LogFormat::Text);
        assert!(cli.shared.leader.config("peerpod-ctrl", "ns").is_none());
        assert_eq!(
            cli.shared.health.watch_stall_timeout,
            Duration::from_secs(180)
        );
    }

    #[cfg(feature = "controller")]
    #[test]
    fn lease_defaults_to_the_controller_and_its_namespace() {
        let cli = Cli::try_parse_from(["x", "--leader-elect", "--identity", "pod-0"]).unwrap();
        let lease = cli
            .shared
            .leader
            .config("peer-pod-config-ctrl", "pp-system")
            .unwrap();
        assert_eq!(
            (
                lease.lease_name.as_str(),
                lease.namespace.as_str(),
                lease.identity.as_str()
            ),
            ("peer-pod-config-ctrl", "pp-system", "pod-0")
        );
        assert_eq!(lease.lease_duration, Duration::from_secs(15));
        let cli = Cli::try_parse_from([
            "x",
            "--leader-elect",
            "--lease-name",
            "mine",
            "--lease-namespace",
            "elsewhere",
            "--lease-duration",
            "20s",
            "--lease-renew-before",
            "4s",
        ])
        .unwrap();
        let lease = cli.shared.leader.config("peerpod-ctrl", "ns").unwrap();
        assert_eq!(
            (lease.lease_name.as_str(), lease.namespace.as_str()),
            ("mine", "elsewhere")
        );
        assert_eq!(lease.renew_before, Duration::from_secs(4));
        assert!(lease.identity.starts_with("peerpod-ctrl-"));
    }

    #[test]
    fn durations_parse_and_negative_ones_are_refused() {
        assert_eq!(duration("5m"), Ok(Duration::from_secs(300)));
        assert_eq!(duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert!(duration("-5s").is_err());
        assert!(duration("soon").is_err());
    }
}
