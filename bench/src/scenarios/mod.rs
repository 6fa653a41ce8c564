//! The scenarios of issue 7 and the services they start. Each scenario starts what it needs, measures, and stops
//! it again, so one scenario's controllers never load the next one's figures.

pub(crate) mod convergence;
pub mod fault_storm;
mod grpc;
pub mod idle;
pub mod load;
mod memory;
mod storm;

use std::net::SocketAddr;
use std::time::Duration;

use kube::api::{Api, ListParams};
use peerpods_api::peerpod::PeerPod;
use test_support::metrics::Scrape;

use crate::Error;
use crate::cluster::{Cluster, wait_until};
use crate::moto::Moto;
use crate::options::Options;
use crate::procs::{Service, Spec, free_addr};
use crate::report::{Outcome, Results};

/// Runs the selected scenarios (the others report "skipped: not selected").
pub async fn run(options: &Options) -> Results {
    let mut results = Results {
        control_plane_tuning: Vec::new(),
        storm: Outcome::skipped("not selected"),
        memory: Outcome::skipped("not selected"),
        cloud_calls: Outcome::skipped("not selected (measured during the storm)"),
        convergence: Outcome::skipped("not selected"),
        grpc: Outcome::skipped("not selected"),
        fault_storm: Outcome::skipped("not selected"),
        load: Outcome::skipped("not selected"),
        idle: Outcome::skipped("not selected"),
    };
    // No cluster needed: provider-service and the webhook run in this process.
    if options.selected("load") {
        eprintln!(
            "bench: load (idle connections on both TLS ports; a capacity flood during a cleanup)"
        );
        results.load = Outcome::from_result(load::run(options).await);
    }
    let cluster_scenarios = [
        "grpc",
        "storm",
        "convergence",
        "memory",
        "fault_storm",
        "idle",
    ];
    if !cluster_scenarios.iter().any(|s| options.selected(s)) {
        return results;
    }
    eprintln!("bench: starting a local control plane");
    let cluster = match Cluster::start().await {
        Ok(cluster) => {
            results.control_plane_tuning = cluster.tuning().to_vec();
            cluster
        }
        Err(e) => {
            if options.selected("storm") {
                results.storm = Outcome::from_error(&e);
                results.cloud_calls = Outcome::from_error(&e);
            }
            if options.selected("convergence") {
                results.convergence = Outcome::from_error(&e);
            }
            if options.selected("memory") {
                results.memory = Outcome::from_error(&e);
            }
            if options.selected("grpc") {
                results.grpc = Outcome::from_error(&e);
            }
            if options.selected("fault_storm") {
                results.fault_storm = Outcome::from_error(&e);
            }
            if options.selected("idle") {
                results.idle = Outcome::from_error(&e);
            }
            return results;
        }
    };
    if options.selected("grpc") {
        eprintln!(
            "bench: grpc ({} DeleteInstance calls each way, TLS + TokenReview; then the Go client)",
            options.grpc_calls
        );
        results.grpc = Outcome::from_result(grpc::run(options, &cluster).await);
    }
    if options.selected("storm") {
        eprintln!("bench: storm ({} PeerPods)", options.storm);
        (results.storm, results.cloud_calls) = storm::run(options, &cluster).await;
    }
    if options.selected("fault_storm") {
        let clouds: Vec<&str> = options
            .fault_storm_clouds
            .iter()
            .map(String::as_str)
            .collect();
        results.fault_storm =
            Outcome::from_result(fault_storm::run(options, &cluster, &clouds).await);
    }
    if options.selected("convergence") {
        eprintln!(
            "bench: convergence ({} nodes; capacity modes {:?})",
            options.convergence_nodes, options.convergence_modes
        );
        results.convergence = Outcome::from_result(convergence::run(options, &cluster).await);
    }
    // Last: it leaves its PeerPods behind (the control plane goes away with the run).
    if options.selected("memory") {
        eprintln!(
            "bench: memory ({} PeerPods / {} nodes)",
            options.memory_peerpods, options.memory_nodes
        );
        results.memory = Outcome::from_result(memory::run(options, &cluster).await);
    }
    // After memory: it tops the cluster's PeerPods up to the same N (memory's stay behind).
    if options.selected("idle") {
        eprintln!(
            "bench: idle (CPU and RSS at rest of all three services; {} PeerPods / {} nodes)",
            options.memory_peerpods, options.memory_nodes
        );
        results.idle = Outcome::from_result(idle::run(options, &cluster).await);
    }
    results
}

/// provider-service (release build) on 127.0.0.1: against moto when given, else on its embedded default (libvirt's
/// test driver). Returns the service and its gRPC address. The configuration directory lives as long as the
/// service needs it: provider-service reads it at start and on change.
async fn start_provider(
    options: &Options,
    scenario: &str,
    moto: Option<&Moto>,
) -> Result<(Service, SocketAddr, Option<tempfile::TempDir>), Error> {
    let listen = free_addr()?;
    let admin = free_addr()?;
    let mut args = vec![
        "--auth=none".to_string(),
        format!("--listen={listen}"),
        format!("--admin-listen={admin}"),
    ];
    let config = match moto {
        Some(moto) => {
            let dir =
                tempfile::tempdir().map_err(|e| Error::io("creating a config directory", e))?;
            for (key, value) in crate::moto::provider_config(moto) {
                std::fs::write(dir.path().join(&key), value)
                    .map_err(|e| Error::io(format!("writing config key {key}"), e))?;
            }
            args.push(format!("--config-dir={}", dir.path().display()));
            Some(dir)
        }
        None => {
            // No cloud: the embedded default (libvirt's test driver), development mode only.
            args.push("--development".to_string());
            None
        }
    };
    let service = Service::start(Spec {
        name: "provider-service",
        scenario,
        program: options.bin_dir.join("provider-service"),
        args,
        env: Vec::new(),
        admin,
        log_dir: &options.log_dir,
    })
    .await?;
    Ok((service, listen, config))
}

/// peerpod-ctrl (release build) against `provider` (plaintext, no token: everything is on loopback).
async fn start_peerpod_ctrl(
    options: &Options,
    scenario: &str,
    cluster: &Cluster,
    provider: SocketAddr,
) -> Result<Service, Error> {
    let admin = free_addr()?;
    Service::start(Spec {
        name: "peerpod-ctrl",
        scenario,
        program: options.bin_dir.join("peerpod-ctrl"),
        args: vec![
            format!("--provider-endpoint=http://{provider}"),
            "--provider-auth=none".into(),
            format!("--admin-listen={admin}"),
        ],
        env: vec![kubeconfig(cluster)],
        admin,
        log_dir: &options.log_dir,
    })
    .await
}

/// Waits until peerpod-ctrl's cache holds every PeerPod in the cluster (counted now): live PeerPods alone with
/// their Pod are cached but never reconciled, so reconciles would not tell.
async fn wait_cached(cluster: &Cluster, ctrl: &Service, timeout: Duration) -> Result<(), Error> {
    let peerpods: Api<PeerPod> = Api::all(cluster.client.clone());
    let in_cluster = count(&peerpods).await?;
    wait_until(
        &format!("peerpod-ctrl to cache all {in_cluster} PeerPods"),
        timeout,
        Duration::from_millis(100),
        || async {
            let text = ctrl.metrics().await?;
            let cached = Scrape::parse(&text)?.sum("peerpod_ctrl_cached_peerpods", &[]);
            Ok((cached >= in_cluster as f64).then_some(()))
        },
    )
    .await
}

/// Objects of `api`, counted with a one-item list (the API server says how many remain).
async fn count<K>(api: &Api<K>) -> Result<usize, Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let page = api.list_metadata(&ListParams::default().limit(1)).await?;
    let remaining = page.metadata.remaining_item_count.unwrap_or(0);
    Ok(page.items.len() + usize::try_from(remaining).unwrap_or(0))
}

/// peer-pod-config-ctrl (release build) acting on the PeerPodConfigs of `namespace`.
async fn start_config_ctrl(
    options: &Options,
    scenario: &str,
    cluster: &Cluster,
    namespace: &str,
) -> Result<Service, Error> {
    let admin = free_addr()?;
    Service::start(Spec {
        name: "peer-pod-config-ctrl",
        scenario,
        program: options.bin_dir.join("peer-pod-config-ctrl"),
        args: vec![
            format!("--namespace={namespace}"),
            format!("--admin-listen={admin}"),
        ],
        env: vec![kubeconfig(cluster)],
        admin,
        log_dir: &options.log_dir,
    })
    .await
}

fn kubeconfig(cluster: &Cluster) -> (String, String) {
    (
        "KUBECONFIG".into(),
        cluster.kubeconfig().display().to_string(),
    )
}
