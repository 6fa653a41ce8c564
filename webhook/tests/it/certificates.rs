//! No cert-manager: the webhook serves with the certificate peer-pod-config-ctrl issues itself, and the API
//! server, trusting the caBundle peer-pod-config-ctrl writes into the MutatingWebhookConfiguration, accepts it
//! for the Service name it dials. Everything comes from peer-pod-config-ctrl's own rendering: the Secret, the
//! Deployment mounting it, the configuration's service reference and bundle. The TLS client checks the
//! certificate as the API server does (the bundle as the only roots, `<service>.<namespace>.svc` as the name).

use std::path::Path;

use crate::support::caa::patched;
use crate::support::{Pair, Webhook, post_tls_as};
use peer_pod_config_ctrl::cert;
use peer_pod_config_ctrl::objects::{
    WEBHOOK_CERT_SECRET, webhook_configuration, webhook_deployment, webhook_dns_names,
};
use peerpods_api::peerpodconfig::PeerPodConfig;
use peerpods_webhook::mutation::{Target, VCPUS_ANNOTATION};
use peerpods_webhook::server::DEFAULT_CERT_DIR;
use serde_json::json;

const NAMESPACE: &str = "confidential-containers-system";

fn review() -> serde_json::Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "3f1c7a52-0d7e-4c57-9a43-5b2f0e1d9c10",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "apps",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "apps"},
                "spec": {"runtimeClassName": "kata-remote", "containers": [{"name": "web", "image": "nginx",
                    "resources": {"requests": {"cpu": "1500m"}}}]}}
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_with_the_certificate_peer_pod_config_ctrl_issues() {
    let mut config =
        PeerPodConfig::new("peerpodconfig", serde_json::from_value(json!({})).unwrap());
    config.metadata.namespace = Some(NAMESPACE.into());
    config.metadata.uid = Some("5b0c1e8e-1111-2222-3333-444455556666".into());

    // The Secret peer-pod-config-ctrl writes when there is none (no issuer, no cert-manager involved).
    let (issued, why) =
        cert::ensure(None, &webhook_dns_names(NAMESPACE), jiff::Timestamp::now()).unwrap();
    assert!(why.is_some(), "a new certificate");
    let secret = issued.to_secret(&config, NAMESPACE).unwrap();
    assert_eq!(secret.metadata.name.as_deref(), Some(WEBHOOK_CERT_SECRET));

    // The Deployment it renders mounts that Secret where the webhook reads its certificate.
    let deployment = webhook_deployment(&config, NAMESPACE).unwrap();
    let pod = deployment.spec.template.spec.unwrap();
    let volume = pod
        .volumes
        .unwrap_or_default()
        .into_iter()
        .find(|v| {
            v.secret.as_ref().and_then(|s| s.secret_name.as_deref()) == Some(WEBHOOK_CERT_SECRET)
        })
        .expect("a volume of the certificate Secret");
    let mount = pod.containers[0]
        .volume_mounts
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|m| m.name == volume.name)
        .expect("the certificate volume mounted");
    assert_eq!(Path::new(&mount.mount_path), Path::new(DEFAULT_CERT_DIR));

    // The mounted files, as the kubelet projects the Secret's keys.
    let data = secret.data.unwrap();
    let text = |key: &str| String::from_utf8(data[key].0.clone()).unwrap();
    let mounted = Pair {
        ca: text("ca.crt"),
        cert: text("tls.crt"),
        key: text("tls.key"),
    };
    let webhook = Webhook::start(Target::default(), Some(&mounted)).await;

    // The API server's side: the configuration's bundle as the only roots, the Service's DNS name, its path.
    // The uid is the chart's object's, which this test does not create: only the webhook entry matters here.
    let configuration = webhook_configuration(&config, NAMESPACE, issued.ca_pem.as_bytes(), "");
    let client = &configuration.webhooks.as_ref().unwrap()[0].client_config;
    let bundle = String::from_utf8(client.ca_bundle.clone().unwrap().0).unwrap();
    let service = client.service.clone().unwrap();
    let server_name = format!("{}.{}.svc", service.name, service.namespace);
    let path = service.path.unwrap();
    let body = serde_json::to_vec(&review()).unwrap();
    let answer = post_tls_as(webhook.webhook_addr, &bundle, &server_name, &path, &body)
        .await
        .unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text());
    let response = answer.json()["response"].clone();
    assert_eq!(response["allowed"], true, "{response}");
    let pod = patched(&review()["request"]["object"], &response);
    assert_eq!(pod["metadata"]["annotations"][VCPUS_ANNOTATION], "2");

    // The check above verifies the name: the Service of another namespace is not covered, nor is another CA.
    let elsewhere = format!("{}.default.svc", service.name);
    assert!(
        post_tls_as(webhook.webhook_addr, &bundle, &elsewhere, &path, &body)
            .await
            .is_err()
    );
    let stranger = Pair::issue();
    assert!(
        post_tls_as(
            webhook.webhook_addr,
            &stranger.ca,
            &server_name,
            &path,
            &body
        )
        .await
        .is_err()
    );
    webhook.stop().await;
}
