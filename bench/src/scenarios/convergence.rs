//! Convergence: M Nodes selected by one PeerPodConfig; its total changes, and the clock runs until every node
//! advertises its share as `kata.peerpods.io/vm`. Then API writes are counted over a window at steady state,
//! from the API server's own `apiserver_request_total` and from the controller's write counters.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use peer_pod_config_ctrl::crd::{PeerPodConfig, PeerPodConfigSpec};
use peer_pod_config_ctrl::objects::EXTENDED_RESOURCE;

use crate::Error;
use crate::cluster::{Cluster, wait_until};
use crate::options::Options;
use crate::report::Convergence;
use crate::stats;
use test_support::metrics::Scrape;

const NAMESPACE: &str = "bench-convergence";
const LABEL: &str = "bench.peerpods.io/convergence";
const POLL: Duration = Duration::from_millis(100);
/// Time after convergence before the steady-state window opens (status writes of the change settle).
const SETTLE: Duration = Duration::from_secs(5);
const WRITE_VERBS: [&str; 6] = [
    "POST",
    "PUT",
    "PATCH",
    "APPLY",
    "DELETE",
    "DELETECOLLECTION",
];
const CONTROLLER_WRITES: [&str; 3] = [
    "peerpodconfig_node_capacity_writes_total",
    "peerpodconfig_object_writes_total",
    "peerpodconfig_status_writes_total",
];

pub async fn run(options: &Options, cluster: &Cluster) -> Result<Convergence, Error> {
    let m = options.convergence_nodes;
    let from_total =
        u32::try_from(m).map_err(|_| Error::setup(format!("{m} nodes is too many")))?;
    // Two and a half VMs per node: the shares differ by one, so the spread itself is exercised.
    let to_total = from_total.saturating_mul(5) / 2;
    cluster.namespace(NAMESPACE).await?;
    let labels = BTreeMap::from([(LABEL.to_string(), "yes".to_string())]);
    cluster.create_nodes("bench-conv", m, &labels).await?;
    let spec: PeerPodConfigSpec = serde_json::from_value(serde_json::json!({
        "limit": from_total,
        "nodeSelector": {LABEL: "yes"},
    }))
    .map_err(|e| Error::setup_from("PeerPodConfig spec", e))?;
    let configs: Api<PeerPodConfig> = Api::namespaced(cluster.client.clone(), NAMESPACE);
    configs
        .create(&PostParams::default(), &PeerPodConfig::new("bench", spec))
        .await?;

    let started = Instant::now();
    let ctrl = super::start_config_ctrl(options, "convergence", cluster, NAMESPACE).await?;
    let nodes: Api<Node> = Api::all(cluster.client.clone());
    let selector = format!("{LABEL}=yes");
    wait_spread(&nodes, &selector, from_total, options.timeout).await?;
    let first_spread = started.elapsed().as_secs_f64();

    let writes_before = controller_writes(
        &Scrape::parse(&ctrl.metrics().await?)?,
        &CONTROLLER_WRITES[..1],
    );
    let change = serde_json::json!({"spec": {"limit": IntOrString::Int(to_total as i32)}});
    let started = Instant::now();
    configs
        .patch("bench", &PatchParams::default(), &Patch::Merge(&change))
        .await?;
    wait_spread(&nodes, &selector, to_total, options.timeout).await?;
    let change_seconds = started.elapsed().as_secs_f64();
    let change_node_writes = controller_writes(
        &Scrape::parse(&ctrl.metrics().await?)?,
        &CONTROLLER_WRITES[..1],
    ) - writes_before;

    tokio::time::sleep(SETTLE).await;
    let api_before = Scrape::parse(&cluster.apiserver_metrics().await?)?;
    let ctrl_before =
        controller_writes(&Scrape::parse(&ctrl.metrics().await?)?, &CONTROLLER_WRITES);
    tokio::time::sleep(options.steady_window).await;
    let api_after = Scrape::parse(&cluster.apiserver_metrics().await?)?;
    let ctrl_after = controller_writes(&Scrape::parse(&ctrl.metrics().await?)?, &CONTROLLER_WRITES);

    let by_resource = writes_by_resource(&api_after, &api_before);
    // The next scenario's controllers must not see these objects: the controller removes what it owns (its
    // finalizer holds the PeerPodConfig until then), then the nodes go.
    configs.delete("bench", &DeleteParams::default()).await?;
    wait_until(
        "the PeerPodConfig to be cleaned up",
        options.timeout,
        POLL,
        || async { Ok(configs.get_opt("bench").await?.is_none().then_some(())) },
    )
    .await?;
    ctrl.stop().await;
    nodes
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels(&selector),
        )
        .await?;
    Ok(Convergence {
        nodes: m,
        from_total,
        to_total,
        first_spread_seconds: first_spread,
        change_seconds,
        change_node_writes,
        steady_window_seconds: options.steady_window.as_secs_f64(),
        steady_api_writes: by_resource.values().sum(),
        steady_api_writes_by_resource: by_resource,
        steady_controller_writes: ctrl_after.saturating_sub(ctrl_before),
    })
}

/// Waits until every selected node advertises its share of `total`.
pub async fn wait_spread(
    nodes: &Api<Node>,
    selector: &str,
    total: u32,
    timeout: Duration,
) -> Result<(), Error> {
    wait_until(
        &format!("{EXTENDED_RESOURCE} spread to {total} over the nodes"),
        timeout,
        POLL,
        || async {
            let list = nodes.list(&ListParams::default().labels(selector)).await?;
            let values: Vec<Option<u32>> = list.items.iter().map(capacity).collect();
            Ok(stats::is_spread_of(&values, total).then_some(()))
        },
    )
    .await
}

fn capacity(node: &Node) -> Option<u32> {
    node.status
        .as_ref()?
        .capacity
        .as_ref()?
        .get(EXTENDED_RESOURCE)?
        .0
        .parse()
        .ok()
}

fn controller_writes(scrape: &Scrape, names: &[&str]) -> u64 {
    names.iter().map(|name| scrape.sum(name, &[])).sum::<f64>() as u64
}

/// Write requests the API server served between two scrapes, by resource (and subresource).
fn writes_by_resource(after: &Scrape, before: &Scrape) -> BTreeMap<String, u64> {
    let count = |scrape: &Scrape| {
        let mut by: BTreeMap<String, f64> = BTreeMap::new();
        for sample in scrape.samples("apiserver_request_total") {
            if !WRITE_VERBS.contains(&sample.label("verb")) {
                continue;
            }
            let resource = sample.label("resource");
            let key = match sample.label("subresource") {
                "" => resource.to_owned(),
                sub => format!("{resource}/{sub}"),
            };
            *by.entry(key).or_default() += sample.value;
        }
        by
    };
    let before = count(before);
    count(after)
        .into_iter()
        .map(|(key, n)| {
            let diff = (n - before.get(&key).copied().unwrap_or(0.0)).max(0.0) as u64;
            (key, diff)
        })
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn api_writes_by_resource_between_scrapes() {
        let before = "apiserver_request_total{resource=\"nodes\",subresource=\"status\",verb=\"PATCH\",code=\"200\"} 10\n\
            apiserver_request_total{resource=\"leases\",subresource=\"\",verb=\"PUT\",code=\"200\"} 4\n";
        let after = "apiserver_request_total{resource=\"nodes\",subresource=\"status\",verb=\"PATCH\",code=\"200\"} 10\n\
            apiserver_request_total{resource=\"leases\",subresource=\"\",verb=\"PUT\",code=\"200\"} 9\n\
            apiserver_request_total{resource=\"nodes\",subresource=\"\",verb=\"GET\",code=\"200\"} 50\n\
            apiserver_request_total{resource=\"events\",subresource=\"\",verb=\"POST\",code=\"201\"} 2\n";
        let parse = |text| Scrape::parse(text).expect("scrape");
        assert_eq!(
            writes_by_resource(&parse(after), &parse(before)),
            BTreeMap::from([("events".into(), 2), ("leases".into(), 5)])
        );
    }
}
