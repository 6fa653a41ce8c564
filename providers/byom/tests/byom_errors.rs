//! Answers the local control plane does not give on demand (throttling, outages), from a scripted
//! stand-in for the Kubernetes API, and configuration errors.

mod byom_support;

use std::time::Duration;

use axum::http::StatusCode;
use byom_support::fake_apiserver::FakeApiserver;
use byom_support::{CONFIGMAP, STATE_KEY, pretty};
use peerpods_provider_byom::{ByomProvider, GET_CONFIGMAP, REPLACE_CONFIGMAP};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider, ProviderConfig};
use serde_json::json;

const NS: &str = "peer-pods";

async fn fake_pool() -> FakeApiserver {
    let state = json!({
        "allocatedIPs": {
            "web-1-0123456789abcdef": {
                "allocationID": "web-1-0123456789abcdef",
                "ip": "10.0.0.2",
                "nodeName": "worker-0",
                "podName": "web-1",
                "allocatedAt": "2025-03-01T10:00:00Z"
            }
        },
        "availableIPs": ["10.0.0.1", "10.0.0.3"],
        "lastUpdated": "2025-03-01T10:00:00Z",
        "version": 2
    });
    FakeApiserver::start(NS, CONFIGMAP, json!({ STATE_KEY: pretty(&state) })).await
}

fn config() -> ProviderConfig {
    ProviderConfig::from_pairs([("VM_POOL_IPS", "10.0.0.1-10.0.0.3"), ("POOL_NAMESPACE", NS)])
}

fn provider(fake: &FakeApiserver, calls: &CloudCalls) -> ByomProvider {
    ByomProvider::with_kube_config(&config(), fake.kube_config(), calls.clone()).expect("provider")
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_reported_with_the_servers_wait_without_retrying() {
    let fake = fake_pool().await;
    let calls = CloudCalls::default();
    let provider = provider(&fake, &calls);
    fake.fail_next(1, StatusCode::TOO_MANY_REQUESTS, Some(7));

    let error = provider.delete_instance("10.0.0.2").await.unwrap_err();

    assert!(
        matches!(error, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(7)),
        "{error:?}"
    );
    assert_eq!(fake.requests(), 1, "a 429 goes back to the caller at once");
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "throttled"), 1);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "throttled"), 1);
    assert_eq!(
        provider.delete_instance("10.0.0.2").await.unwrap(),
        DeleteOutcome::Deleted
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn outages_are_retried_then_the_release_succeeds() {
    let fake = fake_pool().await;
    let calls = CloudCalls::default();
    let provider = provider(&fake, &calls);
    fake.fail_next(1, StatusCode::SERVICE_UNAVAILABLE, None);
    fake.fail_next(1, StatusCode::INTERNAL_SERVER_ERROR, None);

    let outcome = provider.delete_instance("10.0.0.2").await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(fake.requests(), 4, "GET 503, GET 500, GET, PUT");
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "error"), 2);
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "ok"), 1);
    assert_eq!(calls.count("byom", REPLACE_CONFIGMAP, "ok"), 1);
    // Each request the API server answered is an attempt, classified by its status.
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "server_error"), 2);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "ok"), 1);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "ok"), 1);
    let state: serde_json::Value =
        serde_json::from_str(fake.data()[STATE_KEY].as_str().unwrap()).unwrap();
    assert_eq!(state["allocatedIPs"], json!({}));
    assert_eq!(
        state["availableIPs"],
        json!(["10.0.0.1", "10.0.0.3", "10.0.0.2"])
    );
    assert_eq!(state["version"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lasting_outage_is_unavailable_after_a_bounded_number_of_tries() {
    let fake = fake_pool().await;
    let calls = CloudCalls::default();
    let provider = provider(&fake, &calls);
    fake.fail_next(10, StatusCode::SERVICE_UNAVAILABLE, Some(1));

    let error = provider.capacity().await.unwrap_err();

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(error.to_string().contains("HTTP 503"), "{error}");
    assert_eq!(fake.requests(), 3);
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "error"), 3);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "server_error"), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outage_during_the_update_is_retried_too() {
    let fake = fake_pool().await;
    let calls = CloudCalls::default();
    let provider = provider(&fake, &calls);
    let capacity = provider.capacity().await.unwrap();
    assert_eq!(
        (capacity.instances.limit, capacity.instances.in_use),
        (Some(3), Some(1))
    );
    fake.fail_next_updates(1, StatusCode::GATEWAY_TIMEOUT);
    let before = fake.requests();

    let outcome = provider.delete_instance("10.0.0.2").await;

    assert_eq!(fake.requests() - before, 3, "GET, PUT 504, PUT");
    assert_eq!(outcome.unwrap(), DeleteOutcome::Deleted);
    assert_eq!(calls.count("byom", REPLACE_CONFIGMAP, "error"), 1);
    assert_eq!(calls.count("byom", REPLACE_CONFIGMAP, "ok"), 1);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "server_error"), 1);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "ok"), 1);
}

#[test]
fn building_needs_no_cluster_and_no_runtime() {
    // No KUBECONFIG, not in a cluster, not in a tokio runtime: building only reads the config.
    let provider = ByomProvider::from_config(&config(), CloudCalls::default()).unwrap();
    assert!(format!("{provider:?}").contains("peer-pods/byom-ip-pool-state"));
}

#[test]
fn missing_or_invalid_keys_are_config_errors_naming_the_key() {
    let error = ByomProvider::from_config(
        &ProviderConfig::from_pairs([("POOL_NAMESPACE", NS)]),
        CloudCalls::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&error, Error::Config { key, .. } if key == "VM_POOL_IPS"),
        "{error:?}"
    );

    let error = ByomProvider::from_config(
        &ProviderConfig::from_pairs([("VM_POOL_IPS", "10.0.0.1,10.0.0.999-secretish")]),
        CloudCalls::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&error, Error::Config { key, .. } if key == "VM_POOL_IPS"),
        "{error:?}"
    );
    assert!(!error.to_string().contains("secretish"), "{error}");

    let error = ByomProvider::from_config(
        &ProviderConfig::from_pairs([
            ("VM_POOL_IPS", "10.0.0.1"),
            ("POOL_CONFIGMAP_NAME", "Pool!"),
        ]),
        CloudCalls::default(),
    )
    .unwrap_err();
    assert!(
        matches!(&error, Error::Config { key, .. } if key == "POOL_CONFIGMAP_NAME"),
        "{error:?}"
    );
}
