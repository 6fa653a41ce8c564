//! The deletion engine's rules as ECS meets them, through the backend's real signed client
//! against the emulator: what ECS answers right after `RunInstances` (an empty
//! `DescribeInstances`, a `DeleteInstance` refused for a starting instance or answered NotFound)
//! is never taken for "gone", and what one confirmed delete costs.

use std::time::Duration;

use peerpods_emulator_alibabacloud::{AlibabaCloudEmulator, EcsRefusal, examples};
use peerpods_provider_alibabacloud::AlibabaCloudProvider;
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Provider, ProviderConfig};
use serde_json::{Value, json};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;
use test_support::faults::{CallKind, Faults, Visibility};

const WINDOW_KEY: &str = "ALIBABACLOUD_NOT_FOUND_WINDOW_SECS";

fn provider(emulator: &AlibabaCloudEmulator, extra: &[(&str, &str)]) -> AlibabaCloudProvider {
    let mut keys = vec![("ALIBABACLOUD_POLL_INTERVAL_MS", "50")];
    keys.extend_from_slice(extra);
    let config = ProviderConfig::from_pairs(with(emulator.config(), &keys));
    AlibabaCloudProvider::from_config(&config, CloudCalls::default()).expect("provider")
}

/// The reference's `DescribeInstances` example listing `instances` only (each `(id, status)`,
/// no tag, its primary NIC only, created this minute: new instances), on one page.
fn describe_answer(instances: &[(&str, &str)]) -> String {
    let mut answer: Value = serde_json::from_str(examples::DESCRIBE_INSTANCES).expect("example");
    let template = answer["Instances"]["Instance"][0].clone();
    let listed: Vec<Value> = instances
        .iter()
        .map(|(id, status)| {
            let mut item = template.clone();
            item["InstanceId"] = json!(id);
            item["Status"] = json!(status);
            item["CreationTime"] = json!(
                jiff::Timestamp::now()
                    .strftime("%Y-%m-%dT%H:%MZ")
                    .to_string()
            );
            item["Tags"] = json!({"Tag": []});
            item["NetworkInterfaces"] = json!({"NetworkInterface": [
                {"Type": "Primary", "NetworkInterfaceId": "eni-2zeprimary000001"}
            ]});
            item
        })
        .collect();
    answer["Instances"] = json!({"Instance": listed});
    answer["TotalCount"] = json!(instances.len());
    answer["NextToken"] = json!("");
    answer.to_string()
}

/// ECS's documented answers right after `RunInstances`: `DescribeInstances` lists the instance
/// `Starting`, `DeleteInstance` refuses it (`IncorrectInstanceStatus`), and the next
/// `DescribeInstances` comes back empty. That empty list is the cloud's lag, not the instance's
/// end: the delete is held (not yet visible, naming the window's key), the instance is still
/// there, and once ECS lists it again a delete ends with it gone.
#[tokio::test]
async fn a_starting_instance_with_an_empty_describe_is_held_not_deleted() {
    let emulator = AlibabaCloudEmulator::start();
    let provider = provider(&emulator, &[]);
    let id = emulator.create_instance("pod-starting", &[], false);
    emulator.answer_next_verbatim("DescribeInstances", &describe_answer(&[(&id, "Starting")]));
    emulator.answer_next_verbatim("DescribeInstances", &describe_answer(&[]));
    emulator.refuse_next_of("DeleteInstance", 1, EcsRefusal::IncorrectInstanceStatus);

    let answer = provider.delete_instance(&id).await;

    assert!(
        matches!(&answer, Ok(DeleteOutcome::NotYetVisible { setting, .. }) if *setting == WINDOW_KEY),
        "{answer:?}"
    );
    assert!(emulator.instance_exists(&id), "the instance was lost");
    assert_eq!(emulator.requests_of("DeleteInstance"), 1);
    assert_eq!(emulator.requests_of("DescribeInstances"), 2);

    // ECS lists it again (`Running`): deleted, and confirmed gone.
    assert_eq!(
        provider.delete_instance(&id).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
}

/// `DescribeInstances` lists the instance, and `DeleteInstance` answers
/// `InvalidInstanceId.NotFound` (the delete path does not know the new instance yet: the fault
/// layer hides it from deletes only, for its first second). That NotFound proves nothing: the
/// backend looks again, asks again once ECS knows it, and answers Deleted once it is gone, never
/// `AlreadyGone` while it exists.
#[tokio::test]
async fn a_not_found_delete_right_after_a_listing_is_not_already_gone() {
    let emulator = AlibabaCloudEmulator::start();
    emulator.set_faults(Faults {
        invisible: Visibility::only(&[CallKind::Delete], Duration::from_secs(1)),
        ..Faults::default()
    });
    // The instance is new: its NotFound after the delete is believed once the window (short
    // here) has passed since it was first shown.
    let provider = provider(
        &emulator,
        &[("ALIBABACLOUD_POLL_INTERVAL_MS", "200"), (WINDOW_KEY, "1")],
    );
    let id = emulator.create_instance("pod-new", &[], false);

    let answer = provider.delete_instance(&id).await;

    assert_eq!(answer.expect("deleted"), DeleteOutcome::Deleted);
    assert!(
        emulator.injected().not_found >= 1,
        "no DeleteInstance was answered NotFound"
    );
    assert!(emulator.requests_of("DeleteInstance") >= 2);
    assert!(!emulator.vm_or_parts_exist(&id));
}

/// The same NotFound, and ECS still not listing the instance on the lookup after it (the
/// instance is new): not gone, a wait; the instance is still there.
#[tokio::test]
async fn a_not_found_delete_then_an_empty_describe_is_held() {
    let emulator = AlibabaCloudEmulator::start();
    emulator.set_faults(Faults {
        invisible: Visibility::only(&[CallKind::Delete], Duration::from_secs(3600)),
        ..Faults::default()
    });
    let provider = provider(&emulator, &[]);
    let id = emulator.create_instance("pod-new", &[], false);
    emulator.answer_next_verbatim("DescribeInstances", &describe_answer(&[(&id, "Pending")]));
    emulator.answer_next_verbatim("DescribeInstances", &describe_answer(&[]));

    let answer = provider.delete_instance(&id).await;

    assert!(
        matches!(&answer, Ok(DeleteOutcome::NotYetVisible { setting, .. }) if *setting == WINDOW_KEY),
        "{answer:?}"
    );
    assert!(emulator.instance_exists(&id));
    assert_eq!(emulator.requests_of("DeleteInstance"), 1);
}

/// What one confirmed delete costs in ECS and VPC requests, counted at the emulator (ECS
/// releases the instance after one more listing): an instance with cloud-api-adaptor's add-on
/// NIC and EIP, and one without.
#[tokio::test]
async fn one_confirmed_delete_costs_these_requests() {
    let emulator = AlibabaCloudEmulator::start();
    let provider = provider(&emulator, &[]);
    let with_eip = emulator.create_vm("pod-eip", &[]);
    let plain = emulator.create_instance("pod-plain", &[], false);

    let before = emulator.requests();
    assert_eq!(
        provider.delete_instance(&with_eip).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    let eip_cost = emulator.requests() - before;
    let by_action: Vec<(&str, usize)> = [
        "DescribeInstances",
        "DeleteInstance",
        "DescribeEipAddresses",
        "TagResources",
        "UnassociateEipAddress",
        "ReleaseEipAddress",
    ]
    .into_iter()
    .map(|action| (action, emulator.requests_of(action)))
    .collect();
    assert_eq!(
        by_action,
        [
            // Listed, listed `Stopping` after the accepted delete, not listed.
            ("DescribeInstances", 3),
            ("DeleteInstance", 1),
            // Marked ones and those bound to the add-on NIC while listed; marked ones once it
            // is gone; the released one looked up.
            ("DescribeEipAddresses", 4),
            ("TagResources", 1),
            ("UnassociateEipAddress", 0),
            ("ReleaseEipAddress", 1),
        ]
    );
    assert_eq!(eip_cost, 10);

    let before = emulator.requests();
    assert_eq!(
        provider.delete_instance(&plain).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    // Listed, deleted, listed `Stopping`, not listed: no VPC call.
    assert_eq!(emulator.requests() - before, 4);
}
