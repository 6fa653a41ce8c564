//! Every container the chart runs carries resource requests and limits, with each value set the chart tests
//! render: the scheduler places it by its requests, and a memory limit caps what it can take from its node
//! (the figures come from `make bench` and the webhook's memory test; deploy/README.md).

use crate::support::*;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, StatefulSet};
use k8s_openapi::api::core::v1::PodSpec;

const DEV_VALUES: &str = "deploy/tests/values-dev.yaml";
/// The webhook's worst case, its whole admission budget taken by the largest reviews, in MiB: the bound
/// peerpods-webhook's tests/memory.rs derives and holds it to (measured peak 196 MiB).
const WEBHOOK_WORST_CASE_MIB: u64 = 270;

/// A memory quantity in MiB, for the forms the chart writes (`Mi`, `Gi`).
fn mib(quantity: &str) -> Option<u64> {
    if let Some(n) = quantity.strip_suffix("Mi") {
        return n.parse().ok();
    }
    quantity
        .strip_suffix("Gi")?
        .parse::<u64>()
        .ok()
        .map(|n| n * 1024)
}

/// The containers (init containers included) of every workload in `manifest`, by `kind/name/container`.
fn containers(manifest: &str) -> Vec<(String, k8s_openapi::api::core::v1::Container)> {
    let mut out = Vec::new();
    for doc in documents(manifest) {
        let kind = kind_of(&doc).to_owned();
        let (name, pod): (Option<String>, Option<PodSpec>) = match kind.as_str() {
            "Deployment" => {
                let d: Deployment = serde_saphyr::from_str(&doc).expect("a Deployment");
                (d.metadata.name, d.spec.template.spec)
            }
            "DaemonSet" => {
                let d: DaemonSet = serde_saphyr::from_str(&doc).expect("a DaemonSet");
                (d.metadata.name, d.spec.template.spec)
            }
            "StatefulSet" => {
                let d: StatefulSet = serde_saphyr::from_str(&doc).expect("a StatefulSet");
                (d.metadata.name, d.spec.template.spec)
            }
            _ => continue,
        };
        let pod = pod.expect("a pod template");
        let name = name.unwrap_or_default();
        for c in pod
            .containers
            .into_iter()
            .chain(pod.init_containers.unwrap_or_default())
        {
            out.push((format!("{kind}/{name}/{}", c.name), c));
        }
    }
    out
}

#[tokio::test]
async fn every_container_of_the_chart_has_requests_and_limits() {
    let mut deployments = 0;
    let mut webhooks = 0;
    for (case, values) in [
        ("default", vec![DEV_VALUES]),
        ("full", vec!["deploy/tests/values-full.yaml"]),
        (
            "addons",
            vec![DEV_VALUES, "deploy/tests/values-addons.yaml"],
        ),
        (
            "alongside-caa-our-webhook",
            vec![
                DEV_VALUES,
                "deploy/chart/peerpods/examples/alongside-caa.yaml",
                "deploy/tests/values-our-webhook.yaml",
            ],
        ),
    ] {
        let manifest = render("peerpods", "resources", &values).await;
        let found = containers(&manifest);
        assert!(!found.is_empty(), "{case}: no workload rendered");
        for (at, container) in found {
            if at.starts_with("Deployment/") {
                deployments += 1;
            }
            let resources = container
                .resources
                .unwrap_or_else(|| panic!("{case}: {at} has no resources"));
            let requests = resources.requests.unwrap_or_default();
            let limits = resources.limits.unwrap_or_default();
            for name in ["cpu", "memory"] {
                assert!(
                    requests.contains_key(name),
                    "{case}: {at} requests no {name}: {requests:?}"
                );
            }
            assert!(
                limits.contains_key("memory"),
                "{case}: {at} has no memory limit: {limits:?}"
            );
            // The chart's own webhook resources (the full value set sets every value, resources too, on purpose).
            if case != "full" && at.starts_with("Deployment/") && at.contains("webhook") {
                webhooks += 1;
                let limit = mib(&limits["memory"].0);
                assert!(
                    limit.is_some_and(|l| l >= WEBHOOK_WORST_CASE_MIB),
                    "{case}: {at}'s memory limit {:?} is below the webhook's worst case, {WEBHOOK_WORST_CASE_MIB} MiB",
                    limits["memory"]
                );
            }
        }
    }
    // peerpod-ctrl, peer-pod-config-ctrl and provider-service, and the webhook where it is enabled.
    assert!(deployments >= 4 * 2, "{deployments} Deployment containers");
    assert!(webhooks >= 1, "no value set rendered the webhook");
}
