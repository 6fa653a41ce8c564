//! The IBM Cloud VPC backend against the VPC emulator: the real IAM exchange, VPC and Global
//! Tagging calls, driven only through the `Provider` API.

use std::time::Duration;

use crate::ibm_support::{
    Backend, assert_config_error, assert_throttled_for, assert_unauthenticated_and_key_never_shown,
    config_without, selector, started,
};
use peerpods_emulator_ibmcloud::{API_KEY, IbmEmulator, VpcEmulator, examples};
use peerpods_provider_core::{
    CloudCalls, DeleteOutcome, Error, Provider, ProviderConfig, TagSelector,
};
use peerpods_provider_ibmcloud::IbmCloudVpcProvider;
use test_support::cloud::CloudEmulator;

const PROVIDER: &str = "ibmcloud";

fn start() -> VpcEmulator {
    VpcEmulator::started()
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_an_instance_removes_it_with_its_parts_and_keeps_a_reserved_floating_ip() {
    let (emulator, calls, provider) = started::<VpcEmulator>();
    let id = emulator.create_vm("podvm-nginx-1a2b3c4d", &[("coco-pod-vm", "c1")]);
    // An operator's reserved floating IP bound to the peer-pod VM: cloud-api-adaptor creates
    // none, so it is not the VM's.
    let floating_ip = emulator.attach_floating_ip(&id).expect("floating ip");
    assert_eq!(
        emulator.floating_ip_bound_to(&floating_ip).as_deref(),
        Some(id.as_str())
    );
    let other = emulator.create_vm("podvm-other-5e6f7a8b", &[("coco-pod-vm", "c1")]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(
        !emulator.vm_or_parts_exist(&id),
        "instance or a part survived"
    );
    // Still reserved, unbound by the instance's deletion, never released.
    assert!(emulator.floating_ip_exists(&floating_ip));
    assert_eq!(emulator.floating_ip_bound_to(&floating_ip), None);
    assert!(
        !emulator
            .request_log()
            .iter()
            .any(|line| line.contains("floating_ips")),
        "{:?}",
        emulator.request_log()
    );
    assert!(
        emulator.vm_or_parts_exist(&other),
        "another instance was touched"
    );
    assert_eq!(calls.count(PROVIDER, "GetIamToken", "ok"), 1);
    assert_eq!(calls.count(PROVIDER, "DeleteInstance", "ok"), 1);
    // One look before, two while `deleting`, the last one answered 404; its tags read before
    // the DELETE and once while `deleting`.
    assert_eq!(calls.count(PROVIDER, "GetInstance", "ok"), 3);
    assert_eq!(calls.count(PROVIDER, "GetInstance", "error"), 1);
    assert_eq!(calls.count(PROVIDER, "ListTags", "ok"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_that_is_gone_is_already_gone_every_time() {
    let (emulator, calls) =
        crate::ibm_support::an_instance_that_is_gone_is_already_gone::<VpcEmulator>(
            "0717_00000000-0000-4000-8000-000000000999",
            "IBMCLOUD_NOT_FOUND_WINDOW_SECS",
        )
        .await;
    assert_eq!(calls.count(PROVIDER, "DeleteInstance", "ok"), 1);
    assert_eq!(emulator.requests_to("DELETE /v1/instances/{id}"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_already_deleting_is_waited_for_not_deleted_again() {
    let (emulator, _, provider) = started::<VpcEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.set_deleting_polls(3);
    emulator.start_deleting(&id);
    assert_eq!(emulator.instance_status(&id).as_deref(), Some("deleting"));

    assert_eq!(
        provider.delete_instance(&id).await.expect("delete"),
        DeleteOutcome::Deleted
    );
    assert_eq!(emulator.requests_to("DELETE /v1/instances/{id}"), 0);
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_deletion_that_outlasts_the_wait_is_in_progress_until_confirmed_gone() {
    let (emulator, _) =
        crate::ibm_support::a_deletion_that_outlasts_the_wait_is_in_progress_until_confirmed_gone::<
            VpcEmulator,
        >()
        .await;
    // Followed, not repeated.
    assert_eq!(emulator.requests_to("DELETE /v1/instances/{id}"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_reported_with_the_clouds_wait() {
    let (emulator, calls, provider) = started::<VpcEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.throttle_next(1, 7);

    let error = provider.delete_instance(&id).await.expect_err("throttled");

    assert_throttled_for(&error, 7);
    assert!(error.to_string().contains("too_many_requests"), "{error}");
    assert_eq!(calls.count(PROVIDER, "GetInstance", "throttled"), 1);
    assert!(emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_until_the_cloud_answers() {
    let (emulator, calls, provider) = started::<VpcEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.fail_next(2);

    assert_eq!(
        provider.delete_instance(&id).await.expect("delete"),
        DeleteOutcome::Deleted
    );
    assert_eq!(calls.count(PROVIDER, "GetInstance", "error"), 2 + 1);
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cloud_that_keeps_failing_is_unavailable_after_bounded_retries() {
    let emulator = start();
    let provider =
        emulator.backend_with(&[("IBMCLOUD_API_MAX_RETRIES", "2")], &CloudCalls::default());
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.fail_next(100);

    let error = provider.delete_instance(&id).await.expect_err("down");

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert_eq!(emulator.requests_to("GET /v1/instances/{id}"), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_ids_are_invalid_without_any_request() {
    crate::ibm_support::malformed_ids_are_invalid_without_any_request::<VpcEmulator>(
        &[
            "",
            "i-0123456789abcdef0",
            "e21b7391-2ca2-4ab5-84a8-b92157a633b0",
            "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0/../../floating_ips",
            "0717_E21B7391-2CA2-4AB5-84A8-B92157A633B0",
        ],
        "0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_counts_the_regions_instances_and_leaves_limits_unknown() {
    let (emulator, _, provider) = started::<VpcEmulator>();
    emulator.create_vm_with_profile("podvm-a", &[], 2, 8);
    emulator.create_vm_with_profile("podvm-b", &[], 4, 16);

    let capacity = provider.capacity().await.expect("capacity");

    assert_eq!(capacity.instances.in_use, Some(2));
    assert_eq!(capacity.vcpus.in_use, Some(6));
    assert_eq!(capacity.memory_mib.in_use, Some(24 * 1024));
    assert_eq!(capacity.instances.limit, None);
    assert_eq!(capacity.vcpus.limit, None);
    assert_eq!(capacity.memory_mib.limit, None);
}

/// The route of Global Search's query, as the emulator counts it.
const SEARCH: &str = "POST /v3/resources/search";

/// How the old listing paid for tags: a Global Tagging call per instance.
const TAG_LIST: &str = "GET /v3/tags";

#[tokio::test(flavor = "multi_thread")]
async fn listing_by_tag_is_one_search_not_a_tagging_call_per_instance() {
    let (emulator, calls, provider) = started::<VpcEmulator>();
    let mut ours: Vec<String> = (0..102)
        .map(|n| {
            emulator.create_vm(
                &format!("podvm-{n}"),
                &[("coco-pod-vm", "c1"), ("env", "ci")],
            )
        })
        .collect();
    let theirs = emulator.create_vm("podvm-x", &[("coco-pod-vm", "c2"), ("env", "ci")]);
    ours.sort();

    let listed = provider
        .list_instances(&selector(&[("coco-pod-vm", "c1")]))
        .await
        .expect("list");

    let ids: Vec<String> = listed.iter().map(|i| i.id.clone()).collect();
    assert_eq!(ids, ours);
    assert!(!ids.contains(&theirs));
    assert!(listed.iter().all(|i| i.created.is_some()));
    assert_eq!(listed[0].tags.get("env").map(String::as_str), Some("ci"));
    // One page of results, then the empty page that ends the result set: 2 requests for 102
    // instances, where the listing by the VPC API and Global Tagging made 2 + 103.
    assert_eq!(emulator.requests_to(SEARCH), 2);
    assert_eq!(
        emulator.requests_to(TAG_LIST),
        0,
        "no tagging call per instance"
    );
    assert_eq!(emulator.requests_to("GET /v1/instances"), 0);
    // Counted through the same HTTP layer as every call, per attempt.
    assert_eq!(calls.count(PROVIDER, "SearchResources", "ok"), 2);
    assert_eq!(calls.attempts(PROVIDER, "SearchResources", "ok"), 2);

    let both = provider
        .list_instances(&selector(&[("env", "ci")]))
        .await
        .expect("list");
    assert_eq!(both.len(), 103);
    let none = provider
        .list_instances(&selector(&[("coco-pod-vm", "c3")]))
        .await
        .expect("list");
    assert!(none.is_empty());
    assert_eq!(
        emulator.requests_to(SEARCH),
        2 + 2 + 1,
        "an empty result is one request"
    );
    assert_eq!(emulator.requests_to(TAG_LIST), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_more_instances_than_a_page_follows_the_search_cursor() {
    let (emulator, _, provider) = started::<VpcEmulator>();
    let mut ours: Vec<String> = (0..1001)
        .map(|n| emulator.create_vm(&format!("podvm-{n}"), &[("coco-pod-vm", "c1")]))
        .collect();
    ours.sort();

    let listed = provider
        .list_instances(&selector(&[("coco-pod-vm", "c1")]))
        .await
        .expect("list");

    let ids: Vec<String> = listed.into_iter().map(|i| i.id).collect();
    assert_eq!(ids, ours, "every instance once, in id order");
    // 1000, then 1, then the empty page.
    let pages: Vec<String> = emulator
        .request_log()
        .into_iter()
        .filter(|line| line.starts_with(SEARCH))
        .collect();
    assert_eq!(pages.len(), 3, "{pages:?}");
    assert!(
        pages.iter().all(|p| p.ends_with("?limit=1000")),
        "{pages:?}"
    );
    assert_eq!(emulator.requests_to(TAG_LIST), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn another_regions_and_untagged_instances_are_not_listed() {
    let (emulator, _, provider) = started::<VpcEmulator>();
    let ours = emulator.create_vm("podvm-a", &[("coco-pod-vm", "c1")]);
    let untagged = emulator.create_vm("podvm-b", &[]);
    // Global Search is global: the same tag in another region's VPC is another deployment's.
    let elsewhere = emulator.create_vm_in_zone("podvm-c", &[("coco-pod-vm", "c1")], "eu-de-1");
    // A resource of another type in the region: an operator's floating IP.
    emulator.attach_floating_ip(&ours).expect("floating ip");

    let tagged = provider
        .list_instances(&selector(&[("coco-pod-vm", "c1")]))
        .await
        .expect("list");
    let ids: Vec<&str> = tagged.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, [ours.as_str()]);

    let every = provider
        .list_instances(&TagSelector::new())
        .await
        .expect("list");
    let mut expected = vec![ours.clone(), untagged.clone()];
    expected.sort();
    let ids: Vec<String> = every.iter().map(|i| i.id.clone()).collect();
    assert_eq!(
        ids, expected,
        "the region's instances only, not {elsewhere}"
    );
    assert!(every.iter().any(|i| i.id == untagged && i.tags.is_empty()));
}

/// Global Search is eventually consistent: an instance created moments ago is not listed yet.
/// peerpod-ctrl's scans absorb that with their grace periods (see the backend's `search`).
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_the_search_index_has_not_caught_up_with_is_listed_once_it_has() {
    let (emulator, _, provider) = started::<VpcEmulator>();
    emulator.set_search_lag(Duration::from_secs(3600));
    let id = emulator.create_vm("podvm-a", &[("coco-pod-vm", "c1")]);
    let mine = selector(&[("coco-pod-vm", "c1")]);

    assert!(
        provider
            .list_instances(&mine)
            .await
            .expect("list")
            .is_empty()
    );

    emulator.set_search_lag(Duration::ZERO);
    let listed = provider.list_instances(&mine).await.expect("list");
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, id);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_throttled_search_is_reported_as_throttling_with_the_clouds_wait() {
    let (emulator, calls, provider) = started::<VpcEmulator>();
    emulator.create_vm("podvm-a", &[("coco-pod-vm", "c1")]);
    emulator.throttle_next(1, 7);

    let error = provider
        .list_instances(&selector(&[("coco-pod-vm", "c1")]))
        .await
        .expect_err("throttled");

    assert_throttled_for(&error, 7);
    assert_eq!(calls.count(PROVIDER, "SearchResources", "throttled"), 1);
    assert_eq!(calls.attempts(PROVIDER, "SearchResources", "throttled"), 1);
    assert_eq!(
        emulator.requests_to(SEARCH),
        1,
        "throttling is not retried at once"
    );

    // A 5xx is retried like every call, and the listing then answers.
    emulator.fail_next(1);
    let listed = provider
        .list_instances(&selector(&[("coco-pod-vm", "c1")]))
        .await
        .expect("list after a 503");
    assert_eq!(listed.len(), 1);
    assert_eq!(
        calls.attempts(PROVIDER, "SearchResources", "server_error"),
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_without_a_region_is_a_configuration_error_without_any_request() {
    let emulator = start();
    let provider = IbmCloudVpcProvider::from_config(
        &config_without(&emulator, &["IBMCLOUD_ZONE"]),
        CloudCalls::default(),
    )
    .expect("a local endpoint names no region, deleting still works");

    let error = provider
        .list_instances(&TagSelector::new())
        .await
        .expect_err("no region");

    assert_config_error(&error, "IBMCLOUD_ZONE");
    assert_eq!(emulator.requests(), 0);
}

/// The `ListInstances` response example of IBM's VPC API definition, served verbatim as the
/// first page: capacity reads the instance and follows `next.href` to the second page.
#[tokio::test(flavor = "multi_thread")]
async fn the_reference_list_instances_example_is_read_and_its_next_page_followed() {
    let (emulator, _, provider) = started::<VpcEmulator>();
    emulator.answer_next_verbatim("GET /v1/instances", 200, examples::VPC_LIST_INSTANCES);

    let capacity = provider.capacity().await.expect("capacity");

    assert_eq!(capacity.instances.in_use, Some(1));
    assert_eq!(capacity.vcpus.in_use, Some(4));
    assert_eq!(capacity.memory_mib.in_use, Some(8 * 1024));
    let pages: Vec<String> = emulator
        .request_log()
        .into_iter()
        .filter(|line| line.starts_with("GET /v1/instances?"))
        .collect();
    assert_eq!(pages.len(), 2, "{pages:?}");
    assert!(
        pages[1].contains("start=9d5a91a3e2cbd233b5a5b33436855ed1"),
        "the second page starts where `next.href` says: {pages:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_api_key_is_unauthenticated_and_never_shown() {
    let (emulator, calls, provider) = started::<VpcEmulator>();
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.reject_api_key(true);

    let error = provider.delete_instance(&id).await.expect_err("refused");

    assert_unauthenticated_and_key_never_shown(&provider, &error).await;
    assert!(error.to_string().contains("BXNIM0415E"), "{error}");
    assert_eq!(calls.count(PROVIDER, "GetIamToken", "error"), 2);
    assert!(emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_is_exchanged_again_once() {
    let (emulator, calls, provider) = started::<VpcEmulator>();
    assert!(provider.health().await.healthy);
    emulator.revoke_tokens();

    let health = provider.health().await;

    assert!(health.healthy, "{}", health.message);
    assert_eq!(calls.count(PROVIDER, "GetIamToken", "ok"), 2);
    assert_eq!(calls.count(PROVIDER, "ListInstances", "error"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_callers_share_one_token_exchange() {
    let emulator = start();
    let calls = CloudCalls::default();
    let provider = std::sync::Arc::new(emulator.backend(&calls));
    let tasks: Vec<_> = (0..8)
        .map(|_| {
            let provider = std::sync::Arc::clone(&provider);
            tokio::spawn(async move { provider.health().await.healthy })
        })
        .collect();
    for task in tasks {
        assert!(task.await.expect("task"));
    }
    assert_eq!(emulator.requests_to("POST /identity/token"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_keys_are_named_and_nothing_is_called() {
    let emulator = start();
    let error = emulator.backend_without(&["IBMCLOUD_API_KEY"]);
    assert_config_error(&error, "IBMCLOUD_API_KEY");
    let error = emulator.backend_without(&["IBMCLOUD_VPC_ENDPOINT", "IBMCLOUD_ZONE"]);
    assert_config_error(&error, "IBMCLOUD_VPC_ENDPOINT");
    assert!(!error.to_string().contains(API_KEY));
    assert_eq!(emulator.requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_reports_a_cloud_that_answers() {
    let (_emulator, calls, provider) = started::<VpcEmulator>();
    let health = provider.health().await;
    assert!(health.healthy, "{}", health.message);
    assert!(!health.message.contains(API_KEY));
    assert_eq!(calls.count(PROVIDER, "ListInstances", "ok"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_trusted_profile_is_assumed_with_the_compute_resource_token() {
    let emulator = start();
    let profile = "Profile-9fd84246-7df4-4667-94e4-8cd2a72c1d95";
    let cr_token = "eyJhbGciOiJSUzI1NiJ9.projected-service-account-token.c2ln";
    emulator.trust_profile(profile, cr_token);
    let dir = tempfile::tempdir().expect("dir");
    let token_file = dir.path().join("vault-token");
    std::fs::write(&token_file, format!("{cr_token}\n")).expect("token file");
    let mut pairs = emulator.config();
    pairs.retain(|(k, _)| k != "IBMCLOUD_API_KEY");
    pairs.push(("IBMCLOUD_IAM_PROFILE_ID".into(), profile.into()));
    pairs.push((
        "IBMCLOUD_CR_TOKEN_FILENAME".into(),
        token_file.display().to_string(),
    ));
    let provider =
        IbmCloudVpcProvider::from_config(&ProviderConfig::from_pairs(pairs), CloudCalls::default())
            .expect("provider");
    let id = emulator.create_vm("podvm-a", &[]);

    assert_eq!(
        provider.delete_instance(&id).await.expect("delete"),
        DeleteOutcome::Deleted
    );

    std::fs::write(&token_file, "another-token").expect("rotated");
    emulator.revoke_tokens();
    let error = provider.capacity().await.expect_err("unknown token");
    assert!(
        matches!(error, Error::CloudUnauthenticated { .. }),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn with_a_cluster_tag_another_clusters_instance_is_refused_and_kept() {
    crate::ibm_support::another_clusters_instances_are_refused_and_kept::<VpcEmulator>(
        &[&[("coco-pod-vm", "c2")]],
        |emulator, _| assert_eq!(emulator.requests_to("DELETE /v1/instances/{id}"), 0),
    )
    .await;
}

/// An instance carrying the user tag `peerpods-do-not-delete:true` (the spelling IBM user tags
/// allow) is refused with `DoNotDelete` even when untagged deletes are allowed, and no DELETE
/// is sent for it; `peerpods-do-not-delete:false` does not protect.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_tagged_do_not_delete_is_refused_and_kept() {
    crate::ibm_support::an_instance_tagged_do_not_delete_is_refused_and_kept::<VpcEmulator>(
        |_, calls| assert_eq!(calls.count(PROVIDER, "DeleteInstance", "ok"), 0),
    )
    .await;
}
