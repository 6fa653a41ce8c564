//! What the controller asks of the API server, on control planes of their own (an audit log counts the requests
//! the controller makes; the shared control plane keeps none): under an outage (its CRD missing), and in a steady
//! state (no reads of what it watches).

use std::time::Duration;

use peer_pod_config_ctrl::controller::{self, Settings};
use peer_pod_config_ctrl::metrics::Metrics;
use peerpods_api::peerpodconfig::{PeerPodConfig, PeerPodConfigSpec};
use tokio_util::sync::CancellationToken;

/// How long the controller runs without its CRD while its requests are counted.
const WINDOW: Duration = Duration::from_secs(30);

/// A PeerPodConfig watch whose resource does not exist (the CRD is not installed yet) waits longer after each
/// failure instead of re-listing at once: over the window the controller asks for PeerPodConfigs a bounded
/// number of times (a watch backing off from 0.8 s doubling, and the heartbeat retrying every 2 s, make about a
/// dozen), not the hundreds a re-LIST loop makes; and once the CRD is there it picks the config up by itself.
/// Meanwhile an owned Service changes every 100 ms, as owned objects do in a busy cluster (a DaemonSet's status
/// follows its pods): the controller's other watches yield events all the time, and a backoff they reset (kube's
/// one backoff over all of a controller's triggers) is no backoff for the failing watch: without one of its own,
/// the watch re-lists about every second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_crd_the_controller_backs_off_and_starts_once_it_is_installed() {
    let cp = testenv::ControlPlane::start_audited()
        .await
        .expect("audited control plane");
    let client = cp.client().await;
    let ns = testenv::namespace(&client, "ppc-nocrd").await;
    let stop = CancellationToken::new();
    let running = controller::new(
        client.clone(),
        Settings {
            namespace: ns.clone(),
            provider: None,
            instance: Some("nocrd".into()),
            caa_provider_service: None,
            service_accounts: Default::default(),
            node_patch_pace: Default::default(),
        },
        Metrics::default(),
        stop.clone().cancelled_owned(),
    );
    let context = running.context.clone();
    let task = tokio::spawn(running.run);
    let churn = tokio::spawn(churn_an_owned_service(client.clone(), ns.clone()));

    tokio::time::sleep(WINDOW).await;
    let requests = cp
        .audit_events()
        .expect("audit events")
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete")
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "peerpodconfigs")
        })
        .count();
    churn.abort();
    eprintln!("{requests} requests for PeerPodConfigs in {WINDOW:?} without the CRD");
    assert!(
        requests > 0,
        "the controller never asked for PeerPodConfigs"
    );
    assert!(
        requests <= 12,
        "{requests} requests for PeerPodConfigs in {WINDOW:?} without the CRD: a re-list loop"
    );

    testenv::apply_crds(&client, "deploy/crds/peerpodconfigs.yaml").await;
    let spec: PeerPodConfigSpec =
        serde_json::from_value(serde_json::json!({"limit": 2})).expect("spec");
    kube::Api::<PeerPodConfig>::namespaced(client.clone(), &ns)
        .create(
            &kube::api::PostParams::default(),
            &PeerPodConfig::new("peerpodconfig", spec),
        )
        .await
        .expect("create PeerPodConfig");
    // The watch's backoff is capped at 30 s: well within the deadline the watch lists the new config.
    testenv::wait_for(
        "the PeerPodConfig in the cache",
        Duration::from_secs(90),
        || async { (context.configs.state().len() == 1).then_some(()) },
    )
    .await;
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    cp.stop();
}

/// Creates a Service labelled as this controller's and owned by a PeerPodConfig, and changes a label of it every
/// 100 ms, until aborted.
async fn churn_an_owned_service(client: kube::Client, ns: String) {
    use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use kube::Resource;
    use kube::api::{Patch, PatchParams, PostParams};
    let services = kube::Api::<Service>::namespaced(client, &ns);
    let mut service = Service {
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                port: 443,
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    service.metadata.name = Some("churning".into());
    service.metadata.labels = Some(
        [(
            "app.kubernetes.io/managed-by".to_owned(),
            peer_pod_config_ctrl::FIELD_MANAGER.to_owned(),
        )]
        .into(),
    );
    service.metadata.owner_references = Some(vec![OwnerReference {
        api_version: PeerPodConfig::api_version(&()).into_owned(),
        kind: PeerPodConfig::kind(&()).into_owned(),
        name: "peerpodconfig".into(),
        uid: "5b1e7a52-3c1e-4e0b-9d55-0d6f6f1b7a01".into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    for i in 0u64.. {
        let patch = serde_json::json!({"metadata": {"labels": {"churn": i.to_string()}}});
        if services
            .patch("churning", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .is_err()
        {
            // Not there yet (or collected): create it again.
            let _ = services.create(&PostParams::default(), &service).await;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// GETs of the kinds a reconcile compares: its owned objects and CAA's ConfigMap.
const COMPARED: [&str; 6] = [
    "daemonsets",
    "deployments",
    "services",
    "secrets",
    "mutatingwebhookconfigurations",
    "configmaps",
];

/// A reconcile compares against the caches its watches fill (and what it wrote itself) instead of reading: five
/// reconciles of a converged PeerPodConfig make no GET of an owned object or of CAA's ConfigMap (they made
/// seven each), and write nothing: no node patch, no owned object.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconciles_compare_against_the_caches_instead_of_reading() {
    use k8s_openapi::api::core::v1::{ConfigMap, Node};
    use kube::api::{ListParams, Patch, PatchParams, PostParams};
    use peer_pod_config_ctrl::metrics::ResultLabels;

    let cp = testenv::ControlPlane::start_audited()
        .await
        .expect("audited control plane");
    let client = cp.client().await;
    testenv::apply_crds(&client, "deploy/crds/peerpodconfigs.yaml").await;
    crate::support::charts_webhook_configuration(&client).await;
    let ns = testenv::namespace(&client, "ppc-cached").await;
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("peer-pods-cm".into());
    cm.data = Some([("CLOUD_PROVIDER".to_owned(), "aws".to_owned())].into());
    kube::Api::<ConfigMap>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .expect("create CAA's ConfigMap");
    let nodes = kube::Api::<Node>::all(client.clone());
    for i in 0..3 {
        let mut node = Node::default();
        node.metadata.name = Some(format!("cached-{i}"));
        node.metadata.labels = Some([("peerpods-test/cached".to_owned(), "yes".to_owned())].into());
        nodes
            .create(&PostParams::default(), &node)
            .await
            .expect("create Node");
    }
    let (controller_client, controller_user) = client_of_its_own(&cp, &client, &ns).await;
    let metrics = Metrics::default();
    let stop = CancellationToken::new();
    let running = controller::new(
        controller_client,
        Settings {
            namespace: ns.clone(),
            provider: None,
            instance: Some("cached".into()),
            caa_provider_service: None,
            service_accounts: Default::default(),
            node_patch_pace: Default::default(),
        },
        metrics.clone(),
        stop.clone().cancelled_owned(),
    );
    let task = tokio::spawn(running.run);
    let configs = kube::Api::<PeerPodConfig>::namespaced(client.clone(), &ns);
    let spec: PeerPodConfigSpec = serde_json::from_value(serde_json::json!({
        "limit": 6,
        "nodeSelector": {"peerpods-test/cached": "yes"}
    }))
    .expect("spec");
    configs
        .create(
            &PostParams::default(),
            &PeerPodConfig::new("peerpodconfig", spec),
        )
        .await
        .expect("create PeerPodConfig");
    let ok = || {
        metrics
            .reconciles
            .get_or_create(&ResultLabels {
                result: "ok".into(),
            })
            .get()
    };
    let node_versions = || async {
        nodes
            .list(&ListParams::default().labels("peerpods-test/cached=yes"))
            .await
            .expect("list Nodes")
            .items
            .into_iter()
            .map(|n| {
                let value = n
                    .status
                    .and_then(|s| s.capacity)
                    .and_then(|c| c.get("kata.peerpods.io/vm").cloned());
                (n.metadata.name, value, n.metadata.resource_version)
            })
            .collect::<Vec<_>>()
    };
    testenv::wait_for(
        "converged: 2 on each node",
        Duration::from_secs(60),
        || async {
            let versions = node_versions().await;
            versions
                .iter()
                .all(|(_, v, _)| v.as_ref().is_some_and(|q| q.0 == "2"))
                .then_some(())
        },
    )
    .await;
    let poke = |round: String| {
        let configs = configs.clone();
        async move {
            let reconciled = ok();
            let patch = serde_json::json!({"metadata": {"annotations": {"round": round}}});
            configs
                .patch(
                    "peerpodconfig",
                    &PatchParams::default(),
                    &Patch::Merge(&patch),
                )
                .await
                .expect("annotate");
            testenv::wait_for("a reconcile", Duration::from_secs(60), || async {
                (ok() > reconciled).then_some(())
            })
            .await;
        }
    };
    // Converged once a reconcile writes nothing (the status write of the first ones comes back as an event).
    let mut settled = false;
    for round in 0..10 {
        let writes = metrics.writes();
        poke(format!("settle-{round}")).await;
        if metrics.writes() == writes {
            settled = true;
            break;
        }
    }
    assert!(settled, "the controller kept writing");
    // The controller's GETs of what it watches, as "resource namespace/name".
    let gets = || {
        cp.audit_events()
            .expect("audit events")
            .into_iter()
            .filter(|e| e.stage == "ResponseComplete" && e.verb == "get")
            .filter(|e| e.user.username == controller_user)
            .filter_map(|e| e.object_ref)
            .filter(|o| COMPARED.contains(&o.resource.as_str()))
            .map(|o| format!("{} {}/{}", o.resource, o.namespace, o.name))
            .collect::<Vec<_>>()
    };
    let (gets_before, writes_before, nodes_before) =
        (gets().len(), metrics.writes(), node_versions().await);

    for round in 0..5 {
        poke(round.to_string()).await;
    }
    let new_gets = &gets()[gets_before..];
    assert!(
        new_gets.is_empty(),
        "{} GETs of watched objects in 5 reconciles: {new_gets:?}",
        new_gets.len()
    );
    assert_eq!(
        metrics.writes(),
        writes_before,
        "a converged config writes nothing"
    );
    assert_eq!(
        node_versions().await,
        nodes_before,
        "no node was patched again"
    );
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), task).await;
    cp.stop();
}

/// A client of `cp` for the controller under test, as a ServiceAccount of its own bound to `cluster-admin`, and
/// that account's user name. kube-controller-manager uses the admin credentials too (its garbage collector GETs an
/// owner now and then, when its graph has not seen it yet); by user, the audit log tells the controller's requests
/// from its.
async fn client_of_its_own(
    cp: &testenv::ControlPlane,
    admin: &kube::Client,
    ns: &str,
) -> (kube::Client, String) {
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
    use kube::api::{ObjectMeta, PostParams};

    let account = "peer-pod-config-ctrl";
    let token = testenv::service_account_token(admin, ns, account, &[]).await;
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(format!("{ns}-{account}")),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: "cluster-admin".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: account.into(),
            namespace: Some(ns.to_owned()),
            ..Subject::default()
        }]),
    };
    kube::Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("bind the controller's ServiceAccount to cluster-admin");
    (
        cp.client_with_token(&token).await,
        format!("system:serviceaccount:{ns}:{account}"),
    )
}
