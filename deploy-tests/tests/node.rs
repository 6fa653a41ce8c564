//! The Helm chart on a real node (testenv's `node`: kubelet, containerd, runc, kube-proxy, kube-scheduler,
//! CoreDNS), with the images `make images-check` builds: the chart's pods run, pass their probes, run as the
//! non-root user on a read-only root, reach the API through the `kubernetes` Service and each other through
//! Service DNS; peerpod-ctrl releases a PeerPod through the in-cluster provider-service; peer-pod-config-ctrl's
//! CAA DaemonSet lands on the selected node and the node's allocatable shows `kata.peerpods.io/vm`.
//!
//! Run by `make test-node` (root: the test re-runs itself in namespaces of its own).
mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use serde_json::json;
use testenv::node::{NODE_IP, NODE_NAME, NodeOptions};

const NAMESPACE: &str = "peerpods-system";
const SERVICES: [&str; 3] = ["provider-service", "peerpod-ctrl", "peer-pod-config-ctrl"];
/// The one domain libvirt's `test:///default` driver starts with (a fixed UUID of that driver).
const TEST_DOMAIN_UUID: &str = "6695eb01-f6a4-8304-79aa-97f2502e193f";
/// The non-root user of the services' images (deploy/images).
const IMAGE_UID: u32 = 65532;

#[test]
#[ignore = "needs root and the node's binaries and images; run by `make test-node`"]
fn the_chart_runs_on_a_node() {
    if !testenv::node::isolated("the_chart_runs_on_a_node") {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(chart_on_a_node());
}

async fn chart_on_a_node() {
    let cp = testenv::ControlPlane::start_with(testenv::Options {
        node_ip: Some(NODE_IP),
        ..Default::default()
    })
    .expect("control plane on the node address");
    let images = SERVICES
        .map(|s| testenv::repo_root().join(format!("target/images/{s}.oci.tar")))
        .to_vec();
    let node = testenv::node::Node::start(&cp, NodeOptions { images })
        .await
        .expect("node up");
    let client = cp.client().await;

    install_chart(&cp, &client).await;
    for service in SERVICES {
        let deployment = format!("peerpods-{service}");
        if let Err(e) =
            testenv::node::wait_available(&client, NAMESPACE, &deployment, Duration::from_secs(180))
                .await
        {
            panic!("{e}\n{}", describe_pods(&client).await);
        }
    }
    eprintln!("all three Deployments available (readiness probes pass)");

    // Each service's process, seen by the kernel: the image's user, and `/` mounted read-only.
    for service in SERVICES {
        let pid = process_of(service).unwrap_or_else(|| panic!("no {service} process on the node"));
        let uid = process_uid(pid);
        assert_eq!(uid, IMAGE_UID, "{service} runs as uid {uid}");
        assert!(
            root_is_read_only(pid),
            "{service}'s root filesystem is writable"
        );
    }
    eprintln!("each service runs as uid {IMAGE_UID} on a read-only root");

    peerpod_cleaned_through_provider_service(&client).await;
    eprintln!(
        "peerpod-ctrl released a PeerPod after the in-cluster provider-service deleted its VM"
    );

    caa_lands_and_capacity_reaches_allocatable(&client).await;
    eprintln!("the CAA DaemonSet landed on the node; allocatable shows kata.peerpods.io/vm");
    drop(node);
}

async fn install_chart(cp: &testenv::ControlPlane, client: &Client) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": NAMESPACE}})).expect("ns"),
        )
        .await
        .expect("namespace");
    // CAA's configuration, which provider-service reads too: libvirt's test driver as the cloud.
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), NAMESPACE);
    let data = BTreeMap::from([
        ("CLOUD_PROVIDER".to_string(), "libvirt".to_string()),
        ("LIBVIRT_URI".to_string(), "test:///default".to_string()),
    ]);
    let cm = ConfigMap {
        metadata: kube::api::ObjectMeta {
            name: Some("peer-pods-cm".into()),
            ..Default::default()
        },
        data: Some(data),
        ..Default::default()
    };
    config_maps
        .create(&PostParams::default(), &cm)
        .await
        .expect("peer-pods-cm");
    let secrets: Api<Secret> = Api::namespaced(client.clone(), NAMESPACE);
    let secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("peer-pods-secret".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("peer-pods-secret");

    let chart = testenv::repo_root().join(support::CHART);
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    support::run_ok(
        &support::tool("helm"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "install",
            "peerpods",
            &chart.display().to_string(),
            "--namespace",
            NAMESPACE,
            "--set",
            "image.repositoryPrefix=localhost/peerpods-check",
            "--set",
            "image.tag=test",
            "--set",
            "image.pullPolicy=Never",
            "--set",
            "providerService.replicas=1",
            "--set",
            "peerpodCtrl.replicas=1",
            "--set",
            "peerPodConfigCtrl.replicas=1",
        ],
        None,
    )
    .await;
}

/// A PeerPod whose VM (the test driver's domain) CAA failed to delete: peerpod-ctrl has the in-cluster
/// provider-service delete it (reached through the Service's DNS name, TLS and a projected token), records
/// `InstanceDeleted` (not `InstanceAlreadyGone`: the domain existed) and releases the finalizer.
async fn peerpod_cleaned_through_provider_service(client: &Client) {
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPod"),
        "peerpods",
    );
    let peerpods: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &resource);
    let peerpod: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPod",
        "metadata": {"name": "web-0-peerpod", "finalizers": ["peer.pod/finalizer"]},
        "spec": {"cloudProvider": "libvirt", "instanceID": TEST_DOMAIN_UUID},
    }))
    .expect("PeerPod");
    peerpods
        .create(&PostParams::default(), &peerpod)
        .await
        .expect("create PeerPod");
    peerpods
        .delete("web-0-peerpod", &DeleteParams::default())
        .await
        .expect("delete PeerPod");
    testenv::wait_for(
        "the PeerPod's finalizer released",
        Duration::from_secs(90),
        || async {
            peerpods
                .get_opt("web-0-peerpod")
                .await
                .expect("get PeerPod")
                .is_none()
                .then_some(())
        },
    )
    .await;
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(client.clone(), "default");
    let reasons: Vec<String> = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("web-0-peerpod"))
        .filter_map(|e| e.reason)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "InstanceDeleted"),
        "PeerPod events: {reasons:?}"
    );
}

/// peer-pod-config-ctrl, given a PeerPodConfig selecting the node, advertises the VM limit on the node's
/// capacity, kubelet carries it into allocatable, and the CAA DaemonSet's pod is placed on the node (its image,
/// cloud-api-adaptor's, is not in this cluster: the pod is scheduled, not started).
async fn caa_lands_and_capacity_reaches_allocatable(client: &Client) {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .patch(
            NODE_NAME,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"node.kubernetes.io/worker": ""}}})),
        )
        .await
        .expect("label the node");
    let resource = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPodConfig"),
        "peerpodconfigs",
    );
    let configs: Api<DynamicObject> = Api::namespaced_with(client.clone(), NAMESPACE, &resource);
    let config: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPodConfig",
        "metadata": {"name": "peerpodconfig"},
        "spec": {
            "cloudSecretName": "peer-pods-secret",
            "configMapName": "peer-pods-cm",
            "limit": "3",
            "nodeSelector": {"node.kubernetes.io/worker": ""},
        },
    }))
    .expect("PeerPodConfig");
    configs
        .create(&PostParams::default(), &config)
        .await
        .expect("create PeerPodConfig");

    testenv::wait_for(
        "kata.peerpods.io/vm in the node's allocatable",
        Duration::from_secs(90),
        || async {
            let node = nodes.get(NODE_NAME).await.expect("node");
            let allocatable = node.status?.allocatable?;
            (allocatable.get("kata.peerpods.io/vm")?.0 == "3").then_some(())
        },
    )
    .await;

    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let caa = testenv::wait_for("the CAA DaemonSet", Duration::from_secs(60), || async {
        daemonsets
            .list(&ListParams::default())
            .await
            .expect("daemonsets")
            .items
            .into_iter()
            .next()
    })
    .await;
    let selector = caa
        .spec
        .selector
        .match_labels
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    testenv::wait_for(
        "the CAA pod placed on the node",
        Duration::from_secs(60),
        || async {
            let list = pods
                .list(&ListParams::default().labels(&selector))
                .await
                .expect("pods");
            list.items
                .iter()
                .any(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(NODE_NAME))
                .then_some(())
        },
    )
    .await;
}

/// The pid of the process running `/usr/local/bin/<binary>` (the images' entrypoint), in this PID namespace.
fn process_of(binary: &str) -> Option<u32> {
    let wanted = format!("/usr/local/bin/{binary}");
    std::fs::read_dir("/proc")
        .ok()?
        .filter_map(Result::ok)
        .find_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let argv0 = cmdline.split(|b| *b == 0).next()?;
            (argv0 == wanted.as_bytes()).then_some(pid)
        })
}

fn process_uid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("process status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().next())
        .and_then(|uid| uid.parse().ok())
        .expect("Uid line")
}

/// Whether the process's `/` is mounted read-only (its mountinfo's mount options for mount point `/`).
fn root_is_read_only(pid: u32) -> bool {
    let mountinfo =
        std::fs::read_to_string(Path::new("/proc").join(pid.to_string()).join("mountinfo"))
            .expect("process mountinfo");
    mountinfo
        .lines()
        .map(|line| line.split(' ').collect::<Vec<_>>())
        .rfind(|fields| fields.get(4) == Some(&"/"))
        .is_some_and(|fields| {
            fields
                .get(5)
                .is_some_and(|opts| opts.split(',').any(|o| o == "ro"))
        })
}

async fn describe_pods(client: &Client) -> String {
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let list = pods
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default();
    list.iter()
        .map(|p| {
            format!(
                "{}: {:?}",
                p.metadata.name.clone().unwrap_or_default(),
                p.status
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}
