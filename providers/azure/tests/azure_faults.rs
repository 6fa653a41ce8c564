//! The Azure backend against the emulator's fault layer (`test_support::faults`): throttling,
//! 5xx, hangs, slow answers and long deletions, and a VM ARM does not show yet, each classified
//! as the caller needs it (see `test_support::fault_checks`).

use peerpods_emulator_azure::AzureEmulator;
use peerpods_provider_azure::AzureProvider;
use peerpods_provider_core::{CloudCalls, ProviderConfig};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::{self, with};

fn provider(emulator: &AzureEmulator, extra: &[(&str, &str)]) -> AzureProvider {
    let config = ProviderConfig::from_pairs(with(emulator.config(), extra));
    AzureProvider::from_config(&config, CloudCalls::default()).expect("provider")
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_retryable() {
    let emulator = AzureEmulator::start();
    let azure = provider(&emulator, &[]);
    fault_checks::throttling_is_retryable(&emulator, &azure, "podvm-throttled").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_then_unavailable() {
    let emulator = AzureEmulator::start();
    let azure = provider(&emulator, &[]);
    fault_checks::server_errors_are_retried_then_unavailable(&emulator, &azure, "podvm-5xx").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hang_ends_at_the_deadline_as_unavailable() {
    let emulator = AzureEmulator::start();
    let azure = provider(&emulator, &[("AZURE_REQUEST_TIMEOUT_MS", "500")]);
    fault_checks::a_hang_ends_at_the_deadline_as_unavailable(&emulator, &azure, "podvm-hang").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_answers_and_long_operations_complete() {
    let emulator = AzureEmulator::start();
    let azure = provider(&emulator, &[]);
    fault_checks::slow_answers_and_long_operations_complete(&emulator, &azure, "podvm-slow").await;
}

/// EC2-style eventual consistency: ARM answers 404 for a VM created moments ago. Inside
/// AZURE_NOT_FOUND_WINDOW_SECS such a 404 (of a VM this process never saw deleted) is retryable
/// and no part is looked for by name, and the VM is deleted once ARM shows it.
#[tokio::test(flavor = "multi_thread")]
async fn a_new_vm_the_cloud_does_not_show_yet_is_not_gone() {
    let emulator = AzureEmulator::start();
    let azure = provider(&emulator, &[("AZURE_DELETE_TIMEOUT_SECONDS", "3")]);
    fault_checks::a_new_vm_the_cloud_does_not_show_yet_is_not_gone(&emulator, &azure, "podvm-new")
        .await;
}
