//! Cleanup storm: N PeerPods with `peer.pod/finalizer` for N running moto instances are deleted at once; measured
//! until every finalizer is released and every instance is terminated. The floor is the same client releasing N
//! finalizers itself with parallel patches and no cloud call. The EC2 calls provider-service made during the storm
//! are the cloud-calls figures.
//!
//! Then the same storm through an outage: provider-service is stopped when the PeerPods are deleted and started
//! again on the same address [`OUTAGE`] later. Its API writes per PeerPod, against the storm's (the success
//! path), show what an outage costs the API server: peerpod-ctrl's circuit breaker and its one write per change
//! of failure class keep it near the success path (the target is at most 1.2x), where a write per failed attempt
//! made it several times that.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};

use crate::Error;
use crate::cluster::{Cluster, wait_until};
use crate::moto::{self, Moto};
use crate::options::Options;
use crate::procs::{Service, Spec, free_addr};
use crate::report::{CloudCalls, Outcome, Storm};
use test_support::metrics::Scrape;

const POLL: Duration = Duration::from_millis(100);

/// How long provider-service is away in the outage storm.
const OUTAGE: Duration = Duration::from_secs(10);

pub async fn run(options: &Options, cluster: &Cluster) -> (Outcome<Storm>, Outcome<CloudCalls>) {
    match measure(options, cluster).await {
        Ok((storm, calls)) => (Outcome::Measured(storm), Outcome::Measured(calls)),
        Err(e) => (Outcome::from_error(&e), Outcome::from_error(&e)),
    }
}

/// One storm's parts: `options.storm` instances in moto, provider-service and peerpod-ctrl on them, and a
/// PeerPod being deleted for each in namespace `bench-<name>`, every one already seen by the controller.
struct StormRun {
    moto: Moto,
    ec2: aws_sdk_ec2::Client,
    provider: Service,
    provider_addr: std::net::SocketAddr,
    config: Option<tempfile::TempDir>,
    ctrl: Service,
    ns: String,
}

impl StormRun {
    async fn start(options: &Options, cluster: &Cluster, name: &str) -> Result<StormRun, Error> {
        let n = options.storm;
        let moto = moto::start(&options.moto_python, &options.log_dir).await?;
        let ec2 = moto.client();
        let instance_ids = moto::run_instances(&ec2, n).await?;
        let (provider, provider_addr, config) =
            super::start_provider(options, name, Some(&moto)).await?;
        let ctrl = super::start_peerpod_ctrl(options, name, cluster, provider_addr).await?;
        let ns = format!("bench-{name}");
        cluster.namespace(&ns).await?;
        cluster
            .create_peerpods(&ns, name, "aws", &instance_ids, true)
            .await?;
        // Let the controller see every PeerPod before the clock starts, so the figure is the cleanup, not the
        // sync. Best effort, as a count of the whole cluster may include PeerPods leaving it meanwhile.
        let _ = super::wait_cached(cluster, &ctrl, Duration::from_secs(60)).await;
        Ok(StormRun {
            moto,
            ec2,
            provider,
            provider_addr,
            config,
            ctrl,
            ns,
        })
    }
}

async fn measure(options: &Options, cluster: &Cluster) -> Result<(Storm, CloudCalls), Error> {
    let n = options.storm;
    // The floor first, while no controller runs that could release a finalizer itself.
    let floor = floor(options, cluster).await?;
    let cloud_floor = cloud_floor(options).await?;

    let StormRun {
        moto,
        ec2,
        provider,
        // Kept to the end: provider-service reads its configuration from this directory.
        config: _config,
        ctrl,
        ns,
        ..
    } = StormRun::start(options, cluster, "storm").await?;
    let ns = ns.as_str();

    let before = Scrape::parse(&provider.metrics().await?)?;
    let requests_before = moto::provider_requests(&moto);
    let writes_before = controller_writes(cluster).await?;
    let api = cluster.peerpods(ns);
    let started = Instant::now();
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    wait_until(
        "every storm finalizer released and every instance terminated",
        options.timeout,
        POLL,
        || async {
            if !api
                .list(&ListParams::default().limit(1))
                .await?
                .items
                .is_empty()
            {
                return Ok(None);
            }
            Ok((moto::live_instances(&ec2).await? == 0).then_some(()))
        },
    )
    .await?;
    let cleanup = started.elapsed().as_secs_f64();
    let after = Scrape::parse(&provider.metrics().await?)?;
    let requests_after = moto::provider_requests(&moto);
    let writes = settled_writes(options, cluster).await?.since(writes_before);
    let events_written = started.elapsed().as_secs_f64() - SETTLED.as_secs_f64();
    ctrl.stop().await;
    provider.stop().await;

    let by_operation = requests_between(&requests_before, &requests_after);
    let ec2_calls = by_operation.values().sum();
    let sdk_operations = sdk_operations_by_operation(&after, &before).values().sum();
    let delete_calls = |scrape: &Scrape| {
        scrape.sum(
            "provider_service_grpc_calls_total",
            &[("method", "DeleteInstance")],
        )
    };
    let per_delete = |count: f64| if n > 0 { count / n as f64 } else { 0.0 };
    let success_writes_per_delete = per_delete(writes.total());
    let outage = outage(options, cluster).await?;
    let storm = Storm {
        peerpods: n,
        cleanup_seconds: cleanup,
        floor_seconds: floor,
        floor_concurrency: options.floor_concurrency,
        ratio: if floor > 0.0 { cleanup / floor } else { 0.0 },
        cloud_floor_seconds: cloud_floor,
        ratio_to_slower_floor: if floor.max(cloud_floor) > 0.0 {
            cleanup / floor.max(cloud_floor)
        } else {
            0.0
        },
        peerpods_per_second: if cleanup > 0.0 {
            n as f64 / cleanup
        } else {
            0.0
        },
        api_writes_per_delete: success_writes_per_delete,
        peerpod_writes_per_delete: per_delete(writes.peerpods),
        event_writes_per_delete: per_delete(writes.events),
        events_written_seconds: events_written.max(cleanup),
        outage_seconds: OUTAGE.as_secs_f64(),
        outage_writes_during: outage.writes_during,
        outage_api_writes_per_delete: outage.writes_per_delete,
        outage_writes_ratio: if success_writes_per_delete > 0.0 {
            outage.writes_per_delete / success_writes_per_delete
        } else {
            0.0
        },
    };
    let calls = CloudCalls {
        deletes: n,
        ec2_calls,
        ec2_calls_by_operation: by_operation,
        sdk_operations,
        ec2_calls_per_delete: if n > 0 {
            ec2_calls as f64 / n as f64
        } else {
            0.0
        },
        delete_instance_calls: (delete_calls(&after) - delete_calls(&before)).max(0.0) as u64,
    };
    Ok((storm, calls))
}

/// What the outage storm cost the API server.
struct OutageWrites {
    /// Writes while provider-service was away.
    writes_during: f64,
    /// Writes per released PeerPod, outage and recovery together.
    writes_per_delete: f64,
}

/// The storm again, with provider-service stopped from the delete on for [`OUTAGE`] (see the module doc).
async fn outage(options: &Options, cluster: &Cluster) -> Result<OutageWrites, Error> {
    let n = options.storm;
    let StormRun {
        // Kept to the end: dropping it stops moto.
        moto: _moto,
        ec2,
        provider,
        provider_addr,
        config,
        ctrl,
        ns,
    } = StormRun::start(options, cluster, "outage").await?;
    let ns = ns.as_str();
    provider.stop().await;
    let writes_before = controller_writes(cluster).await?;
    let api = cluster.peerpods(ns);
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    tokio::time::sleep(OUTAGE).await;
    let writes_during = controller_writes(cluster)
        .await?
        .since(writes_before)
        .total();
    // Back on the same address and configuration, as a restarted Pod behind its Service.
    let config_dir = config.as_ref().map(|dir| dir.path().display().to_string());
    let admin = free_addr()?;
    let provider = Service::start(Spec {
        name: "provider-service",
        scenario: "outage",
        program: options.bin_dir.join("provider-service"),
        args: [
            "--auth=none".to_string(),
            format!("--listen={provider_addr}"),
            format!("--admin-listen={admin}"),
        ]
        .into_iter()
        .chain(config_dir.map(|dir| format!("--config-dir={dir}")))
        .collect(),
        env: Vec::new(),
        admin,
        log_dir: &options.log_dir,
    })
    .await?;
    wait_until(
        "every outage finalizer released and every instance terminated",
        options.timeout,
        POLL,
        || async {
            if !api
                .list(&ListParams::default().limit(1))
                .await?
                .items
                .is_empty()
            {
                return Ok(None);
            }
            Ok((moto::live_instances(&ec2).await? == 0).then_some(()))
        },
    )
    .await?;
    let writes = settled_writes(options, cluster)
        .await?
        .since(writes_before)
        .total();
    ctrl.stop().await;
    provider.stop().await;
    drop(config);
    Ok(OutageWrites {
        writes_during,
        writes_per_delete: if n > 0 { writes / n as f64 } else { 0.0 },
    })
}

/// Seconds from deleting N finalizer-held PeerPods to all of them gone, releasing the finalizers directly.
async fn floor(options: &Options, cluster: &Cluster) -> Result<f64, Error> {
    let ns = "bench-floor";
    cluster.namespace(ns).await?;
    // Well-formed ids nothing will ever look up: no controller runs during the floor.
    let ids: Vec<String> = (0..options.storm).map(|i| format!("i-{i:017x}")).collect();
    cluster
        .create_peerpods(ns, "floor", "aws", &ids, false)
        .await?;
    let api = cluster.peerpods(ns);
    let release = serde_json::json!({"metadata": {"finalizers": null}});
    let started = Instant::now();
    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await?;
    futures::stream::iter(0..options.storm)
        .map(|i| {
            let api = api.clone();
            let release = &release;
            async move {
                api.patch(
                    &format!("floor-{i}"),
                    &PatchParams::default(),
                    &Patch::Merge(release),
                )
                .await
            }
        })
        .buffer_unordered(options.floor_concurrency.max(1))
        .try_for_each(|_| async { Ok(()) })
        .await?;
    wait_until(
        "every floor PeerPod gone",
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
    .await?;
    Ok(started.elapsed().as_secs_f64())
}

/// Instances per EC2 call of the cloud floor: EC2's bound on a filter's values, the batch provider-service
/// sends at most.
const CLOUD_FLOOR_BATCH: usize = 200;

/// Seconds for the bench itself to make the EC2 calls a confirmed delete of N instances needs, batched as
/// provider-service batches them, on a moto of its own with N running instances: `DescribeInstances` by id
/// (the look before deleting, for the guards), `TerminateInstances`, `DescribeInstances` again (the look that
/// confirms). No API server and no controller: what the cloud alone costs, as the floor is what the API server
/// alone costs. moto answers one call at a time, so the calls go one after another.
async fn cloud_floor(options: &Options) -> Result<f64, Error> {
    let moto = moto::start(&options.moto_python, &options.log_dir.join("cloud-floor")).await?;
    let ec2 = moto.client();
    let ids = moto::run_instances(&ec2, options.storm).await?;
    let started = Instant::now();
    for chunk in ids.chunks(CLOUD_FLOOR_BATCH) {
        moto::describe(&ec2, chunk).await?;
    }
    for chunk in ids.chunks(CLOUD_FLOOR_BATCH) {
        moto::terminate(&ec2, chunk).await?;
    }
    for chunk in ids.chunks(CLOUD_FLOOR_BATCH) {
        moto::describe(&ec2, chunk).await?;
    }
    Ok(started.elapsed().as_secs_f64())
}

/// Writes of the kinds a cleanup makes, counted by the API server: to the PeerPods (patches and status: the
/// finalizer's release is the one a cleanup needs) and Events (where its outcome goes). The bench's own DELETE
/// of the PeerPods is not a write of these verbs; nothing else writes them during the storm.
#[derive(Debug, Clone, Copy)]
struct Writes {
    peerpods: f64,
    events: f64,
}

impl Writes {
    /// The writes made since `before`.
    fn since(self, before: Writes) -> Writes {
        Writes {
            peerpods: self.peerpods - before.peerpods,
            events: self.events - before.events,
        }
    }

    fn total(self) -> f64 {
        self.peerpods + self.events
    }
}

/// How long the writes' count stays the same before [`settled_writes`] takes it as final.
const SETTLED: Duration = Duration::from_millis(500);

/// The controller's writes once they stop: its Events are written behind the releases (by one writer), so some
/// land after the last release. Taken when two counts [`SETTLED`] apart agree.
async fn settled_writes(options: &Options, cluster: &Cluster) -> Result<Writes, Error> {
    let mut last = controller_writes(cluster).await?;
    let deadline = Instant::now() + options.timeout;
    loop {
        tokio::time::sleep(SETTLED).await;
        let now = controller_writes(cluster).await?;
        if now.total() == last.total() || Instant::now() >= deadline {
            return Ok(now);
        }
        last = now;
    }
}

async fn controller_writes(cluster: &Cluster) -> Result<Writes, Error> {
    Ok(Writes {
        peerpods: cluster.api_writes("peerpods", "").await?
            + cluster.api_writes("peerpods", "status").await?,
        events: cluster.api_writes("events", "").await?,
    })
}

/// HTTP requests the cloud received between two counts, by EC2 action.
fn requests_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(action, n)| {
            (
                action.clone(),
                n.saturating_sub(before.get(action).copied().unwrap_or(0)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

/// EC2 operations provider-service counted itself (SDK operations: retries inside the SDK are invisible here)
/// between two scrapes of its metrics, by operation.
fn sdk_operations_by_operation(after: &Scrape, before: &Scrape) -> BTreeMap<String, u64> {
    let count = |scrape: &Scrape| {
        let mut by_op: BTreeMap<String, f64> = BTreeMap::new();
        for sample in scrape.samples("provider_service_cloud_api_calls_total") {
            if sample.label("provider") == "aws" {
                let op = sample.label("operation").to_owned();
                *by_op.entry(op).or_default() += sample.value;
            }
        }
        by_op
    };
    let before = count(before);
    count(after)
        .into_iter()
        .map(|(op, n)| {
            let diff = (n - before.get(&op).copied().unwrap_or(0.0)).max(0.0) as u64;
            (op, diff)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cloud_calls_are_the_difference_per_operation() {
        let before = "provider_service_cloud_api_calls_total{provider=\"aws\",operation=\"TerminateInstances\",result=\"ok\"} 2\n";
        let after = "provider_service_cloud_api_calls_total{provider=\"aws\",operation=\"TerminateInstances\",result=\"ok\"} 7\n\
            provider_service_cloud_api_calls_total{provider=\"aws\",operation=\"TerminateInstances\",result=\"throttled\"} 1\n\
            provider_service_cloud_api_calls_total{provider=\"aws\",operation=\"DescribeInstances\",result=\"ok\"} 3\n\
            provider_service_cloud_api_calls_total{provider=\"libvirt\",operation=\"delete\",result=\"ok\"} 9\n";
        let parse = |text| Scrape::parse(text).expect("scrape");
        let calls = sdk_operations_by_operation(&parse(after), &parse(before));
        assert_eq!(
            calls,
            BTreeMap::from([
                ("DescribeInstances".into(), 3),
                ("TerminateInstances".into(), 6)
            ])
        );
    }
}
