//! The Power Virtual Server backend against the PowerVS emulator: the real IAM exchange, Power
//! Cloud API and Global Tagging calls, driven only through the `Provider` API.

use std::time::Duration;

use peerpods_emulator_ibmcloud::{API_KEY, IbmEmulator, PowerVsEmulator};
use peerpods_provider_core::{
    CloudCalls, DeleteOutcome, Error, Figure, Provider, ProviderConfig, TagSelector,
};
use peerpods_provider_ibmcloud::PowerVsProvider;
use test_support::cloud::CloudEmulator;

const PROVIDER: &str = "ibmcloud-powervs";

fn start() -> PowerVsEmulator {
    PowerVsEmulator::start().expect("emulator")
}

fn provider(emulator: &PowerVsEmulator, calls: &CloudCalls) -> PowerVsProvider {
    PowerVsProvider::from_config(
        &ProviderConfig::from_pairs(emulator.config()),
        calls.clone(),
    )
    .expect("provider")
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_an_instance_waits_until_it_and_its_parts_are_gone() {
    let emulator = start();
    let calls = CloudCalls::default();
    let provider = provider(&emulator, &calls);
    let id = emulator.create_vm("podvm-nginx-1a2b3c4d", &[]);
    let other = emulator.create_vm("podvm-other-5e6f7a8b", &[]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(!emulator.vm_or_parts_exist(&id));
    assert!(emulator.vm_or_parts_exist(&other));
    assert_eq!(calls.count(PROVIDER, "GetIamToken", "ok"), 1);
    assert_eq!(calls.count(PROVIDER, "DeletePvmInstance", "ok"), 1);
    // Listed twice more after the DELETE, then 404.
    assert_eq!(calls.count(PROVIDER, "GetPvmInstance", "ok"), 2);
    assert_eq!(calls.count(PROVIDER, "GetPvmInstance", "error"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_that_is_gone_is_already_gone() {
    let emulator = start();
    let provider = provider(&emulator, &CloudCalls::default());
    let id = emulator.create_vm("podvm-a", &[]);
    assert_eq!(
        provider.delete_instance(&id).await.expect("first"),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        provider.delete_instance(&id).await.expect("second"),
        DeleteOutcome::AlreadyGone
    );
    assert_eq!(
        provider
            .delete_instance("00000000-0000-4000-8000-000000000999")
            .await
            .expect("unknown"),
        DeleteOutcome::AlreadyGone
    );
}

/// The Power Cloud API reference lists 410 Gone for deleting a PVM instance: gone is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_deletion_answered_gone_is_already_gone() {
    let emulator = start();
    let calls = CloudCalls::default();
    let provider = provider(&emulator, &calls);
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.answer_gone(&id);

    assert_eq!(
        provider.delete_instance(&id).await.expect("gone"),
        DeleteOutcome::AlreadyGone
    );
    assert_eq!(emulator.requests_to("DELETE pvm-instances/{id}"), 1);
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_mid_deletion_is_deleted_idempotently() {
    let emulator = start();
    let provider = provider(&emulator, &CloudCalls::default());
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.start_deleting(&id);
    assert!(emulator.is_deleting(&id));

    assert_eq!(
        provider.delete_instance(&id).await.expect("delete"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_reported_with_the_clouds_wait() {
    let emulator = start();
    let calls = CloudCalls::default();
    let provider = provider(&emulator, &calls);
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.throttle_next(1, 11);

    let error = provider.delete_instance(&id).await.expect_err("throttled");

    assert!(
        matches!(error, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(11)),
        "{error:?}"
    );
    assert_eq!(calls.count(PROVIDER, "DeletePvmInstance", "throttled"), 1);
    assert!(emulator.vm_or_parts_exist(&id));
    assert!(!emulator.is_deleting(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_until_the_cloud_answers() {
    let emulator = start();
    let calls = CloudCalls::default();
    let provider = provider(&emulator, &calls);
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.fail_next(3);

    assert_eq!(
        provider.delete_instance(&id).await.expect("delete"),
        DeleteOutcome::Deleted
    );
    assert_eq!(calls.count(PROVIDER, "DeletePvmInstance", "error"), 3);
    assert_eq!(calls.count(PROVIDER, "DeletePvmInstance", "ok"), 1);
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_ids_are_invalid_without_any_request() {
    let emulator = start();
    let provider = provider(&emulator, &CloudCalls::default());
    for id in [
        "",
        "podvm-nginx-1a2b3c4d",
        "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0",
        "2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4a/../..",
    ] {
        let error = provider.delete_instance(id).await.expect_err(id);
        assert!(
            matches!(
                error,
                Error::InvalidArgument {
                    field: "instance_id",
                    ..
                }
            ),
            "{error:?}"
        );
    }
    assert_eq!(emulator.requests(), 0);
    assert!(
        provider
            .validate_instance_id("2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4a")
            .is_ok()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_comes_from_the_workspace_limits_and_usage() {
    let emulator = start();
    let provider = provider(&emulator, &CloudCalls::default());
    emulator.create_vm_sized("podvm-a", &[], 0.5, 2.0);
    emulator.create_vm_sized("podvm-b", &[], 1.0, 4.0);

    let capacity = provider.capacity().await.expect("capacity");

    assert_eq!(
        capacity.instances,
        Figure {
            limit: Some(50),
            in_use: Some(2)
        }
    );
    assert_eq!(
        capacity.vcpus,
        Figure {
            limit: Some(100),
            in_use: Some(2)
        }
    );
    assert_eq!(
        capacity.memory_mib,
        Figure {
            limit: Some(800 * 1024),
            in_use: Some(6 * 1024)
        }
    );

    emulator.set_limits(None);
    let capacity = provider.capacity().await.expect("capacity");
    assert_eq!(capacity.instances.limit, None, "unknown, not guessed");
    assert_eq!(capacity.instances.in_use, Some(2));
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_filters_by_tag_and_orders_by_id() {
    let emulator = start();
    let calls = CloudCalls::default();
    let provider = provider(&emulator, &calls);
    let mut ours = [
        emulator.create_vm("podvm-a", &[("coco-pod-vm", "c1")]),
        emulator.create_vm("podvm-b", &[("coco-pod-vm", "c1")]),
    ];
    ours.sort();
    let theirs = emulator.create_vm("podvm-c", &[("coco-pod-vm", "c2")]);
    let untagged = emulator.create_vm("podvm-d", &[]);

    let selector: TagSelector = [("coco-pod-vm".to_owned(), "c1".to_owned())].into();
    let listed = provider.list_instances(&selector).await.expect("list");

    let ids: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ours.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(listed.iter().all(|i| i.created.is_some()));

    let all = provider
        .list_instances(&TagSelector::new())
        .await
        .expect("list");
    let ids: Vec<&str> = all.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids.len(), 4);
    assert!(ids.contains(&theirs.as_str()) && ids.contains(&untagged.as_str()));
    assert!(ids.windows(2).all(|w| w[0] < w[1]));
    // Tags are read only when the selector needs them: 4 for the first list, none after.
    assert_eq!(calls.count(PROVIDER, "ListTags", "ok"), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_api_key_is_unauthenticated_and_never_shown() {
    let emulator = start();
    let provider = provider(&emulator, &CloudCalls::default());
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.reject_api_key(true);

    let error = provider.delete_instance(&id).await.expect_err("refused");

    assert!(
        matches!(error, Error::CloudUnauthenticated { .. }),
        "{error:?}"
    );
    assert!(!error.to_string().contains(API_KEY), "{error}");
    assert!(!format!("{error:?}").contains(API_KEY), "{error:?}");
    let health = provider.health().await;
    assert!(!health.healthy);
    assert!(!health.message.contains(API_KEY), "{}", health.message);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_keys_are_named_and_nothing_is_called() {
    let emulator = start();
    for missing in [
        "POWERVS_ZONE",
        "POWERVS_SERVICE_INSTANCE_ID",
        "IBMCLOUD_API_KEY",
    ] {
        let mut pairs = emulator.config();
        pairs.retain(|(k, _)| k != missing);
        let error =
            PowerVsProvider::from_config(&ProviderConfig::from_pairs(pairs), CloudCalls::default())
                .err()
                .expect(missing);
        assert!(
            matches!(error, Error::Config { ref key, .. } if key == missing),
            "{error:?}"
        );
    }
    assert_eq!(emulator.requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_reports_the_workspace() {
    let emulator = start();
    let calls = CloudCalls::default();
    let provider = provider(&emulator, &calls);
    let health = provider.health().await;
    assert!(health.healthy, "{}", health.message);
    assert_eq!(calls.count(PROVIDER, "GetCloudInstance", "ok"), 1);
}
