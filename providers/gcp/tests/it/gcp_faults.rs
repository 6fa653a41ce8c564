//! The GCP backend against the emulator's fault layer (`test_support::faults`): throttling,
//! 5xx, hangs, slow answers and long deletions, and an instance the cloud does not show yet, each
//! classified as the caller needs it (see `test_support::fault_checks`). The hang check gives
//! each attempt 500 ms (`GCP_REQUEST_TIMEOUT_MS`); at the default 30 s the client's four attempts
//! would outlast the check's patience.

use peerpods_emulator_gcp::GcpEmulator;
use peerpods_provider_core::{CloudCalls, ProviderConfig};
use peerpods_provider_gcp::GcpProvider;
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;

fn emulator() -> GcpEmulator {
    GcpEmulator::start().expect("emulator")
}

async fn provider(
    emulator: &GcpEmulator,
    extra: &[(&str, &str)],
    calls: CloudCalls,
) -> GcpProvider {
    // A lookup every 20 ms while a deletion goes on (the default is 1 s).
    let config = with(emulator.config(), &[("GCP_DELETE_POLL_MS", "20")]);
    let config = ProviderConfig::from_pairs(with(config, extra));
    GcpProvider::from_config(&config, calls)
        .await
        .expect("provider")
}

test_support::fault_suite! {
    emulator: emulator,
    provider: provider,
    hang_config: &[("GCP_REQUEST_TIMEOUT_MS", "500")],
    /// EC2-style eventual consistency on this cloud: a 404 inside GCP_NOT_FOUND_WINDOW_SECS of an
    /// instance this process never saw deleted is a wait (not yet visible), not gone.
    not_shown_yet: a_new_instance_the_cloud_does_not_show_yet_is_not_gone(&[("GCP_NOT_FOUND_WINDOW_SECS", "2")]),
}
