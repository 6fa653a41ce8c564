//! What operators steer, against the real control plane: deleting a PeerPodConfig waits while peer pods still
//! run (or until forced), and a node's own `kata.peerpods.io/vm-limit` label overrides its share.

use std::collections::BTreeMap;

use crate::support::{Scenario, TIMEOUT, peer_pod_resource};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use peer_pod_config_ctrl::hold::{DELETION_HELD, FORCE_DELETE};
use peer_pod_config_ctrl::spread::VM_LIMIT_LABEL;
use peerpods_api::peerpodconfig::PeerPodConfig;

const NAME: &str = "peerpodconfig";

fn peerpods(s: &Scenario) -> Api<DynamicObject> {
    Api::namespaced_with(s.client.clone(), &s.ns, &peer_pod_resource())
}

/// A PeerPod as cloud-api-adaptor records a running peer pod (without the finalizer, so deleting it is
/// immediate: this controller only cares whether it exists).
async fn peer_pod(s: &Scenario, name: &str) {
    let object: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPod",
        "metadata": {"name": name},
        "spec": {"cloudProvider": "libvirt", "instanceID": format!("vm-{name}")},
    }))
    .expect("PeerPod");
    peerpods(s)
        .create(&PostParams::default(), &object)
        .await
        .expect("create PeerPod");
}

fn held(config: &PeerPodConfig) -> Option<String> {
    config
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == DELETION_HELD && c.status == "True")
        .map(|c| c.message.clone())
}

async fn wait_held(s: &Scenario, what: &str, check: impl Fn(&str) -> bool) -> String {
    let api = s.configs();
    let check = &check;
    testenv::wait_for(what, TIMEOUT, || {
        let api = api.clone();
        async move {
            let config = api.get_opt(NAME).await.ok().flatten()?;
            held(&config).filter(|m| check(m))
        }
    })
    .await
}

async fn advertised(s: &Scenario) -> BTreeMap<String, Option<u32>> {
    s.node_state()
        .await
        .into_iter()
        .map(|(name, (value, _))| (name, value))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_config_waits_for_running_peer_pods_and_names_them() {
    let s = Scenario::start("ppc-hold").await;
    testenv::apply_crds(&s.client, "deploy/crds/peerpods.yaml").await;
    s.create_nodes(0..2, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 4, "nodeSelector": s.selector()}),
    )
    .await;
    s.wait_spread(4).await;
    peer_pod(&s, "web-resource-aaaaa").await;
    peer_pod(&s, "db-resource-bbbbb").await;

    s.configs()
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete PeerPodConfig");
    let message = wait_held(&s, "the deletion held", |m| m.contains("2 peer pod(s)")).await;
    let db = format!("{}/db-resource-bbbbb", s.ns);
    let web = format!("{}/web-resource-aaaaa", s.ns);
    assert!(message.contains(&db) && message.contains(&web), "{message}");
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns);
    testenv::wait_for_event(
        "a Warning Event naming the peer pods",
        &events,
        TIMEOUT,
        |e| {
            e.reason.as_deref() == Some(DELETION_HELD)
                && e.note.as_deref().is_some_and(|n| n.contains(&web))
        },
    )
    .await;
    // The runtime stays while it is held: capacity on every node.
    assert!(
        advertised(&s).await.values().all(Option::is_some),
        "capacity kept while held"
    );

    peerpods(&s)
        .delete("web-resource-aaaaa", &DeleteParams::default())
        .await
        .expect("delete PeerPod");
    let message = wait_held(&s, "one peer pod left", |m| m.contains("1 peer pod(s)")).await;
    assert!(
        message.contains(&db) && !message.contains(&web),
        "{message}"
    );

    peerpods(&s)
        .delete("db-resource-bbbbb", &DeleteParams::default())
        .await
        .expect("delete PeerPod");
    testenv::wait_for("the PeerPodConfig gone once none run", TIMEOUT, || async {
        matches!(s.configs().get_opt(NAME).await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        advertised(&s).await.values().all(Option::is_none),
        "capacity removed by the cleanup"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_force_annotation_lets_a_held_deletion_proceed() {
    let s = Scenario::start("ppc-force").await;
    testenv::apply_crds(&s.client, "deploy/crds/peerpods.yaml").await;
    s.create_nodes(0..1, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 2, "nodeSelector": s.selector()}),
    )
    .await;
    s.wait_spread(2).await;
    peer_pod(&s, "still-running").await;
    s.configs()
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete PeerPodConfig");
    wait_held(&s, "the deletion held", |m| m.contains("still-running")).await;
    s.configs()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {FORCE_DELETE: "true"}}})),
        )
        .await
        .expect("annotate");
    testenv::wait_for("the forced deletion done", TIMEOUT, || async {
        matches!(s.configs().get_opt(NAME).await, Ok(None)).then_some(())
    })
    .await;
    assert!(
        peerpods(&s)
            .get_opt("still-running")
            .await
            .expect("get")
            .is_some(),
        "forcing deletes no PeerPod"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_label_overrides_its_share_and_the_rest_is_spread() {
    let s = Scenario::start("ppc-vmlimit").await;
    s.create_nodes(0..4, |_| true).await;
    let big = s.node_name(0);
    s.nodes()
        .patch(
            &big,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {VM_LIMIT_LABEL: "7"}}})),
        )
        .await
        .expect("label node");
    s.create_config(
        NAME,
        serde_json::json!({"limit": 10, "nodeSelector": s.selector()}),
    )
    .await;
    let want = |values: &BTreeMap<String, Option<u32>>, big_value: u32, others: u32| {
        values.len() == 4
            && values[&big] == Some(big_value)
            && values
                .iter()
                .filter(|(n, _)| **n != big)
                .all(|(_, v)| *v == Some(others))
    };
    testenv::wait_for(
        "7 on the labelled node, 1 on each other",
        TIMEOUT,
        || async { want(&advertised(&s).await, 7, 1).then_some(()) },
    )
    .await;
    // Changing the label alone rebalances: the node watch sees label changes.
    s.nodes()
        .patch(
            &big,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"labels": {VM_LIMIT_LABEL: "1"}}})),
        )
        .await
        .expect("relabel node");
    testenv::wait_for(
        "1 on the labelled node, 3 on each other",
        TIMEOUT,
        || async { want(&advertised(&s).await, 1, 3).then_some(()) },
    )
    .await;
    let nodes: Api<Node> = s.nodes();
    assert!(
        nodes
            .get(&big)
            .await
            .expect("node")
            .labels()
            .contains_key(VM_LIMIT_LABEL)
    );
    s.finish().await;
}
