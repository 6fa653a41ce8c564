//! cloud-api-adaptor's developer mode (`PODVM_DEVELOPER_MODE` in its ConfigMap): while it is on, each selected
//! node advertises at most one VM, CAA's own default then, and CAA's pod template carries the mode, so switching
//! it rolls CAA's pods (CAA reads the ConfigMap only when it starts).

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use peer_pod_config_ctrl::caches::CAA_CONFIG_MAP;
use peer_pod_config_ctrl::objects::{CAA_DAEMONSET, DEVELOPER_MODE_ANNOTATION};
use peerpods_api::peerpodconfig::EventReason;
use peerpods_protocol::decide::DEVELOPER_MODE_KEY;

use crate::support::{Scenario, TIMEOUT};

const NAME: &str = "peerpodconfig";

/// The developer-mode annotation of the CAA DaemonSet's pod template, once the DaemonSet has `wanted`.
async fn wait_template(s: &Scenario, wanted: Option<&str>) {
    let daemonsets: Api<DaemonSet> = Api::namespaced(s.client.clone(), &s.ns);
    testenv::wait_for(
        &format!("the CAA pod template's {DEVELOPER_MODE_ANNOTATION} is {wanted:?}"),
        TIMEOUT,
        || async {
            let ds = daemonsets.get_opt(CAA_DAEMONSET).await.ok().flatten()?;
            let annotation = ds
                .spec
                .template
                .metadata
                .and_then(|m| m.annotations)
                .and_then(|a| a.get(DEVELOPER_MODE_ANNOTATION).cloned());
            (annotation.as_deref() == wanted).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn developer_mode_caps_each_node_at_one_vm_and_switching_it_rolls_caa() {
    let s = Scenario::start("ppc-devmode").await;
    let config_maps: Api<ConfigMap> = Api::namespaced(s.client.clone(), &s.ns);
    let setting = |value: &str| BTreeMap::from([(DEVELOPER_MODE_KEY.to_owned(), value.to_owned())]);
    config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: ObjectMeta {
                    name: Some(CAA_CONFIG_MAP.into()),
                    ..ObjectMeta::default()
                },
                data: Some(setting("true")),
                ..ConfigMap::default()
            },
        )
        .await
        .expect("create CAA's ConfigMap");
    s.create_nodes(0..3, |i| i < 2).await;
    s.create_config(
        NAME,
        serde_json::json!({"limitPerNode": 4, "nodeSelector": s.selector()}),
    )
    .await;

    // On: one VM on each selected node, whatever the limit asks, and the pod template says why.
    let values = s.wait_spread(2).await;
    assert_eq!(values.values().copied().collect::<Vec<_>>(), [1, 1]);
    wait_template(&s, Some("on")).await;
    let configs = s.configs();
    let status = testenv::wait_for("status under developer mode", TIMEOUT, || async {
        let status = configs.get(NAME).await.ok()?.status?;
        (status.effective_limit == Some(2)).then_some(status)
    })
    .await;
    assert_eq!(status.requested_limit, Some(8));
    let capacity = status
        .conditions
        .iter()
        .find(|c| c.type_ == "CapacityAdvertised")
        .expect("CapacityAdvertised");
    assert!(
        capacity
            .message
            .ends_with("at most 1 per node: cloud-api-adaptor runs in developer mode"),
        "{}",
        capacity.message
    );

    // Off: the limit again, a template without the annotation (CAA's pods roll), and an Event saying so.
    config_maps
        .patch(
            CAA_CONFIG_MAP,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": setting("false")})),
        )
        .await
        .expect("switch developer mode off");
    let values = s.wait_spread(8).await;
    assert_eq!(values.values().copied().collect::<Vec<_>>(), [4, 4]);
    wait_template(&s, None).await;
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns);
    testenv::wait_for_event(
        "an Event saying developer mode is now off",
        &events,
        TIMEOUT,
        |e| {
            e.reason.as_deref() == Some(EventReason::DeveloperModeChanged.as_str())
                && e.note
                    .as_deref()
                    .is_some_and(|n| n.contains("developer mode is now off"))
        },
    )
    .await;
    s.finish().await;
}
