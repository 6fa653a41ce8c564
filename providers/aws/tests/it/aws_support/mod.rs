//! The shared moto harness (`peerpods-test-support`), with configurations as the AWS backend's
//! [`ProviderConfig`].

use peerpods_provider_core::ProviderConfig;
pub use test_support::moto::{
    Moto, SECRET_ACCESS_KEY, SERIAL, closed_port, moto, moto_with_env, run_instances, state_of,
    unknown_id,
};

/// How long a deletion waits before looking again, in these tests: moto terminates an instance
/// at once, so the default pace (2 s) would only slow the tests down.
pub const DELETE_POLL: (&str, &str) = ("AWS_DELETE_POLL_MS", "50");

/// The AWS provider's configuration against `endpoint`, with [`DELETE_POLL`], plus `extra`.
pub fn config_for(endpoint: &str, extra: &[(&str, &str)]) -> ProviderConfig {
    let mut pairs = vec![DELETE_POLL];
    pairs.extend_from_slice(extra);
    ProviderConfig::from_pairs(test_support::moto::config_for(endpoint, &pairs))
}

/// The AWS provider's configuration against this binary's moto server, plus `extra`.
pub fn moto_config(extra: &[(&str, &str)]) -> ProviderConfig {
    config_for(&moto().endpoint, extra)
}
