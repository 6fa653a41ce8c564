//! Wires flags and environment to the library. The environment variables and flags are the upstream webhook's,
//! so the Deployment peer-pod-config-ctrl renders (and upstream's manifests) run this image unchanged.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use peerpods_runtime::args::{SecureMetricsArgs, duration};
use peerpods_runtime::telemetry::{self, LogFormat};
use peerpods_webhook::listen::ListenAddr;
use peerpods_webhook::mutation::{DEFAULT_EXTENDED_RESOURCE, DEFAULT_RUNTIME_CLASS, Target};
use peerpods_webhook::server::{
    self, AdmissionLimits, CERT_POLL_INTERVAL, DEFAULT_CERT_DIR, Options,
};
use peerpods_webhook::tls::TlsVersion;

const COMPONENT: &str = "peerpods-webhook";

#[derive(Parser, Debug)]
#[command(
    version,
    about = "Peer-pods mutating admission webhook: peer pods request kata.peerpods.io/vm, their size goes to annotations"
)]
struct Cli {
    /// Runtime class of peer pods, the only pods changed; empty means kata-remote.
    #[arg(long, env = "TARGET_RUNTIMECLASS", default_value = DEFAULT_RUNTIME_CLASS)]
    target_runtime_class: String,
    /// Extended resource a peer pod's first container requests one of (it counts peer-pod VMs on a node).
    #[arg(long, env = "POD_VM_EXTENDED_RESOURCE", default_value = DEFAULT_EXTENDED_RESOURCE)]
    pod_vm_extended_resource: String,
    /// Accepted, not used. peer-pod-config-ctrl passes its PeerPodConfig's instanceType here, as upstream's
    /// controller does, but upstream's webhook no longer uses it either: cloud-api-adaptor chooses the instance
    /// type from the size annotations and its own configuration.
    #[arg(long, env = "POD_VM_INSTANCE_TYPE", hide = true)]
    pod_vm_instance_type: Option<String>,
    /// HTTPS address of the webhook: `:port` (every interface) or `ip:port`.
    #[arg(long, env = "WEBHOOK_BIND_ADDRESS", default_value = ":9443")]
    webhook_bind_address: ListenAddr,
    /// Directory with the serving certificate, `tls.crt` and `tls.key`; re-read when they change.
    #[arg(long, env = "CERT_DIR", default_value = DEFAULT_CERT_DIR)]
    cert_dir: PathBuf,
    /// Plain-HTTP address of /healthz, /readyz and (without --metrics-secure) /metrics: `:port`, `ip:port`, or 0
    /// for none (secure metrics included).
    #[arg(long, env = "HEALTH_PROBE_BIND_ADDRESS", default_value = ":8081")]
    health_probe_bind_address: ListenAddr,
    /// Lowest TLS version the webhook port accepts.
    #[arg(long, env = "TLS_MIN_VERSION", value_enum, default_value_t = TlsVersion::Tls12)]
    tls_min_version: TlsVersion,
    /// TLS 1.2 cipher suites the webhook port allows, comma-separated Go names (TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    /// ...); unset allows every suite it implements. Not allowed with VersionTLS13, as upstream.
    #[arg(long, env = "TLS_CIPHER_SUITES", value_delimiter = ',')]
    tls_cipher_suites: Vec<String>,
    /// How long reading an admission request's body may take once its share of the admission budget is held: a
    /// client sending slowly must not keep the budget. Keep it within the webhook configuration's timeoutSeconds.
    #[arg(long, env = "BODY_READ_TIMEOUT", default_value = "10s", value_parser = duration)]
    body_read_timeout: Duration,
    /// Log line format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
    /// OTLP/gRPC collector to export trace spans to (e.g. http://otel-collector:4317); unset: no export.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    otlp_endpoint: Option<String>,
    /// `--metrics-secure`, `--metrics-listen`, `--metrics-cert-dir`: the same as every other service's.
    #[command(flatten)]
    metrics: SecureMetricsArgs,
    // Upstream's manifests pass these two; accepted so they keep working. Every replica serves (a webhook has
    // nothing to lead), and /metrics is on the health probe address or, with --metrics-secure, --metrics-listen.
    #[arg(long, hide = true)]
    leader_elect: bool,
    #[arg(long, hide = true)]
    metrics_bind_address: Option<String>,
}

impl Cli {
    /// The options, but for the secure metrics port, which [`SecureMetricsArgs::secure_metrics`] binds.
    fn options(&self) -> Options {
        Options {
            webhook: self.webhook_bind_address,
            health: self.health_probe_bind_address,
            secure_metrics: None,
            cert_dir: self.cert_dir.clone(),
            cert_poll_interval: CERT_POLL_INTERVAL,
            tls_min_version: self.tls_min_version,
            tls_cipher_suites: self.tls_cipher_suites.clone(),
            target: Target::new(&self.target_runtime_class, &self.pod_vm_extended_resource),
            admission: AdmissionLimits {
                body_read_timeout: self.body_read_timeout,
                ..AdmissionLimits::default()
            },
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let otlp = cli.otlp_endpoint.as_deref().filter(|e| !e.is_empty());
    let telemetry = telemetry::init_with(COMPONENT, cli.log_format, otlp);
    peerpods_runtime::service::run(COMPONENT, telemetry, async {
        if let Some(instance_type) = &cli.pod_vm_instance_type {
            tracing::info!(
                instance_type,
                "POD_VM_INSTANCE_TYPE is not used by the webhook"
            );
        }
        if cli.leader_elect || cli.metrics_bind_address.is_some() {
            tracing::info!(
                "--leader-elect and --metrics-bind-address are not needed: every replica serves, /metrics is on the health probe address"
            );
        }
        let secure_metrics = cli.metrics.secure_metrics().await?;
        let options = Options {
            secure_metrics,
            ..cli.options()
        };
        server::run(options, peerpods_runtime::shutdown::on_signal()).await
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use peer_pod_config_ctrl::objects::{WEBHOOK_PATH, WEBHOOK_PORT, webhook_deployment};
    use peerpods_api::peerpodconfig::PeerPodConfig;

    #[test]
    fn flags_fit_together() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from([COMPONENT]).unwrap();
        let options = cli.options();
        assert_eq!(options.webhook, ListenAddr::AnyInterface(9443));
        assert_eq!(options.health, ListenAddr::AnyInterface(8081));
        assert_eq!(
            options.cert_dir,
            PathBuf::from("/tmp/k8s-webhook-server/serving-certs")
        );
        assert_eq!(options.tls_min_version, TlsVersion::Tls12);
        assert_eq!(
            options.target,
            Target::new("kata-remote", "kata.peerpods.io/vm")
        );
        assert_eq!(options.admission, AdmissionLimits::default());
    }

    #[test]
    fn the_body_read_timeout_is_a_duration() {
        let cli = Cli::try_parse_from([COMPONENT, "--body-read-timeout", "2m"]).unwrap();
        assert_eq!(
            cli.options().admission.body_read_timeout,
            Duration::from_secs(120)
        );
        assert!(Cli::try_parse_from([COMPONENT, "--body-read-timeout", "soon"]).is_err());
    }

    #[test]
    fn secure_metrics_flags_are_the_other_services() {
        let cli = Cli::try_parse_from([
            COMPONENT,
            "--metrics-secure",
            "--metrics-listen=0.0.0.0:8443",
            "--metrics-cert-dir=/etc/metrics-tls",
        ])
        .unwrap();
        assert!(cli.metrics.metrics_secure);
        assert_eq!(cli.metrics.metrics_listen, "0.0.0.0:8443".parse().unwrap());
        assert_eq!(
            cli.metrics.metrics_cert_dir,
            Some(PathBuf::from("/etc/metrics-tls"))
        );
    }

    #[test]
    fn upstream_flags_are_accepted() {
        let cli = Cli::try_parse_from([
            COMPONENT,
            "--leader-elect",
            "--health-probe-bind-address=:8081",
            "--metrics-bind-address=127.0.0.1:8080",
            "--tls-min-version=VersionTLS13",
        ])
        .unwrap();
        assert_eq!(cli.options().tls_min_version, TlsVersion::Tls13);
        assert!(!cli.metrics.metrics_secure, "plain /metrics unless asked");
        let cli = Cli::try_parse_from([
            COMPONENT,
            "--health-probe-bind-address=0",
            "--target-runtime-class=",
        ])
        .unwrap();
        assert_eq!(cli.options().health, ListenAddr::Off);
        assert_eq!(
            cli.options().target.runtime_class,
            "kata-remote",
            "empty is the default"
        );
    }

    /// The Deployment peer-pod-config-ctrl renders starts this binary as it is: its args and environment parse
    /// (each variable given through the flag that reads it), its ports and probes are where the webhook
    /// serves, and the certificate is mounted where the webhook reads it.
    #[test]
    fn runs_as_peer_pod_config_ctrl_deploys_it() {
        let spec = serde_json::from_value(serde_json::json!({
            "limit": 3,
            "instanceType": "t3.small",
            "webhook": {"targetRuntimeClass": "kata-remote-snp"}
        }))
        .unwrap();
        let mut config = PeerPodConfig::new("peerpodconfig", spec);
        // As the API server returns it: the owner reference of the Deployment needs a uid.
        config.metadata.namespace = Some("peer-pods".into());
        config.metadata.uid = Some("5b0c1e8e-1111-2222-3333-444455556666".into());
        let deployment = webhook_deployment(&config, "peer-pods").unwrap();
        let pod = deployment.spec.template.spec.unwrap();
        let container = &pod.containers[0];

        let command = Cli::command();
        let mut argv = vec![COMPONENT.to_owned()];
        argv.extend(container.args.clone().unwrap_or_default());
        for env in container.env.as_deref().unwrap_or_default() {
            let arg = command
                .get_arguments()
                .find(|a| a.get_env().is_some_and(|e| e == env.name.as_str()))
                .unwrap_or_else(|| panic!("{} is not read", env.name));
            let long = arg.get_long().unwrap();
            let value = env.value.clone().unwrap_or_default();
            if arg.get_action().takes_values() {
                argv.push(format!("--{long}={value}"));
            } else if value == "true" {
                // A switch (SetTrue) read from the environment as "true" is its bare flag on the command line.
                argv.push(format!("--{long}"));
            }
        }
        let cli = Cli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?}: {e}"));
        let options = cli.options();
        assert_eq!(
            options.target,
            Target::new("kata-remote-snp", "kata.peerpods.io/vm")
        );
        assert_eq!(cli.pod_vm_instance_type.as_deref(), Some("t3.small"));
        // /metrics only behind review, on the container's port named metrics.
        assert!(cli.metrics.metrics_secure);
        let metrics_port = container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some("metrics"))
            .map(|p| p.container_port);
        assert_eq!(
            metrics_port.map(|p| u16::try_from(p).unwrap()),
            Some(cli.metrics.metrics_listen.port())
        );

        let port = container.ports.as_deref().unwrap_or_default()[0].container_port;
        assert_eq!(port, WEBHOOK_PORT);
        assert_eq!(
            options.webhook,
            ListenAddr::AnyInterface(u16::try_from(port).unwrap())
        );
        assert_eq!(WEBHOOK_PATH, server::WEBHOOK_PATH);
        for (probe, path) in [
            (&container.readiness_probe, "/readyz"),
            (&container.liveness_probe, "/healthz"),
        ] {
            let get = probe.as_ref().and_then(|p| p.http_get.as_ref()).unwrap();
            assert_eq!(get.path.as_deref(), Some(path));
            let IntOrString::Int(probe_port) = get.port else {
                panic!("named probe port")
            };
            assert_eq!(
                options.health,
                ListenAddr::AnyInterface(u16::try_from(probe_port).unwrap())
            );
        }
        let mounts = container.volume_mounts.as_deref().unwrap_or_default();
        assert!(
            mounts
                .iter()
                .any(|m| std::path::Path::new(&m.mount_path) == options.cert_dir),
            "{mounts:?}"
        );
    }
}
