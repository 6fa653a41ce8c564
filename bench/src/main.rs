//! Wires flags (each also an environment variable) to the scenarios, prints the table and writes results.json.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use peerpods_bench::options::{Options, SCENARIOS};

/// Measures what users of peer pods feel: cleanup storms, memory, cloud calls, convergence and gRPC overhead,
/// against a local control plane, moto and the release builds of the services.
#[derive(Debug, Parser)]
#[command(version)]
struct Cli {
    /// PeerPods (with live moto instances) deleted at once in the cleanup storm.
    #[arg(long, env = "BENCH_STORM", default_value_t = 1000)]
    storm: usize,
    /// PeerPods per cloud in the fault storm (20% 5xx, 10% throttling, 5% hangs on every cloud request).
    #[arg(long, env = "BENCH_FAULT_STORM", default_value_t = 500)]
    fault_storm: usize,
    /// Clouds of the fault storm, comma-separated: aws (moto) and the emulators.
    #[arg(long, env = "BENCH_FAULT_STORM_CLOUDS", value_delimiter = ',',
          default_values_t = peerpods_bench::scenarios::fault_storm::CLOUDS.map(String::from))]
    fault_storm_clouds: Vec<String>,
    /// Whether the fault storm's lookups by id lag and flap after a create too (`false`: only lists and
    /// deletes do).
    #[arg(long, env = "BENCH_FAULT_STORM_LOOKUP_LAG", default_value_t = true, action = clap::ArgAction::Set)]
    fault_storm_lookup_lag: bool,
    /// Parallel finalizer patches of the storm's floor (peerpod-ctrl's default --api-writes).
    #[arg(long, env = "BENCH_FLOOR_CONCURRENCY", default_value_t = 32)]
    floor_concurrency: usize,
    /// PeerPods in the cluster while peak RSS is measured.
    #[arg(long, env = "BENCH_MEMORY_PEERPODS", default_value_t = 10_000)]
    memory_peerpods: usize,
    /// Nodes in the cluster while peak RSS is measured.
    #[arg(long, env = "BENCH_MEMORY_NODES", default_value_t = 1000)]
    memory_nodes: usize,
    /// Nodes selected by the convergence scenario's PeerPodConfig (its limit is one VM per node, then 2.5).
    #[arg(long, env = "BENCH_CONVERGENCE_NODES", default_value_t = 5000)]
    convergence_nodes: usize,
    /// Capacity modes the convergence scenario measures, comma-separated, in order: node (a capacity patch per
    /// node, at peer-pod-config-ctrl's default pace) and dra (the DeviceClass and ResourceSlices).
    #[arg(long, env = "BENCH_CONVERGENCE_MODES", value_delimiter = ',', default_values_t = ["node".to_string(), "dra".to_string()])]
    convergence_modes: Vec<String>,
    /// Seconds over which API writes are counted at steady state.
    #[arg(long, env = "BENCH_STEADY_WINDOW", default_value_t = 60)]
    steady_window: u64,
    /// DeleteInstance calls timed each way (direct and through gRPC).
    #[arg(long, env = "BENCH_GRPC_CALLS", default_value_t = 1000)]
    grpc_calls: usize,
    /// Scenarios to run, comma-separated: storm (with cloud_calls), memory, convergence, grpc, fault_storm, load,
    /// idle.
    #[arg(long, env = "BENCH_SCENARIOS", value_delimiter = ',', default_values_t = SCENARIOS.map(String::from))]
    scenarios: Vec<String>,
    /// Directory of the release binaries of provider-service, peerpod-ctrl and peer-pod-config-ctrl.
    #[arg(long, env = "BENCH_BIN_DIR", default_value = "target/release")]
    bin_dir: PathBuf,
    /// Python of the venv moto is installed in (`make moto`).
    #[arg(long, env = "MOTO_PYTHON", default_value = ".tools/venv/bin/python")]
    moto_python: PathBuf,
    /// Where results.json and the logs of every started process go.
    #[arg(long, env = "BENCH_OUT_DIR", default_value = "target/bench")]
    out_dir: PathBuf,
    /// Longest wait, in seconds, for any one condition (a storm draining, nodes converging).
    #[arg(long, env = "BENCH_TIMEOUT", default_value_t = 1800)]
    timeout: u64,
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(unknown) = cli
        .scenarios
        .iter()
        .find(|s| !SCENARIOS.contains(&s.as_str()))
    {
        eprintln!(
            "unknown scenario {unknown:?}; known: {}",
            SCENARIOS.join(", ")
        );
        return ExitCode::FAILURE;
    }
    let mut convergence_modes = Vec::new();
    for mode in &cli.convergence_modes {
        match serde_json::from_value(serde_json::Value::String(mode.clone())) {
            Ok(mode) => convergence_modes.push(mode),
            Err(_) => {
                eprintln!("unknown capacity mode {mode:?}; known: node, dra");
                return ExitCode::FAILURE;
            }
        }
    }
    let options = Options {
        storm: cli.storm,
        fault_storm: cli.fault_storm,
        fault_storm_clouds: cli.fault_storm_clouds,
        fault_storm_lookup_lag: cli.fault_storm_lookup_lag,
        floor_concurrency: cli.floor_concurrency,
        memory_peerpods: cli.memory_peerpods,
        memory_nodes: cli.memory_nodes,
        convergence_nodes: cli.convergence_nodes,
        convergence_modes,
        steady_window: Duration::from_secs(cli.steady_window),
        grpc_calls: cli.grpc_calls,
        scenarios: cli.scenarios,
        bin_dir: cli.bin_dir,
        moto_python: cli.moto_python,
        log_dir: cli.out_dir.join("logs"),
        timeout: Duration::from_secs(cli.timeout),
    };
    // On Ctrl-C or SIGTERM the run is dropped, and with it every process it started.
    let results = tokio::select! {
        results = peerpods_bench::run(&options) => results,
        () = peerpods_runtime::shutdown::signal() => {
            eprintln!("bench: interrupted; everything it started is stopped");
            return ExitCode::from(130);
        }
    };
    print!("{}", results.table());
    let path = cli.out_dir.join("results.json");
    let written = results.to_json().and_then(|json| {
        std::fs::create_dir_all(&cli.out_dir)
            .and_then(|()| std::fs::write(&path, json))
            .map_err(|e| peerpods_bench::Error::io(format!("writing {}", path.display()), e))
    });
    match written {
        Ok(()) => println!("results: {}", path.display()),
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    }
    if results.any_failed() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
