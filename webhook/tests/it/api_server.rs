//! The webhook behind the real API server (testenv): registered with a MutatingWebhookConfiguration that calls
//! it by URL, it turns a peer pod into one that asks for a VM, and leaves a pod of another runtime class alone.
//!
//! Names are this test's own (its namespace, runtime classes named after it), and the configuration selects only
//! that namespace, so other tests sharing the control plane never reach this webhook.

use std::collections::BTreeMap;

use crate::support::{Pair, Webhook, connect_tls, eventually, post_tls};
use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::node::v1::RuntimeClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use kube::api::{Api, DeleteParams, PostParams};
use peerpods_webhook::mutation::{GPUS_ANNOTATION, MEMORY_ANNOTATION, Target, VCPUS_ANNOTATION};
use serde_json::json;

fn runtime_class(name: &str, handler: &str) -> RuntimeClass {
    RuntimeClass {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        handler: handler.to_owned(),
        ..RuntimeClass::default()
    }
}

/// The webhook as peer-pod-config-ctrl registers it, but called by URL and limited to `namespace`.
fn configuration(
    name: &str,
    namespace: &str,
    url: String,
    ca: &str,
) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: "mwebhook.peerpods.io".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                url: Some(url),
                ca_bundle: Some(ByteString(ca.as_bytes().to_vec())),
                service: None,
            },
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            reinvocation_policy: Some("IfNeeded".into()),
            timeout_seconds: Some(10),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["pods".into()]),
                scope: None,
            }]),
            namespace_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([(
                    "kubernetes.io/metadata.name".to_owned(),
                    namespace.to_owned(),
                )])),
                match_expressions: None,
            }),
            ..MutatingWebhook::default()
        }]),
    }
}

/// A pod of `runtime_class`: an app and a sidecar container and an init container, with requests and limits.
/// Without the webhook it asks the node for 1.75 CPUs (2.25 at most), 1280Mi (2Gi at most) and one GPU.
fn pod(name: &str, runtime_class: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": {"team": "payments"}},
        "spec": {
            "runtimeClassName": runtime_class,
            "initContainers": [{"name": "migrate", "image": "busybox", "resources": {"limits": {"cpu": "250m"}}}],
            "containers": [
                {"name": "app", "image": "nginx", "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"},
                    // No GPU request: the API server defaults it from the limit before calling webhooks.
                    "limits": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"}}},
                {"name": "sidecar", "image": "envoy", "resources": {"requests": {"cpu": "500m", "memory": "256Mi"}}}
            ]
        }
    }))
    .unwrap()
}

fn annotations(pod: &Pod) -> BTreeMap<String, String> {
    pod.metadata.annotations.clone().unwrap_or_default()
}

fn resources(pod: &Pod) -> Vec<serde_json::Value> {
    let spec = pod.spec.as_ref().unwrap();
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .map(|c| serde_json::to_value(c.resources.clone().unwrap_or_default()).unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_stores_peer_pods_mutated_and_other_pods_as_they_are() {
    let client = testenv::shared().client().await;
    let ns = testenv::namespace(&client, "webhook").await;
    // Pods must name an existing RuntimeClass (the RuntimeClass admission plugin checks).
    let (peer_class, other_class) = (format!("{ns}-kata-remote"), format!("{ns}-runc"));
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    for (name, handler) in [(&peer_class, "kata-remote"), (&other_class, "runc")] {
        classes
            .create(&PostParams::default(), &runtime_class(name, handler))
            .await
            .unwrap();
    }

    let pair = Pair::issue();
    let webhook =
        Webhook::start(Target::new(&peer_class, "kata.peerpods.io/vm"), Some(&pair)).await;
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    configurations
        .create(
            &PostParams::default(),
            &configuration(&ns, &ns, webhook.url(), &pair.ca),
        )
        .await
        .unwrap();

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    until_in_effect(&pods, &peer_class).await;

    pods.create(&PostParams::default(), &pod("peer", &peer_class))
        .await
        .unwrap();
    pods.create(&PostParams::default(), &pod("plain", &other_class))
        .await
        .unwrap();

    let peer = pods.get("peer").await.unwrap();
    assert_eq!(
        annotations(&peer),
        BTreeMap::from([
            ("team".to_owned(), "payments".to_owned()),
            // CPU: limits 2 + 0.25 cover the requests 1.75; 2.25 rounds up to 3.
            (VCPUS_ANNOTATION.to_owned(), "3".to_owned()),
            // Memory: the 2Gi limit covers the 1280Mi requested.
            (MEMORY_ANNOTATION.to_owned(), "2048".to_owned()),
            (GPUS_ANNOTATION.to_owned(), "1".to_owned()),
        ])
    );
    let vm = json!({"kata.peerpods.io/vm": "1"});
    assert_eq!(
        resources(&peer),
        vec![json!({}), json!({"requests": vm, "limits": vm}), json!({})],
        "init container, app, sidecar"
    );

    let plain = pods.get("plain").await.unwrap();
    assert_eq!(
        annotations(&plain),
        BTreeMap::from([("team".to_owned(), "payments".to_owned())])
    );
    assert_eq!(
        resources(&plain),
        vec![
            json!({"requests": {"cpu": "250m"}, "limits": {"cpu": "250m"}}),
            json!({"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"},
                   "limits": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"}}),
            json!({"requests": {"cpu": "500m", "memory": "256Mi"}}),
        ]
    );

    configurations
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    for name in [&peer_class, &other_class] {
        classes
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    webhook.stop().await;
}

/// A webhook out of admission budget sheds the API server's call with HTTP 429 and `Retry-After` (see
/// `server::mutate`); the API server retries it within the configuration's timeout, so the Pod is created, and
/// mutated, once the budget frees, instead of being refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shed_admission_is_retried_by_the_api_server_and_the_pod_is_mutated() {
    use peerpods_webhook::metrics::OutcomeLabels;
    use peerpods_webhook::server::{AdmissionLimits, WEBHOOK_PATH};
    use std::time::Duration;
    use tokio::io::AsyncWriteExt;

    let client = testenv::shared().client().await;
    let ns = testenv::namespace(&client, "webhook-shed").await;
    let peer_class = format!("{ns}-kata-remote");
    let classes: Api<RuntimeClass> = Api::all(client.clone());
    classes
        .create(
            &PostParams::default(),
            &runtime_class(&peer_class, "kata-remote"),
        )
        .await
        .unwrap();

    // A budget one admission fills, a short wait for it, and bodies that may take long: a connection that sent
    // only its headers keeps the whole budget for as long as the test holds it open.
    let pair = Pair::issue();
    let webhook = Webhook::start_with(
        Target::new(&peer_class, "kata.peerpods.io/vm"),
        Some(&pair),
        AdmissionLimits {
            budget_bytes: peerpods_webhook::server::ADMISSION_MIN_SHARE,
            wait: Duration::from_secs(1),
            body_read_timeout: Duration::from_secs(600),
            ..AdmissionLimits::default()
        },
    )
    .await;
    let shed = || {
        webhook
            .running
            .as_ref()
            .unwrap()
            .metrics
            .reviews
            .get_or_create(&OutcomeLabels { outcome: "shed" })
            .get()
    };
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    let mut config = configuration(&ns, &ns, webhook.url(), &pair.ca);
    // The most the API server allows: the whole call, its retries included, must end within it.
    config.webhooks.as_mut().unwrap()[0].timeout_seconds = Some(30);
    configurations
        .create(&PostParams::default(), &config)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    until_in_effect(&pods, &peer_class).await;

    // Hold the budget, and see that a direct request is now shed.
    let mut holder = connect_tls(webhook.webhook_addr, &pair.ca, "127.0.0.1")
        .await
        .unwrap();
    holder
        .write_all(
            format!(
                "POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n\
                 Content-Length: 1000\r\n\r\n"
            )
            .as_bytes(),
        )
        .await
        .unwrap();
    holder.flush().await.unwrap();
    eventually("the budget held", || async {
        let answer = post_tls(webhook.webhook_addr, &pair.ca, WEBHOOK_PATH, b"{}")
            .await
            .unwrap();
        (answer.status == 429).then_some(())
    })
    .await;
    let shed_before = shed();

    // The API server's call is shed too; once the budget frees, its retry is answered.
    let create = tokio::spawn({
        let pods = pods.clone();
        let peer_class = peer_class.clone();
        async move {
            pods.create(&PostParams::default(), &pod("peer", &peer_class))
                .await
        }
    });
    eventually("the API server's call shed", || async {
        (shed() > shed_before).then_some(())
    })
    .await;
    drop(holder);

    let created = tokio::time::timeout(Duration::from_secs(60), create)
        .await
        .expect("the create ends within the webhook timeout")
        .unwrap()
        .expect("the Pod is created after the API server retried the shed call");
    assert_eq!(
        annotations(&created)
            .get(VCPUS_ANNOTATION)
            .map(String::as_str),
        Some("3"),
        "and mutated: {:?}",
        annotations(&created)
    );

    configurations
        .delete(&ns, &DeleteParams::default())
        .await
        .unwrap();
    classes
        .delete(&peer_class, &DeleteParams::default())
        .await
        .unwrap();
    webhook.stop().await;
}

/// Waits until the API server applies a new webhook configuration (within moments): a dry-run
/// create of a Pod of `peer_class` comes back mutated.
async fn until_in_effect(pods: &Api<Pod>, peer_class: &str) {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    eventually("the webhook configuration in effect", || async {
        let created = pods
            .create(&dry_run, &pod("probe", peer_class))
            .await
            .ok()?;
        annotations(&created)
            .contains_key(VCPUS_ANNOTATION)
            .then_some(())
    })
    .await;
}
