//! What the tests of both IBM Cloud backends share: each backend against its emulator
//! ([`Backend`]), configurations with keys set or left out, and the checks every test of a
//! refusal makes.
#![allow(dead_code)] // each test binary uses a different part of this module

use peerpods_emulator_ibmcloud::{API_KEY, IbmEmulator, PowerVsEmulator, VpcEmulator};
use peerpods_provider_core::{
    CloudCalls, DeleteOutcome, Error, Provider, ProviderConfig, TagSelector,
};
use peerpods_provider_ibmcloud::{IbmCloudVpcProvider, PowerVsProvider};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;

/// An IBM Cloud backend and the emulator it is tested against.
pub trait Backend: CloudEmulator + IbmEmulator + Sized {
    type Provider: Provider;

    /// A new emulator.
    fn started() -> Self;

    /// The backend built from `config`, as provider-service builds it.
    fn provider_from(config: &ProviderConfig, calls: CloudCalls) -> Result<Self::Provider, Error>;

    /// The backend against this emulator, counting its calls in `calls`.
    fn backend(&self, calls: &CloudCalls) -> Self::Provider {
        self.backend_with(&[], calls)
    }

    /// The backend against this emulator with `extra` settings (each replaces the emulator's
    /// value of its key, if any).
    fn backend_with(&self, extra: &[(&str, &str)], calls: &CloudCalls) -> Self::Provider {
        Self::provider_from(&config(self, extra), calls.clone()).expect("provider")
    }

    /// Building the backend without the `missing` keys of this emulator's configuration: its
    /// error.
    fn backend_without(&self, missing: &[&str]) -> Error {
        Self::provider_from(&config_without(self, missing), CloudCalls::default())
            .err()
            .expect("a missing key is an error")
    }
}

impl Backend for VpcEmulator {
    type Provider = IbmCloudVpcProvider;

    fn started() -> Self {
        VpcEmulator::start().expect("emulator")
    }

    fn provider_from(config: &ProviderConfig, calls: CloudCalls) -> Result<Self::Provider, Error> {
        IbmCloudVpcProvider::from_config(config, calls)
    }
}

impl Backend for PowerVsEmulator {
    type Provider = PowerVsProvider;

    fn started() -> Self {
        PowerVsEmulator::start().expect("emulator")
    }

    fn provider_from(config: &ProviderConfig, calls: CloudCalls) -> Result<Self::Provider, Error> {
        PowerVsProvider::from_config(config, calls)
    }
}

/// The emulator's configuration with `extra` set.
pub fn config(emulator: &impl CloudEmulator, extra: &[(&str, &str)]) -> ProviderConfig {
    ProviderConfig::from_pairs(with(emulator.config(), extra))
}

/// The emulator's configuration without the `missing` keys.
pub fn config_without(emulator: &impl CloudEmulator, missing: &[&str]) -> ProviderConfig {
    let mut pairs = emulator.config();
    pairs.retain(|(k, _)| !missing.contains(&k.as_str()));
    ProviderConfig::from_pairs(pairs)
}

/// A tag selector of `pairs`.
pub fn selector(pairs: &[(&str, &str)]) -> TagSelector {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// `error` refuses an instance id (the `instance_id` field).
pub fn assert_invalid_instance_id(error: &Error) {
    assert!(
        matches!(
            error,
            Error::InvalidArgument {
                field: "instance_id",
                ..
            }
        ),
        "{error:?}"
    );
}

/// `error` names the missing configuration key `key`.
pub fn assert_config_error(error: &Error, key: &str) {
    assert!(
        matches!(error, Error::Config { key: named, .. } if named == key),
        "{error:?}"
    );
}

/// Deleting `id` is refused with `reason`, naming it, and the instance and its parts are kept.
pub async fn assert_delete_refused_and_kept(
    emulator: &impl CloudEmulator,
    provider: &impl Provider,
    id: &str,
    reason: &str,
) {
    let refused = provider.delete_instance(id).await.expect_err(reason);
    assert_eq!(refused.reason(), reason, "{refused}");
    assert!(refused.to_string().contains(id), "{refused}");
    assert!(emulator.vm_or_parts_exist(id), "{id} must not be touched");
}

/// Deleting `id` answers `Deleted` and the instance and its parts are gone.
pub async fn assert_deleted(emulator: &impl CloudEmulator, provider: &impl Provider, id: &str) {
    assert_eq!(
        provider.delete_instance(id).await.expect("delete"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(id), "{id} or a part survived");
}

/// A refused API key: `error` is `CloudUnauthenticated`, and neither it nor the health the
/// backend reports (unhealthy) shows the key.
pub async fn assert_unauthenticated_and_key_never_shown(provider: &impl Provider, error: &Error) {
    assert!(
        matches!(error, Error::CloudUnauthenticated { .. }),
        "{error:?}"
    );
    assert!(!error.to_string().contains(API_KEY), "{error}");
    assert!(!format!("{error:?}").contains(API_KEY), "{error:?}");
    let health = provider.health().await;
    assert!(!health.healthy);
    assert!(!health.message.contains(API_KEY), "{}", health.message);
}
