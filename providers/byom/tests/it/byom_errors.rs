//! Answers the local control plane does not give on demand (throttling, outages, an answer lost
//! after the API server applied a write), scripted in a fault layer in front of the real API
//! server; conflicts come from the API server's own resourceVersion precondition. And
//! configuration errors.

use std::time::Duration;

use crate::byom_support::api_faults::{Answer, ApiFaults, object_path, step, trace};
use crate::byom_support::{CONFIGMAP, Pool, Tap, caa_allocate};
use http::Method;
use k8s_openapi::api::core::v1::ConfigMap;
use peerpods_provider_byom::{ByomProvider, GET_CONFIGMAP, REPLACE_CONFIGMAP};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider, ProviderConfig};
use serde_json::json;

const NS: &str = "peer-pods";
const IPS: [&str; 3] = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];
/// The pool as provider-service is configured for it (a range, as operators write it).
const POOL_RANGE: (&str, &str) = ("VM_POOL_IPS", "10.0.0.1-10.0.0.3");

/// A pool of three machines on the control plane, 10.0.0.2 allocated by CAA to web-1 (version 2),
/// and the provider reaching it through a fault layer.
async fn pool_with_one_allocation(calls: &CloudCalls) -> (Pool, ByomProvider, ApiFaults, String) {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("10.0.0.2", "web-1", "worker-0").await;
    let (provider, faults) =
        crate::byom_support::provider_behind_faults(&pool, &[POOL_RANGE], calls).await;
    let path = object_path::<ConfigMap>(&pool.ns, CONFIGMAP);
    (pool, provider, faults, path)
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_reported_with_the_servers_wait_without_retrying() {
    let calls = CloudCalls::default();
    let (pool, provider, faults, path) = pool_with_one_allocation(&calls).await;
    faults.fail_next(Method::GET, &path, 1, Answer::too_many_requests(7));

    let error = provider.delete_instance("10.0.0.2").await.unwrap_err();

    assert!(
        matches!(error, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(7)),
        "{error:?}"
    );
    assert_eq!(
        faults.requests(),
        1,
        "a 429 goes back to the caller at once"
    );
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "throttled"), 1);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "throttled"), 1);
    assert_eq!(pool.allocated().await.len(), 1, "nothing was freed");
    assert_eq!(
        provider.delete_instance("10.0.0.2").await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(pool.allocated().await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn flow_control_throttling_is_throttling_without_retrying() {
    // API Priority and Fairness answers 429 in plain text, the wait only in Retry-After.
    let calls = CloudCalls::default();
    let (pool, provider, faults, path) = pool_with_one_allocation(&calls).await;
    faults.fail_next(
        Method::GET,
        &path,
        1,
        Answer::FlowControlThrottled {
            retry_after_seconds: 5,
        },
    );

    let error = provider.delete_instance("10.0.0.2").await.unwrap_err();

    assert!(
        matches!(error, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(5)),
        "throttled with the server's wait from Retry-After: {error:?}"
    );
    assert!(error.to_string().contains("HTTP 429"), "{error}");
    assert_eq!(
        faults.requests(),
        1,
        "a 429 goes back to the caller at once"
    );
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "throttled"), 1);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "throttled"), 1);
    assert_eq!(pool.allocated().await.len(), 1, "nothing was freed");
}

#[tokio::test(flavor = "multi_thread")]
async fn outages_are_retried_then_the_release_succeeds() {
    let calls = CloudCalls::default();
    let (pool, provider, faults, path) = pool_with_one_allocation(&calls).await;
    faults.fail_next(Method::GET, &path, 1, Answer::ServiceUnavailable);
    faults.fail_next(Method::GET, &path, 1, Answer::InternalError);

    let outcome = provider.delete_instance("10.0.0.2").await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(
        trace(&faults.seen()),
        [
            step("GET", 503, false),
            step("GET", 500, false),
            step("GET", 200, true),
            step("PUT", 200, true),
            // The deletion engine's confirming read.
            step("GET", 200, true),
        ]
    );
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "error"), 2);
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "ok"), 2);
    assert_eq!(calls.count("byom", REPLACE_CONFIGMAP, "ok"), 1);
    // Each request the API server answered is an attempt, classified by its status.
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "server_error"), 2);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "ok"), 2);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "ok"), 1);
    let (state, _) = pool.state().await;
    assert_eq!(state["allocatedIPs"], json!({}));
    assert_eq!(
        state["availableIPs"],
        json!(["10.0.0.1", "10.0.0.3", "10.0.0.2"])
    );
    assert_eq!(state["version"], 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lasting_outage_is_unavailable_after_a_bounded_number_of_tries() {
    let calls = CloudCalls::default();
    let (_pool, provider, faults, path) = pool_with_one_allocation(&calls).await;
    faults.fail_next(Method::GET, &path, 10, Answer::ServiceUnavailable);

    let error = provider.capacity().await.unwrap_err();

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(error.to_string().contains("HTTP 503"), "{error}");
    assert!(
        error.to_string().contains("(ServiceUnavailable)"),
        "the API server's reason is kept: {error}"
    );
    assert_eq!(faults.requests(), 3);
    assert_eq!(faults.served(), 0);
    assert_eq!(calls.count("byom", GET_CONFIGMAP, "error"), 3);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "server_error"), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outage_during_the_update_is_retried_too() {
    let calls = CloudCalls::default();
    let (pool, provider, faults, path) = pool_with_one_allocation(&calls).await;
    let capacity = provider.capacity().await.unwrap();
    assert_eq!(
        (capacity.instances.limit, capacity.instances.in_use),
        (Some(3), Some(1))
    );
    faults.fail_next(Method::PUT, &path, 1, Answer::Timeout);
    let before = faults.requests();

    let outcome = provider.delete_instance("10.0.0.2").await;

    assert_eq!(
        trace(&faults.seen()[before..]),
        [
            step("GET", 200, true),
            step("PUT", 504, false),
            step("PUT", 200, true),
            step("GET", 200, true),
        ]
    );
    assert_eq!(outcome.unwrap(), DeleteOutcome::Deleted);
    assert_eq!(calls.count("byom", REPLACE_CONFIGMAP, "error"), 1);
    assert_eq!(calls.count("byom", REPLACE_CONFIGMAP, "ok"), 1);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "server_error"), 1);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "ok"), 1);
    assert!(pool.allocated().await.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn an_update_applied_whose_answer_was_lost_is_found_done_on_the_reread() {
    // The API server timed out the answer after it wrote: the retried update's resourceVersion is
    // stale, the API server refuses it (409), and the fresh read shows the machine already free.
    // That proves nothing about who freed it; the engine's later read confirms it gone, and the
    // answer is Deleted: this delete saw the machine allocated (the old code answered AlreadyGone).
    let calls = CloudCalls::default();
    let (pool, provider, faults, path) = pool_with_one_allocation(&calls).await;
    faults.fail_next_after_serving(Method::PUT, &path, 1, Answer::Timeout);

    let outcome = provider.delete_instance("10.0.0.2").await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(
        trace(&faults.seen()),
        [
            step("GET", 200, true),
            step("PUT", 504, true),
            step("PUT", 409, true),
            step("GET", 200, true),
            // The engine's confirming read.
            step("GET", 200, true),
        ]
    );
    let (state, _) = pool.state().await;
    assert_eq!(state["allocatedIPs"], json!({}));
    assert_eq!(
        state["availableIPs"],
        json!(["10.0.0.1", "10.0.0.3", "10.0.0.2"]),
        "returned once"
    );
    assert_eq!(state["version"], 3, "written once");
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "server_error"), 1);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "client_error"), 1);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "ok"), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_conflict_then_an_outage_on_the_reread_still_releases_and_keeps_both_changes() {
    let calls = CloudCalls::default();
    let (pool, _, faults, path) = pool_with_one_allocation(&calls).await;
    // CAA on another node allocates .3 after the provider read the ConfigMap and before its update
    // reaches the API server; the API server is unavailable for the read that follows.
    let tap = Tap::new(faults.client(&pool.ns));
    let caa = pool.api();
    let outage = faults.clone();
    let get_path = path.clone();
    tap.before_first_put(async move {
        caa_allocate(&caa, "10.0.0.3", "batch-7", "worker-2").await;
        outage.fail_next(Method::GET, &get_path, 1, Answer::ServiceUnavailable);
    });
    let provider = ByomProvider::with_client(
        &crate::byom_support::config(&pool, &[POOL_RANGE]),
        tap.client(&pool.ns),
        calls.clone(),
    )
    .unwrap();

    let outcome = provider.delete_instance("10.0.0.2").await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(
        trace(&faults.seen()),
        [
            step("GET", 200, true),
            step("PUT", 409, true),
            step("GET", 503, false),
            step("GET", 200, true),
            step("PUT", 200, true),
            step("GET", 200, true),
        ]
    );
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "client_error"), 1);
    assert_eq!(calls.attempts("byom", REPLACE_CONFIGMAP, "ok"), 1);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "server_error"), 1);
    assert_eq!(calls.attempts("byom", GET_CONFIGMAP, "ok"), 3);
    let allocated: Vec<String> = pool
        .allocated()
        .await
        .into_iter()
        .map(|(_, ip)| ip)
        .collect();
    assert_eq!(allocated, ["10.0.0.3"], "the competing allocation survived");
    assert_eq!(pool.available().await, ["10.0.0.1", "10.0.0.2"]);
}

fn config() -> ProviderConfig {
    ProviderConfig::from_pairs([POOL_RANGE, ("POOL_NAMESPACE", NS)])
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
