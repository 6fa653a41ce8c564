//! The Azure backend against the emulator's fault layer (`test_support::faults`): throttling,
//! 5xx, hangs, slow answers and long deletions, and a VM ARM does not show yet, each classified
//! as the caller needs it (see `test_support::fault_checks`).

use peerpods_emulator_azure::AzureEmulator;
use peerpods_provider_azure::AzureProvider;
use peerpods_provider_core::{CloudCalls, ProviderConfig};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;

fn emulator() -> AzureEmulator {
    AzureEmulator::start()
}

async fn provider(
    emulator: &AzureEmulator,
    extra: &[(&str, &str)],
    calls: CloudCalls,
) -> AzureProvider {
    let config = ProviderConfig::from_pairs(with(emulator.config(), extra));
    AzureProvider::from_config(&config, calls).expect("provider")
}

test_support::fault_suite! {
    emulator: emulator,
    provider: provider,
    hang_config: &[("AZURE_REQUEST_TIMEOUT_MS", "500")],
    /// EC2-style eventual consistency: ARM answers 404 for a VM created moments ago. Inside
    /// AZURE_NOT_FOUND_WINDOW_SECS such a 404 (of a VM this process never saw deleted) is a wait
    /// (NotYetVisible) and no part is looked for by name, and the VM is deleted once ARM shows it.
    not_shown_yet: a_new_vm_the_cloud_does_not_show_yet_is_not_gone(&[("AZURE_NOT_FOUND_WINDOW_SECS", "2")]),
}
