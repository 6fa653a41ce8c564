//! PeerPodConfig scenarios against the real control plane (testenv), with Node objects created through the API.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use crate::support::{ProviderService, Scenario, TIMEOUT};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use peer_pod_config_ctrl::controller::{Context, FINALIZER, reconcile};
use peer_pod_config_ctrl::nodes::{CAA_OWNER, CAA_OWNER_ANNOTATION};
use peer_pod_config_ctrl::objects::{
    CAA_DAEMONSET, EXTENDED_RESOURCE, WEBHOOK_CERT_SECRET, WEBHOOK_CONFIGURATION,
    WEBHOOK_DEPLOYMENT, WEBHOOK_SERVICE,
};
use peerpods_api::peerpodconfig::PeerPodConfig;

/// The `kata.peerpods.io/vm` value on a Node as the API server serves it.
fn advertised(node: &Node) -> Option<String> {
    let capacity = node.status.as_ref()?.capacity.as_ref()?;
    Some(capacity.get(EXTENDED_RESOURCE)?.0.clone())
}

const NAME: &str = "peerpodconfig";

fn condition(config: &PeerPodConfig, type_: &str) -> Option<(String, String, String)> {
    let c = config
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

async fn wait_config<T>(
    s: &Scenario,
    name: &str,
    what: &str,
    check: impl Fn(&PeerPodConfig) -> Option<T>,
) -> T {
    let api = s.configs();
    testenv::wait_for(what, TIMEOUT, || {
        let api = api.clone();
        let check = &check;
        async move {
            api.get_opt(name)
                .await
                .ok()
                .flatten()
                .as_ref()
                .and_then(check)
        }
    })
    .await
}

/// resourceVersions of everything a steady cluster must not write: the nodes and every owned object.
async fn resource_versions(s: &Scenario) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = s
        .node_state()
        .await
        .into_iter()
        .map(|(name, (_, rv))| (format!("Node/{name}"), rv))
        .collect();
    let rv = |kind: &str, meta: &kube::api::ObjectMeta| {
        (
            kind.to_owned(),
            meta.resource_version.clone().unwrap_or_default(),
        )
    };
    let ds: DaemonSet = Api::namespaced(s.client.clone(), &s.ns)
        .get(CAA_DAEMONSET)
        .await
        .expect("DaemonSet");
    let deploy: Deployment = Api::namespaced(s.client.clone(), &s.ns)
        .get(WEBHOOK_DEPLOYMENT)
        .await
        .expect("Deployment");
    let svc: Service = Api::namespaced(s.client.clone(), &s.ns)
        .get(WEBHOOK_SERVICE)
        .await
        .expect("Service");
    let secret: Secret = Api::namespaced(s.client.clone(), &s.ns)
        .get(WEBHOOK_CERT_SECRET)
        .await
        .expect("Secret");
    let mwc: MutatingWebhookConfiguration = Api::all(s.client.clone())
        .get(WEBHOOK_CONFIGURATION)
        .await
        .expect("MWC");
    let config = s.configs().get(NAME).await.expect("PeerPodConfig");
    out.extend([
        rv("DaemonSet", &ds.metadata),
        rv("Deployment", &deploy.metadata),
        rv("Service", &svc.metadata),
        rv("Secret", &secret.metadata),
        rv("MutatingWebhookConfiguration", &mwc.metadata),
        rv("PeerPodConfig", &config.metadata),
    ]);
    out
}

/// Reconciles directly (the controller loop stopped) until one reconcile writes nothing; returns the writes the
/// settling took. A controller that writes on every reconcile never settles and fails here.
async fn settle(s: &Scenario, ctx: &Arc<Context>) -> u64 {
    let start = ctx.metrics.writes();
    let configs = s.configs();
    testenv::wait_for("a reconcile that writes nothing", TIMEOUT, || {
        let configs = configs.clone();
        let ctx = ctx.clone();
        async move {
            let before = ctx.metrics.writes();
            let config = configs.get(NAME).await.ok()?;
            reconcile(Arc::new(config), ctx.clone()).await.ok()?;
            (ctx.metrics.writes() == before).then_some(())
        }
    })
    .await;
    ctx.metrics.writes() - start
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_nodes_forty_selected_share_one_hundred_and_a_steady_cluster_costs_no_writes() {
    let mut s = Scenario::start("ppc-spread").await;
    s.create_nodes(0..50, |i| i < 40).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": "100", "nodeSelector": s.selector()}),
    )
    .await;

    let values = s.wait_spread(100).await;
    assert_eq!(values.len(), 40);
    assert!(values.values().all(|v| *v == 2 || *v == 3), "{values:?}");
    let state = s.node_state().await;
    for i in 40..50 {
        assert_eq!(
            state[&s.node_name(i)].0,
            None,
            "unselected node {i} got capacity"
        );
    }
    let status = wait_config(&s, NAME, "setupCompleted", |c| {
        c.status.as_ref().filter(|st| st.setup_completed).cloned()
    })
    .await;
    assert_eq!(
        (status.effective_limit, status.selected_nodes),
        (Some(100), Some(40))
    );
    assert_eq!(
        (status.per_node_min, status.per_node_max),
        (Some(2), Some(3))
    );
    let capacity = wait_config(&s, NAME, "CapacityAdvertised", |c| {
        condition(c, "CapacityAdvertised")
    })
    .await;
    assert_eq!(capacity.0, "True", "{capacity:?}");

    // Steady state: stop the loop, settle, then one more reconcile must write nothing at all.
    let ctx = s.stop_controller().await;
    settle(&s, &ctx).await;
    let writes = ctx.metrics.writes();
    let before = resource_versions(&s).await;
    let config = s.configs().get(NAME).await.unwrap();
    reconcile(Arc::new(config), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(
        ctx.metrics.writes(),
        writes,
        "a reconcile of a steady cluster wrote something"
    );
    assert_eq!(
        resource_versions(&s).await,
        before,
        "a steady reconcile changed an object"
    );
    eprintln!("steady state: 0 API writes per reconcile over 50 nodes and 5 owned objects");

    s.run_controller(None);
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn joining_leaving_and_relabelled_nodes_are_rebalanced_and_untouched_nodes_not_written() {
    let s = Scenario::start("ppc-rebalance").await;
    s.create_nodes(0..10, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 25, "nodeSelector": s.selector()}),
    )
    .await;
    let before = s.wait_spread(25).await;
    assert_eq!(before.len(), 10);

    // Checks a transition: the new spread sums to 25, and every node whose value did not change was not written.
    async fn check_transition(
        s: &Scenario,
        before_state: &BTreeMap<String, (Option<u32>, String)>,
        expect_nodes: usize,
    ) {
        let after = s.wait_spread(25).await;
        assert_eq!(after.len(), expect_nodes);
        let state = s.node_state().await;
        let mut changed = 0;
        for (name, (value, rv)) in &state {
            if let Some((old_value, old_rv)) = before_state.get(name) {
                if old_value == value {
                    assert_eq!(
                        rv, old_rv,
                        "node {name} kept its value {value:?} but was written"
                    );
                } else {
                    changed += 1;
                }
            }
        }
        // 25 over 10 → 11 nodes: the average drops from 2.5 to 2.27, so about 2 nodes must change; the spreading
        // rule allows one more. Far from rewriting every node.
        assert!(changed <= 4, "{changed} nodes changed");
    }

    let state = s.node_state().await;
    s.create_nodes(10..11, |_| true).await;
    check_transition(&s, &state, 11).await;

    let state = s.node_state().await;
    s.nodes()
        .delete(&s.node_name(3), &DeleteParams::default())
        .await
        .expect("delete node");
    check_transition(&s, &state, 10).await;

    let state = s.node_state().await;
    let relabel = serde_json::json!({"metadata": {"labels": {s.label.clone(): null}}});
    s.nodes()
        .patch(
            &s.node_name(5),
            &PatchParams::default(),
            &Patch::Merge(&relabel),
        )
        .await
        .expect("relabel");
    check_transition(&s, &state, 9).await;
    assert_eq!(
        s.node_state().await[&s.node_name(5)].0,
        None,
        "a node that stopped matching keeps capacity"
    );

    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owned_objects_come_back_after_deletion_and_follow_edits() {
    let s = Scenario::start("ppc-owned").await;
    s.create_nodes(0..3, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limitPerNode": 2, "nodeSelector": s.selector()}),
    )
    .await;
    let values = s.wait_spread(6).await;
    assert!(values.values().all(|v| *v == 2));

    let daemonsets: Api<DaemonSet> = Api::namespaced(s.client.clone(), &s.ns);
    let services: Api<Service> = Api::namespaced(s.client.clone(), &s.ns);
    let ds = testenv::wait_for("DaemonSet", TIMEOUT, || async {
        daemonsets.get_opt(CAA_DAEMONSET).await.ok().flatten()
    })
    .await;
    let pod = ds.spec.template.spec.as_ref().unwrap();
    let env = pod.containers[0].env.as_ref().unwrap();
    assert!(
        env.iter()
            .any(|e| e.name == "PEERPODS_LIMIT_PER_NODE" && e.value.as_deref() == Some("-1"))
    );
    assert_eq!(
        pod.node_selector
            .as_ref()
            .unwrap()
            .get(&s.label)
            .map(String::as_str),
        Some("yes")
    );
    let owner = &ds.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.name.as_str(), owner.controller),
        ("PeerPodConfig", NAME, Some(true))
    );

    for (what, uid) in [
        ("DaemonSet", ds.uid()),
        (
            "Service",
            services.get(WEBHOOK_SERVICE).await.unwrap().uid(),
        ),
    ] {
        match what {
            "DaemonSet" => daemonsets
                .delete(CAA_DAEMONSET, &DeleteParams::background())
                .await
                .map(|_| ()),
            _ => services
                .delete(WEBHOOK_SERVICE, &DeleteParams::default())
                .await
                .map(|_| ()),
        }
        .expect("delete by hand");
        testenv::wait_for(&format!("{what} recreated"), TIMEOUT, || async {
            let now = match what {
                "DaemonSet" => daemonsets
                    .get_opt(CAA_DAEMONSET)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|o| o.uid()),
                _ => services
                    .get_opt(WEBHOOK_SERVICE)
                    .await
                    .ok()
                    .flatten()
                    .and_then(|o| o.uid()),
            };
            now.filter(|u| Some(u) != uid.as_ref()).map(|_| ())
        })
        .await;
    }

    // Edit the PeerPodConfig: new CAA image and per-node value.
    let edit = serde_json::json!({"spec": {"caa": {"image": "registry.example/caa:v2"}, "limitPerNode": 3}});
    s.configs()
        .patch(NAME, &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("edit");
    testenv::wait_for("DaemonSet image updated", TIMEOUT, || async {
        let ds = daemonsets.get_opt(CAA_DAEMONSET).await.ok().flatten()?;
        let image = ds.spec.template.spec?.containers.first()?.image.clone()?;
        (image == "registry.example/caa:v2").then_some(())
    })
    .await;
    let values = s.wait_spread(9).await;
    assert!(values.values().all(|v| *v == 3));

    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webhook_certificate_serves_the_service_name_and_the_configuration_trusts_its_ca() {
    let s = Scenario::start("ppc-webhook").await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 1, "nodeSelector": s.selector()}),
    )
    .await;
    let mwc = webhook_entry_added(&s).await;
    let secrets: Api<Secret> = Api::namespaced(s.client.clone(), &s.ns);
    let secret = secrets
        .get(WEBHOOK_CERT_SECRET)
        .await
        .expect("serving certificate Secret");
    let data = secret.data.clone().expect("Secret data");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));

    let hook = &mwc.webhooks.as_ref().expect("webhooks")[0];
    assert_eq!(hook.name, "mwebhook.peerpods.io");
    assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
    let svc = hook
        .client_config
        .service
        .as_ref()
        .expect("service reference");
    assert_eq!(
        (
            svc.name.as_str(),
            svc.namespace.as_str(),
            svc.path.as_deref(),
            svc.port
        ),
        (
            WEBHOOK_SERVICE,
            s.ns.as_str(),
            Some("/mutate-v1-pod"),
            Some(443)
        )
    );
    assert_eq!(
        hook.client_config.ca_bundle.as_ref().expect("caBundle").0,
        data["ca.crt"].0,
        "caBundle is the Secret's ca.crt"
    );

    // The leaf is signed by the CA in the bundle, valid now, and names <svc>.<ns>.svc.
    let (_, ca_pem) = x509_parser::pem::parse_x509_pem(&data["ca.crt"].0).expect("ca.crt PEM");
    let (_, leaf_pem) = x509_parser::pem::parse_x509_pem(&data["tls.crt"].0).expect("tls.crt PEM");
    let ca = ca_pem.parse_x509().expect("CA");
    let leaf = leaf_pem.parse_x509().expect("leaf");
    leaf.verify_signature(Some(ca.public_key()))
        .expect("leaf signed by the bundle's CA");
    assert!(leaf.validity().is_valid(), "certificate valid now");
    let dns = format!("{WEBHOOK_SERVICE}.{}.svc", s.ns);
    let sans = leaf
        .subject_alternative_name()
        .expect("SAN")
        .expect("SAN present");
    assert!(
        sans.value
            .general_names
            .iter()
            .any(|n| matches!(n, x509_parser::extensions::GeneralName::DNSName(d) if *d == dns)),
        "certificate not valid for {dns}"
    );
    assert!(!data["tls.key"].0.is_empty());

    // The Service the configuration points at routes to the webhook's port 9443.
    let service: Service = Api::namespaced(s.client.clone(), &s.ns)
        .get(WEBHOOK_SERVICE)
        .await
        .expect("Service");
    let port = &service.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
    assert_eq!(
        port.target_port,
        Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(9443))
    );

    s.finish().await;
}

/// The chart's webhook configuration once the controller has added its webhook to it.
async fn webhook_entry_added(s: &Scenario) -> MutatingWebhookConfiguration {
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    testenv::wait_for(
        "the webhook in the webhook configuration",
        TIMEOUT,
        || async {
            let mwc = mwcs.get_opt(WEBHOOK_CONFIGURATION).await.ok().flatten()?;
            let calls_ours = mwc.webhooks.as_ref()?.iter().any(|w| {
                w.client_config
                    .service
                    .as_ref()
                    .is_some_and(|svc| svc.namespace == s.ns)
            });
            calls_ours.then_some(mwc)
        },
    )
    .await
}

/// The chart creates the webhook configuration (no webhooks, Helm's label and annotation); the controller adds
/// its one webhook to that object under its own field manager and leaves Helm's fields alone; when the
/// PeerPodConfig goes, the object stays, as Helm left it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_controller_patches_the_charts_webhook_configuration_and_leaves_it_as_helm_made_it() {
    let s = Scenario::start("ppc-charts-mwc").await;
    let chart = crate::support::charts_webhook_configuration(&s.client).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 1, "nodeSelector": s.selector()}),
    )
    .await;
    let patched = webhook_entry_added(&s).await;
    assert_eq!(
        patched.uid(),
        chart.uid(),
        "the chart's object, not a new one"
    );
    let names: Vec<&str> = patched
        .webhooks
        .iter()
        .flatten()
        .map(|w| w.name.as_str())
        .collect();
    assert_eq!(names, ["mwebhook.peerpods.io"]);
    let (label, annotation) = (crate::support::HELM_LABEL, crate::support::HELM_ANNOTATION);
    assert_eq!(
        patched.labels().get(label.0).map(String::as_str),
        Some(label.1)
    );
    assert_eq!(
        patched.annotations().get(annotation.0).map(String::as_str),
        Some(annotation.1)
    );
    let managers: Vec<(String, String)> = patched
        .managed_fields()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect();
    assert!(
        managers.contains(&("peer-pod-config-ctrl".into(), "Apply".into())),
        "applied under its own field manager: {managers:?}"
    );

    s.configs()
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete PeerPodConfig");
    testenv::wait_for("PeerPodConfig gone", TIMEOUT, || async {
        matches!(s.configs().get_opt(NAME).await, Ok(None)).then_some(())
    })
    .await;
    let left: MutatingWebhookConfiguration = Api::all(s.client.clone())
        .get(WEBHOOK_CONFIGURATION)
        .await
        .expect("the chart's webhook configuration stays");
    assert_eq!(left.uid(), chart.uid());
    assert!(
        left.webhooks.clone().unwrap_or_default().is_empty(),
        "webhook left behind: {:?}",
        left.webhooks
    );
    assert_eq!(
        left.labels().get(label.0).map(String::as_str),
        Some(label.1)
    );
    assert_eq!(
        left.annotations().get(annotation.0).map(String::as_str),
        Some(annotation.1)
    );
    assert!(
        !left
            .labels()
            .contains_key(peer_pod_config_ctrl::objects::OWNER_LABEL),
        "the controller's labels are left: {:?}",
        left.labels()
    );
    s.finish().await;
}

/// Without the chart's webhook configuration (an install without the chart) the controller creates none: the
/// PeerPodConfig's WebhookReady condition and a Warning Event say why, and once the configuration exists the
/// webhook is added to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_charts_webhook_configuration_none_is_created_and_the_config_says_why() {
    let s = Scenario::start("ppc-no-mwc").await;
    let mwcs: Api<MutatingWebhookConfiguration> = Api::all(s.client.clone());
    mwcs.delete(WEBHOOK_CONFIGURATION, &DeleteParams::default())
        .await
        .expect("delete the chart's webhook configuration");
    testenv::wait_for("webhook configuration gone", TIMEOUT, || async {
        matches!(mwcs.get_opt(WEBHOOK_CONFIGURATION).await, Ok(None)).then_some(())
    })
    .await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 1, "nodeSelector": s.selector()}),
    )
    .await;
    let (status, message) = wait_config(
        &s,
        NAME,
        "WebhookReady says the configuration is missing",
        |c| {
            condition(c, "WebhookReady")
                .filter(|(_, reason, _)| reason == "WebhookConfigurationMissing")
                .map(|(status, _, message)| (status, message))
        },
    )
    .await;
    assert_eq!(status, "False");
    assert!(
        message.contains(WEBHOOK_CONFIGURATION) && message.contains("chart creates it"),
        "{message}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(s.client.clone(), &s.ns);
    testenv::wait_for_event(
        "a Warning Event about the missing webhook configuration",
        &events,
        TIMEOUT,
        |e| {
            e.reason.as_deref() == Some("WebhookConfigurationMissing")
                && e.type_.as_deref() == Some("Warning")
        },
    )
    .await;
    // The rest is rendered (the DaemonSet), the configuration is not.
    let daemonsets: Api<DaemonSet> = Api::namespaced(s.client.clone(), &s.ns);
    testenv::wait_for("DaemonSet", TIMEOUT, || async {
        daemonsets.get_opt(CAA_DAEMONSET).await.ok().flatten()
    })
    .await;
    assert!(
        mwcs.get_opt(WEBHOOK_CONFIGURATION)
            .await
            .expect("get")
            .is_none(),
        "the controller created the webhook configuration"
    );

    // The chart creates it: the watch brings the webhook in, without waiting out the backoff.
    crate::support::charts_webhook_configuration(&s.client).await;
    webhook_entry_added(&s).await;
    wait_config(&s, NAME, "WebhookReady no longer missing", |c| {
        condition(c, "WebhookReady")
            .filter(|(_, reason, _)| reason != "WebhookConfigurationMissing")
    })
    .await;
    s.finish().await;
}

/// `spec.caa.serviceAccountName` is limited to CAA's ServiceAccount (the controller's --caa-service-account): a
/// PeerPodConfig naming provider-service's gets ServiceAccountNotAllowed and no DaemonSet runs as it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_naming_provider_services_service_account_is_refused_and_renders_nothing() {
    let s = Scenario::start("ppc-foreign-sa").await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 1, "nodeSelector": s.selector(),
                           "caa": {"serviceAccountName": "peerpods-provider-service"}}),
    )
    .await;
    let (status, message) = wait_config(&s, NAME, "Invalid: ServiceAccountNotAllowed", |c| {
        condition(c, "Invalid")
            .filter(|(_, reason, _)| reason == "ServiceAccountNotAllowed")
            .map(|(status, _, message)| (status, message))
    })
    .await;
    assert_eq!(status, "True");
    assert!(
        message.contains("peerpods-provider-service") && message.contains("cloud-api-adaptor"),
        "{message}"
    );
    // The verdict is written before anything would be rendered, and an invalid config renders nothing.
    let daemonsets: Api<DaemonSet> = Api::namespaced(s.client.clone(), &s.ns);
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.ns);
    assert!(
        daemonsets
            .get_opt(CAA_DAEMONSET)
            .await
            .expect("get")
            .is_none()
    );
    assert!(
        deployments
            .get_opt(WEBHOOK_DEPLOYMENT)
            .await
            .expect("get")
            .is_none()
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_the_config_removes_capacity_owned_objects_and_releases_the_finalizer() {
    let s = Scenario::start("ppc-delete").await;
    s.create_nodes(0..6, |i| i < 5).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 7, "nodeSelector": s.selector()}),
    )
    .await;
    s.wait_spread(7).await;
    let config = wait_config(&s, NAME, "finalizer", |c| {
        c.finalizers()
            .contains(&FINALIZER.to_owned())
            .then(|| c.clone())
    })
    .await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(s.client.clone(), &s.ns);
    let deployments: Api<Deployment> = Api::namespaced(s.client.clone(), &s.ns);
    testenv::wait_for("DaemonSet", TIMEOUT, || async {
        daemonsets.get_opt(CAA_DAEMONSET).await.ok().flatten()
    })
    .await;

    s.configs()
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete PeerPodConfig");
    testenv::wait_for(
        "PeerPodConfig gone (finalizer released)",
        TIMEOUT,
        || async { matches!(s.configs().get_opt(NAME).await, Ok(None)).then_some(()) },
    )
    .await;
    let state = s.node_state().await;
    assert!(
        state.values().all(|(v, _)| v.is_none()),
        "capacity left on nodes: {state:?}"
    );
    // The webhook configuration is the chart's: it stays, without the webhook.
    let mwc: MutatingWebhookConfiguration = Api::all(s.client.clone())
        .get(WEBHOOK_CONFIGURATION)
        .await
        .expect("the chart's webhook configuration stays");
    assert!(
        mwc.webhooks.unwrap_or_default().is_empty(),
        "the webhook is left in the configuration"
    );
    // The garbage collector removes the namespaced objects through their owner references.
    testenv::wait_for("owned objects collected", TIMEOUT, || async {
        let ds = daemonsets.get_opt(CAA_DAEMONSET).await.ok()?;
        let deploy = deployments.get_opt(WEBHOOK_DEPLOYMENT).await.ok()?;
        (ds.is_none() && deploy.is_none()).then_some(())
    })
    .await;
    assert!(config.metadata.deletion_timestamp.is_none());

    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_limits_are_rejected_by_the_api_server_or_reported_as_invalid() {
    let s = Scenario::start("ppc-invalid").await;
    s.create_nodes(0..2, |_| true).await;
    let api = s.configs();
    for (spec, needle) in [
        (
            serde_json::json!({"limit": "ten"}),
            "limit must be a non-negative integer",
        ),
        (
            serde_json::json!({"limit": -1}),
            "limit must be a non-negative integer",
        ),
        (
            serde_json::json!({"limit": "1", "limitPerNode": 1}),
            "not both",
        ),
        (serde_json::json!({}), "set limit"),
        (serde_json::json!({"limitPerNode": -2}), "limitPerNode"),
        (
            serde_json::json!({"limit": 1, "webhook": {"replicas": 0}}),
            "replicas",
        ),
    ] {
        let body = serde_json::json!({
            "apiVersion": "confidentialcontainers.org/v1alpha1", "kind": "PeerPodConfig",
            "metadata": {"name": "bad"}, "spec": spec,
        });
        let raw: Api<kube::api::DynamicObject> = Api::namespaced_with(
            s.client.clone(),
            &s.ns,
            &kube::api::ApiResource::erase::<PeerPodConfig>(&()),
        );
        let object: kube::api::DynamicObject = serde_json::from_value(body).unwrap();
        match raw.create(&PostParams::default(), &object).await {
            Err(kube::Error::Api(status)) => {
                assert_eq!(status.code, 422, "{spec}: {status:?}");
                assert!(
                    status.message.contains(needle),
                    "{spec}: {}",
                    status.message
                );
            }
            other => panic!("{spec} accepted: {other:?}"),
        }
    }

    // What the schema cannot say is reported as Invalid, and the controller keeps working.
    s.create_config(
        "bad-selector",
        serde_json::json!({"limit": 4, "nodeSelector": {"not a label!": "x"}}),
    )
    .await;
    let invalid = wait_config(&s, "bad-selector", "Invalid condition", |c| {
        condition(c, "Invalid")
    })
    .await;
    assert_eq!(
        (invalid.0.as_str(), invalid.1.as_str()),
        ("True", "InvalidNodeSelector"),
        "{invalid:?}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(s.client.clone(), &s.ns);
    let warning = testenv::wait_for(
        "Warning Event for the invalid selector",
        TIMEOUT,
        || async {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("InvalidNodeSelector")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref())
                            == Some("bad-selector")
                })
        },
    )
    .await;
    assert_eq!(warning.type_.as_deref(), Some("Warning"));
    assert!(warning.note.unwrap_or_default().contains("not a label!"));
    api.delete("bad-selector", &DeleteParams::default())
        .await
        .expect("delete");

    let other_ns = testenv::namespace(&s.client, "ppc-elsewhere").await;
    let elsewhere: Api<PeerPodConfig> = Api::namespaced(s.client.clone(), &other_ns);
    let spec =
        serde_json::from_value(serde_json::json!({"limit": 4, "nodeSelector": s.selector()}))
            .unwrap();
    elsewhere
        .create(&PostParams::default(), &PeerPodConfig::new(NAME, spec))
        .await
        .expect("create");
    let misplaced = testenv::wait_for("WrongNamespace", TIMEOUT, || async {
        elsewhere
            .get_opt(NAME)
            .await
            .ok()
            .flatten()
            .as_ref()
            .and_then(|c| condition(c, "Invalid"))
    })
    .await;
    assert_eq!(
        (misplaced.0.as_str(), misplaced.1.as_str()),
        ("True", "WrongNamespace")
    );

    s.create_config(
        NAME,
        serde_json::json!({"limit": 4, "nodeSelector": s.selector()}),
    )
    .await;
    s.create_config(
        "second",
        serde_json::json!({"limit": 9, "nodeSelector": s.selector()}),
    )
    .await;
    let values = s.wait_spread(4).await;
    assert_eq!(values.len(), 2);
    let duplicate = wait_config(&s, "second", "DuplicateConfig", |c| condition(c, "Invalid")).await;
    assert_eq!(duplicate.1, "DuplicateConfig", "{duplicate:?}");
    // The misplaced one never wrote anything; deleting it must not touch the nodes.
    elsewhere
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete");
    testenv::wait_for("misplaced config gone", TIMEOUT, || async {
        matches!(elsewhere.get_opt(NAME).await, Ok(None)).then_some(())
    })
    .await;
    assert_eq!(s.wait_spread(4).await, values);

    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_with_less_free_capacity_caps_the_total() {
    let provider = ProviderService::start().await;
    let s = Scenario::start_with("ppc-provider", Some(provider.url())).await;
    // What the libvirt test driver's host reports, asked directly (within the scenario: another may take vCPUs).
    let free_vms = provider.free_vcpus().await / 2; // two vCPUs per VM below
    assert!(
        free_vms > 0 && free_vms < 100,
        "the test driver's host is small: {free_vms} VMs fit"
    );

    s.create_nodes(0..4, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({
            "limit": 100,
            "nodeSelector": s.selector(),
            "capacityFromProvider": {"cloudProvider": "libvirt", "vcpusPerInstance": 2, "refreshSeconds": 10},
        }),
    )
    .await;
    let values = s.wait_spread(u32::try_from(free_vms).unwrap()).await;
    assert_eq!(values.len(), 4);
    let status = wait_config(&s, NAME, "status with provider capacity", |c| {
        c.status
            .as_ref()
            .filter(|st| st.provider_free_capacity.is_some())
            .cloned()
    })
    .await;
    assert_eq!(status.requested_limit, Some(100));
    assert_eq!(status.provider_free_capacity, Some(free_vms));
    assert_eq!(status.effective_limit, Some(free_vms));
    let advertised = status
        .conditions
        .iter()
        .find(|c| c.type_ == "CapacityAdvertised")
        .expect("condition");
    assert!(
        advertised
            .message
            .contains(&format!("capped by {free_vms} free")),
        "{}",
        advertised.message
    );

    // A limit below the free capacity is not raised.
    s.configs()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"limit": 2}})),
        )
        .await
        .expect("edit");
    s.wait_spread(2).await;

    s.finish().await;
    drop(provider);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_nodes_follow_a_limit_change() {
    let s = Scenario::start("ppc-thousand").await;
    s.create_nodes(0..1000, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 2500, "nodeSelector": s.selector()}),
    )
    .await;
    let first = s.wait_spread(2500).await;
    assert_eq!(first.len(), 1000);
    assert!(first.values().all(|v| *v == 2 || *v == 3));

    let started = Instant::now();
    s.configs()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"limit": 3200}})),
        )
        .await
        .expect("edit");
    let second = s.wait_spread(3200).await;
    let elapsed = started.elapsed();
    assert!(second.values().all(|v| *v == 3 || *v == 4));
    let ctx = s.context();
    eprintln!(
        "1000 nodes: limit 2500 -> 3200 applied to every node in {:.2}s ({} node writes in total)",
        elapsed.as_secs_f64(),
        ctx.metrics.node_writes.get()
    );
    s.finish().await;
}

/// A TLS server on 127.0.0.1 with the webhook's certificate and key; a client that trusts only `ca.crt`
/// connects for `server_name`. Ok when the handshake succeeds.
async fn handshake(ca: &[u8], cert: &[u8], key: &[u8], server_name: &str) -> Result<(), String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain: Vec<CertificateDer> = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<_, _>>()
        .map_err(|e| e.to_string())?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| e.to_string())?;
    let server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| e.to_string())?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let addr = listener.local_addr().map_err(|e| e.to_string())?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
    let serve = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.ok()?;
        let mut tls = acceptor.accept(tcp).await.ok()?;
        tls.write_all(b"ok").await.ok()?;
        tls.shutdown().await.ok()
    });
    let mut roots = RootCertStore::empty();
    for ca in CertificateDer::pem_slice_iter(ca) {
        roots
            .add(ca.map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    }
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from(server_name.to_owned()).map_err(|e| e.to_string())?;
    let result = async {
        let mut tls = connector
            .connect(name, tcp)
            .await
            .map_err(|e| e.to_string())?;
        let mut reply = Vec::new();
        tls.read_to_end(&mut reply)
            .await
            .map_err(|e| e.to_string())?;
        (reply == b"ok")
            .then_some(())
            .ok_or_else(|| "no reply".to_owned())
    }
    .await;
    serve.abort();
    result
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_trusting_the_ca_bundle_completes_a_tls_handshake_for_the_service_name() {
    let s = Scenario::start("ppc-tls").await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 1, "nodeSelector": s.selector()}),
    )
    .await;
    let secrets: Api<Secret> = Api::namespaced(s.client.clone(), &s.ns);
    let secret = testenv::wait_for("serving certificate", TIMEOUT, || async {
        secrets.get_opt(WEBHOOK_CERT_SECRET).await.ok().flatten()
    })
    .await;
    let data = secret.data.expect("Secret data");
    let mwc = webhook_entry_added(&s).await;
    // Trust exactly what the API server trusts: the configuration's caBundle.
    let bundle = mwc.webhooks.expect("webhooks")[0]
        .client_config
        .ca_bundle
        .clone()
        .expect("caBundle")
        .0;
    let (cert, key) = (&data["tls.crt"].0, &data["tls.key"].0);
    let service_name = format!("{WEBHOOK_SERVICE}.{}.svc", s.ns);
    handshake(&bundle, cert, key, &service_name)
        .await
        .expect("handshake for the Service name");
    let other = format!("other.{}.svc", s.ns);
    assert!(
        handshake(&bundle, cert, key, &other).await.is_err(),
        "certificate accepted for {other}"
    );
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_lease_holder_acts_and_the_standby_takes_over() {
    use peer_pod_config_ctrl::controller::{Settings, run};
    use peer_pod_config_ctrl::metrics::Metrics;
    use peerpods_runtime::leader::LeaderConfig;
    use tokio_util::sync::CancellationToken;

    let s = Scenario::start_idle("ppc-leader").await;
    s.create_nodes(0..4, |_| true).await;
    let replica = |identity: &str| {
        let metrics = Metrics::default();
        let stop = CancellationToken::new();
        let lease = LeaderConfig {
            lease_duration: std::time::Duration::from_secs(4),
            renew_before: std::time::Duration::from_secs(2),
            ..LeaderConfig::new("peer-pod-config-ctrl", &s.ns, identity)
        };
        let settings = Settings {
            namespace: s.ns.clone(),
            provider: None,
            instance: Some(identity.into()),
            caa_provider_service: None,
            service_accounts: Default::default(),
            node_patch_pace: Default::default(),
        };
        let task = tokio::spawn(run(
            s.client.clone(),
            settings,
            metrics.clone(),
            Some(lease),
            stop.clone(),
            None,
        ));
        (metrics, stop, task)
    };
    let replicas = [replica("replica-a"), replica("replica-b")];
    s.create_config(
        NAME,
        serde_json::json!({"limit": 8, "nodeSelector": s.selector()}),
    )
    .await;
    s.wait_spread(8).await;
    let acted: Vec<bool> = replicas.iter().map(|(m, _, _)| m.writes() > 0).collect();
    assert_eq!(
        acted.iter().filter(|a| **a).count(),
        1,
        "exactly one replica writes: {acted:?}"
    );
    let (leader, standby) = if acted[0] { (0, 1) } else { (1, 0) };
    assert_eq!(replicas[standby].0.writes(), 0);

    // The leader stops (releasing the Lease); the standby follows the next edit.
    let [first, second] = replicas;
    let ((_, leader_stop, leader_task), (standby_metrics, standby_stop, standby_task)) =
        if leader == 0 {
            (first, second)
        } else {
            (second, first)
        };
    leader_stop.cancel();
    leader_task
        .await
        .expect("leader task")
        .expect("leader stopped cleanly");
    s.configs()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"limit": 12}})),
        )
        .await
        .expect("edit");
    s.wait_spread(12).await;
    assert!(
        standby_metrics.node_writes.get() > 0,
        "the standby did not take over"
    );

    s.finish().await;
    standby_stop.cancel();
    standby_task
        .await
        .expect("standby task")
        .expect("standby stopped cleanly");
}

/// `/readyz` stays false until both watches (PeerPodConfigs, Nodes) have listed; an idle but connected controller
/// stays live and ready (its heartbeat watches are renewed three times per bound). When the API server stops
/// answering for several times the bound, `/readyz` turns false naming the stalled watches while `/healthz` stays
/// 200 all along (a restart would not bring the API server back); once it answers again the same process becomes
/// ready on its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_waits_for_the_first_list_and_turns_false_while_the_api_server_stalls_and_liveness_stays()
 {
    use crate::support::{StallingProxy, http_get};
    use peer_pod_config_ctrl::controller::{NODE_WATCH, Settings, run};
    use peer_pod_config_ctrl::metrics::Metrics;
    use peerpods_runtime::admin::{AdminServer, Readiness};
    use peerpods_runtime::health::{Health, Liveness};
    use std::time::Duration;
    use tokio_util::sync::CancellationToken;

    const BOUND: Duration = Duration::from_secs(3);
    let s = Scenario::start_idle("ppc-health").await;
    let proxy = StallingProxy::start().await;
    let health = Health {
        readiness: Readiness::default(),
        liveness: Liveness::new(BOUND),
    };
    let stop = CancellationToken::new();
    let admin = AdminServer::bind(
        "127.0.0.1:0".parse().expect("address"),
        health.readiness.clone(),
        Arc::new(prometheus_client::registry::Registry::default()),
    )
    .await
    .expect("admin server")
    .with_liveness(health.liveness.clone());
    let addr = admin.local_addr().expect("admin address");
    let admin = tokio::spawn(admin.serve(stop.clone().cancelled_owned()));

    // The API server does not answer yet, so no list can have completed.
    proxy.stall();
    let controller = tokio::spawn(run(
        proxy.client().await,
        Settings {
            namespace: s.ns.clone(),
            provider: None,
            instance: Some("health".into()),
            caa_provider_service: None,
            service_accounts: Default::default(),
            node_patch_pace: Default::default(),
        },
        Metrics::default(),
        None,
        stop.clone(),
        Some(health.clone()),
    ));
    let before = testenv::wait_for("the watches registered", TIMEOUT, || async {
        let (code, body) = http_get(addr, "/readyz").await;
        body.contains(NODE_WATCH).then_some((code, body))
    })
    .await;
    assert_eq!(before.0, 503, "{}", before.1);
    assert!(
        before.1.contains("not ready: waiting for the initial list"),
        "{}",
        before.1
    );

    proxy.resume();
    let ready = testenv::wait_for("ready after the first list", TIMEOUT, || async {
        let (code, body) = http_get(addr, "/readyz").await;
        (code == 200).then_some(body)
    })
    .await;
    assert!(
        ready.contains("watch/peerpodconfigs: ok") && ready.contains("watch/nodes: ok"),
        "{ready}"
    );

    // Idle (nothing to reconcile in this namespace) but connected: live for twice the bound.
    let idle_since = Instant::now();
    while idle_since.elapsed() < 2 * BOUND {
        let (code, body) = http_get(addr, "/healthz").await;
        assert_eq!(code, 200, "an idle, connected controller is live: {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }

    proxy.stall();
    // Each watch notices its own stall at its own heartbeat, so the two may turn at different moments: wait until
    // both are named (under load one can lag the other by a heartbeat).
    testenv::wait_for("both watches to be reported stalled", TIMEOUT, || async {
        let (code, body) = http_get(addr, "/readyz").await;
        (code == 503
            && body.contains("watch/peerpodconfigs: stalled: no progress")
            && body.contains("watch/nodes: stalled: no progress"))
        .then_some(body)
    })
    .await;
    // Stalled for four more times the bound (the old liveness limit was one bound): never a liveness failure.
    let stalled_since = Instant::now();
    while stalled_since.elapsed() < 4 * BOUND {
        let (code, body) = http_get(addr, "/healthz").await;
        assert_eq!(
            code, 200,
            "the API server away is no reason to restart: {body}"
        );
        assert!(body.contains("loop/reconcile: ok"), "{body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(http_get(addr, "/readyz").await.0, 503);

    // The same process recovers on its own (bounded by the wait, not timed: the watch backoff decides when).
    proxy.resume();
    testenv::wait_for("readiness to recover", TIMEOUT, || async {
        (http_get(addr, "/readyz").await.0 == 200).then_some(())
    })
    .await;

    stop.cancel();
    controller
        .await
        .expect("controller task")
        .expect("controller stopped");
    admin.await.expect("admin task").expect("admin server");
    s.finish().await;
}

/// A node as a watch saw it: its `kata.peerpods.io/vm` value and the test's marker label.
type NodeView = (Option<String>, Option<String>);

/// What cloud-api-adaptor's `Shutdown()` sends for its node since September 2024 (`RemoveExtendedResources` with
/// its `POD_UID`): it reads the node, and unless the node's `kata.peerpods.io/caa-owner` annotation names an owner
/// other than itself, removes `kata.peerpods.io/vm` with a JSON patch on `nodes/<name>/status`. Returns whether it
/// sent the remove.
async fn replay_caa_shutdown(nodes: &Api<Node>, node: &str, pod_uid: &str) -> bool {
    let live = nodes.get(node).await.expect("CAA reads its node");
    let owner = live
        .annotations()
        .get(CAA_OWNER_ANNOTATION)
        .cloned()
        .unwrap_or_default();
    if !pod_uid.is_empty() && !owner.is_empty() && owner != pod_uid {
        return false;
    }
    let remove: json_patch::Patch = serde_json::from_value(
        serde_json::json!([{"op": "remove", "path": "/status/capacity/kata.peerpods.io~1vm"}]),
    )
    .expect("CAA's patch");
    // CAA ignores the answer for the remove's effect; a missing path is its error, not ours.
    let _ = nodes
        .patch_status(node, &PatchParams::default(), &Patch::<()>::Json(remove))
        .await;
    true
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn caa_shutdowns_and_rolling_updates_never_empty_the_capacity_of_a_managed_node() {
    let s = Scenario::start("ppc-caa-owner").await;
    s.create_nodes(0..2, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limitPerNode": 3, "nodeSelector": s.selector()}),
    )
    .await;
    s.wait_spread(6).await;
    let nodes = s.nodes();
    let managed = s.node_name(0);
    // The owner annotation came with the capacity, in the same write: no wait for it here, so without it the
    // replays below remove the capacity.
    // Every state of the node from now on, in order, as a watch sees it.
    let seen: Arc<std::sync::Mutex<Vec<NodeView>>> = Arc::default();
    let watch = {
        let seen = seen.clone();
        let stream = kube::runtime::watcher(
            nodes.clone(),
            kube::runtime::watcher::Config::default().fields(&format!("metadata.name={managed}")),
        );
        tokio::spawn(async move {
            let mut stream = std::pin::pin!(kube::runtime::WatchStreamExt::applied_objects(stream));
            while let Some(Ok(node)) = futures::StreamExt::next(&mut stream).await {
                let marker = node.labels().get("peerpods-test/marker").cloned();
                seen.lock().expect("lock").push((advertised(&node), marker));
            }
        })
    };
    testenv::wait_for("the watch's first view", TIMEOUT, || async {
        (!seen.lock().expect("lock").is_empty()).then_some(())
    })
    .await;

    // Twenty rolling updates of CAA (maxSurge 1): the new pod starts with PEERPODS_LIMIT_PER_NODE=-1 and so
    // writes nothing, then the old pod shuts down. Then one CAA stopping for good.
    let mut removes = 0;
    for round in 0..20u32 {
        let old_pod = format!("3f2b8a6e-0000-4000-8000-{round:012}");
        if replay_caa_shutdown(&nodes, &managed, &old_pod).await {
            removes += 1;
        }
    }
    if replay_caa_shutdown(&nodes, &managed, "3f2b8a6e-0000-4000-8000-999999999999").await {
        removes += 1;
    }
    // A marker written after the replays: once the watch shows it, it has shown every state before it.
    nodes
        .patch(
            &managed,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"labels": {"peerpods-test/marker": "done"}}}),
            ),
        )
        .await
        .expect("marker");
    testenv::wait_for("the watch reaches the marker", TIMEOUT, || async {
        seen.lock()
            .expect("lock")
            .iter()
            .any(|(_, marker)| marker.as_deref() == Some("done"))
            .then_some(())
    })
    .await;
    watch.abort();
    let seen = seen.lock().expect("lock").clone();
    assert!(
        seen.iter()
            .all(|(capacity, _)| capacity.as_deref() == Some("3")),
        "kata.peerpods.io/vm read otherwise than 3 across CAA shutdowns: {seen:?}"
    );
    assert_eq!(
        removes, 0,
        "CAA's shutdown logic chose to remove the capacity"
    );
    let node = nodes.get(&managed).await.expect("node");
    assert_eq!(
        node.annotations()
            .get(CAA_OWNER_ANNOTATION)
            .map(String::as_str),
        Some(CAA_OWNER)
    );
    eprintln!(
        "21 CAA shutdowns replayed: 0 removes sent, {} node states watched, capacity never empty",
        seen.len()
    );

    // Taking the capacity back gives the annotation up with it.
    s.configs()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"spec": {"nodeSelector": {"peerpods-test/nowhere": "yes"}}}),
            ),
        )
        .await
        .expect("select no node");
    testenv::wait_for("capacity and annotation removed", TIMEOUT, || async {
        let node = nodes.get(&managed).await.ok()?;
        (advertised(&node).is_none() && !node.annotations().contains_key(CAA_OWNER_ANNOTATION))
            .then_some(())
    })
    .await;
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_share_in_thousands_stored_as_1k_costs_no_node_patch_on_a_steady_reconcile() {
    let mut s = Scenario::start("ppc-quantity").await;
    s.create_nodes(0..3, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limitPerNode": 1000, "nodeSelector": s.selector()}),
    )
    .await;
    s.wait_spread(3000).await;
    let stored = s
        .nodes()
        .get(&s.node_name(0))
        .await
        .expect("node")
        .status
        .and_then(|st| st.capacity)
        .and_then(|c| c.get(EXTENDED_RESOURCE).cloned())
        .expect("capacity");
    assert_eq!(stored.0, "1k", "the API server's canonical form");

    let ctx = s.stop_controller().await;
    settle(&s, &ctx).await;
    let node_writes = ctx.metrics.node_writes.get();
    for _ in 0..3 {
        let config = s.configs().get(NAME).await.expect("config");
        reconcile(Arc::new(config), ctx.clone())
            .await
            .expect("reconcile");
    }
    assert_eq!(
        ctx.metrics.node_writes.get(),
        node_writes,
        "a steady reconcile patched nodes whose \"1k\" is the 1000 it wants"
    );
    s.run_controller(None);
    s.finish().await;
}

/// "applying capacity: n of m nodes" in CapacityAdvertised, as (n, m).
fn applying(config: &PeerPodConfig) -> Option<(u32, u32)> {
    let (status, reason, message) = condition(config, "CapacityAdvertised")?;
    if status != "False" || reason != "Applying" {
        return None;
    }
    let rest = message.strip_prefix("applying capacity: ")?;
    let (done, rest) = rest.split_once(" of ")?;
    let (of, _) = rest.split_once(" nodes")?;
    Some((done.parse().ok()?, of.parse().ok()?))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paced_rebalance_shows_how_many_nodes_are_done_until_all_are() {
    let mut s = Scenario::start_idle("ppc-paced").await;
    s.create_nodes(0..5, |_| true).await;
    // One patch a second: five nodes take about four seconds, over which the status is written once a second.
    s.run_controller_paced(
        None,
        peer_pod_config_ctrl::nodes::Pace {
            per_second: 1,
            burst: 1,
        },
    );
    s.create_config(
        NAME,
        serde_json::json!({"limit": 10, "nodeSelector": s.selector()}),
    )
    .await;
    let (done, of) = wait_config(
        &s,
        NAME,
        "applying capacity: n of m nodes, 0 < n < m",
        |c| applying(c).filter(|(done, of)| 0 < *done && done < of),
    )
    .await;
    eprintln!("seen while applying: {done} of {of} nodes");

    let values = s.wait_spread(10).await;
    assert_eq!(values.len(), 5);
    let capacity = wait_config(&s, NAME, "CapacityAdvertised=True", |c| {
        condition(c, "CapacityAdvertised").filter(|c| c.0 == "True")
    })
    .await;
    assert_eq!(capacity.1, "Advertised");
    assert_eq!(capacity.2, "kata.peerpods.io/vm 10 over 5 nodes (2 each)");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_caches_hold_only_what_is_read_and_capacity_still_converges() {
    let s = Scenario::start("ppc-lean").await;
    s.create_nodes(0..4, |i| i < 3).await;
    // What a kubelet's node carries besides what the controller reads: other annotations, a spec, a status.
    for i in 0..4 {
        let name = s.node_name(i);
        s.nodes()
            .patch(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({
                    "metadata": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}},
                    "spec": {"podCIDR": format!("10.244.{i}.0/24")},
                })),
            )
            .await
            .expect("patch Node");
        s.nodes()
            .patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({"status": {
                    "capacity": {"cpu": "8", "memory": "32Gi"},
                    "nodeInfo": {"kubeletVersion": "v1.37.0"},
                    "addresses": [{"type": "InternalIP", "address": format!("10.0.0.{i}")}],
                }})),
            )
            .await
            .expect("patch Node status");
    }
    s.create_config(
        NAME,
        serde_json::json!({"limit": 6, "nodeSelector": s.selector()}),
    )
    .await;
    let values = s.wait_spread(6).await;
    assert!(values.values().all(|v| *v == 2), "{values:?}");
    wait_config(&s, NAME, "setupCompleted", |c| {
        c.status.as_ref().filter(|st| st.setup_completed).cloned()
    })
    .await;

    let ctx = s.context();
    // The cache's nodes are `nodes::Node`s: their spec and the rest of their status are never read.
    let ours: Vec<Arc<peer_pod_config_ctrl::nodes::Node>> = ctx
        .nodes
        .state()
        .into_iter()
        .filter(|n| n.name_any().starts_with("ppc-lean-"))
        .collect();
    assert_eq!(ours.len(), 4);
    for node in &ours {
        assert_eq!(node.metadata.managed_fields, None, "{}", node.name_any());
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        assert!(
            annotations.keys().all(|k| k == CAA_OWNER_ANNOTATION),
            "{annotations:?}"
        );
        let status = node.status.clone().unwrap_or_default();
        let capacity = status.capacity.unwrap_or_default();
        assert!(
            capacity.keys().all(|k| k == EXTENDED_RESOURCE),
            "{capacity:?}"
        );
        assert!(node.labels().contains_key("peerpods-test/prefix"));
    }
    let configs = ctx.configs.state();
    assert!(!configs.is_empty());
    assert!(
        configs.iter().all(|c| c.metadata.managed_fields.is_none()),
        "PeerPodConfigs cached with managedFields"
    );
    let daemonsets = ctx.owned.daemonsets.state();
    assert!(!daemonsets.is_empty());
    assert!(
        daemonsets
            .iter()
            .all(|d| d.metadata.managed_fields.is_none()),
        "DaemonSets cached with managedFields"
    );
    s.finish().await;
}

/// A node patch's answer is the whole Node, a kubelet's images and the managed fields included: `nodes::apply`
/// keeps of each only what the controller reads as it arrives, so a rebalance of a thousand nodes never holds a
/// thousand whole Nodes at once (the peak a heap profile of `make bench`'s memory scenario showed).
#[tokio::test]
async fn node_patch_answers_are_kept_only_as_far_as_they_are_read() {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use peer_pod_config_ctrl::nodes::NodeStatus;
    use peer_pod_config_ctrl::nodes::{self, CapacityChange, PatchRate};

    let s = Scenario::start_idle("ppc-trim").await;
    s.create_nodes(0..2, |_| true).await;
    let api = s.nodes();
    // What a kubelet writes: the node's images.
    for i in 0..2 {
        let status = serde_json::json!({"status": {"images": [
            {"names": ["registry.example/app@sha256:0123", "registry.example/app:1"], "sizeBytes": 1000}
        ]}});
        api.patch_status(
            &s.node_name(i),
            &PatchParams::default(),
            &Patch::Merge(&status),
        )
        .await
        .unwrap();
    }
    let as_stored = api.get_status(&s.node_name(0)).await.unwrap();
    assert!(as_stored.metadata.managed_fields.is_some());
    assert!(as_stored.status.as_ref().unwrap().images.is_some());

    let changes = vec![
        (s.node_name(0), CapacityChange::Set { value: 3 }),
        (s.node_name(1), CapacityChange::Set { value: 2 }),
    ];
    let (done, _) = tokio::sync::watch::channel(0);
    let read_as_ours: Api<nodes::Node> = Api::all(api.clone().into_client());
    let mut live = nodes::apply(
        &read_as_ours,
        &changes,
        &Arc::new(PatchRate::new(100, 10)),
        &done,
    )
    .await
    .unwrap();
    live.sort_by_key(|n| n.name_any());
    assert_eq!(*done.borrow(), 2);
    let kept: Vec<_> = live
        .iter()
        .map(|n| {
            (
                n.name_any(),
                n.metadata.managed_fields.clone(),
                n.status.clone(),
            )
        })
        .collect();
    let capacity = |value: &str| {
        Some(NodeStatus {
            capacity: Some(BTreeMap::from([(
                EXTENDED_RESOURCE.to_owned(),
                Quantity(value.into()),
            )])),
        })
    };
    assert_eq!(
        kept,
        [
            (s.node_name(0), None, capacity("3")),
            (s.node_name(1), None, capacity("2")),
        ]
    );
    assert!(
        live.iter()
            .all(|n| n.labels().contains_key("peerpods-test/prefix"))
    );
    s.finish().await;
}
