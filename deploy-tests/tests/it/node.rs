//! The Helm chart on a real node (testenv's `node`: kubelet, containerd, runc, kube-proxy, kube-scheduler,
//! CoreDNS), with the images `make images-check` builds: the chart's pods run, pass their probes, run as the
//! non-root user on a read-only root, reach the API through the `kubernetes` Service and each other through
//! Service DNS; peerpod-ctrl releases a PeerPod through the in-cluster provider-service; peer-pod-config-ctrl's
//! CAA DaemonSet lands on the selected node and the node's allocatable shows `kata.peerpods.io/vm`; the webhook
//! Deployment it renders (with the project's `peerpods-webhook` image) serves the API server's admission request
//! for a kata-remote Pod. Then the same PeerPodConfig switches to `capacityMode: dra` (issue 35): the pool of one
//! slot, its DeviceClass and the kubelet plugin (the project's `peerpods-dra-plugin` image) replace the node's
//! capacity; a webhook-mutated pod is scheduled onto a slot and started (the kubelet prepares it through the
//! plugin), a second one waits with the scheduler's reason until the first is deleted; back in node mode no
//! ResourceSlice is left.
//!
//! A second test runs the Tiltfile's cluster mode (real Tilt, `tilt ci`) against such a node with a local
//! registry: Tilt builds the three images with make, pushes them there, deploys the chart, and the pods run.
//!
//! Run by `make test-node` (root: each test re-runs itself in namespaces of its own).

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
/// The images `make images-check` builds: the services, the peer-pods webhook and the DRA kubelet plugin.
/// provider-service's is its libvirt variant: the test's cloud is libvirt's test driver.
const IMAGES: [&str; 5] = [
    "provider-service-libvirt",
    "peerpod-ctrl",
    "peer-pod-config-ctrl",
    "peerpods-webhook",
    "peerpods-dra-plugin",
];
/// The one domain libvirt's `test:///default` driver starts with (a fixed UUID of that driver).
const TEST_DOMAIN_UUID: &str = "6695eb01-f6a4-8304-79aa-97f2502e193f";
/// The non-root user of the services' images (deploy/images).
const IMAGE_UID: u32 = 65532;

#[test]
#[ignore = "needs root and the node's binaries and images; run by `make test-node`"]
fn the_chart_runs_on_a_node() {
    in_the_node_namespaces(
        &testenv::test_name!("the_chart_runs_on_a_node"),
        chart_on_a_node,
    );
}

async fn chart_on_a_node() {
    let images = IMAGES
        .map(|s| testenv::repo_root().join(format!("target/images/{s}.oci.tar")))
        .to_vec();
    let (cp, node) = control_plane_and_node(NodeOptions { images }).await;
    let client = cp.client().await;

    create_cloud_config(&client, NAMESPACE).await;
    install_chart(&cp).await;
    for service in SERVICES {
        let deployment = format!("peerpods-{service}");
        if let Err(e) = testenv::node::wait_available(
            &client,
            &namespace_of(service, NAMESPACE),
            &deployment,
            Duration::from_secs(180),
        )
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

    webhook_mutates_a_peer_pod(&client).await;
    eprintln!(
        "the webhook Deployment peer-pod-config-ctrl runs mutated a kata-remote Pod created through the API"
    );

    dra_pool_serves_peer_pods(&client, &node).await;
    drop(node);
}

#[test]
#[ignore = "needs root, the node's binaries and Tilt; run by `make test-node`"]
fn tilt_cluster_mode_deploys_onto_the_node() {
    in_the_node_namespaces(
        &testenv::test_name!("tilt_cluster_mode_deploys_onto_the_node"),
        tilt_on_a_node,
    );
}

async fn tilt_on_a_node() {
    const TILT_NAMESPACE: &str = "peerpods-dev";
    let (cp, node) = control_plane_and_node(NodeOptions::default()).await;
    let client = cp.client().await;
    let registry = testenv::node::Registry::start(&client)
        .await
        .expect("registry");
    create_cloud_config(&client, TILT_NAMESPACE).await;

    let root = testenv::repo_root();
    let output = tokio::process::Command::new(root.join(".tools/bin/tilt"))
        .args([
            "ci",
            "--timeout",
            "8m",
            // Tilt built from source would serve its web UI from a webpack dev server (yarn, npm packages).
            "--web-mode",
            "prod",
            "--port",
            "0",
            "--",
            "--mode=cluster",
        ])
        .arg(format!("--namespace={TILT_NAMESPACE}"))
        // The control plane serves on the node address, which Tilt does not take for a local cluster.
        .arg("--allow-k8s-context=testenv")
        .current_dir(&root)
        .env("KUBECONFIG", cp.kubeconfig_path())
        // The images from the debug binaries `cargo test` built (a release build would take minutes).
        .env("IMAGE_BINARIES", "debug")
        .output()
        .await
        .expect("running tilt");
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "tilt ci failed:\n{log}");

    for service in SERVICES {
        let deployment = format!("peerpods-{service}");
        let namespace = namespace_of(service, TILT_NAMESPACE);
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        testenv::node::wait_available(&client, &namespace, &deployment, Duration::from_secs(60))
            .await
            .expect("Deployment available after tilt ci");
        let list = pods.list(&ListParams::default()).await.expect("pods");
        let image = list
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&deployment))
            })
            .find_map(|p| p.spec.as_ref()?.containers.first()?.image.clone())
            .unwrap_or_default();
        assert!(
            image.starts_with(&format!("{}/", testenv::node::REGISTRY)),
            "{service} runs image {image:?}, not one Tilt pushed to the local registry"
        );
    }
    eprintln!(
        "tilt ci (cluster mode) built, pushed and deployed the three services; they run on the node"
    );
    drop(registry);
    drop(node);
}

/// Runs `scenario` on a runtime of its own inside the node's namespaces (the test re-runs itself there; see
/// `testenv::node::isolated`).
fn in_the_node_namespaces<F: std::future::Future<Output = ()>>(
    test_name: &str,
    scenario: impl FnOnce() -> F,
) {
    if !testenv::node::isolated(test_name) {
        return;
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
        .block_on(scenario());
}

/// A control plane serving on the node address, and the node joined to it.
async fn control_plane_and_node(
    options: NodeOptions,
) -> (testenv::ControlPlane, testenv::node::Node) {
    let cp = testenv::ControlPlane::start_with(testenv::Options {
        node_ip: Some(NODE_IP),
        ..Default::default()
    })
    .expect("control plane on the node address");
    let node = testenv::node::Node::start(&cp, options)
        .await
        .expect("node up");
    (cp, node)
}

/// The namespace and cloud-api-adaptor's configuration there, which provider-service reads too: libvirt's test
/// driver as the cloud.
async fn create_cloud_config(client: &Client, namespace: &str) {
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": namespace}})).expect("ns"),
        )
        .await
        .expect("namespace");
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
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
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
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
}

async fn install_chart(cp: &testenv::ControlPlane) {
    let chart = testenv::repo_root().join(crate::support::CHART);
    // libvirt's test driver as the cloud: no cluster tag needed there, development mode for provider-service.
    let dev_values = testenv::repo_root().join("deploy/tests/values-dev.yaml");
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    // The node's kubelet runs with --root-dir .testenv/run/node/kubelet (testenv::node): the chart's admission
    // policy admits the DRA plugin's hostPath mounts under that directory only.
    let kubelet_dir = format!(
        "peerPodConfigCtrl.dra.kubeletDir={}",
        testenv::repo_root().join(NODE_KUBELET_DIR).display()
    );
    crate::support::run_ok(
        &crate::support::tool("helm"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "install",
            "peerpods",
            &chart.display().to_string(),
            "-f",
            &dev_values.display().to_string(),
            "--namespace",
            NAMESPACE,
            "--set",
            "image.repositoryPrefix=localhost/peerpods-check",
            "--set",
            "providerService.image.repository=localhost/peerpods-check/provider-service-libvirt",
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
            "--set",
            &kubelet_dir,
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
    let configs = peerpod_configs(client);
    let config: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPodConfig",
        "metadata": {"name": "peerpodconfig"},
        "spec": {
            "cloudSecretName": "peer-pods-secret",
            "configMapName": "peer-pods-cm",
            "limit": "3",
            "nodeSelector": {"node.kubernetes.io/worker": ""},
            "webhook": {
                "image": "localhost/peerpods-check/peerpods-webhook:test",
                "imagePullPolicy": "Never",
                "replicas": 1,
            },
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

/// Where the chart runs `service`: provider-service in a namespace of its own (`providerService.namespace`).
fn namespace_of(service: &str, release_namespace: &str) -> String {
    if service == "provider-service" {
        crate::support::provider_namespace(release_namespace)
    } else {
        release_namespace.to_owned()
    }
}

async fn describe_pods(client: &Client) -> String {
    let mut list = Vec::new();
    for namespace in [
        NAMESPACE.to_owned(),
        crate::support::provider_namespace(NAMESPACE),
    ] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
        list.extend(
            pods.list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default(),
        );
    }
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

/// The webhook Deployment peer-pod-config-ctrl rendered (our image) becomes Available, and the API server sends it
/// a kata-remote Pod: stored with one `kata.peerpods.io/vm` and its cpu as Kata's annotation instead of resources.
async fn webhook_mutates_a_peer_pod(client: &Client) {
    if let Err(e) = testenv::node::wait_available(
        client,
        NAMESPACE,
        "peer-pods-webhook",
        Duration::from_secs(120),
    )
    .await
    {
        panic!("{e}\n{}", describe_pods(client).await);
    }
    let runtime_classes: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("node.k8s.io", "v1", "RuntimeClass"),
            "runtimeclasses",
        ),
    );
    let runtime_class: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
        // The node's runc: enough to run the peer pods of the DRA step (a real peer pod's handler starts a VM).
        "metadata": {"name": "kata-remote"}, "handler": "runc",
    }))
    .expect("RuntimeClass");
    runtime_classes
        .create(&PostParams::default(), &runtime_class)
        .await
        .expect("create RuntimeClass");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "peer-pod"},
        "spec": {
            "runtimeClassName": "kata-remote",
            "containers": [{
                "name": "app",
                "image": "localhost/peerpods-node/pause:test",
                "resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}},
            }],
        },
    }))
    .expect("Pod");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    // The webhook configuration points at the webhook's Service; its endpoints may trail the Deployment.
    let start = std::time::Instant::now();
    let stored = loop {
        match pods.create(&PostParams::default(), &pod).await {
            Ok(stored) => break stored,
            Err(e) if start.elapsed() < Duration::from_secs(60) => {
                eprintln!("kata-remote Pod not admitted yet: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => panic!("the API server did not admit the kata-remote Pod: {e}"),
        }
    };
    let container = &stored.spec.as_ref().expect("spec").containers[0];
    let resources = container.resources.as_ref().expect("resources");
    let limits = resources.limits.as_ref().expect("limits");
    assert_eq!(
        limits.get("kata.peerpods.io/vm").map(|q| q.0.as_str()),
        Some("1"),
        "{resources:?}"
    );
    assert!(!limits.contains_key("cpu"), "cpu limit kept: {resources:?}");
    let annotations = stored.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("io.katacontainers.config.hypervisor.default_vcpus")
            .map(String::as_str),
        Some("2"),
        "{annotations:?}"
    );
}

/// The node's kubelet root directory (its --root-dir, testenv::node), under the repository.
const NODE_KUBELET_DIR: &str = ".testenv/run/node/kubelet";
/// The project's DRA kubelet plugin image, as `make images-check` tags it.
const DRA_PLUGIN_IMAGE: &str = "localhost/peerpods-check/peerpods-dra-plugin:test";
/// What the node's pods wait for: image import, the plugin's registration, the scheduler's retry after a claim is
/// freed (its backoff), on a loaded 2-core machine. Generous: a verdict is never the timeout's expiry.
const DRA_STEP: Duration = Duration::from_secs(180);

/// capacityMode dra on the real node (issue 35): the PeerPodConfig of the steps before switches from node capacity to
/// a pool of one slot. peer-pod-config-ctrl withdraws the node's kata.peerpods.io/vm and publishes the DeviceClass
/// (extendedResourceName kata.peerpods.io/vm), the pool's ResourceSlices (driver vm.peerpods.io, one device) and the
/// plugin DaemonSet with our image on the node's kubelet directory. A kata-remote pod the webhook mutated is given
/// the slot by kube-scheduler (its extended resource claim allocated from the pool) and started by the kubelet,
/// which prepares the claim through our plugin (it refuses to start a pod whose driver is not registered); a second
/// one stays Pending with the scheduler's reason, and starts once the first is deleted (the kubelet unprepares, the
/// ResourceClaim controller frees the claim). Back in node mode no ResourceSlice of the driver is left, and the node
/// has its capacity again.
async fn dra_pool_serves_peer_pods(client: &Client, node: &testenv::node::Node) {
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let nodes: Api<Node> = Api::all(client.clone());
    let slices: Api<ResourceSlice> = Api::all(client.clone());
    let classes: Api<DeviceClass> = Api::all(client.clone());
    let claims: Api<ResourceClaim> = Api::namespaced(client.clone(), "default");
    let daemonsets: Api<DaemonSet> = Api::namespaced(client.clone(), NAMESPACE);
    let configs = peerpod_configs(client);

    // The webhook step's pod runs on a node-mode slot: gone first, so the pool starts empty of our pods.
    delete_pod(client, node, &pods, "peer-pod").await;

    // The node's kubelet runs with --root-dir .testenv/run/node/kubelet (testenv::node): the plugin's hostPath
    // mounts must be that directory, not /var/lib/kubelet.
    let kubelet_dir = testenv::repo_root().join(NODE_KUBELET_DIR);
    configs
        .patch(
            "peerpodconfig",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "capacityMode": "dra",
                "limit": 1,
                "dra": {"pluginImage": DRA_PLUGIN_IMAGE, "kubeletDir": kubelet_dir.display().to_string()},
            }})),
        )
        .await
        .expect("switch the PeerPodConfig to capacityMode dra");

    wait_dra(
        client,
        node,
        "kata.peerpods.io/vm gone from the node (the pool serves it now)",
        || async {
            let node = nodes.get(NODE_NAME).await.expect("node");
            let status = node.status.unwrap_or_default();
            let advertised = [status.capacity, status.allocatable]
                .iter()
                .flatten()
                .any(|r| r.contains_key("kata.peerpods.io/vm"));
            (!advertised).then_some(())
        },
    )
    .await;
    let class = wait_dra(client, node, "the DeviceClass vm.peerpods.io", || async {
        classes
            .get_opt("vm.peerpods.io")
            .await
            .expect("DeviceClass")
    })
    .await;
    assert_eq!(
        class.spec.and_then(|s| s.extended_resource_name).as_deref(),
        Some("kata.peerpods.io/vm")
    );
    wait_dra(client, node, "a pool of one device", || async {
        (pool_devices(&slices).await == 1).then_some(())
    })
    .await;
    wait_dra(
        client,
        node,
        "the kubelet plugin running on the node",
        || async {
            let ds = daemonsets
                .get_opt("peerpods-dra-plugin")
                .await
                .expect("DaemonSet")?;
            let image = ds
                .spec
                .template
                .spec
                .as_ref()?
                .containers
                .first()?
                .image
                .clone();
            assert_eq!(image.as_deref(), Some(DRA_PLUGIN_IMAGE));
            (ds.status?.number_ready == 1).then_some(())
        },
    )
    .await;
    wait_dra(
        client,
        node,
        "the PeerPodConfig telling the plugin is ready (DraPluginReady True, PodsReady)",
        || async { plugin_condition(&configs, "True", "PodsReady").await },
    )
    .await;
    eprintln!(
        "capacityMode dra: node capacity withdrawn, DeviceClass and a pool of one slot published, plugin ready"
    );

    // The first peer pod: mutated by the webhook, given the slot, started.
    let first = create_peer_pod(&pods, "dra-peer-pod-1").await;
    let limits = first.spec.as_ref().expect("spec").containers[0]
        .resources
        .as_ref()
        .and_then(|r| r.limits.clone())
        .unwrap_or_default();
    assert_eq!(
        limits.get("kata.peerpods.io/vm").map(|q| q.0.as_str()),
        Some("1"),
        "the webhook did not ask for a slot: {limits:?}"
    );
    let running = wait_running(client, node, &pods, "dra-peer-pod-1").await;
    let claim_name = running
        .status
        .as_ref()
        .and_then(|s| s.extended_resource_claim_status.as_ref())
        .map(|c| c.resource_claim_name.clone())
        .expect("the scheduler recorded the pod's extended resource claim");
    let claim = claims
        .get(&claim_name)
        .await
        .expect("the pod's ResourceClaim");
    let results = claim
        .status
        .and_then(|s| s.allocation)
        .and_then(|a| a.devices)
        .and_then(|d| d.results)
        .unwrap_or_default();
    assert_eq!(results.len(), 1, "{results:?}");
    assert_eq!(
        (results[0].driver.as_str(), results[0].pool.as_str()),
        ("vm.peerpods.io", "peerpods"),
        "{results:?}"
    );
    eprintln!(
        "a webhook-mutated kata-remote pod got slot {} of the pool and runs (prepared by the plugin)",
        results[0].device
    );

    // The pool is exhausted: the second stays Pending, with the scheduler's reason.
    create_peer_pod(&pods, "dra-peer-pod-2").await;
    let (reason, message) = wait_dra(
        client,
        node,
        "the second peer pod found unschedulable",
        || async {
            let pod = pods.get("dra-peer-pod-2").await.expect("pod");
            let status = pod.status?;
            let scheduled = status
                .conditions?
                .into_iter()
                .find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
            assert_eq!(status.phase.as_deref(), Some("Pending"));
            Some((scheduled.reason?, scheduled.message.unwrap_or_default()))
        },
    )
    .await;
    assert_eq!(reason, "Unschedulable", "{message}");
    assert!(
        message.contains("cannot allocate all claims"),
        "the scheduler's message: {message}"
    );
    eprintln!("with the pool exhausted the next peer pod waits: {reason}: {message}");

    // The slot comes back when the first pod goes: the second starts.
    delete_pod(client, node, &pods, "dra-peer-pod-1").await;
    wait_running(client, node, &pods, "dra-peer-pod-2").await;
    eprintln!("the first pod deleted, the second got its slot and runs");

    // Back to node mode while the second pod still runs on its slot: the pool goes at once (nothing more is
    // allocated from it), but the kubelet plugin stays, draining, for the kubelet to unprepare the running pod's
    // claim through it.
    configs
        .patch(
            "peerpodconfig",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"capacityMode": "node"}})),
        )
        .await
        .expect("switch the PeerPodConfig back to capacityMode node");
    wait_dra(
        client,
        node,
        "the plugin draining (DraPluginReady False, DraPluginDraining) while a pod holds a slot",
        || async { plugin_condition(&configs, "False", "DraPluginDraining").await },
    )
    .await;
    let plugin = daemonsets
        .get_opt("peerpods-dra-plugin")
        .await
        .expect("DaemonSet")
        .expect("the plugin stays while a claim of the driver is allocated");
    assert!(
        plugin.metadata.deletion_timestamp.is_none(),
        "the plugin is being deleted under a running pod's claim"
    );
    eprintln!("back in capacityMode node with a pod on its slot: the plugin stays, draining");

    // The pod deleted, its claim unprepared through the plugin and freed: nothing of the pool remains, and the node
    // advertises the limit again.
    delete_pod(client, node, &pods, "dra-peer-pod-2").await;
    wait_dra(
        client,
        node,
        "no ResourceSlice of vm.peerpods.io, no DeviceClass, no plugin DaemonSet",
        || async {
            let slices_left = slices
                .list(&ListParams::default())
                .await
                .expect("ResourceSlices")
                .items
                .into_iter()
                .any(|s| s.spec.driver == "vm.peerpods.io");
            let class_left = classes
                .get_opt("vm.peerpods.io")
                .await
                .expect("DeviceClass")
                .is_some();
            let plugin_left = daemonsets
                .get_opt("peerpods-dra-plugin")
                .await
                .expect("DaemonSet")
                .is_some();
            (!slices_left && !class_left && !plugin_left).then_some(())
        },
    )
    .await;
    wait_dra(
        client,
        node,
        "kata.peerpods.io/vm back in the node's allocatable",
        || async {
            let allocatable = nodes
                .get(NODE_NAME)
                .await
                .expect("node")
                .status?
                .allocatable?;
            (allocatable.get("kata.peerpods.io/vm")?.0 == "1").then_some(())
        },
    )
    .await;
    eprintln!(
        "back in capacityMode node: no ResourceSlice, DeviceClass or plugin left; the node has its capacity"
    );
}

/// `Some` once the PeerPodConfig's DraPluginReady condition has `status` and `reason`.
async fn plugin_condition(configs: &Api<DynamicObject>, status: &str, reason: &str) -> Option<()> {
    let config = configs.get("peerpodconfig").await.ok()?;
    let conditions = config.data["status"]["conditions"].as_array()?;
    conditions
        .iter()
        .any(|c| c["type"] == "DraPluginReady" && c["status"] == status && c["reason"] == reason)
        .then_some(())
}

/// Devices of driver vm.peerpods.io in all its ResourceSlices now.
async fn pool_devices(slices: &Api<k8s_openapi::api::resource::v1::ResourceSlice>) -> usize {
    slices
        .list(&ListParams::default())
        .await
        .expect("ResourceSlices")
        .items
        .iter()
        .filter(|s| s.spec.driver == "vm.peerpods.io")
        .map(|s| s.spec.devices.as_ref().map_or(0, Vec::len))
        .sum()
}

/// A kata-remote pod (the pause image, runc through the RuntimeClass), as the webhook stores it.
async fn create_peer_pod(pods: &Api<Pod>, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "runtimeClassName": "kata-remote",
            "terminationGracePeriodSeconds": 0,
            "containers": [{
                "name": "app",
                "image": "localhost/peerpods-node/pause:test",
                "resources": {"requests": {"cpu": "100m"}},
            }],
        },
    }))
    .expect("Pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("create {name}: {e}"))
}

async fn wait_running(
    client: &Client,
    node: &testenv::node::Node,
    pods: &Api<Pod>,
    name: &str,
) -> Pod {
    wait_dra(client, node, &format!("{name} Running"), || async {
        let pod = pods.get(name).await.expect("pod");
        (pod.status.as_ref()?.phase.as_deref() == Some("Running")).then_some(pod)
    })
    .await
}

/// Deletes a pod and waits until it is gone (the kubelet has stopped it and, for a DRA pod, unprepared its claim).
async fn delete_pod(client: &Client, node: &testenv::node::Node, pods: &Api<Pod>, name: &str) {
    pods.delete(name, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    wait_dra(client, node, &format!("{name} gone"), || async {
        pods.get_opt(name)
            .await
            .expect("pod")
            .is_none()
            .then_some(())
    })
    .await;
}

/// [`testenv::wait_for`] with [`DRA_STEP`], and on timeout what explains it: the PeerPodConfig's status, the Events
/// of the default and release namespaces, the pods, and the end of the kubelet's log.
async fn wait_dra<T, F, Fut>(
    client: &Client,
    node: &testenv::node::Node,
    what: &str,
    mut check: F,
) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let waited = tokio::time::timeout(DRA_STEP, async {
        loop {
            if let Some(value) = check().await {
                return value;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    })
    .await;
    match waited {
        Ok(value) => value,
        Err(_) => panic!(
            "timed out after {DRA_STEP:?} waiting for {what}\n{}",
            dra_diagnosis(client, node).await
        ),
    }
}

/// The PeerPodConfigs of the chart's namespace (the CRD's types live in the controller; the test reads JSON).
fn peerpod_configs(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(
        client.clone(),
        NAMESPACE,
        &ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPodConfig"),
            "peerpodconfigs",
        ),
    )
}

async fn dra_diagnosis(client: &Client, node: &testenv::node::Node) -> String {
    let configs = peerpod_configs(client);
    let config = configs
        .get("peerpodconfig")
        .await
        .map(|c| format!("{}", c.data))
        .unwrap_or_else(|e| e.to_string());
    let nodes: Api<Node> = Api::all(client.clone());
    let node_status = nodes
        .get(NODE_NAME)
        .await
        .map(|n| {
            let status = n.status.unwrap_or_default();
            format!(
                "capacity {:?}\nallocatable {:?}",
                status.capacity, status.allocatable
            )
        })
        .unwrap_or_else(|e| e.to_string());
    let mut events = Vec::new();
    for namespace in ["default", NAMESPACE] {
        let api: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(client.clone(), namespace);
        events.extend(
            api.list(&ListParams::default())
                .await
                .map(|l| l.items)
                .unwrap_or_default()
                .into_iter()
                .map(|e| {
                    format!(
                        "{} {}: {} {}",
                        namespace,
                        e.regarding.and_then(|r| r.name).unwrap_or_default(),
                        e.reason.unwrap_or_default(),
                        e.note.unwrap_or_default()
                    )
                }),
        );
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), NAMESPACE);
    let mut logs = Vec::new();
    for pod in pods
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let name = pod.metadata.name.unwrap_or_default();
        if name.contains("peer-pod-config-ctrl") || name.contains("dra-plugin") {
            let params = kube::api::LogParams {
                tail_lines: Some(30),
                ..Default::default()
            };
            let log = pods
                .logs(&name, &params)
                .await
                .unwrap_or_else(|e| e.to_string());
            logs.push(format!("--- {name}:\n{log}"));
        }
    }
    let kubelet = std::fs::read_to_string(node.log_path("kubelet")).unwrap_or_default();
    let kubelet: Vec<&str> = kubelet
        .lines()
        .filter(|l| {
            l.contains("dra")
                || l.contains("DRA")
                || l.contains("plugin")
                || l.contains("E1")
                || l.contains("E0")
        })
        .collect();
    format!(
        "PeerPodConfig: {config}\nnode: {node_status}\nevents:\n{}\nlogs:\n{}\npods:\n{}\nkubelet (DRA, plugin and error lines, last 40):\n{}",
        events.join("\n"),
        logs.join("\n"),
        describe_pods(client).await,
        kubelet[kubelet.len().saturating_sub(40)..].join("\n")
    )
}
