//! The shared moto harness (`peerpods-test-support`), with configurations as the AWS backend's
//! [`ProviderConfig`].

use peerpods_provider_core::ProviderConfig;
pub use test_support::moto::{
    SECRET_ACCESS_KEY, SERIAL, closed_port, moto, moto_with_env, run_instances, state_of,
    unknown_id,
};

/// The AWS provider's configuration against `endpoint`, plus `extra`.
pub fn config_for(endpoint: &str, extra: &[(&str, &str)]) -> ProviderConfig {
    ProviderConfig::from_pairs(test_support::moto::config_for(endpoint, extra))
}

/// The AWS provider's configuration against this binary's moto server, plus `extra`.
pub fn moto_config(extra: &[(&str, &str)]) -> ProviderConfig {
    config_for(&moto().endpoint, extra)
}
