//! Fault storm: on every cloud, N PeerPods with `peer.pod/finalizer` name N VMs of that cloud's emulator (moto for
//! AWS), and every cloud API request provider-service makes goes through the fault layer: 20% server errors, 10%
//! throttling (each cloud's own answer) and 5% hangs (held 10 minutes, far past every client deadline); each
//! deletion takes 8 polls (the emulators' `operation_polls`; moto has no such knob: EC2 terminates at once there);
//! and the cloud is eventually consistent: for the storm's first seconds a lookup, a list and a deletion each may
//! not see a VM yet (each its own window), and answers about a VM flap between found and not found (seeded). The
//! PeerPods are deleted at once; provider-service and peerpod-ctrl clean up.
//!
//! A watch sees each PeerPod go and asks the cloud at that moment whether its VM (or any part of it) still exists:
//! such a release is early. The check reads the emulator's state directly (on AWS: moto with the bench's own key,
//! which the fault layer spares, retried until it answers); a check that gets no answer, or a release the watch
//! did not see, fails the run, as does a VM still there after the last PeerPod is gone (leaked). Beside every
//! tenth VM the storm places a part that is not the VM's (an operator's Elastic IP associated with it on AWS, a
//! persistent volume's disk attached with `Detach` on Azure, an operator's floating IP on IBM Cloud VPC, an
//! operator's EIP on the add-on NIC on Alibaba Cloud; the GCP and Power Virtual Server emulators model none): each
//! must survive. Figures per cloud: cleanup time, when each PeerPod was released (p50/p95), the cloud API requests
//! (faulted ones included) and DeleteInstance calls per PeerPod: what confirming "gone" costs on that cloud.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aws_sdk_ec2::types::{DomainType, Filter};
use futures::StreamExt;
use kube::api::{DeleteParams, ListParams};
use kube::runtime::{WatchStreamExt, watcher};
use peerpods_api::peerpod::PeerPod;
use serde::Serialize;
use test_support::cloud::CloudEmulator;
use test_support::faults::{CallKind, Faults, Flapping, Visibility};
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
/// The seed of every draw of the storm (rates and flapping).
const SEED: u64 = 7;
/// A VM's deletion takes this many polls (or looks) on each emulator.
const OPERATION_POLLS: u32 = 8;
/// From the storm's start, how long each kind of call still does not see a VM: the visibility windows run from a
/// VM's creation, so the bench adds the time its setup took (as if the VMs had been created just before the
/// PeerPods were deleted).
const INVISIBLE_GET: Duration = Duration::from_secs(10);
const INVISIBLE_LIST: Duration = Duration::from_secs(20);
const INVISIBLE_DELETE: Duration = Duration::from_secs(10);
/// From the storm's start, how long answers about a VM flap (every kind of call, half of them not found).
const FLAPPING: Duration = Duration::from_secs(30);
/// How much longer than the storm's longest lag provider-service's consistency window is.
const WINDOW_MARGIN: Duration = Duration::from_secs(5);
/// Every this many VMs (the first included), one gets a part beside it that is not the VM's.
const FOREIGN_EVERY: usize = 10;
/// A lookup of the checks (release, leak, foreign part) is asked this often, each within the deadline, before it
/// counts as a failed check.
const CHECK_ATTEMPTS: u32 = 8;
const CHECK_DEADLINE: Duration = Duration::from_secs(10);
/// The bench's checks keep at most this many failure messages per cloud (all are counted).
const KEPT_FAILURES: usize = 10;

/// The storm's knobs on one cloud, as set.
#[derive(Debug, Clone, Serialize)]
pub struct StormSettings {
    pub server_error_rate: f64,
    pub throttle_rate: f64,
    pub hang_rate: f64,
    /// Polls (or looks) a VM's deletion takes; `None`: the cloud has no such knob (moto terminates at once).
    pub operation_polls: Option<u32>,
    /// From the storm's start, how long a lookup, a list and a deletion do not see a VM.
    pub invisible_get_seconds: f64,
    pub invisible_list_seconds: f64,
    pub invisible_delete_seconds: f64,
    /// From the storm's start, how long answers about a VM flap (every kind of call).
    pub flapping_seconds: f64,
    pub flapping_miss_rate: f64,
    pub seed: u64,
}

/// One cloud's figures.
#[derive(Debug, Clone, Serialize)]
pub struct CloudStorm {
    pub cloud: String,
    pub peerpods: usize,
    pub settings: StormSettings,
    /// Delete of all PeerPods → the last finalizer released.
    pub cleanup_seconds: f64,
    /// When PeerPods were released, from the delete.
    pub release_p50_seconds: f64,
    pub release_p95_seconds: f64,
    /// PeerPods the watch saw go (each checked against the cloud at that moment).
    pub releases_observed: usize,
    /// PeerPods released that the watch did not see go, so were not checked: each fails the run.
    pub releases_unchecked: usize,
    /// Released while the VM or a part of it still existed.
    pub released_early: usize,
    /// VMs (or parts) still there after every PeerPod was gone.
    pub leaked: usize,
    /// Lookups of the bench's checks (at release, for leaks, for foreign parts) that got no answer: each fails the
    /// run.
    pub failed_checks: usize,
    /// The first failed checks, with why.
    pub failed_check_errors: Vec<String>,
    /// Parts placed beside a VM that were not the VM's (0 where the emulator models none), and how many of them
    /// were deleted (must be 0).
    pub foreign_parts: usize,
    pub foreign_parts_deleted: usize,
    /// Cloud API requests provider-service made (every attempt, faulted ones included), and per PeerPod.
    pub cloud_requests: u64,
    pub cloud_requests_per_peerpod: f64,
    /// Faults the layer answered.
    pub server_errors: u64,
    pub throttled: u64,
    pub hangs: u64,
    /// Answers that did not see a VM (visibility windows and flapping; a list counts each VM it left out).
    pub not_seen: u64,
    /// DeleteInstance calls peerpod-ctrl made (first asks and re-asks while "in progress" or failing).
    pub delete_instance_calls: u64,
}

impl CloudStorm {
    /// What makes this cloud's run a failure, whatever its times: empty when it passed.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        let mut count = |n: usize, what: &str| {
            if n > 0 {
                problems.push(format!("{n} {what}"));
            }
        };
        count(self.leaked, "VMs leaked");
        count(self.released_early, "finalizers released early");
        count(
            self.failed_checks,
            "checks without an answer from the cloud",
        );
        count(
            self.releases_unchecked,
            "releases the watch did not see (unchecked)",
        );
        count(
            self.foreign_parts_deleted,
            "parts deleted that were not the VM's",
        );
        problems
    }
}

/// What the release-time check found.
#[derive(Debug, Clone)]
enum Check {
    Gone,
    Exists,
    /// The lookup got no answer after every attempt: a failed check, never taken as "gone".
    NoAnswer(String),
}

/// The emulators as the storm drives them: [`CloudEmulator`] and, beside a VM, a part that is not the VM's, with the
/// emulator's own helpers (each emulator's README).
trait StormEmulator: CloudEmulator {
    /// Places beside VM `name` (id `id`) a part that is not the VM's and returns its id; `None` where the emulator
    /// models no such part.
    fn place_foreign_part(&self, name: &str, id: &str) -> Option<String>;

    /// Whether the part [`Self::place_foreign_part`] placed still exists, read from the emulator's state.
    fn foreign_part_exists(&self, part: &str) -> bool;
}

impl StormEmulator for peerpods_emulator_azure::AzureEmulator {
    /// A persistent volume's disk, attached by the Azure Disk CSI driver with `Detach` and no cluster tag.
    fn place_foreign_part(&self, name: &str, _id: &str) -> Option<String> {
        let disk = format!("{name}-pv");
        self.attach_data_disk(name, &disk, "Detach").then_some(disk)
    }

    fn foreign_part_exists(&self, part: &str) -> bool {
        self.disk_exists(part)
    }
}

impl StormEmulator for peerpods_emulator_gcp::GcpEmulator {
    /// None: the emulator serves no disk or address API, so the backend could delete nothing but the instance.
    fn place_foreign_part(&self, _name: &str, _id: &str) -> Option<String> {
        None
    }

    fn foreign_part_exists(&self, _part: &str) -> bool {
        false
    }
}

impl StormEmulator for peerpods_emulator_ibmcloud::VpcEmulator {
    /// An operator's floating IP bound to the instance's interface.
    fn place_foreign_part(&self, _name: &str, id: &str) -> Option<String> {
        self.attach_floating_ip(id)
    }

    fn foreign_part_exists(&self, part: &str) -> bool {
        self.floating_ip_exists(part)
    }
}

impl StormEmulator for peerpods_emulator_ibmcloud::PowerVsEmulator {
    /// None: the emulator serves no volume or network API, so the backend could delete nothing but the instance.
    fn place_foreign_part(&self, _name: &str, _id: &str) -> Option<String> {
        None
    }

    fn foreign_part_exists(&self, _part: &str) -> bool {
        false
    }
}

impl StormEmulator for peerpods_emulator_alibabacloud::AlibabaCloudEmulator {
    /// An operator's EIP (not cloud-api-adaptor's description) bound to the instance's add-on NIC.
    fn place_foreign_part(&self, _name: &str, id: &str) -> Option<String> {
        self.add_operator_eip(id, "operator's address")
    }

    fn foreign_part_exists(&self, part: &str) -> bool {
        self.eip_exists(part)
    }
}

/// The cloud behind one run: an emulator of this process, or moto.
enum Cloud {
    Emulator(Box<dyn StormEmulator>),
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

    /// provider-service's configuration for this cloud, with short request deadlines where they can be set, and
    /// the cloud's consistency window (`window`, whole seconds up) when given.
    fn config(&self, window: Option<Duration>) -> Vec<(String, String)> {
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
        let mut extra: Vec<(&str, &str)> = extra
            .into_iter()
            .filter(|(k, _)| k.starts_with(prefix) || *k == "DELETE_UNTAGGED")
            .collect();
        let window_secs = window.map(|w| w.as_secs_f64().ceil().to_string());
        if let Some(secs) = &window_secs {
            extra.push((self.window_setting(), secs));
        }
        test_support::fault_checks::with(base, &extra)
    }

    /// The configuration key of this cloud's consistency window.
    fn window_setting(&self) -> &'static str {
        match self {
            Cloud::Aws(_) => "AWS_NOT_FOUND_WINDOW_SECS",
            Cloud::Emulator(emulator) => match emulator.provider() {
                "azure" => "AZURE_NOT_FOUND_WINDOW_SECS",
                "gcp" => "GCP_NOT_FOUND_WINDOW_SECS",
                "ibmcloud-powervs" => "POWERVS_NOT_FOUND_WINDOW_SECS",
                "ibmcloud" => "IBMCLOUD_NOT_FOUND_WINDOW_SECS",
                // alibabacloud, the last of FAULT_STORM_CLOUDS
                _ => "ALIBABACLOUD_NOT_FOUND_WINDOW_SECS",
            },
        }
    }

    /// Creates `n` VMs; returns their names and ids.
    async fn create_vms(&self, n: usize) -> Result<Vec<(String, String)>, Error> {
        let name = |i: usize| format!("podvm-storm-{i}");
        match self {
            Cloud::Emulator(emulator) => Ok((0..n)
                .map(|i| (name(i), emulator.create_vm(&name(i), &[])))
                .collect()),
            Cloud::Aws(client) => {
                let mut ids = Vec::with_capacity(n);
                while ids.len() < n {
                    let count = (n - ids.len()).min(100) as i32;
                    ids.extend(test_support::moto::run_instances(client, count, &[]).await);
                }
                Ok(ids
                    .into_iter()
                    .enumerate()
                    .map(|(i, id)| (name(i), id))
                    .collect())
            }
        }
    }

    /// Places beside VM `name` (`id`) a part that is not the VM's: on AWS an operator's Elastic IP (untagged, so not
    /// cloud-api-adaptor's) associated with the instance. `None` where the cloud models none.
    async fn place_foreign_part(&self, name: &str, id: &str) -> Result<Option<String>, Error> {
        match self {
            Cloud::Emulator(emulator) => Ok(emulator.place_foreign_part(name, id)),
            Cloud::Aws(client) => {
                let allocated = client
                    .allocate_address()
                    .domain(DomainType::Vpc)
                    .send()
                    .await
                    .map_err(|e| Error::ec2_from("AllocateAddress", e))?;
                let allocation = allocated
                    .allocation_id()
                    .ok_or_else(|| Error::setup("AllocateAddress answered no allocation id"))?
                    .to_owned();
                client
                    .associate_address()
                    .allocation_id(&allocation)
                    .instance_id(id)
                    .send()
                    .await
                    .map_err(|e| Error::ec2_from(format!("AssociateAddress {id}"), e))?;
                Ok(Some(allocation))
            }
        }
    }

    /// Whether a part [`Self::place_foreign_part`] placed still exists (on AWS: still allocated).
    async fn foreign_part_exists(&self, part: &str) -> Result<bool, Error> {
        match self {
            Cloud::Emulator(emulator) => Ok(emulator.foreign_part_exists(part)),
            Cloud::Aws(client) => {
                let answer = client
                    .describe_addresses()
                    .filters(Filter::builder().name("allocation-id").values(part).build())
                    .send()
                    .await
                    .map_err(|e| Error::ec2_from(format!("DescribeAddresses {part}"), e))?;
                Ok(answer
                    .addresses()
                    .iter()
                    .any(|a| a.allocation_id() == Some(part)))
            }
        }
    }

    /// Whether the VM or a part of it still exists, asked of the cloud now: an emulator's state directly; on AWS
    /// moto, with the bench's own key (the fault layer spares it), by an `instance-id` filter (which never fails
    /// for an id EC2 no longer lists). A terminated or shutting-down instance is gone (EC2 takes none back).
    async fn exists(&self, id: &str) -> Result<bool, Error> {
        match self {
            Cloud::Emulator(emulator) => Ok(emulator.vm_or_parts_exist(id)),
            Cloud::Aws(client) => {
                let answer = client
                    .describe_instances()
                    .filters(Filter::builder().name("instance-id").values(id).build())
                    .send()
                    .await
                    .map_err(|e| Error::ec2_from(format!("DescribeInstances {id}"), e))?;
                Ok(answer
                    .reservations()
                    .iter()
                    .flat_map(|r| r.instances())
                    .filter(|i| i.instance_id() == Some(id))
                    .any(|i| {
                        !matches!(
                            i.state().and_then(|s| s.name()).map(|n| n.as_str()),
                            None | Some("terminated" | "shutting-down")
                        )
                    }))
            }
        }
    }

    /// The storm's knobs, with the visibility and flapping windows reaching `setup` (the VMs' age) further.
    /// `lookups_are_lists`: the backend looks an instance up with a list call (Alibaba Cloud's
    /// DescribeInstances by id), so without lagging lookups its lists do not lag either.
    fn storm_settings(
        &self,
        setup: Duration,
        lookup_lag: bool,
        lookups_are_lists: bool,
    ) -> (StormSettings, Faults) {
        let (get, list, flapping_kinds): (Duration, Duration, &[CallKind]) =
            match (lookup_lag, lookups_are_lists) {
                (true, _) => (INVISIBLE_GET, INVISIBLE_LIST, &CallKind::ALL),
                (false, false) => (
                    Duration::ZERO,
                    INVISIBLE_LIST,
                    &[CallKind::List, CallKind::Delete],
                ),
                (false, true) => (Duration::ZERO, Duration::ZERO, &[CallKind::Delete]),
            };
        let faults = Faults {
            invisible: Visibility {
                get: setup + get,
                list: setup + list,
                delete: setup + INVISIBLE_DELETE,
            },
            flapping: Flapping::within(setup + FLAPPING, flapping_kinds),
            operation_polls: Some(OPERATION_POLLS),
            created_age: Some(Duration::ZERO),
            ..Faults::storm(HANG, SEED)
        };
        let settings = StormSettings {
            server_error_rate: faults.server_error_rate,
            throttle_rate: faults.throttle_rate,
            hang_rate: faults.hang_rate,
            operation_polls: match self {
                Cloud::Emulator(_) => faults.operation_polls,
                Cloud::Aws(_) => None,
            },
            invisible_get_seconds: get.as_secs_f64(),
            invisible_list_seconds: list.as_secs_f64(),
            invisible_delete_seconds: INVISIBLE_DELETE.as_secs_f64(),
            flapping_seconds: FLAPPING.as_secs_f64(),
            flapping_miss_rate: faults.flapping.miss_rate,
            seed: faults.seed,
        };
        (settings, faults)
    }

    /// Turns the storm on (`Some`: its knobs) or off.
    fn set_storm(&self, storm: Option<&Faults>) {
        match self {
            Cloud::Emulator(emulator) => emulator.set_faults(storm.cloned().unwrap_or_default()),
            Cloud::Aws(_) => {
                let faults = match storm {
                    // moto's layer has the same knobs but operation_polls: EC2 terminates at once there.
                    Some(storm) => test_support::moto::Faults {
                        server_error_rate: storm.server_error_rate,
                        throttle_rate: storm.throttle_rate,
                        hang_rate: storm.hang_rate,
                        hang_for: storm.hang_for,
                        invisible: storm.invisible,
                        flapping: storm.flapping.clone(),
                        access_key: Some(AWS_PROVIDER_KEY.into()),
                        seed: storm.seed,
                        ..Default::default()
                    },
                    None => test_support::moto::Faults::default(),
                };
                test_support::moto::moto().set_faults(&faults);
            }
        }
    }

    /// (requests, server errors, throttled, hangs, not seen) since the faults were set.
    fn counts(&self) -> (u64, u64, u64, u64, u64) {
        match self {
            Cloud::Emulator(emulator) => {
                let i = emulator.injected();
                (
                    i.requests,
                    i.server_errors,
                    i.throttled,
                    i.hangs,
                    i.not_found,
                )
            }
            Cloud::Aws(_) => {
                let moto = test_support::moto::moto();
                let i = moto.injected();
                let requests = moto.requests_signed_by(AWS_PROVIDER_KEY).values().sum();
                (requests, i.server_errors, i.throttled, i.hangs, i.not_found)
            }
        }
    }
}

/// Asks `lookup` until it answers: up to [`CHECK_ATTEMPTS`] times, each within [`CHECK_DEADLINE`]. The last
/// failure when none answered.
async fn answered<T, F, Fut>(what: &str, mut lookup: F) -> Result<T, String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, Error>>,
{
    let mut last = String::new();
    for attempt in 0..CHECK_ATTEMPTS {
        if attempt > 0 {
            tokio::time::sleep(POLL * attempt.min(10)).await;
        }
        match tokio::time::timeout(CHECK_DEADLINE, lookup()).await {
            Ok(Ok(answer)) => return Ok(answer),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = format!("no answer within {CHECK_DEADLINE:?}"),
        }
    }
    Err(format!(
        "{what}: no answer after {CHECK_ATTEMPTS} attempts: {last}"
    ))
}

/// The failed checks of one cloud: all counted, the first few kept.
#[derive(Debug, Default)]
struct Failures {
    count: usize,
    kept: Vec<String>,
}

impl Failures {
    fn add(&mut self, why: String) {
        eprintln!("bench: fault storm check failed: {why}");
        self.count += 1;
        if self.kept.len() < KEPT_FAILURES {
            self.kept.push(why);
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
    // Born new: the VMs lag for the storm's windows from their creation, and say they are that young (their
    // creation times), as a cloud lags only for new instances.
    cloud.set_storm(Some(&Faults {
        created_age: Some(Duration::ZERO),
        ..Faults::default()
    }));
    let created = Instant::now();
    let vms = cloud.create_vms(n).await?;
    let ids: Vec<String> = vms.iter().map(|(_, id)| id.clone()).collect();
    let mut foreign = Vec::new();
    for (vm, id) in vms.iter().step_by(FOREIGN_EVERY) {
        if let Some(part) = cloud.place_foreign_part(vm, id).await? {
            foreign.push(part);
        }
    }
    let ns = format!("bench-fault-storm-{name}");
    cluster.namespace(&ns).await?;
    cluster
        .create_peerpods(&ns, "storm", name, &ids, false)
        .await?;
    let api = cluster.peerpods(&ns);

    let (settings, faults) = cloud.storm_settings(
        created.elapsed(),
        options.fault_storm_lookup_lag,
        name == "alibabacloud",
    );
    // The cloud's consistency window outlasts its longest lag, the premise of the engine's window.
    let window = faults.longest_lag() + WINDOW_MARGIN;
    let (provider, _config) =
        start_provider(options, &scenario, &cloud.config(Some(window))).await?;
    let ctrl = start_ctrl(options, &scenario, cluster, provider.1).await?;
    let provider = provider.0;

    // The watch: every PeerPod seen going is checked against the cloud at that moment.
    let releases: Arc<Mutex<Vec<(Duration, Check)>>> = Arc::default();
    let started = Arc::new(Mutex::new(None::<Instant>));
    let watch = {
        let api = api.clone();
        let cloud = Arc::clone(&cloud);
        let releases = Arc::clone(&releases);
        let started = Arc::clone(&started);
        tokio::spawn(async move {
            let mut events = watcher(api, watcher::Config::default())
                .default_backoff()
                .boxed();
            while let Some(event) = events.next().await {
                let Ok(watcher::Event::Delete(peerpod)) = event else {
                    continue;
                };
                let peerpod: PeerPod = peerpod;
                let id = &peerpod.spec.instance_id;
                let check =
                    match answered(&format!("release check of {id}"), || cloud.exists(id)).await {
                        Ok(true) => Check::Exists,
                        Ok(false) => Check::Gone,
                        Err(why) => Check::NoAnswer(why),
                    };
                let at = started
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .map_or(Duration::ZERO, |s| s.elapsed());
                releases
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((at, check));
            }
        })
    };

    let before = Scrape::parse(&provider.metrics().await?)?;
    cloud.set_storm(Some(&faults));
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
    let (requests, server_errors, throttled, hangs, not_seen) = cloud.counts();
    cloud.set_storm(None);
    let after = Scrape::parse(&provider.metrics().await?)?;
    // Let the watch catch up with the last deletions before reading it.
    let _ = wait_until(
        "the watch to see every release",
        Duration::from_secs(120),
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

    let mut failures = Failures::default();
    let mut leaked = 0;
    for id in &ids {
        match answered(&format!("leak check of {id}"), || cloud.exists(id)).await {
            Ok(true) => leaked += 1,
            Ok(false) => {}
            Err(why) => failures.add(why),
        }
    }
    let mut foreign_deleted = 0;
    for part in &foreign {
        match answered(&format!("check of part {part}"), || {
            cloud.foreign_part_exists(part)
        })
        .await
        {
            Ok(true) => {}
            Ok(false) => foreign_deleted += 1,
            Err(why) => failures.add(why),
        }
    }
    let releases = releases.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (_, check) in &releases {
        if let Check::NoAnswer(why) = check {
            failures.add(why.clone());
        }
    }
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
        settings,
        cleanup_seconds: cleanup,
        release_p50_seconds: percentile(&times, 50.0).as_secs_f64(),
        release_p95_seconds: percentile(&times, 95.0).as_secs_f64(),
        releases_observed: releases.len(),
        releases_unchecked: n.saturating_sub(releases.len()),
        released_early: releases
            .iter()
            .filter(|(_, check)| matches!(check, Check::Exists))
            .count(),
        leaked,
        failed_checks: failures.count,
        failed_check_errors: failures.kept,
        foreign_parts: foreign.len(),
        foreign_parts_deleted: foreign_deleted,
        cloud_requests: requests,
        cloud_requests_per_peerpod: if n > 0 {
            requests as f64 / n as f64
        } else {
            0.0
        },
        server_errors,
        throttled,
        hangs,
        not_seen,
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
    let problems = figures.problems();
    let s = &figures.settings;
    vec![
        (
            "result".into(),
            if problems.is_empty() {
                "ok".into()
            } else {
                format!("FAILED: {}", problems.join(", "))
            },
        ),
        ("PeerPods".into(), figures.peerpods.to_string()),
        (
            "storm".into(),
            format!(
                "{:.0}% 5xx, {:.0}% throttled, {:.0}% hung; deletes of {}; unseen by get / list / delete \
                 {:.0} / {:.0} / {:.0} s, flapping {:.0} s",
                s.server_error_rate * 100.0,
                s.throttle_rate * 100.0,
                s.hang_rate * 100.0,
                s.operation_polls
                    .map_or("1 call (no knob)".to_owned(), |p| format!("{p} polls")),
                s.invisible_get_seconds,
                s.invisible_list_seconds,
                s.invisible_delete_seconds,
                s.flapping_seconds
            ),
        ),
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
            "cloud calls per PeerPod".into(),
            format!(
                "{:.1} ({} in all: {} 5xx, {} throttled, {} hung, {} not seen)",
                figures.cloud_requests_per_peerpod,
                figures.cloud_requests,
                figures.server_errors,
                figures.throttled,
                figures.hangs,
                figures.not_seen
            ),
        ),
        (
            "DeleteInstance calls per PeerPod".into(),
            format!(
                "{:.1}",
                figures.delete_instance_calls as f64 / figures.peerpods.max(1) as f64
            ),
        ),
        (
            "released early".into(),
            format!(
                "{} ({} of {} releases checked)",
                figures.released_early, figures.releases_observed, figures.peerpods
            ),
        ),
        ("VMs leaked".into(), figures.leaked.to_string()),
        (
            "foreign parts deleted".into(),
            if figures.foreign_parts == 0 {
                "n/a (the emulator models no part that is not the VM's)".into()
            } else {
                format!(
                    "{} of {}",
                    figures.foreign_parts_deleted, figures.foreign_parts
                )
            },
        ),
        (
            "failed checks".into(),
            match figures.failed_check_errors.first() {
                None => figures.failed_checks.to_string(),
                Some(first) => format!("{} (first: {first})", figures.failed_checks),
            },
        ),
    ]
}
