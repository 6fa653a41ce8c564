//! The Azure emulator with configurations as the Azure backend's [`ProviderConfig`].

use peerpods_emulator_azure::AzureEmulator;
use peerpods_provider_azure::AzureProvider;
use peerpods_provider_core::{CloudCalls, ProviderConfig};
use test_support::cloud::CloudEmulator;

/// The backend's configuration against `emulator`, with `extra` keys added or replaced (an
/// empty value removes a key).
pub fn config(emulator: &AzureEmulator, extra: &[(&str, &str)]) -> ProviderConfig {
    let mut pairs = emulator.config();
    for (key, value) in extra {
        pairs.retain(|(k, _)| k != key);
        if !value.is_empty() {
            pairs.push(((*key).to_owned(), (*value).to_owned()));
        }
    }
    ProviderConfig::from_pairs(pairs)
}

/// A provider against `emulator`, and the call counts it records.
pub fn provider(emulator: &AzureEmulator, extra: &[(&str, &str)]) -> (AzureProvider, CloudCalls) {
    let calls = CloudCalls::default();
    let provider =
        AzureProvider::from_config(&config(emulator, extra), calls.clone()).expect("provider");
    (provider, calls)
}

/// The instance id of a VM of `emulator`'s resource group that does not exist.
pub fn unknown_id(name: &str) -> String {
    format!(
        "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}",
        peerpods_emulator_azure::SUBSCRIPTION_ID,
        peerpods_emulator_azure::RESOURCE_GROUP
    )
}
