//! The webhook's ports over real sockets: HTTPS with the certificate from its directory (waited for, then
//! followed when rotated), AdmissionReviews in and out, and the health port.

use crate::support::{Pair, Webhook, eventually, get, post_tls};
use peerpods_webhook::mutation::{MEMORY_ANNOTATION, Target, VCPUS_ANNOTATION};
use peerpods_webhook::server::WEBHOOK_PATH;
use serde_json::{Value, json};

fn review(runtime_class: &str) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "7f0b2d7e-5c1e-4d8a-9b43-2f6f0c1d9e11",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "name": "web",
            "namespace": "apps",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "web", "namespace": "apps"},
                "spec": {"runtimeClassName": runtime_class, "containers": [{"name": "web", "image": "nginx",
                    "resources": {"requests": {"cpu": "250m", "memory": "100Mi"}}}]}
            }
        }
    }))
    .unwrap()
}

fn patched(response: &Value) -> Value {
    let bytes: Vec<u8> = serde_json::from_value(response["patch"].clone()).unwrap();
    let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
    let body: Value = serde_json::from_slice(&review("kata-remote")).unwrap();
    let mut pod = body["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    pod
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_admission_reviews_over_https() {
    let pair = Pair::issue();
    let webhook = Webhook::start(Target::default(), Some(&pair)).await;
    let addr = webhook.webhook_addr;

    let peer = post_tls(addr, &pair.ca, WEBHOOK_PATH, &review("kata-remote"))
        .await
        .unwrap();
    assert_eq!(peer.status, 200, "{}", peer.text());
    let answer = peer.json();
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], "7f0b2d7e-5c1e-4d8a-9b43-2f6f0c1d9e11");
    assert_eq!(response["allowed"], true);
    assert_eq!(response["patchType"], "JSONPatch");
    let pod = patched(response);
    assert_eq!(pod["metadata"]["annotations"][VCPUS_ANNOTATION], "1");
    assert_eq!(pod["metadata"]["annotations"][MEMORY_ANNOTATION], "100");
    assert_eq!(
        pod["spec"]["containers"][0]["resources"],
        json!({"requests": {"kata.peerpods.io/vm": "1"}, "limits": {"kata.peerpods.io/vm": "1"}})
    );

    let other = post_tls(addr, &pair.ca, WEBHOOK_PATH, &review("runc"))
        .await
        .unwrap()
        .json();
    assert_eq!(other["response"]["allowed"], true);
    assert!(other["response"].get("patch").is_none(), "{other}");

    let malformed = post_tls(addr, &pair.ca, WEBHOOK_PATH, b"{\"kind\": 7")
        .await
        .unwrap();
    assert_eq!(malformed.status, 200, "an answer the API server can read");
    let malformed = malformed.json();
    assert_eq!(malformed["response"]["allowed"], false);
    assert_eq!(malformed["response"]["status"]["code"], 400);

    let elsewhere = post_tls(addr, &pair.ca, "/validate", &review("kata-remote"))
        .await
        .unwrap();
    assert_eq!(elsewhere.status, 404);

    let metrics = get(webhook.health_addr, "/metrics").await.text();
    for outcome in ["mutated", "unchanged", "invalid"] {
        let line = format!("peerpods_webhook_admission_reviews_total{{outcome=\"{outcome}\"}} 1");
        assert!(metrics.contains(&line), "{line} missing from\n{metrics}");
    }
    webhook.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_for_its_certificate_and_follows_its_rotation() {
    let webhook = Webhook::start(Target::default(), None).await;
    let (addr, health) = (webhook.webhook_addr, webhook.health_addr);
    let first = Pair::issue();

    // No certificate yet: alive, not ready, no handshake.
    assert_eq!(get(health, "/healthz").await.status, 200);
    let not_ready = get(health, "/readyz").await;
    assert_eq!(not_ready.status, 503);
    assert!(
        not_ready.text().contains("certificate: not ready"),
        "{}",
        not_ready.text()
    );
    assert!(not_ready.text().contains("tls.crt"), "{}", not_ready.text());
    assert!(
        post_tls(addr, &first.ca, WEBHOOK_PATH, &review("runc"))
            .await
            .is_err()
    );

    first.write_to(webhook.cert_dir.path());
    eventually("ready once the certificate is there", || async {
        (get(health, "/readyz").await.status == 200).then_some(())
    })
    .await;
    let answer = post_tls(addr, &first.ca, WEBHOOK_PATH, &review("runc"))
        .await
        .unwrap();
    assert_eq!(answer.json()["response"]["allowed"], true);

    // A new pair from a new CA (as peer-pod-config-ctrl rotates it) is served without a restart.
    let second = Pair::issue();
    second.write_to(webhook.cert_dir.path());
    eventually("the rotated certificate served", || async {
        post_tls(addr, &second.ca, WEBHOOK_PATH, &review("runc"))
            .await
            .ok()
    })
    .await;
    assert!(
        post_tls(addr, &first.ca, WEBHOOK_PATH, &review("runc"))
            .await
            .is_err()
    );

    // A broken pair keeps the one served, and stays ready.
    std::fs::write(webhook.cert_dir.path().join("tls.key"), "garbage").unwrap();
    eventually("the broken pair reported", || async {
        let ready = get(health, "/readyz").await;
        (ready.status == 200 && ready.text().contains("new one rejected")).then_some(())
    })
    .await;
    assert!(
        post_tls(addr, &second.ca, WEBHOOK_PATH, &review("runc"))
            .await
            .is_ok()
    );
    webhook.stop().await;
}
