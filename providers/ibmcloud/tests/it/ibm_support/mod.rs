//! What the tests of both IBM Cloud backends share: each backend against its emulator
//! ([`Backend`]), configurations with keys set or left out, and the checks every test of a
//! refusal makes.

use std::time::Duration;

use peerpods_emulator_ibmcloud::{API_KEY, IbmEmulator, PowerVsEmulator, VpcEmulator};
use peerpods_provider_core::{
    CloudCalls, DO_NOT_DELETE_PORTABLE_TAG, DeleteOutcome, Error, Provider, ProviderConfig,
    TagSelector,
};
use peerpods_provider_ibmcloud::{IbmCloudVpcProvider, PowerVsProvider};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;

/// An IBM Cloud backend and the emulator it is tested against.
pub trait Backend: CloudEmulator + IbmEmulator + Sized {
    type Provider: Provider;

    /// A new emulator.
    fn started() -> Self;

    /// Whether the instance's deletion was accepted and it still shows.
    fn deletion_in_progress(&self, id: &str) -> bool;

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

    fn deletion_in_progress(&self, id: &str) -> bool {
        self.instance_status(id).as_deref() == Some("deleting")
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

    fn deletion_in_progress(&self, id: &str) -> bool {
        self.is_deleting(id)
    }

    fn provider_from(config: &ProviderConfig, calls: CloudCalls) -> Result<Self::Provider, Error> {
        PowerVsProvider::from_config(config, calls)
    }
}

/// A new emulator, a call counter, and the backend against the emulator counting into it.
pub fn started<B: Backend>() -> (B, CloudCalls, B::Provider) {
    let emulator = B::started();
    let calls = CloudCalls::default();
    let provider = emulator.backend(&calls);
    (emulator, calls, provider)
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

/// `error` is throttling with the cloud's `Retry-After` of `seconds`.
pub fn assert_throttled_for(error: &Error, seconds: u64) {
    assert!(
        matches!(error, Error::Throttled { retry_after, .. } if *retry_after == Duration::from_secs(seconds)),
        "{error:?}"
    );
}

/// With `CLUSTER_TAG` `coco-pod-vm=c1`, deleting an instance tagged each of `others` is refused
/// with `NotOwnedByCluster`, the instance kept and (`no_delete_sent`) no DELETE sent for it;
/// this cluster's instance is deleted.
pub async fn another_clusters_instances_are_refused_and_kept<B: Backend>(
    others: &[&[(&str, &str)]],
    no_delete_sent: impl FnOnce(&B, &CloudCalls),
) {
    let emulator = B::started();
    let calls = CloudCalls::default();
    let guarded = emulator.backend_with(&[("CLUSTER_TAG", "coco-pod-vm=c1")], &calls);
    let ours = emulator.create_vm("podvm-ours-1a2b3c4d", &[("coco-pod-vm", "c1")]);
    let others: Vec<String> = others
        .iter()
        .enumerate()
        .map(|(n, tags)| emulator.create_vm(&format!("podvm-theirs-{n}"), tags))
        .collect();

    for other in &others {
        assert_delete_refused_and_kept(&emulator, &guarded, other, "NotOwnedByCluster").await;
    }
    no_delete_sent(&emulator, &calls);
    assert_deleted(&emulator, &guarded, &ours).await;
}

/// An instance carrying the user tag `peerpods-do-not-delete:true` is refused with
/// `DoNotDelete`, kept and (`no_delete_sent`) no DELETE sent for it, even when untagged deletes
/// are allowed; one tagged `peerpods-do-not-delete:false` is deleted.
pub async fn an_instance_tagged_do_not_delete_is_refused_and_kept<B: Backend>(
    no_delete_sent: impl FnOnce(&B, &CloudCalls),
) {
    let emulator = B::started();
    let calls = CloudCalls::default();
    let open = emulator.backend_with(
        &[
            ("CLUSTER_TAG", "coco-pod-vm=c1"),
            ("DELETE_UNTAGGED", "allow"),
        ],
        &calls,
    );
    let kept = emulator.create_vm(
        "podvm-kept-1a2b3c4d",
        &[(DO_NOT_DELETE_PORTABLE_TAG, "true")],
    );
    let unmarked = emulator.create_vm(
        "podvm-unmarked-5e6f7a8b",
        &[(DO_NOT_DELETE_PORTABLE_TAG, "false")],
    );

    assert_delete_refused_and_kept(&emulator, &open, &kept, "DoNotDelete").await;
    no_delete_sent(&emulator, &calls);
    assert_deleted(&emulator, &open, &unmarked).await;
}

/// A deletion still running when the wait's bound passes is not "deleted" (the finalizer would
/// be released on an inference), nor a failure: in progress, the instance still deleting; asked
/// again, the deletion is followed until a lookup answers that the instance is gone. Returns the
/// emulator and the instance's id for the cloud's own counts.
pub async fn a_deletion_that_outlasts_the_wait_is_in_progress_until_confirmed_gone<B: Backend>()
-> (B, String) {
    let emulator = B::started();
    let impatient = emulator.backend_with(
        &[("IBMCLOUD_DELETE_TIMEOUT_SECONDS", "0")],
        &CloudCalls::default(),
    );
    let id = emulator.create_vm("podvm-a", &[]);
    emulator.set_deleting_polls(5);

    // Accepted but not yet gone: not an answer of "deleted", nor an error: a wait.
    let answer = impatient.delete_instance(&id).await.expect("in progress");
    assert_eq!(answer, DeleteOutcome::InProgress);
    assert!(emulator.deletion_in_progress(&id));

    // Asked again, the deletion is followed until the instance is gone.
    let provider = emulator.backend(&CloudCalls::default());
    assert_deleted(&emulator, &provider, &id).await;
    (emulator, id)
}

/// An instance deleted is already gone when deleted again. An id never seen deleted by this
/// process (`never_existed`) is not believed gone on its first 404 (it may be an instance
/// created moments ago): not yet visible, naming the window's key `window`; with the window at zero
/// the 404 is trusted at once. Returns the emulator and the first backend's calls, for the
/// cloud's own counts.
pub async fn an_instance_that_is_gone_is_already_gone<B: Backend>(
    never_existed: &str,
    window: &str,
) -> (B, CloudCalls) {
    let (emulator, calls, provider) = started::<B>();
    let id = emulator.create_vm("podvm-a", &[]);
    assert_eq!(
        provider.delete_instance(&id).await.expect("first"),
        DeleteOutcome::Deleted
    );

    assert_eq!(
        provider.delete_instance(&id).await.expect("second"),
        DeleteOutcome::AlreadyGone
    );
    let unknown = provider.delete_instance(never_existed).await;
    assert!(
        matches!(&unknown, Ok(DeleteOutcome::NotYetVisible { setting, .. }) if *setting == window),
        "{unknown:?}"
    );
    let trusting = emulator.backend_with(&[(window, "0")], &CloudCalls::default());
    assert_eq!(
        trusting
            .delete_instance(never_existed)
            .await
            .expect("unknown"),
        DeleteOutcome::AlreadyGone
    );
    (emulator, calls)
}

/// Each of the `malformed` ids is refused as an invalid `instance_id`, by validation and by a
/// delete, before any request reaches the cloud; `valid` passes validation.
pub async fn malformed_ids_are_invalid_without_any_request<B: Backend>(
    malformed: &[&str],
    valid: &str,
) {
    let (emulator, _, provider) = started::<B>();
    for id in malformed {
        assert_invalid_instance_id(&provider.validate_instance_id(id).expect_err(id));
        assert_invalid_instance_id(&provider.delete_instance(id).await.expect_err(id));
    }
    assert_eq!(emulator.requests(), 0);
    assert!(provider.validate_instance_id(valid).is_ok());
}
