//! The GCP backend through its public `Provider` API, with the real Compute Engine client and
//! `google-cloud-auth` credentials, against the local Compute Engine emulator.

use std::sync::Arc;
use std::time::Duration;

use peerpods_emulator_gcp::{
    GcpEmulator, OperationFailure, PROJECT, RateRefusal, VCPUS_PER_VM, ZONE,
};
use peerpods_provider_core::{
    CloudCalls, DeleteOutcome, Error, Figure, Provider, ProviderConfig, TagSelector,
};
use peerpods_provider_gcp::GcpProvider;
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;
use test_support::faults::Faults;
use test_support::provider_checks;

const GCP: &str = "gcp";

fn emulator() -> GcpEmulator {
    GcpEmulator::start().expect("emulator starts")
}

/// The provider of `config`, looking again every 20 ms while a deletion goes on (unless
/// `config` sets the pace).
async fn provider_with(config: Vec<(String, String)>, calls: CloudCalls) -> GcpProvider {
    let config = if config.iter().any(|(k, _)| k == "GCP_DELETE_POLL_MS") {
        config
    } else {
        with(config, &[("GCP_DELETE_POLL_MS", "20")])
    };
    GcpProvider::from_config(&ProviderConfig::from_pairs(config), calls)
        .await
        .expect("provider builds")
}

async fn provider(emulator: &GcpEmulator) -> (GcpProvider, CloudCalls) {
    let calls = CloudCalls::default();
    (provider_with(emulator.config(), calls.clone()).await, calls)
}

fn deletes_sent(emulator: &GcpEmulator, name: &str) -> usize {
    let path = format!("DELETE /compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{name}");
    emulator
        .request_log()
        .iter()
        .filter(|r| **r == path)
        .count()
}

#[tokio::test]
async fn delete_removes_the_vm_and_its_boot_disk_after_the_operation_is_done() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-nginx-1a2b3c4d", &[("cluster", "blue")]);
    let other = emulator.create_vm("podvm-other-5e6f7a8b", &[("cluster", "blue")]);
    emulator.set_operation_polls(2);
    let (gcp, calls) = provider(&emulator).await;

    assert_eq!(
        gcp.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );

    assert!(!emulator.vm_or_parts_exist(&id));
    assert!(!emulator.disk_exists(&id));
    assert!(emulator.vm_or_parts_exist(&other), "only the named VM goes");
    assert_eq!(calls.count(GCP, "DeleteInstance", "ok"), 1);
    // The lookup before the DELETE; then Compute Engine deletes on its own: the next lookup
    // still shows the instance, and the operation (this process's own) says it is running;
    // the lookup after that answers 404, which confirms the accepted delete.
    assert_eq!(calls.count(GCP, "GetInstance", "ok"), 2);
    assert_eq!(calls.count(GCP, "GetInstance", "error"), 1);
    assert_eq!(calls.count(GCP, "GetZoneOperation", "ok"), 1);
    assert_eq!(gcp.api_calls("GetZoneOperation", "ok"), 1);
    assert_eq!(emulator.requests(), 5);
}

/// The cost of one confirmed delete when Compute Engine deletes at once: the lookup, the
/// DELETE, the lookup that confirms it gone.
#[tokio::test]
async fn a_confirmed_delete_is_three_calls() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-cost", &[]);
    let (gcp, _calls) = provider(&emulator).await;

    provider_checks::deleted(&emulator, &gcp, &id).await;

    let path = format!("/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{id}");
    assert_eq!(
        emulator.request_log(),
        [
            format!("GET {path}"),
            format!("DELETE {path}"),
            format!("GET {path}")
        ]
    );
}

/// Compute Engine answering the DELETE 404 right after `instances.get` found the instance proves
/// nothing (a lookup and a deletion may see the instance differently for a while): the delete
/// goes on looking and asking, answers nothing while the VM exists, and completes once the
/// cloud deletes it. (It used to answer AlreadyGone at once, the VM still running.)
#[tokio::test(flavor = "multi_thread")]
async fn a_delete_answered_404_after_a_found_lookup_is_held_until_the_vm_is_gone() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-delete-404", &[]);
    let (gcp, _calls) = provider(&emulator).await;
    provider_checks::a_delete_answered_404_after_a_found_lookup_is_held(
        &emulator,
        Arc::new(gcp),
        &id,
        Duration::from_secs(30),
        || deletes_sent(&emulator, &id) as u64,
        || emulator.instance_exists(&id),
    )
    .await;
}

#[tokio::test]
async fn deleting_a_vm_that_is_gone_is_already_gone_every_time() {
    let emulator = emulator();
    let (gcp, calls) = provider(&emulator).await;

    provider_checks::deleting_twice_is_already_gone(&emulator, &gcp, "podvm-twice").await;
    // An id never seen deleted is not believed gone on its first 404: it may be an instance
    // created moments ago (GCP_NOT_FOUND_WINDOW_SECS); the answer is retryable.
    provider_checks::an_unknown_vm_is_not_gone_inside_the_not_found_window(
        &emulator,
        &gcp,
        "podvm-never-existed",
        "GCP_NOT_FOUND_WINDOW_SECS",
    )
    .await;
    // The 404s of the lookups (the one confirming the first delete, then one before each
    // later DELETE) are answers, not retried, and nothing is deleted after them.
    assert_eq!(calls.count(GCP, "GetInstance", "error"), 3);
    assert_eq!(calls.count(GCP, "DeleteInstance", "error"), 0);
    assert_eq!(deletes_sent(&emulator, "podvm-never-existed"), 0);
}

/// With the window at zero a 404 is trusted at once, as before the window.
#[tokio::test]
async fn a_zero_not_found_window_trusts_a_404_at_once() {
    let emulator = emulator();
    let mut config = emulator.config();
    config.push(("GCP_NOT_FOUND_WINDOW_SECS".into(), "0".into()));
    let gcp = provider_with(config, CloudCalls::default()).await;
    provider_checks::already_gone(&emulator, &gcp, "podvm-never-existed").await;
}

/// Another client's deletion: `STOPPING` is no deletion state on Compute Engine (a VM being
/// stopped shows it too), so the DELETE is sent; refused as resourceNotReady, it is asked again
/// after each lookup until `instances.get` says 404. No delete of this process was accepted, so
/// that 404 counts only past the not-found window: at once with the window at zero, a wait with
/// the default window for a new instance (an old one's 404 is believed at once).
#[tokio::test]
async fn a_vm_already_being_deleted_counts_as_deleted_once_gone() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-stopping", &[]);
    emulator.begin_deletion(&id, 2);
    assert_eq!(emulator.instance_status(&id).as_deref(), Some("STOPPING"));
    let calls = CloudCalls::default();
    let gcp = provider_with(
        with(emulator.config(), &[("GCP_NOT_FOUND_WINDOW_SECS", "0")]),
        calls.clone(),
    )
    .await;

    provider_checks::a_vm_the_cloud_is_deleting_is_deleted_once_gone(&emulator, &gcp, &id).await;

    assert_eq!(deletes_sent(&emulator, &id), 2);
    assert_eq!(calls.count(GCP, "GetInstance", "ok"), 2);
    assert_eq!(calls.count(GCP, "GetInstance", "error"), 1);

    // With the default window: an instance created an hour ago is no new instance the cloud
    // may not show yet, so its 404 is believed at once.
    let emulator = self::emulator();
    let id = emulator.create_vm("podvm-stopping", &[]);
    emulator.begin_deletion(&id, 1);
    let (gcp, _) = provider(&emulator).await;
    assert_eq!(
        gcp.delete_instance(&id).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));

    // A new one's 404 may be the cloud's lag: a wait, naming the window's key.
    let emulator = self::emulator();
    emulator.set_faults(Faults {
        created_age: Some(Duration::ZERO),
        ..Faults::default()
    });
    let id = emulator.create_vm("podvm-stopping", &[]);
    emulator.begin_deletion(&id, 1);
    let (gcp, _) = provider(&emulator).await;
    let answer = gcp.delete_instance(&id).await;
    assert!(
        matches!(
            answer,
            Ok(DeleteOutcome::NotYetVisible {
                setting: "GCP_NOT_FOUND_WINDOW_SECS",
                ..
            })
        ),
        "{answer:?}"
    );
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test]
async fn throttling_is_reported_with_the_clouds_wait_and_not_retried() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-throttled", &[]);
    let (gcp, calls) = provider(&emulator).await;
    emulator.throttle_next(1, 7);

    provider_checks::throttling_is_reported_with_the_clouds_wait(
        &emulator,
        &gcp,
        &id,
        Duration::from_secs(7),
    )
    .await;

    // The first call, the lookup of the instance's labels, was the one throttled.
    assert_eq!(calls.count(GCP, "GetInstance", "throttled"), 1);
    assert_eq!(emulator.requests(), 1);
    assert_eq!(deletes_sent(&emulator, &id), 0);
    // Once the cloud lets us, the same call succeeds.
    provider_checks::deleted(&emulator, &gcp, &id).await;
}

/// Compute Engine refuses a spent rate quota with 403 and a reason, not with 429: the reason
/// decides. A caller told to wait (RESOURCE_EXHAUSTED with RetryInfo over gRPC) and asking again
/// gets the instance deleted; nobody is sent to check IAM.
#[tokio::test]
async fn a_403_rate_limit_answer_is_throttling_and_the_delete_succeeds_once_the_cloud_lets_us() {
    // A spent API rate refuses any call (here the lookup before the DELETE); a spent operation
    // rate refuses deletions only (the DELETE after each lookup): how many DELETEs are sent.
    for (refusal, reason, deletes) in [
        (RateRefusal::RateLimitExceeded, "rateLimitExceeded", 1),
        (
            RateRefusal::ResourceOperationRateExceeded,
            "RESOURCE_OPERATION_RATE_EXCEEDED",
            3,
        ),
    ] {
        let emulator = emulator();
        let id = emulator.create_vm("podvm-rate-limited", &[]);
        let (gcp, calls) = provider(&emulator).await;
        emulator.refuse_rate_next(2, refusal);

        let mut throttled = 0;
        let outcome = loop {
            match gcp.delete_instance(&id).await {
                Ok(outcome) => break outcome,
                Err(Error::Throttled {
                    retry_after,
                    message,
                    ..
                }) => {
                    // No Retry-After from Compute Engine: the quota refills within the minute.
                    assert!(
                        (Duration::from_secs(1)..=Duration::from_secs(60)).contains(&retry_after),
                        "{reason}: {retry_after:?}"
                    );
                    assert!(message.contains(reason), "{message}");
                    assert!(message.contains("HTTP 403"), "{message}");
                    assert!(emulator.vm_or_parts_exist(&id));
                    throttled += 1;
                    assert!(
                        throttled <= 2,
                        "{reason}: throttled more often than refused"
                    );
                }
                Err(other) => panic!("{reason}: expected Throttled, got {other:?}"),
            }
        };

        assert_eq!(outcome, DeleteOutcome::Deleted, "{reason}");
        assert_eq!(throttled, 2, "{reason}");
        assert!(!emulator.vm_or_parts_exist(&id), "{reason}");
        // Throttled answers are counted as such and not repeated by the SDK.
        assert_eq!(
            calls.count(GCP, "GetInstance", "throttled")
                + calls.count(GCP, "DeleteInstance", "throttled"),
            2,
            "{reason}"
        );
        assert_eq!(deletes_sent(&emulator, &id), deletes, "{reason}");
    }
}

/// A deletion accepted, then refused when it ran because another operation held the instance
/// (DONE with RESOURCE_NOT_READY), is sent again as a new request and deletes the instance.
#[tokio::test]
async fn a_deletion_operation_that_ends_not_ready_is_sent_again_and_deletes() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-held", &[]);
    let (gcp, calls) = provider(&emulator).await;
    emulator.fail_next_operations(1, OperationFailure::ResourceNotReady);

    assert_eq!(
        gcp.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );

    assert!(!emulator.vm_or_parts_exist(&id));
    assert_eq!(deletes_sent(&emulator, &id), 2);
    assert_eq!(calls.count(GCP, "DeleteInstance", "ok"), 2);
}

/// An operation that ends with RESOURCE_OPERATION_RATE_EXCEEDED deleted nothing: throttling,
/// with the instance still there, and the next call deletes it.
#[tokio::test]
async fn a_deletion_operation_refused_for_its_rate_is_throttling() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-too-often", &[]);
    let (gcp, _calls) = provider(&emulator).await;
    emulator.fail_next_operations(1, OperationFailure::ResourceOperationRateExceeded);

    let error = gcp.delete_instance(&id).await.expect_err("throttled");

    assert!(matches!(error, Error::Throttled { .. }), "{error:?}");
    assert!(
        error
            .to_string()
            .contains("RESOURCE_OPERATION_RATE_EXCEEDED"),
        "{error}"
    );
    assert_eq!(emulator.instance_status(&id).as_deref(), Some("RUNNING"));
    assert_eq!(
        gcp.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test]
async fn server_errors_are_retried_by_the_sdk_then_succeed() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-flaky", &[]);
    let (gcp, calls) = provider(&emulator).await;
    emulator.fail_next(2, 503);

    assert_eq!(
        gcp.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );

    // The failures hit the lookup before the DELETE; the SDK retried it. The lookup's 404
    // after the DELETE confirmed it.
    assert_eq!(calls.count(GCP, "GetInstance", "error"), 3);
    assert_eq!(calls.count(GCP, "GetInstance", "ok"), 1);
    assert_eq!(deletes_sent(&emulator, &id), 1);
    assert_eq!(calls.count(GCP, "DeleteInstance", "ok"), 1);
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test]
async fn server_errors_that_persist_become_unavailable_after_bounded_attempts() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-down", &[]);
    let (gcp, calls) = provider(&emulator).await;
    emulator.fail_next(100, 500);

    let error = gcp.delete_instance(&id).await.expect_err("unavailable");

    assert_eq!(error.reason(), "CloudUnavailable", "{error}");
    assert!(error.to_string().contains("HTTP 500"), "{error}");
    // The lookup before the DELETE failed every bounded attempt: nothing was deleted.
    assert_eq!(calls.count(GCP, "GetInstance", "error"), 4);
    assert_eq!(deletes_sent(&emulator, &id), 0);
    assert!(emulator.vm_or_parts_exist(&id));
}

#[tokio::test]
async fn malformed_ids_are_invalid_arguments_without_any_request() {
    let emulator = emulator();
    let (gcp, calls) = provider(&emulator).await;
    let too_long = "a".repeat(64);
    provider_checks::malformed_ids_are_invalid_without_any_request(
        &emulator,
        &gcp,
        &[
            "",
            "Podvm-upper",
            "podvm_underscore",
            "../podvm",
            "projects/p/zones/z/instances/x",
            "-podvm",
            "podvm-",
            "1podvm",
            too_long.as_str(),
        ],
        // A CAA name is valid.
        "podvm-nginx-1a2b3c4d",
    )
    .await;
    assert_eq!(emulator.requests(), 0);
    assert_eq!(calls.count(GCP, "DeleteInstance", "error"), 0);
}

#[tokio::test]
async fn capacity_comes_from_the_regions_cpu_and_instance_quotas() {
    let emulator = emulator();
    for name in ["podvm-a", "podvm-b", "podvm-c"] {
        emulator.create_vm(name, &[]);
    }
    let (gcp, calls) = provider(&emulator).await;

    let capacity = gcp.capacity().await.expect("capacity");
    assert_eq!(
        capacity.instances,
        Figure {
            limit: Some(24),
            in_use: Some(3)
        }
    );
    assert_eq!(
        capacity.vcpus,
        Figure {
            limit: Some(24),
            in_use: Some(3 * u64::from(VCPUS_PER_VM))
        }
    );
    assert_eq!(
        capacity.memory_mib,
        Figure::default(),
        "GCP has no memory quota"
    );

    emulator.set_region_quota("CPUS", 96.0, 40.0);
    let capacity = gcp.capacity().await.expect("capacity");
    assert_eq!(
        capacity.vcpus,
        Figure {
            limit: Some(96),
            in_use: Some(40)
        }
    );
    assert_eq!(calls.count(GCP, "GetRegion", "ok"), 2);
}

#[tokio::test]
async fn list_returns_the_clusters_labelled_vms_across_pages_ordered_by_name() {
    let emulator = emulator();
    emulator.create_vm("podvm-blue-2", &[("cluster", "blue"), ("owner", "caa")]);
    emulator.create_vm("podvm-red-1", &[("cluster", "red"), ("owner", "caa")]);
    emulator.create_vm("podvm-blue-1", &[("cluster", "blue"), ("owner", "caa")]);
    emulator.create_vm("podvm-blue-3", &[("cluster", "blue")]);
    emulator.create_vm("unlabelled", &[]);
    emulator.set_page_size(1);
    let (gcp, calls) = provider(&emulator).await;

    let selector: TagSelector = [("cluster", "blue"), ("owner", "caa")]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
    let listed = gcp.list_instances(&selector).await.expect("list");

    let ids: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["podvm-blue-1", "podvm-blue-2"]);
    assert!(listed.iter().all(|i| i.created.is_some()));
    assert_eq!(listed[0].tags.get("owner").map(String::as_str), Some("caa"));
    // The label filter ran in the cloud: two matches, one per page.
    assert_eq!(calls.count(GCP, "ListInstances", "ok"), 2);

    let everything = gcp
        .list_instances(&TagSelector::new())
        .await
        .expect("list all");
    assert_eq!(everything.len(), 5);
    assert!(everything.windows(2).all(|w| w[0].id < w[1].id));
}

#[tokio::test]
async fn rejected_credentials_are_cloud_unauthenticated_and_never_shown() {
    let emulator = emulator();
    let id = emulator.create_vm("podvm-auth", &[]);
    let mut config = emulator.config();
    for (key, value) in &mut config {
        if key == "GCP_CREDENTIALS" {
            *value = GcpEmulator::wrong_credentials_json().to_owned();
        }
    }
    let secret_key: serde_json::Value =
        serde_json::from_str(GcpEmulator::wrong_credentials_json()).expect("key file");
    let private_key = secret_key["private_key"].as_str().expect("private key");
    let a_key_line = private_key.lines().nth(5).expect("a line of the key");
    let gcp = provider_with(config, CloudCalls::default()).await;

    provider_checks::refused_credentials_are_unauthenticated_and_never_shown(
        &emulator,
        &gcp,
        &id,
        &[a_key_line, "PRIVATE KEY"],
    )
    .await;

    // The right key works until the cloud revokes it.
    let (gcp, _) = provider(&emulator).await;
    assert!(gcp.health().await.healthy);
    emulator.reject_credentials(true);
    let error = gcp.capacity().await.expect_err("revoked");
    assert_eq!(error.reason(), "CloudUnauthenticated");
}

#[tokio::test]
async fn a_missing_or_broken_key_is_a_config_error_naming_it_without_any_request() {
    let emulator = emulator();
    let without = |dropped: &str| -> Vec<(String, String)> {
        emulator
            .config()
            .into_iter()
            .filter(|(k, _)| k != dropped)
            .collect()
    };
    for key in ["GCP_PROJECT_ID", "GCP_ZONE"] {
        let error = GcpProvider::from_config(
            &ProviderConfig::from_pairs(without(key)),
            CloudCalls::default(),
        )
        .await
        .expect_err(key);
        assert!(
            matches!(&error, Error::Config { key: named, .. } if named == key),
            "{error:?}"
        );
    }
    let mut broken = without("GCP_CREDENTIALS");
    broken.push((
        "GCP_CREDENTIALS".into(),
        "{\"private_key\": \"s3cr3t-not-json".into(),
    ));
    let error =
        GcpProvider::from_config(&ProviderConfig::from_pairs(broken), CloudCalls::default())
            .await
            .expect_err("broken credentials");
    assert!(
        matches!(&error, Error::Config { key, .. } if key == "GCP_CREDENTIALS"),
        "{error:?}"
    );
    assert!(!format!("{error} {error:?}").contains("s3cr3t"));

    // Building a valid provider calls nothing either.
    let (_gcp, _) = provider(&emulator).await;
    assert_eq!(emulator.requests(), 0);
}

#[tokio::test]
async fn a_request_timeout_that_is_not_a_positive_number_of_milliseconds_is_a_config_error() {
    let emulator = emulator();
    for value in ["0", "30s", "-1"] {
        let mut config = emulator.config();
        config.push(("GCP_REQUEST_TIMEOUT_MS".into(), value.into()));
        let error =
            GcpProvider::from_config(&ProviderConfig::from_pairs(config), CloudCalls::default())
                .await
                .expect_err(value);
        assert!(
            matches!(&error, Error::Config { key, .. } if key == "GCP_REQUEST_TIMEOUT_MS"),
            "{value}: {error:?}"
        );
    }
    let mut config = emulator.config();
    config.push(("GCP_REQUEST_TIMEOUT_MS".into(), "500".into()));
    GcpProvider::from_config(&ProviderConfig::from_pairs(config), CloudCalls::default())
        .await
        .expect("a timeout of 500 ms");
    assert_eq!(emulator.requests(), 0);
}

#[tokio::test]
async fn health_is_one_authenticated_region_read() {
    let emulator = emulator();
    let (gcp, calls) = provider(&emulator).await;
    let message = provider_checks::health_is_one_request(&emulator, &gcp).await;
    assert!(message.contains(PROJECT), "{message}");
    assert_eq!(emulator.requests(), 1);
    assert_eq!(calls.count(GCP, "GetRegion", "ok"), 1);
}

/// A spent rate quota (403 rateLimitExceeded) is reported as throttling, not as refused
/// credentials: health must not send operators to IAM.
#[tokio::test]
async fn health_under_a_rate_limit_says_throttled_not_credentials() {
    let emulator = emulator();
    let (gcp, calls) = provider(&emulator).await;
    emulator.refuse_rate_next(1, RateRefusal::RateLimitExceeded);

    let health = gcp.health().await;

    assert!(!health.healthy);
    assert!(health.message.contains("throttled"), "{}", health.message);
    assert!(
        !health.message.contains("credentials"),
        "{}",
        health.message
    );
    assert_eq!(calls.count(GCP, "GetRegion", "throttled"), 1);
    assert!(gcp.health().await.healthy, "once the quota refills");
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_cluster_tag_another_clusters_instance_is_refused_and_kept() {
    let emulator = GcpEmulator::start().expect("emulator");
    let mut config = emulator.config();
    config.push(("CLUSTER_TAG".into(), "peerpods-cluster=c1".into()));
    let guarded = provider_with(config, CloudCalls::default()).await;
    let ours = emulator.create_vm("podvm-ours", &[("peerpods-cluster", "c1")]);
    let theirs = emulator.create_vm("podvm-theirs", &[("peerpods-cluster", "c2")]);

    provider_checks::another_clusters_vm_is_refused_and_kept(
        &emulator,
        &guarded,
        &ours,
        &[&theirs],
    )
    .await;
    assert_eq!(deletes_sent(&emulator, &theirs), 0);
    assert!(matches!(
        guarded.delete_instance("podvm-never-existed").await,
        Ok(DeleteOutcome::NotYetVisible { .. })
    ));
}

/// An instance labelled `peerpods-do-not-delete` (the spelling GCP label keys allow) is refused
/// with `DoNotDelete` even when untagged deletes are allowed, and no DELETE is sent for it.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_labelled_do_not_delete_is_refused_and_kept() {
    let emulator = GcpEmulator::start().expect("emulator");
    let mut config = emulator.config();
    config.push(("CLUSTER_TAG".into(), "peerpods-cluster=c1".into()));
    config.push(("DELETE_UNTAGGED".into(), "allow".into()));
    let gcp = provider_with(config, CloudCalls::default()).await;

    let checked =
        provider_checks::a_vm_marked_do_not_delete_is_refused_and_kept(&emulator, &gcp).await;

    // A GCP instance id is its name: the refusal named `podvm-kept`.
    assert_eq!(checked.kept, "podvm-kept");
    assert_eq!(deletes_sent(&emulator, &checked.kept), 0);
    assert_eq!(deletes_sent(&emulator, &checked.unmarked), 1);
}
