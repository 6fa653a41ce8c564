//! The IBM Cloud Power Virtual Server backend against the emulator's fault layer (`test_support::faults`): throttling,
//! 5xx, hangs, slow answers and long deletions, and an instance the cloud does not show yet, each
//! classified as the caller needs it (see `test_support::fault_checks`).

use peerpods_emulator_ibmcloud::PowerVsEmulator;
use peerpods_provider_core::{CloudCalls, ProviderConfig};
use peerpods_provider_ibmcloud::PowerVsProvider;
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::{self, with};

fn emulator() -> PowerVsEmulator {
    PowerVsEmulator::start().expect("emulator")
}

async fn provider(emulator: &PowerVsEmulator, extra: &[(&str, &str)]) -> PowerVsProvider {
    let config = ProviderConfig::from_pairs(with(emulator.config(), extra));
    PowerVsProvider::from_config(&config, CloudCalls::default()).expect("provider")
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
    let provider = provider(&emulator, &[("IBMCLOUD_API_TIMEOUT_SECONDS", "1")]).await;
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

/// EC2-style eventual consistency on this cloud: a 404 inside POWERVS_NOT_FOUND_WINDOW_SECS of an instance this
/// process never saw deleted is retryable, not gone.
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
