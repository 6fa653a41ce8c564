//! The Power Virtual Server backend against the PowerVS emulator: the real IAM exchange, Power
//! Cloud API and Global Tagging calls, driven only through the `Provider` API.

use crate::ibm_support::{
    Backend, assert_config_error, assert_deleted, assert_throttled_for,
    assert_unauthenticated_and_key_never_shown, selector, started,
};
use peerpods_emulator_ibmcloud::{IbmEmulator, PowerVsEmulator};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Figure, Provider, TagSelector};
use test_support::cloud::CloudEmulator;

const PROVIDER: &str = "ibmcloud-powervs";

fn start() -> PowerVsEmulator {
    PowerVsEmulator::started()
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_an_instance_waits_until_it_and_its_parts_are_gone() {
    let (emulator, calls, provider) = started::<PowerVsEmulator>();
    let id = emulator.create_vm("podvm-nginx-1a2b3c4d", &[]);
    let other = emulator.create_vm("podvm-other-5e6f7a8b", &[]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(!emulator.vm_or_parts_exist(&id));
    assert!(emulator.vm_or_parts_exist(&other));
    assert_eq!(calls.count(PROVIDER, "GetIamToken", "ok"), 1);
    assert_eq!(calls.count(PROVIDER, "DeletePvmInstance", "ok"), 1);
    // Read with its tags before the DELETE (the owner and do-not-delete check), twice more
    // `DELETING` after it (its tags read once more, for the first of them), then 404.
    assert_eq!(calls.count(PROVIDER, "ListTags", "ok"), 2);
    assert_eq!(calls.count(PROVIDER, "GetPvmInstance", "ok"), 3);
    assert_eq!(calls.count(PROVIDER, "GetPvmInstance", "error"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_that_is_gone_is_already_gone() {
    crate::ibm_support::an_instance_that_is_gone_is_already_gone::<PowerVsEmulator>(
        "00000000-0000-4000-8000-000000000999",
        "POWERVS_NOT_FOUND_WINDOW_SECS",
    )
    .await;
}

/// The Power Cloud API reference lists 410 Gone for a PVM instance: a lookup answering it says
/// the instance was deleted (no DELETE is sent). A DELETE answered 410 right after a lookup found
/// the instance proves nothing by itself: the delete looks again, finds it, asks again, and
/// answers only once a lookup no longer finds it.
#[tokio::test(flavor = "multi_thread")]
async fn a_deletion_answered_gone_is_believed_only_from_a_lookup() {
    let (emulator, _, provider) = started::<PowerVsEmulator>();
    let looked_up_gone = emulator.create_vm("podvm-a", &[]);
    emulator.answer_gone(&looked_up_gone);

    // The lookup's 404 of an instance this process never saw deleted waits out the window
    // (POWERVS_NOT_FOUND_WINDOW_SECS): not yet visible; with the window at zero it is gone at
    // once.
    assert!(matches!(
        provider.delete_instance(&looked_up_gone).await,
        Ok(DeleteOutcome::NotYetVisible {
            setting: "POWERVS_NOT_FOUND_WINDOW_SECS",
            ..
        })
    ));
    let trusting = emulator.backend_with(
        &[("POWERVS_NOT_FOUND_WINDOW_SECS", "0")],
        &CloudCalls::default(),
    );
    assert_eq!(
        trusting
            .delete_instance(&looked_up_gone)
            .await
            .expect("gone"),
        DeleteOutcome::AlreadyGone
    );
    assert_eq!(emulator.requests_to("DELETE pvm-instances/{id}"), 0);

    let still_there = emulator.create_vm("podvm-b", &[]);
    emulator.answer_next_verbatim(
        "DELETE pvm-instances/{id}",
        410,
        r#"{"code":410,"description":"pvm-instance has been deleted","error":"Gone","message":"pvm-instance has been deleted"}"#,
    );
    assert_deleted(&emulator, &provider, &still_there).await;
    assert_eq!(emulator.requests_to("DELETE pvm-instances/{id}"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_mid_deletion_is_deleted_idempotently() {
    let (emulator, _, provider) = started::<PowerVsEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.start_deleting(&id);
    assert!(emulator.is_deleting(&id));

    assert_deleted(&emulator, &provider, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_reported_with_the_clouds_wait() {
    let (emulator, calls, provider) = started::<PowerVsEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.throttle_next(1, 11);

    let error = provider.delete_instance(&id).await.expect_err("throttled");

    assert_throttled_for(&error, 11);
    // The first call, the lookup before the DELETE, was the one throttled.
    assert_eq!(calls.count(PROVIDER, "GetPvmInstance", "throttled"), 1);
    assert_eq!(emulator.requests_to("DELETE pvm-instances/{id}"), 0);
    assert!(emulator.vm_or_parts_exist(&id));
    assert!(!emulator.is_deleting(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_until_the_cloud_answers() {
    let (emulator, calls, provider) = started::<PowerVsEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.fail_next(3);

    assert_eq!(
        provider.delete_instance(&id).await.expect("delete"),
        DeleteOutcome::Deleted
    );
    // The failures hit the lookup before the DELETE, retried until it answered: three 503s,
    // then (after the DELETE) the 404 that confirms the instance gone.
    assert_eq!(calls.count(PROVIDER, "GetPvmInstance", "error"), 4);
    assert_eq!(calls.count(PROVIDER, "DeletePvmInstance", "ok"), 1);
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_ids_are_invalid_without_any_request() {
    crate::ibm_support::malformed_ids_are_invalid_without_any_request::<PowerVsEmulator>(
        &[
            "",
            "podvm-nginx-1a2b3c4d",
            "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0",
            "2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4a/../..",
        ],
        "2f9d7c66-0c1e-4b7e-9e38-5c2a8f1d3b4a",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_comes_from_the_workspace_limits_and_usage() {
    let (emulator, _, provider) = started::<PowerVsEmulator>();
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
    let (emulator, calls, provider) = started::<PowerVsEmulator>();
    let mut ours = [
        emulator.create_vm("podvm-a", &[("coco-pod-vm", "c1")]),
        emulator.create_vm("podvm-b", &[("coco-pod-vm", "c1")]),
    ];
    ours.sort();
    let theirs = emulator.create_vm("podvm-c", &[("coco-pod-vm", "c2")]);
    let untagged = emulator.create_vm("podvm-d", &[]);

    let listed = provider
        .list_instances(&selector(&[("coco-pod-vm", "c1")]))
        .await
        .expect("list");

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
    let (emulator, _, provider) = started::<PowerVsEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.reject_api_key(true);

    let error = provider.delete_instance(&id).await.expect_err("refused");

    assert_unauthenticated_and_key_never_shown(&provider, &error).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_keys_are_named_and_nothing_is_called() {
    let emulator = start();
    for missing in [
        "POWERVS_ZONE",
        "POWERVS_SERVICE_INSTANCE_ID",
        "IBMCLOUD_API_KEY",
    ] {
        assert_config_error(&emulator.backend_without(&[missing]), missing);
    }
    assert_eq!(emulator.requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_reports_the_workspace() {
    let (_emulator, calls, provider) = started::<PowerVsEmulator>();
    let health = provider.health().await;
    assert!(health.healthy, "{}", health.message);
    assert_eq!(calls.count(PROVIDER, "GetCloudInstance", "ok"), 1);
}

/// With `CLUSTER_TAG`, an instance of another cluster (or one without the tag) is refused with
/// `NotOwnedByCluster` and kept: no DELETE is sent for it. This cluster's is deleted.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_cluster_tag_another_clusters_instance_is_refused_and_kept() {
    crate::ibm_support::another_clusters_instances_are_refused_and_kept::<PowerVsEmulator>(
        &[&[("coco-pod-vm", "c2")], &[]],
        |emulator, _| assert_eq!(emulator.requests_to("DELETE pvm-instances/{id}"), 0),
    )
    .await;
}

/// An instance carrying the user tag `peerpods-do-not-delete:true` (the spelling IBM user tags
/// allow) is refused with `DoNotDelete` even when untagged deletes are allowed, and kept;
/// `peerpods-do-not-delete:false` does not protect.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_tagged_do_not_delete_is_refused_and_kept() {
    crate::ibm_support::an_instance_tagged_do_not_delete_is_refused_and_kept::<PowerVsEmulator>(
        |emulator, _| assert_eq!(emulator.requests_to("DELETE pvm-instances/{id}"), 0),
    )
    .await;
}

/// A deletion still running when the wait's bound passes is not "deleted" (the finalizer would be
/// released on an inference): a retryable error, and asked again, the deletion is followed until
/// a lookup answers that the instance is gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_deletion_that_outlasts_the_wait_is_in_progress_until_confirmed_gone() {
    crate::ibm_support::a_deletion_that_outlasts_the_wait_is_in_progress_until_confirmed_gone::<
        PowerVsEmulator,
    >()
    .await;
}
