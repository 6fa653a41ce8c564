//! Wires flags and environment to the library: `peerpods-dra-plugin --driver-name vm.peerpods.io --kubelet-dir
//! /var/lib/kubelet`, as the DaemonSet peer-pod-config-ctrl renders in `capacityMode: dra` runs it.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use peerpods_dra_plugin::driver::{DEFAULT_DRIVER, DriverName};
use peerpods_dra_plugin::serve::{self, Options};
use peerpods_runtime::service;
use peerpods_runtime::telemetry::{self, LogFormat};

const COMPONENT: &str = "peerpods-dra-plugin";

#[derive(Parser, Debug)]
#[command(
    version,
    about = "DRA kubelet plugin of the peer-pods VM pool: registers the driver with the kubelet and prepares its claims with nothing to inject"
)]
struct Cli {
    /// DRA driver whose claims this plugin prepares (the driver of the pool's ResourceSlices).
    #[arg(long, default_value = DEFAULT_DRIVER, value_parser = DriverName::parse)]
    driver_name: DriverName,
    /// The kubelet's root directory (its --root-dir), mounted at the same path: the plugin registers in
    /// <dir>/plugins_registry and serves in <dir>/plugins/<driver>.
    #[arg(long, default_value = "/var/lib/kubelet")]
    kubelet_dir: PathBuf,
    /// The node's name, for logs (the DaemonSet sets it from spec.nodeName).
    #[arg(long, env = "NODE_NAME", default_value = "")]
    node_name: String,
    /// Log line format: text or json.
    #[arg(long, env = "LOG_FORMAT", default_value = "text")]
    log_format: LogFormat,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    // OTEL_EXPORTER_OTLP_ENDPOINT, when set, exports spans as every service does.
    let telemetry = telemetry::init(COMPONENT, cli.log_format);
    let options = Options {
        driver: cli.driver_name,
        kubelet_dir: cli.kubelet_dir,
        node: cli.node_name,
    };
    service::run(
        COMPONENT,
        telemetry,
        serve::run(options, peerpods_runtime::shutdown::on_signal()),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_fit_together() {
        Cli::command().debug_assert();
    }

    #[test]
    fn defaults_are_the_kubelets_and_the_pools() {
        let cli = Cli::try_parse_from([COMPONENT]).unwrap();
        assert_eq!(cli.driver_name.as_str(), "vm.peerpods.io");
        assert_eq!(cli.kubelet_dir, PathBuf::from("/var/lib/kubelet"));
    }

    #[test]
    fn a_driver_name_that_is_no_subdomain_is_refused() {
        let error = Cli::try_parse_from([COMPONENT, "--driver-name", "../x"]).unwrap_err();
        assert!(error.to_string().contains("DNS subdomain"), "{error}");
    }
}
