//! The Alibaba Cloud backend through its public `Provider` API, against the local ECS/VPC
//! emulator (which verifies every request's V3 signature).

use std::time::Duration;

use peerpods_emulator_alibabacloud::{
    ACCESS_KEY_SECRET, AlibabaCloudEmulator, DEFAULT_MAX_VCPUS, EcsRefusal, examples,
};
use peerpods_provider_alibabacloud::{AlibabaCloudProvider, NAME};
use peerpods_provider_core::{
    CloudCalls, DeleteOutcome, Error, Figure, Provider, ProviderConfig, TagSelector,
};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;
use test_support::provider_checks;

/// The emulator's configuration with `extra` keys added or replaced.
fn config(emulator: &AlibabaCloudEmulator, extra: &[(&str, &str)]) -> ProviderConfig {
    ProviderConfig::from_pairs(with(emulator.config(), extra))
}

fn provider(
    emulator: &AlibabaCloudEmulator,
    extra: &[(&str, &str)],
) -> (AlibabaCloudProvider, CloudCalls) {
    let calls = CloudCalls::default();
    let provider = AlibabaCloudProvider::from_config(&config(emulator, extra), calls.clone())
        .expect("provider");
    (provider, calls)
}

fn selector(pairs: &[(&str, &str)]) -> TagSelector {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[tokio::test]
async fn deleting_an_instance_releases_its_eip_and_waits_until_it_is_gone() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[]);
    let id = emulator.create_vm("pod-a", &[("cluster", "c1")]);
    let eip = emulator.eip_of(&id).expect("the VM has an EIP");
    let other = emulator.create_vm("pod-b", &[("cluster", "c1")]);
    emulator.set_release_polls(2);

    let outcome = provider.delete_instance(&id).await.expect("deleted");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(
        !emulator.vm_or_parts_exist(&id),
        "instance, NICs or EIP left"
    );
    assert!(!emulator.eip_exists(&eip));
    assert!(emulator.vm_or_parts_exist(&other), "another VM was touched");
    for operation in ["TagResources", "ReleaseEipAddress", "DeleteInstance"] {
        assert_eq!(calls.count(NAME, operation, "ok"), 1, "{operation}");
    }
    // The release of the instance took its add-on NIC and so unbound the EIP: nothing to unbind.
    assert_eq!(calls.count(NAME, "UnassociateEipAddress", "ok"), 0);
    // Found once, then polled until ECS no longer listed it (two more answers list it).
    assert!(calls.count(NAME, "DescribeInstances", "ok") >= 4);
    assert_eq!(calls.count(NAME, "DeleteInstance", "error"), 0);

    // Idempotent: the second deletion finds nothing and deletes nothing.
    let before = emulator.requests_of("DeleteInstance");
    provider_checks::already_gone(&emulator, &provider, &id).await;
    assert_eq!(emulator.requests_of("DeleteInstance"), before);
}

#[tokio::test]
async fn every_eip_of_a_multi_eip_nic_is_released_across_pages() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[]);
    let id = emulator.create_vm("pod-many", &[]);
    let mut eips = vec![emulator.eip_of(&id).expect("EIP")];
    // More than the 10 a `DescribeEipAddresses` page holds by default.
    eips.extend((0..11).map(|_| emulator.add_eip(&id).expect("EIP")));

    assert_eq!(
        provider.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    for eip in &eips {
        assert!(!emulator.eip_exists(eip), "{eip} leaked");
    }
    assert!(!emulator.vm_or_parts_exist(&id));
}

/// The `DescribeInstances` and `DescribeAccountAttributes` response examples of the ECS API
/// reference, served verbatim: read as they are, and the example's `NextToken` followed.
#[tokio::test]
async fn the_reference_examples_are_read_and_the_next_token_followed() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[]);
    emulator.answer_next_verbatim("DescribeInstances", examples::DESCRIBE_INSTANCES);

    let listed = provider
        .list_instances(&TagSelector::new())
        .await
        .expect("listed");

    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, "i-bp67acfmxazb4p****");
    assert_eq!(
        listed[0].tags.get("TestKey").map(String::as_str),
        Some("TestValue")
    );
    assert_eq!(
        listed[0].created,
        Some("2017-12-10T04:05:00Z".parse().expect("time")),
        "ECS writes `CreationTime` to the minute (04:04): the latest it may be is the minute's end"
    );
    let pages = emulator.params_of("DescribeInstances");
    assert_eq!(pages.len(), 2, "{pages:?}");
    assert!(
        pages[1]
            .iter()
            .any(|(k, v)| k == "NextToken" && v == "caeba0bbb2be03f84eb48b699f0a4883"),
        "{pages:?}"
    );

    emulator.answer_next_verbatim("DescribeInstances", examples::DESCRIBE_INSTANCES);
    emulator.answer_next_verbatim(
        "DescribeAccountAttributes",
        examples::DESCRIBE_ACCOUNT_ATTRIBUTES,
    );
    let capacity = provider.capacity().await.expect("capacity");
    // The example reports `max-security-groups` only: no vCPU quota is known.
    assert_eq!(capacity.vcpus, Figure::default());
    assert_eq!(
        capacity.memory_mib,
        Figure {
            limit: None,
            in_use: Some(16384)
        }
    );
    assert_eq!(capacity.instances.in_use, Some(1));
}

#[tokio::test]
async fn an_instance_without_eip_is_deleted_without_vpc_calls() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[]);
    let id = emulator.create_instance("pod-plain", &[], false);

    assert_eq!(
        provider.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
    assert_eq!(emulator.requests_of("DescribeEipAddresses"), 0);
}

/// ECS is eventually consistent after `RunInstances`: an id it does not list, never seen
/// deleted by this process, is not believed gone inside the window; the answer is retryable.
#[tokio::test]
async fn an_unknown_instance_is_not_gone_inside_the_window() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _calls) = provider(&emulator, &[]);

    provider_checks::an_unknown_vm_is_not_gone_inside_the_not_found_window(
        &emulator,
        &provider,
        "i-2zeunknown0000001",
        "ALIBABACLOUD_NOT_FOUND_WINDOW_SECS",
    )
    .await;

    assert_eq!(emulator.requests_of("DeleteInstance"), 0);
}

#[tokio::test]
async fn an_unknown_instance_is_already_gone() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[("ALIBABACLOUD_NOT_FOUND_WINDOW_SECS", "0")]);

    provider_checks::already_gone(&emulator, &provider, "i-2zeunknown0000001").await;

    assert_eq!(emulator.requests_of("DeleteInstance"), 0);
    assert_eq!(calls.count(NAME, "DescribeInstances", "ok"), 1);
}

#[tokio::test]
async fn an_instance_being_released_is_waited_for() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[]);
    let id = emulator.create_vm("pod-c", &[]);
    let eip = emulator.eip_of(&id).expect("EIP");
    emulator.begin_release(&id, 3);

    provider_checks::a_vm_the_cloud_is_deleting_is_deleted_once_gone(&emulator, &provider, &id)
        .await;

    assert!(!emulator.instance_exists(&id));
    assert!(!emulator.eip_exists(&eip), "the EIP leaked");
    // ECS listed it `Stopping` (being released): the backend waited the release out, asking
    // for no second one.
    assert_eq!(emulator.requests_of("DeleteInstance"), 0);
    assert!(calls.count(NAME, "DescribeInstances", "ok") >= 4);
}

/// A release ECS is still running when the wait bound passes is a wait (in progress), not a
/// failure: no Warning, no breaker count; the next call resumes.
#[tokio::test]
async fn a_release_that_never_finishes_is_in_progress_after_the_wait_bound() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[("ALIBABACLOUD_WAIT_TIMEOUT_MS", "100")]);
    let id = emulator.create_instance("pod-stuck", &[], false);
    emulator.begin_release(&id, 1_000_000);

    let answer = provider.delete_instance(&id).await.expect("in progress");

    assert_eq!(answer, DeleteOutcome::InProgress);
    assert!(emulator.instance_exists(&id));
}

/// A delete ECS still refuses for the instance's state when the wait bound passes is a
/// retryable failure naming what ECS said and the bound's key, and nothing was deleted.
#[tokio::test]
async fn a_refusal_still_standing_at_the_wait_bound_is_unavailable_naming_it() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[("ALIBABACLOUD_WAIT_TIMEOUT_MS", "100")]);
    let id = emulator.create_instance("pod-refused", &[], false);
    emulator.refuse_next_of("DeleteInstance", 1_000, EcsRefusal::IncorrectInstanceStatus);

    let error = provider.delete_instance(&id).await.expect_err("refused");

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    let text = error.to_string();
    assert!(
        text.contains("IncorrectInstanceStatus") && text.contains("ALIBABACLOUD_WAIT_TIMEOUT_MS"),
        "{text}"
    );
    assert!(emulator.instance_exists(&id));
}

#[tokio::test]
async fn throttling_reports_the_clouds_wait() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[]);
    let id = emulator.create_vm("pod-d", &[]);
    emulator.throttle_next(1, 7);

    provider_checks::throttling_is_reported_with_the_clouds_wait(
        &emulator,
        &provider,
        &id,
        Duration::from_secs(7),
    )
    .await;

    assert_eq!(calls.count(NAME, "DescribeInstances", "throttled"), 1);
    assert!(emulator.instance_exists(&id));
    // Throttling is the caller's to wait out: one request, no retry.
    assert_eq!(emulator.requests(), 1);

    provider_checks::deleted(&emulator, &provider, &id).await;
}

#[tokio::test]
async fn server_errors_are_retried_then_reported_unavailable() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[]);
    emulator.create_vm("pod-e", &[("cluster", "c1")]);
    emulator.fail_next(2, 503);

    let listed = provider
        .list_instances(&selector(&[("cluster", "c1")]))
        .await
        .expect("third attempt answers");

    assert_eq!(listed.len(), 1);
    assert_eq!(emulator.requests_of("DescribeInstances"), 3);
    assert_eq!(calls.count(NAME, "DescribeInstances", "error"), 2);
    assert_eq!(calls.count(NAME, "DescribeInstances", "ok"), 1);

    emulator.fail_next(10, 500);
    let error = provider
        .list_instances(&TagSelector::new())
        .await
        .expect_err("every attempt fails");
    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert_eq!(
        emulator.requests_of("DescribeInstances"),
        6,
        "3 attempts, then give up"
    );
}

#[tokio::test]
async fn malformed_ids_are_refused_without_any_request() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[]);

    provider_checks::malformed_ids_are_invalid_without_any_request(
        &emulator,
        &provider,
        &[
            "",
            "vm-1",
            "i-",
            "i-ABCDEFGH",
            "i-2ze****",
            "/subscriptions/x",
            "i-2zeabcdefgh 1",
        ],
        "i-2zeunknown0000001",
    )
    .await;
    assert_eq!(emulator.requests(), 0);
}

#[tokio::test]
async fn capacity_comes_from_account_attributes_and_the_clusters_instances() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[("TAGS", "cluster=c1")]);
    emulator.create_sized_instance("pod-f", &[("cluster", "c1")], 4, 8192);
    emulator.create_sized_instance("pod-g", &[("cluster", "c1")], 2, 4096);
    emulator.create_sized_instance("other", &[("cluster", "c2")], 8, 32768);

    let capacity = provider.capacity().await.expect("capacity");

    let max_vcpus: u64 = DEFAULT_MAX_VCPUS.parse().expect("number");
    assert_eq!(
        capacity.vcpus,
        Figure {
            limit: Some(max_vcpus),
            // The quota is the account's: every pay-as-you-go instance of the region counts.
            in_use: Some(14)
        }
    );
    assert_eq!(
        capacity.instances,
        Figure {
            limit: None,
            in_use: Some(2)
        }
    );
    assert_eq!(
        capacity.memory_mib,
        Figure {
            limit: None,
            in_use: Some(12288)
        }
    );
    assert_eq!(calls.count(NAME, "DescribeAccountAttributes", "ok"), 1);

    emulator.set_account_attribute("max-postpaid-instance-vcpu-count", None);
    emulator.set_account_attribute("used-postpaid-instance-vcpu-count", Some("30"));
    let capacity = provider.capacity().await.expect("capacity");
    assert_eq!(
        capacity.vcpus,
        Figure {
            limit: None,
            in_use: Some(30)
        }
    );
}

#[tokio::test]
async fn listing_by_tags_pages_and_excludes_other_clusters() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[]);
    emulator.set_page_limit(2);
    let mut ours: Vec<String> = (0..5)
        .map(|n| emulator.create_vm(&format!("pod-{n}"), &[("cluster", "c1"), ("team", "pods")]))
        .collect();
    emulator.create_vm("theirs-1", &[("cluster", "c2"), ("team", "pods")]);
    emulator.create_vm("untagged", &[]);
    ours.sort();

    let listed = provider
        .list_instances(&selector(&[("cluster", "c1"), ("team", "pods")]))
        .await
        .expect("listed");

    let ids: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ours.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(listed.iter().all(|i| i.created.is_some()));
    assert!(
        listed
            .iter()
            .all(|i| i.tags.get("cluster").map(String::as_str) == Some("c1"))
    );
    assert_eq!(
        emulator.requests_of("DescribeInstances"),
        3,
        "pages of 2, 2 and 1"
    );

    let everything = provider
        .list_instances(&TagSelector::new())
        .await
        .expect("all");
    assert_eq!(everything.len(), 7);
}

#[tokio::test]
async fn refused_credentials_are_unauthenticated_and_never_shown() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[]);
    let id = emulator.create_vm("pod-h", &[]);
    emulator.reject_credentials();

    let error = provider_checks::refused_credentials_are_unauthenticated_and_never_shown(
        &emulator,
        &provider,
        &id,
        &[ACCESS_KEY_SECRET],
    )
    .await;

    assert!(
        error.to_string().contains("SignatureDoesNotMatch"),
        "{error}"
    );
    assert!(emulator.instance_exists(&id));
    assert_eq!(
        calls.count(NAME, "DescribeInstances", "error"),
        1,
        "not retried"
    );

    let (unknown_key, _) = provider_with_key(&emulator, "LTAI5tNotAKnownKeyId0");
    let error = unknown_key
        .list_instances(&TagSelector::new())
        .await
        .expect_err("unknown key");
    assert!(
        matches!(error, Error::CloudUnauthenticated { .. }),
        "{error:?}"
    );
}

fn provider_with_key(
    emulator: &AlibabaCloudEmulator,
    key: &str,
) -> (AlibabaCloudProvider, CloudCalls) {
    provider(emulator, &[("ALIBABACLOUD_ACCESS_KEY_ID", key)])
}

#[tokio::test]
async fn health_is_one_authenticated_call() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, calls) = provider(&emulator, &[]);

    let message = provider_checks::health_is_one_request(&emulator, &provider).await;

    assert!(message.contains("cn-beijing"), "{message}");
    assert_eq!(emulator.requests(), 1);
    assert_eq!(calls.count(NAME, "DescribeAccountAttributes", "ok"), 1);
}

#[test]
fn configuration_problems_name_the_key_and_call_nothing() {
    let emulator = AlibabaCloudEmulator::start();
    let without_secret: Vec<(String, String)> = emulator
        .config()
        .into_iter()
        .filter(|(k, _)| k != "ALIBABACLOUD_ACCESS_KEY_SECRET")
        .collect();
    let error = AlibabaCloudProvider::from_config(
        &ProviderConfig::from_pairs(without_secret),
        CloudCalls::default(),
    )
    .expect_err("no secret");
    assert!(
        matches!(&error, Error::Config { key, .. } if key == "ALIBABACLOUD_ACCESS_KEY_SECRET"),
        "{error:?}"
    );

    for (key, value) in [
        ("ALIBABACLOUD_ECS_ENDPOINT", "ecs.internal:8080"),
        ("ALIBABACLOUD_VPC_ENDPOINT", "ftp://vpc.internal"),
        ("TAGS", "cluster"),
        ("ALIBABACLOUD_MAX_ATTEMPTS", "many"),
    ] {
        let error = AlibabaCloudProvider::from_config(
            &config(&emulator, &[(key, value)]),
            CloudCalls::default(),
        )
        .expect_err(key);
        assert!(
            matches!(&error, Error::Config { key: k, .. } if k == key),
            "{key}: {error:?}"
        );
        assert!(!error.to_string().contains(ACCESS_KEY_SECRET));
    }
    assert_eq!(
        emulator.requests(),
        0,
        "building a provider never calls the cloud"
    );
}

#[tokio::test]
async fn with_a_cluster_tag_another_clusters_instance_is_refused_and_kept() {
    let emulator = AlibabaCloudEmulator::start();
    let (guarded, _) = provider(&emulator, &[("CLUSTER_TAG", "cluster=c1")]);
    let ours = emulator.create_vm("pod-ours", &[("cluster", "c1")]);
    let theirs = emulator.create_vm("pod-theirs", &[("cluster", "c2")]);
    let untagged = emulator.create_vm("pod-untagged", &[]);

    provider_checks::another_clusters_vm_is_refused_and_kept(
        &emulator,
        &guarded,
        &ours,
        &[&theirs, &untagged],
    )
    .await;
    // No DeleteInstance was sent for the refused ones: the only one named ours.
    let deletes: Vec<String> = emulator
        .params_of("DeleteInstance")
        .iter()
        .filter_map(|params| params.iter().find(|(k, _)| k == "InstanceId"))
        .map(|(_, id)| id.clone())
        .collect();
    assert_eq!(deletes, [ours.as_str()]);

    // DELETE_UNTAGGED=allow turns the check off.
    let (open, _) = provider(
        &emulator,
        &[("CLUSTER_TAG", "cluster=c1"), ("DELETE_UNTAGGED", "allow")],
    );
    assert_eq!(
        open.delete_instance(&untagged).await.expect("allowed"),
        DeleteOutcome::Deleted
    );
}

/// An instance tagged `peerpods-do-not-delete` (the spelling ECS tag keys allow) is refused with
/// `DoNotDelete` even when untagged deletes are allowed, and no `DeleteInstance` is sent for it;
/// `false` does not protect.
#[tokio::test]
async fn an_instance_tagged_do_not_delete_is_refused_and_kept() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(
        &emulator,
        &[("CLUSTER_TAG", "cluster=c1"), ("DELETE_UNTAGGED", "allow")],
    );

    let checked =
        provider_checks::a_vm_marked_do_not_delete_is_refused_and_kept(&emulator, &provider).await;

    assert!(emulator.instance_exists(&checked.kept));
    assert!(
        emulator
            .params_of("DeleteInstance")
            .iter()
            .all(|params| !params.iter().any(|(_, v)| *v == checked.kept)),
        "a DeleteInstance named the marked instance"
    );
}

/// The release mark `TagResources` puts on a VM's EIP while the VM is listed.
const RELEASE_MARK: &str = "peerpods.io/released-with";

/// A deletion whose `ReleaseEipAddress` failed after ECS released the instance: the instance is
/// gone, its EIP unbound (the add-on NIC went with it) and still allocated, linked to the instance
/// only by the mark put on it while the instance was listed.
async fn delete_failing_at_the_release(
    emulator: &AlibabaCloudEmulator,
    provider: &AlibabaCloudProvider,
    id: &str,
    eip: &str,
) {
    emulator.fail_next_of("ReleaseEipAddress", 1, 500);
    let first = provider.delete_instance(id).await;
    assert!(
        matches!(&first, Err(Error::Unavailable { .. })),
        "{first:?}"
    );
    assert!(!emulator.instance_exists(id));
    assert!(emulator.eip_exists(eip), "the failed release released it");
    assert!(!emulator.eip_bound(eip), "the EIP is still bound");
    assert_eq!(
        emulator.eip_tags(eip),
        Some(vec![(RELEASE_MARK.to_owned(), id.to_owned())]),
        "marked for its instance while the instance was listed"
    );
}

#[tokio::test]
async fn an_eip_whose_release_failed_is_found_by_its_mark_and_released_before_gone() {
    let emulator = AlibabaCloudEmulator::start();
    // One attempt per call, so the injected failure reaches the flow.
    let (provider, _) = provider(
        &emulator,
        &[
            ("ALIBABACLOUD_MAX_ATTEMPTS", "1"),
            ("ALIBABACLOUD_POLL_INTERVAL_MS", "50"),
        ],
    );
    let id = emulator.create_vm("pod-resume", &[]);
    let eip = emulator.eip_of(&id).expect("the VM has an EIP");
    delete_failing_at_the_release(&emulator, &provider, &id, &eip).await;

    // The instance is older than the window (seeded an hour old): ECS's absence is believed at once.
    let outcome = provider.delete_instance(&id).await.expect("gone");

    assert_eq!(outcome, DeleteOutcome::AlreadyGone);
    assert!(!emulator.eip_exists(&eip), "the unbound EIP leaked");
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test]
async fn a_marked_eip_of_an_instance_already_gone_is_released_before_gone() {
    let emulator = AlibabaCloudEmulator::start();
    let (first, _) = provider(
        &emulator,
        &[
            ("ALIBABACLOUD_MAX_ATTEMPTS", "1"),
            ("ALIBABACLOUD_POLL_INTERVAL_MS", "50"),
        ],
    );
    let id = emulator.create_vm("pod-gone", &[]);
    let eip = emulator.eip_of(&id).expect("the VM has an EIP");
    delete_failing_at_the_release(&emulator, &first, &id, &eip).await;
    // Another process (a restart) that never saw the instance: past the window, the mark
    // still finds its EIP.
    let (restarted, _) = provider(&emulator, &[("ALIBABACLOUD_NOT_FOUND_WINDOW_SECS", "0")]);

    let outcome = restarted.delete_instance(&id).await.expect("gone");

    assert_eq!(outcome, DeleteOutcome::AlreadyGone);
    assert!(!emulator.eip_exists(&eip), "the unbound EIP leaked");
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test]
async fn an_operators_eip_on_the_vms_nic_survives_the_deletion() {
    let emulator = AlibabaCloudEmulator::start();
    let (provider, _) = provider(&emulator, &[]);
    let id = emulator.create_vm("pod-shared", &[]);
    let caas = emulator.eip_of(&id).expect("the VM has an EIP");
    let operators = emulator
        .add_operator_eip(&id, "reserved egress address")
        .expect("an add-on NIC");

    assert_eq!(
        provider.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert!(
        !emulator.eip_exists(&caas),
        "cloud-api-adaptor's EIP leaked"
    );
    assert!(
        emulator.eip_exists(&operators),
        "the operator's EIP was released"
    );
    assert_eq!(
        emulator.eip_tags(&operators),
        Some(vec![]),
        "the operator's EIP was marked"
    );
    assert!(!emulator.vm_or_parts_exist(&id));
    // Not even the unbind: ECS unbinds it with the NIC; nothing of ours touched it.
    assert!(
        emulator
            .params_of("UnassociateEipAddress")
            .iter()
            .all(|params| !params.iter().any(|(_, v)| *v == operators)),
        "the operator's EIP was unbound by the backend"
    );
}
