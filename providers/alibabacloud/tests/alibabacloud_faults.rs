//! The Alibaba Cloud backend against the emulator's fault layer (`test_support::faults`): throttling,
//! 5xx, hangs, slow answers and long deletions, and an instance the cloud does not show yet, each
//! classified as the caller needs it (see `test_support::fault_checks`).

use peerpods_emulator_alibabacloud::AlibabaCloudEmulator;
use peerpods_provider_alibabacloud::AlibabaCloudProvider;
use peerpods_provider_core::{CloudCalls, Provider, ProviderConfig};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::{self, with};

fn emulator() -> AlibabaCloudEmulator {
    AlibabaCloudEmulator::start()
}

async fn provider(emulator: &AlibabaCloudEmulator, extra: &[(&str, &str)]) -> AlibabaCloudProvider {
    let config = ProviderConfig::from_pairs(with(emulator.config(), extra));
    AlibabaCloudProvider::from_config(&config, CloudCalls::default()).expect("provider")
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_retryable() {
    let emulator = emulator();
    let provider = provider(&emulator, &[]).await;
    fault_checks::throttling_is_retryable(&emulator, &provider, "podvm-throttled").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_then_unavailable() {
    let emulator = emulator();
    let provider = provider(&emulator, &[]).await;
    fault_checks::server_errors_are_retried_then_unavailable(&emulator, &provider, "podvm-5xx")
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hang_ends_at_the_deadline_as_unavailable() {
    let emulator = emulator();
    let provider = provider(&emulator, &[("ALIBABACLOUD_REQUEST_TIMEOUT_MS", "500")]).await;
    fault_checks::a_hang_ends_at_the_deadline_as_unavailable(&emulator, &provider, "podvm-hang")
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_answers_and_long_operations_complete() {
    let emulator = emulator();
    let provider = provider(&emulator, &[]).await;
    fault_checks::slow_answers_and_long_operations_complete(&emulator, &provider, "podvm-slow")
        .await;
}

/// ECS's documented eventual consistency: an instance `DescribeInstances` does not list yet,
/// inside ALIBABACLOUD_NOT_FOUND_WINDOW_SECS, is retryable, not gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_instance_the_cloud_does_not_show_yet_is_not_gone() {
    let emulator = emulator();
    let provider = provider(&emulator, &[]).await;
    fault_checks::a_new_vm_the_cloud_does_not_show_yet_is_not_gone(
        &emulator,
        &provider,
        "podvm-new",
    )
    .await;
}

/// ECS accepted the deletion but still lists the instance when the wait bound ends (a slow
/// release, or lookups lost to the faults): that is not "deleted", it is retryable, and a later
/// call that sees the instance gone answers it.
#[tokio::test(flavor = "multi_thread")]
async fn an_accepted_release_still_listed_at_the_bound_is_unavailable_not_deleted() {
    let emulator = emulator();
    let provider = provider(&emulator, &[("ALIBABACLOUD_WAIT_TIMEOUT_MS", "100")]).await;
    let id = emulator.create_vm("podvm-slow-release", &[]);
    emulator.set_release_polls(1_000_000);

    let answer = provider.delete_instance(&id).await;

    assert!(
        matches!(
            answer,
            Err(peerpods_provider_core::Error::Unavailable { .. })
        ),
        "{answer:?}"
    );
    assert!(emulator.vm_or_parts_exist(&id));
}
