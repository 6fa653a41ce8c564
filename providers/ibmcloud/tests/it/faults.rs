//! Both IBM Cloud backends, VPC and Power Virtual Server, against their emulator's fault layer
//! (`test_support::faults`): throttling, 5xx, hangs, slow answers and long deletions, and an instance the cloud
//! does not show yet, each classified as the caller needs it (see `test_support::fault_checks`). One suite,
//! instantiated per backend: the checks and their settings are the same for both.

/// The fault suite of one backend, by its emulator and provider types.
macro_rules! backend_suite {
    ($backend:ident, $emulator:ty, $provider:ty, $window_key:literal) => {
        mod $backend {
            use peerpods_provider_core::{CloudCalls, ProviderConfig};
            use test_support::cloud::CloudEmulator;
            use test_support::fault_checks::with;

            fn emulator() -> $emulator {
                <$emulator>::start().expect("emulator")
            }

            async fn provider(
                emulator: &$emulator,
                extra: &[(&str, &str)],
                calls: CloudCalls,
            ) -> $provider {
                let config = ProviderConfig::from_pairs(with(emulator.config(), extra));
                <$provider>::from_config(&config, calls).expect("provider")
            }

            test_support::fault_suite! {
                emulator: emulator,
                provider: provider,
                hang_config: &[("IBMCLOUD_API_TIMEOUT_SECONDS", "1")],
                /// EC2-style eventual consistency on this cloud: a 404 inside the backend's NotFound window
                /// (`IBMCLOUD_NOT_FOUND_WINDOW_SECS`, `POWERVS_NOT_FOUND_WINDOW_SECS`) of an instance this
                /// process never saw deleted is a wait (not yet visible), not gone.
                not_shown_yet: a_new_instance_the_cloud_does_not_show_yet_is_not_gone(&[($window_key, "2")]),
            }
        }
    };
}

backend_suite!(
    vpc,
    peerpods_emulator_ibmcloud::VpcEmulator,
    peerpods_provider_ibmcloud::IbmCloudVpcProvider,
    "IBMCLOUD_NOT_FOUND_WINDOW_SECS"
);
backend_suite!(
    powervs,
    peerpods_emulator_ibmcloud::PowerVsEmulator,
    peerpods_provider_ibmcloud::PowerVsProvider,
    "POWERVS_NOT_FOUND_WINDOW_SECS"
);
