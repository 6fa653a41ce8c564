//! The Alibaba Cloud backend against the emulator's fault layer (`test_support::faults`): throttling,
//! 5xx, hangs, slow answers and long deletions, and an instance the cloud does not show yet, each
//! classified as the caller needs it (see `test_support::fault_checks`).

use peerpods_emulator_alibabacloud::AlibabaCloudEmulator;
use peerpods_provider_alibabacloud::AlibabaCloudProvider;
use peerpods_provider_core::{CloudCalls, Provider, ProviderConfig};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;

fn emulator() -> AlibabaCloudEmulator {
    AlibabaCloudEmulator::start()
}

async fn provider(
    emulator: &AlibabaCloudEmulator,
    extra: &[(&str, &str)],
    calls: CloudCalls,
) -> AlibabaCloudProvider {
    let config = ProviderConfig::from_pairs(with(emulator.config(), extra));
    AlibabaCloudProvider::from_config(&config, calls).expect("provider")
}

test_support::fault_suite! {
    emulator: emulator,
    provider: provider,
    hang_config: &[("ALIBABACLOUD_REQUEST_TIMEOUT_MS", "500")],
    /// ECS's documented eventual consistency: an instance `DescribeInstances` does not list yet,
    /// inside ALIBABACLOUD_NOT_FOUND_WINDOW_SECS, is retryable, not gone.
    not_shown_yet: a_new_instance_the_cloud_does_not_show_yet_is_not_gone(&[("ALIBABACLOUD_NOT_FOUND_WINDOW_SECS", "2")]),
}

/// ECS accepted the deletion but still lists the instance when the wait bound ends (a slow
/// release): that is not "deleted", it is in progress, and a later call that sees the instance
/// gone answers it.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_release_still_listed_at_the_bound_is_in_progress_not_deleted() {
    let emulator = emulator();
    let provider = provider(
        &emulator,
        &[("ALIBABACLOUD_WAIT_TIMEOUT_MS", "100")],
        CloudCalls::default(),
    )
    .await;
    let id = emulator.create_vm("podvm-slow-release", &[]);
    emulator.set_release_polls(1_000_000);

    let answer = provider.delete_instance(&id).await;

    assert!(
        matches!(
            answer,
            Ok(peerpods_provider_core::DeleteOutcome::InProgress)
        ),
        "{answer:?}"
    );
    assert!(emulator.vm_or_parts_exist(&id));
}
