//! Fault storm: on every cloud, N PeerPods with `peer.pod/finalizer` name N VMs of that cloud's emulator (moto for
//! AWS), and every cloud API request provider-service makes goes through the fault layer: 20% server errors, 10%
//! throttling (each cloud's own answer) and 5% hangs (held 10 minutes, far past every client deadline). The
//! PeerPods are deleted at once; provider-service and peerpod-ctrl clean up.
//!
//! A watch sees each PeerPod go and asks the cloud at that moment whether its VM (or any part of it) still exists:
//! such a release is early. After the last PeerPod is gone, every VM still there is leaked. Both must be 0.
//! Figures per cloud: cleanup time, when each PeerPod was released (p50/p95), the cloud API requests (faulted ones
//! included) and DeleteInstance calls per PeerPod: what confirming "gone" costs on that cloud.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::watcher;
use peerpod_ctrl::crd::PeerPod;
use serde::Serialize;
use test_support::cloud::CloudEmulator;
use test_support::faults::Faults;
use test_support::metrics::Scrape;

use crate::Error;
use crate::cluster::{Cluster, wait_until};
use crate::options::Options;
use crate::procs::{Service, Spec, free_addr};
use crate::stats::percentile;

/// The clouds, in the order they run: AWS (moto) and each emulator.
pub const CLOUDS: [&str; 6] = [
    "aws",
    "azure",
    "gcp",
    "ibmcloud",
    "ibmcloud-powervs",
    "alibabacloud",
];

/// How long a hung request is held: longer than any client deadline, so it always ends at the client's.
const HANG: Duration = Duration::from_secs(600);
/// provider-service's own deadline for one cloud request (one attempt on GCP), set on every cloud.
const REQUEST_TIMEOUT_SECS: u64 = 5;
/// The access key provider-service signs with on moto: only its calls get faults.
const AWS_PROVIDER_KEY: &str = "AKIDSTORMPROVIDER";
const POLL: Duration = Duration::from_millis(200);

/// One cloud's figures.
#[derive(Debug, Clone, Serialize)]
pub struct CloudStorm {
    pub cloud: String,
    pub peerpods: usize,
    /// Delete of all PeerPods → the last finalizer released.
    pub cleanup_seconds: f64,
    /// When PeerPods were released, from the delete.
    pub release_p50_seconds: f64,
    pub release_p95_seconds: f64,
    /// PeerPods the watch saw go (each checked against the cloud at that moment).
    pub releases_observed: usize,
    /// Released while the VM or a part of it still existed.
    pub released_early: usize,
    /// VMs (or parts) still there after every PeerPod was gone.
    pub leaked: usize,
    /// Cloud API requests provider-service made (every attempt, faulted ones included), and per PeerPod.
    pub cloud_requests: u64,
    pub cloud_requests_per_peerpod: f64,
    /// Faults the layer answered.
    pub server_errors: u64,
    pub throttled: u64,
    pub hangs: u64,
    /// DeleteInstance calls peerpod-ctrl made (first asks and re-asks while "in progress" or failing).
    pub delete_instance_calls: u64,
}

/// The cloud behind one run: an emulator of this process, or moto.
enum Cloud {
    Emulator(Box<dyn CloudEmulator>),
    Aws(aws_sdk_ec2::Client),
}

impl Cloud {
    fn start(name: &str) -> Result<Cloud, Error> {
        let setup =
            |e: std::io::Error| Error::setup_from(format!("starting the {name} emulator"), e);
        Ok(match name {
            "aws" => Cloud::Aws(crate::moto::shared()?.client()),
            "azure" => Cloud::Emulator(Box::new(peerpods_emulator_azure::AzureEmulator::start())),
            "gcp" => Cloud::Emulator(Box::new(
                peerpods_emulator_gcp::GcpEmulator::start().map_err(setup)?,
            )),
            "ibmcloud" => Cloud::Emulator(Box::new(
                peerpods_emulator_ibmcloud::VpcEmulator::start().map_err(setup)?,
            )),
            "ibmcloud-powervs" => Cloud::Emulator(Box::new(
                peerpods_emulator_ibmcloud::PowerVsEmulator::start().map_err(setup)?,
            )),
            "alibabacloud" => Cloud::Emulator(Box::new(
                peerpods_emulator_alibabacloud::AlibabaCloudEmulator::start(),
            )),
            other => return Err(Error::setup(format!("no emulator for cloud {other:?}"))),
        })
    }

    /// provider-service's configuration for this cloud, with short request deadlines where they can be set.
    fn config(&self) -> Vec<(String, String)> {
        let timeout_ms = (REQUEST_TIMEOUT_SECS * 1000).to_string();
        let timeout_s = REQUEST_TIMEOUT_SECS.to_string();
        let extra: Vec<(&str, &str)> = vec![
            // The storm's VMs carry no cluster tag: deleting them is allowed explicitly.
            ("DELETE_UNTAGGED", "allow"),
            ("AWS_ACCESS_KEY_ID", AWS_PROVIDER_KEY),
            ("AWS_OPERATION_TIMEOUT_MS", &timeout_ms),
            ("AZURE_REQUEST_TIMEOUT_MS", &timeout_ms),
            ("GCP_REQUEST_TIMEOUT_MS", &timeout_ms),
            ("IBMCLOUD_API_TIMEOUT_SECONDS", &timeout_s),
            ("ALIBABACLOUD_REQUEST_TIMEOUT_MS", &timeout_ms),
        ];
        let base = match self {
            Cloud::Emulator(emulator) => emulator.config(),
            Cloud::Aws(_) => test_support::moto::moto().config(&[]),
        };
        let prefix = match self {
            Cloud::Emulator(emulator) => cloud_prefix(emulator.provider()),
            Cloud::Aws(_) => "AWS_",
        };
        // Only this cloud's keys (and the shared ones): another cloud's key would be unknown to it.
        test_support::fault_checks::with(
            base,
            &extra
                .into_iter()
                .filter(|(k, _)| k.starts_with(prefix) || *k == "DELETE_UNTAGGED")
                .collect::<Vec<_>>(),
        )
    }

    async fn create_vms(&self, n: usize) -> Result<Vec<String>, Error> {
        match self {
            Cloud::Emulator(emulator) => Ok((0..n)
                .map(|i| emulator.create_vm(&format!("podvm-storm-{i}"), &[]))
                .collect()),
            Cloud::Aws(client) => {
                let mut ids = Vec::with_capacity(n);
                while ids.len() < n {
                    let count = (n - ids.len()).min(100) as i32;
                    ids.extend(test_support::moto::run_instances(client, count, &[]).await);
                }
                Ok(ids)
            }
        }
    }

    /// Whether the VM or a part of it still exists, asked of the cloud now. On AWS a terminated or shutting-down
    /// instance is gone (EC2 takes none back).
    async fn exists(&self, id: &str) -> Result<bool, Error> {
        match self {
            Cloud::Emulator(emulator) => Ok(emulator.vm_or_parts_exist(id)),
            Cloud::Aws(client) => {
                let answer = client
                    .describe_instances()
                    .instance_ids(id)
                    .send()
                    .await
                    .map_err(|e| Error::ec2_from(format!("DescribeInstances {id}"), e))?;
                let state = answer
                    .reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .find_map(|i| i.state()?.name().map(|n| n.as_str().to_owned()));
                Ok(!matches!(
                    state.as_deref(),
                    None | Some("terminated" | "shutting-down")
                ))
            }
        }
    }

    fn set_storm(&self, on: bool) {
        match self {
            Cloud::Emulator(emulator) => emulator.set_faults(if on {
                Faults::storm(HANG, 7)
            } else {
                Faults::default()
            }),
            Cloud::Aws(_) => {
                let faults = if on {
                    test_support::moto::Faults {
                        server_error_rate: 0.20,
                        throttle_rate: 0.10,
                        hang_rate: 0.05,
                        hang_for: HANG,
                        access_key: Some(AWS_PROVIDER_KEY.into()),
                        seed: 7,
                        ..Default::default()
                    }
                } else {
                    test_support::moto::Faults::default()
                };
                test_support::moto::moto().set_faults(&faults);
            }
        }
    }

    /// (requests, server errors, throttled, hangs) since the faults were set.
    fn counts(&self) -> (u64, u64, u64, u64) {
        match self {
            Cloud::Emulator(emulator) => {
                let i = emulator.injected();
                (i.requests, i.server_errors, i.throttled, i.hangs)
            }
            Cloud::Aws(_) => {
                let moto = test_support::moto::moto();
                let i = moto.injected();
                let requests = moto.requests_signed_by(AWS_PROVIDER_KEY).values().sum();
                (requests, i.server_errors, i.throttled, i.hangs)
            }
        }
    }
}

fn cloud_prefix(provider: &str) -> &'static str {
    match provider {
        "azure" => "AZURE_",
        "gcp" => "GCP_",
        "ibmcloud" | "ibmcloud-powervs" => "IBMCLOUD_",
        "alibabacloud" => "ALIBABACLOUD_",
        _ => "",
    }
}

/// Runs the storm on each of `clouds` in turn, each with its own provider-service and peerpod-ctrl.
pub async fn run(
    options: &Options,
    cluster: &Cluster,
    clouds: &[&str],
) -> Result<Vec<CloudStorm>, Error> {
    let mut figures = Vec::new();
    for cloud in clouds {
        eprintln!(
            "bench: fault storm on {cloud} ({} PeerPods)",
            options.fault_storm
        );
        figures.push(one_cloud(options, cluster, cloud).await?);
    }
    Ok(figures)
}

/// The storm on all of `clouds` at once (each with its own provider-service and peerpod-ctrl): the same checks in
/// the time of the slowest cloud, for the reduced-size test. Times measured this way share the machine.
pub async fn run_concurrently(
    options: &Options,
    cluster: &Cluster,
    clouds: &[&str],
) -> Result<Vec<CloudStorm>, Error> {
    futures::future::try_join_all(
        clouds
            .iter()
            .map(|cloud| one_cloud(options, cluster, cloud)),
    )
    .await
}

async fn one_cloud(options: &Options, cluster: &Cluster, name: &str) -> Result<CloudStorm, Error> {
    let n = options.fault_storm;
    let scenario = format!("fault-storm-{name}");
    let cloud = Arc::new(Cloud::start(name)?);
    if let Cloud::Aws(_) = *cloud {
        test_support::moto::moto().reset();
    }
    let ids = cloud.create_vms(n).await?;
    let (provider, _config) = start_provider(options, &scenario, &cloud.config()).await?;
    let ctrl = start_ctrl(options, &scenario, cluster, provider.1).await?;
    let provider = provider.0;

    let ns = format!("bench-fault-storm-{name}");
    cluster.namespace(&ns).await?;
    cluster
        .create_peerpods(&ns, "storm", name, &ids, false)
        .await?;
    let api = cluster.peerpods(&ns);

    // The watch: every PeerPod seen going is checked against the cloud at that moment.
    let releases: Arc<Mutex<Vec<(Duration, bool)>>> = Arc::default();
    let started = Arc::new(Mutex::new(None::<Instant>));
    let watch = {
        let api = api.clone();
        let cloud = Arc::clone(&cloud);
        let releases = Arc::clone(&releases);
        let started = Arc::clone(&started);
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default()).boxed();
            while let Some(event) = events.next().await {
                let Ok(watcher::Event::Delete(peerpod)) = event else {
                    continue;
                };
                let peerpod: PeerPod = peerpod;
                let early = cloud
                    .exists(&peerpod.spec.instance_id)
                    .await
                    .unwrap_or(false);
                let at = started
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .map_or(Duration::ZERO, |s| s.elapsed());
                releases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((at, early));
            }
        })
    };

    let before = Scrape::parse(&provider.metrics().await?)?;
    cloud.set_storm(true);
    let begin = Instant::now();
    *started.lock().unwrap_or_else(|p| p.into_inner()) = Some(begin);
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    let drained = wait_until(
        &format!("every {name} finalizer released"),
        options.timeout,
        POLL,
        || async {
            Ok(api
                .list(&ListParams::default().limit(1))
                .await?
                .items
                .is_empty()
                .then_some(()))
        },
    )
    .await;
    let cleanup = begin.elapsed().as_secs_f64();
    let (requests, server_errors, throttled, hangs) = cloud.counts();
    cloud.set_storm(false);
    let after = Scrape::parse(&provider.metrics().await?)?;
    // Let the watch catch up with the last deletions before reading it.
    let _ = wait_until(
        "the watch to see every release",
        Duration::from_secs(10),
        POLL,
        || async {
            Ok((releases.lock().unwrap_or_else(|p| p.into_inner()).len() >= n).then_some(()))
        },
    )
    .await;
    watch.abort();
    ctrl.stop().await;
    provider.stop().await;
    drained?;

    let mut leaked = 0;
    for id in &ids {
        if cloud.exists(id).await? {
            leaked += 1;
        }
    }
    let releases = releases.lock().unwrap_or_else(|p| p.into_inner()).clone();
    let mut times: Vec<Duration> = releases.iter().map(|(at, _)| *at).collect();
    times.sort();
    let delete_calls = |scrape: &Scrape| {
        scrape.sum(
            "provider_service_grpc_calls_total",
            &[("method", "DeleteInstance")],
        )
    };
    Ok(CloudStorm {
        cloud: name.to_owned(),
        peerpods: n,
        cleanup_seconds: cleanup,
        release_p50_seconds: percentile(&times, 50.0).as_secs_f64(),
        release_p95_seconds: percentile(&times, 95.0).as_secs_f64(),
        releases_observed: releases.len(),
        released_early: releases.iter().filter(|(_, early)| *early).count(),
        leaked,
        cloud_requests: requests,
        cloud_requests_per_peerpod: if n > 0 {
            requests as f64 / n as f64
        } else {
            0.0
        },
        server_errors,
        throttled,
        hangs,
        delete_instance_calls: (delete_calls(&after) - delete_calls(&before)).max(0.0) as u64,
    })
}

/// provider-service on 127.0.0.1 with `config`, no caller auth (everything is on loopback).
async fn start_provider(
    options: &Options,
    scenario: &str,
    config: &[(String, String)],
) -> Result<((Service, std::net::SocketAddr), tempfile::TempDir), Error> {
    let listen = free_addr()?;
    let admin = free_addr()?;
    let dir = tempfile::tempdir().map_err(|e| Error::io("creating a config directory", e))?;
    for (key, value) in config {
        std::fs::write(dir.path().join(key), value)
            .map_err(|e| Error::io(format!("writing config key {key}"), e))?;
    }
    let service = Service::start(Spec {
        name: "provider-service",
        scenario,
        program: options.bin_dir.join("provider-service"),
        args: vec![
            "--auth=none".to_string(),
            format!("--listen={listen}"),
            format!("--admin-listen={admin}"),
            format!("--config-dir={}", dir.path().display()),
        ],
        env: Vec::new(),
        admin,
        log_dir: &options.log_dir,
    })
    .await?;
    Ok(((service, listen), dir))
}

/// peerpod-ctrl against `provider`, retrying a failing PeerPod at most every 10 s.
async fn start_ctrl(
    options: &Options,
    scenario: &str,
    cluster: &Cluster,
    provider: std::net::SocketAddr,
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
            "--retry-max-delay=10s".into(),
        ],
        env: vec![(
            "KUBECONFIG".into(),
            cluster.kubeconfig().display().to_string(),
        )],
        admin,
        log_dir: &options.log_dir,
    })
    .await
}

/// The rows of the printed table for one cloud.
pub fn rows(figures: &CloudStorm) -> Vec<(String, String)> {
    vec![
        ("PeerPods".into(), figures.peerpods.to_string()),
        (
            "cleanup (last finalizer)".into(),
            format!("{:.2} s", figures.cleanup_seconds),
        ),
        (
            "release p50 / p95".into(),
            format!(
                "{:.2} s / {:.2} s",
                figures.release_p50_seconds, figures.release_p95_seconds
            ),
        ),
        (
            "VMs leaked / released early".into(),
            format!("{} / {}", figures.leaked, figures.released_early),
        ),
        (
            "cloud requests per PeerPod".into(),
            format!(
                "{:.1} ({} in all: {} 5xx, {} throttled, {} hung)",
                figures.cloud_requests_per_peerpod,
                figures.cloud_requests,
                figures.server_errors,
                figures.throttled,
                figures.hangs
            ),
        ),
        (
            "DeleteInstance calls per PeerPod".into(),
            format!(
                "{:.1}",
                figures.delete_instance_calls as f64 / figures.peerpods.max(1) as f64
            ),
        ),
    ]
}
