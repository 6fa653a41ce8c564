//! The checks of a cloud backend's `Provider` against its emulator that are the same on every
//! cloud: malformed ids refused before any request, throttling reported with the cloud's wait
//! and not retried, a VM the cloud is already deleting answered deleted only once gone, a second
//! delete answered already gone, a 404 of an unknown VM not believed inside the not-found
//! window, a DELETE's 404 after a found lookup held until the VM is gone, another cluster's VM
//! and a VM marked do-not-delete refused and kept, health as one request, refused credentials
//! reported as such and never shown.
//!
//! Each check drives the backend's real client code through the [`Provider`] its cloud's test
//! built, and inspects the cloud through [`CloudEmulator`]. What differs between clouds stays in
//! the cloud's tests: the inputs (its malformed ids, its tag keys), the arrangements the
//! emulator offers in its own words (throttle the next request, start a VM's deletion), and the
//! cloud's own counts (which operation was throttled, which requests were sent), asserted around
//! the check. "A request" here is one the emulator's fault layer saw: every API request (a
//! token endpoint the layer spares is not one; a cloud that has one counts it in its tests).
#![allow(clippy::unwrap_used)] // test support: a failed check ends the test with its message

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use peerpods_provider_core::{DO_NOT_DELETE_PORTABLE_TAG, DeleteOutcome, Error, Provider};

use crate::cloud::CloudEmulator;
use crate::faults::{CallKind, Faults, Visibility};

/// Requests the emulator's fault layer has seen so far.
fn requests(emulator: &dyn CloudEmulator) -> u64 {
    emulator.injected().requests
}

/// A delete of `id` answers `Deleted` at once, and afterwards neither the VM nor any part of it
/// exists.
pub async fn deleted(emulator: &dyn CloudEmulator, provider: &dyn Provider, id: &str) {
    let cloud = emulator.provider();
    let answer = provider.delete_instance(id).await;
    assert!(
        matches!(answer, Ok(DeleteOutcome::Deleted)),
        "{cloud}: {id}: expected Deleted, got {answer:?}"
    );
    assert!(
        !emulator.vm_or_parts_exist(id),
        "{cloud}: {id} answered deleted while the VM or a part of it exists"
    );
}

/// A delete of `id` answers `AlreadyGone`.
pub async fn already_gone(emulator: &dyn CloudEmulator, provider: &dyn Provider, id: &str) {
    let answer = provider.delete_instance(id).await;
    assert!(
        matches!(answer, Ok(DeleteOutcome::AlreadyGone)),
        "{}: {id}: expected AlreadyGone, got {answer:?}",
        emulator.provider()
    );
}

/// Each of `malformed` is refused by `validate_instance_id` and by `delete_instance` as an
/// `InvalidArgument` of `instance_id`, and not one request reaches the cloud; `valid` (an id of
/// the cloud's form) validates. Returns the delete refusals' messages, in `malformed`'s order,
/// for the cloud's own expectations of them.
pub async fn malformed_ids_are_invalid_without_any_request(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    malformed: &[&str],
    valid: &str,
) -> Vec<String> {
    let cloud = emulator.provider();
    let before = requests(emulator);
    let mut messages = Vec::new();
    for &id in malformed {
        let validated = provider.validate_instance_id(id);
        assert!(
            matches!(
                validated,
                Err(Error::InvalidArgument {
                    field: "instance_id",
                    ..
                })
            ),
            "{cloud}: validating {id:?}: {validated:?}"
        );
        match provider.delete_instance(id).await {
            Err(Error::InvalidArgument {
                field: "instance_id",
                message,
            }) => messages.push(message),
            other => panic!("{cloud}: deleting {id:?}: {other:?}"),
        }
    }
    assert_eq!(
        requests(emulator),
        before,
        "{cloud}: a malformed id reached the cloud"
    );
    if let Err(error) = provider.validate_instance_id(valid) {
        panic!("{cloud}: {valid:?} is an id of the cloud's form: {error:?}");
    }
    messages
}

/// The emulator has been told to throttle the next request with the cloud's wait `wait`: a
/// delete of `id` is `Throttled` with that wait, after that one request (the backend does not
/// retry it: the caller decides when to come back), and the VM is still there. Returns the
/// error, for the cloud's own expectations of it; the caller then checks its counts and that a
/// later delete ([`deleted`]) succeeds.
pub async fn throttling_is_reported_with_the_clouds_wait(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    id: &str,
    wait: Duration,
) -> Error {
    let cloud = emulator.provider();
    let before = requests(emulator);
    let answer = provider.delete_instance(id).await;
    let error = match answer {
        Err(error @ Error::Throttled { retry_after, .. }) if retry_after == wait => error,
        other => panic!("{cloud}: expected Throttled with a wait of {wait:?}, got {other:?}"),
    };
    assert_eq!(
        requests(emulator) - before,
        1,
        "{cloud}: a throttled request was retried inside the call"
    );
    assert!(
        emulator.vm_or_parts_exist(id),
        "{cloud}: a throttled delete deleted {id}"
    );
    error
}

/// The cloud is already deleting `id` (the caller started its deletion in the emulator): the VM
/// still exists, a delete answers `Deleted`, and only once the VM and its parts are gone.
pub async fn a_vm_the_cloud_is_deleting_is_deleted_once_gone(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    id: &str,
) {
    assert!(
        emulator.vm_or_parts_exist(id),
        "{}: {id}: the cloud's deletion has not ended yet",
        emulator.provider()
    );
    deleted(emulator, provider, id).await;
}

/// A DELETE of `id` answered 404 right after a lookup found the VM proves nothing (a lookup and a
/// deletion may see a VM differently for a while: the fault layer hides it from deletions only):
/// the delete goes on looking and asking (the cloud got three DELETEs, counted by `deletes_sent`,
/// `within` this long), answers nothing while the VM exists (`vm_exists`), and completes
/// `Deleted` once the cloud deletes it.
pub async fn a_delete_answered_404_after_a_found_lookup_is_held<P: Provider>(
    emulator: &dyn CloudEmulator,
    provider: Arc<P>,
    id: &str,
    within: Duration,
    deletes_sent: impl Fn() -> u64,
    vm_exists: impl Fn() -> bool,
) {
    emulator.set_faults(Faults {
        invisible: Visibility::only(&[CallKind::Delete], Duration::from_secs(3600)),
        ..Faults::default()
    });
    let deleting = tokio::spawn({
        let (provider, id) = (Arc::clone(&provider), id.to_owned());
        async move { provider.delete_instance(&id).await }
    });
    let asked = tokio::time::timeout(within, async {
        while deletes_sent() < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        asked.is_ok(),
        "{}: the DELETE was not asked again after its 404",
        emulator.provider()
    );
    assert!(
        !deleting.is_finished(),
        "{}: answered while the VM exists: {:?}",
        emulator.provider(),
        deleting.await
    );
    assert!(vm_exists(), "{}: {id} is gone", emulator.provider());
    assert!(emulator.injected().not_found >= 3);

    emulator.set_faults(Faults::default());
    let answer = tokio::time::timeout(Duration::from_secs(30), deleting)
        .await
        .expect("the delete completes once the cloud deletes")
        .expect("the delete's task");
    assert_eq!(answer.expect("deleted"), DeleteOutcome::Deleted);
    assert!(!emulator.vm_or_parts_exist(id));
}

/// A VM created as cloud-api-adaptor does, named `name`, is deleted, and a second delete answers
/// `AlreadyGone`. Returns its id.
pub async fn deleting_twice_is_already_gone(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    name: &str,
) -> String {
    let id = emulator.create_vm(name, &[]);
    deleted(emulator, provider, &id).await;
    already_gone(emulator, provider, &id).await;
    id
}

/// `unknown` (well formed, never created, never seen deleted by `provider`) answers 404, which
/// inside the cloud's not-found window may be a VM created moments ago: the deletion engine
/// answers a wait ([`DeleteOutcome::NotYetVisible`], naming the window's key `window_key`), not
/// gone and not a failure.
pub async fn an_unknown_vm_is_not_gone_inside_the_not_found_window(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    unknown: &str,
    window_key: &str,
) {
    let answer = provider.delete_instance(unknown).await;
    assert!(
        matches!(&answer, Ok(DeleteOutcome::NotYetVisible { setting, .. }) if *setting == window_key),
        "{}: {unknown}: expected NotYetVisible naming {window_key}, got {answer:?}",
        emulator.provider()
    );
}

/// `guarded` was built with a `CLUSTER_TAG` that `ours` carries and none of `others` does: each
/// of `others` is refused as `NotOwnedByCluster` and still exists; `ours` is deleted.
pub async fn another_clusters_vm_is_refused_and_kept(
    emulator: &dyn CloudEmulator,
    guarded: &dyn Provider,
    ours: &str,
    others: &[&str],
) {
    let cloud = emulator.provider();
    for &other in others {
        let answer = guarded.delete_instance(other).await;
        assert!(
            matches!(answer, Err(Error::NotOwnedByCluster { .. })),
            "{cloud}: {other}: expected NotOwnedByCluster, got {answer:?}"
        );
        assert!(
            emulator.vm_or_parts_exist(other),
            "{cloud}: {other} must not be touched"
        );
    }
    deleted(emulator, guarded, ours).await;
}

/// The two VMs of [`a_vm_marked_do_not_delete_is_refused_and_kept`], and what its refusal cost.
#[derive(Debug)]
pub struct DoNotDelete {
    /// The VM marked `peerpods-do-not-delete: true`, refused and still there.
    pub kept: String,
    /// The VM marked `peerpods-do-not-delete: false`, deleted.
    pub unmarked: String,
    /// Requests that reached the cloud while the marked VM's delete was refused.
    pub requests_for_the_refusal: u64,
}

/// `provider` deletes untagged VMs (`DELETE_UNTAGGED=allow`): a VM created with the portable
/// do-not-delete tag ([`DO_NOT_DELETE_PORTABLE_TAG`]) `true`, named `podvm-kept`, is refused as
/// `DoNotDelete` naming it, and stays; `false` does not protect, that VM is deleted.
pub async fn a_vm_marked_do_not_delete_is_refused_and_kept(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
) -> DoNotDelete {
    let cloud = emulator.provider();
    let name = "podvm-kept";
    let kept = emulator.create_vm(name, &[(DO_NOT_DELETE_PORTABLE_TAG, "true")]);
    let unmarked = emulator.create_vm("podvm-unmarked", &[(DO_NOT_DELETE_PORTABLE_TAG, "false")]);

    let before = requests(emulator);
    let answer = provider.delete_instance(&kept).await;
    let requests_for_the_refusal = requests(emulator) - before;
    match &answer {
        Err(error @ Error::DoNotDelete { .. }) => {
            // Named as the cloud's console shows it: by its id, or (where the id is a path
            // ending in it) by its name.
            let message = error.to_string();
            assert!(
                message.contains(&kept) || message.contains(name),
                "{cloud}: the refusal does not name {kept}: {message}"
            );
        }
        other => panic!("{cloud}: {kept}: expected DoNotDelete, got {other:?}"),
    }
    assert!(
        emulator.vm_or_parts_exist(&kept),
        "{cloud}: {kept} must not be touched"
    );
    deleted(emulator, provider, &unmarked).await;
    DoNotDelete {
        kept,
        unmarked,
        requests_for_the_refusal,
    }
}

/// Health is one request to the cloud (authenticated: a token request the fault layer spares
/// comes on top) and answers healthy. Returns its message, for the cloud's own expectations.
pub async fn health_is_one_request(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
) -> String {
    let cloud = emulator.provider();
    let before = requests(emulator);
    let health = provider.health().await;
    assert!(health.healthy, "{cloud}: {}", health.message);
    assert_eq!(
        requests(emulator) - before,
        1,
        "{cloud}: health is one request"
    );
    health.message
}

/// The cloud refuses `provider`'s credentials (wrong, or revoked): a delete of `id` is
/// `CloudUnauthenticated` and leaves the VM, health answers unhealthy, and none of `secrets`
/// (the credentials, or recognisable parts of them) shows in the error, its debug form, the
/// health message or the provider's debug form. Returns the error, for the cloud's own
/// expectations of it.
pub async fn refused_credentials_are_unauthenticated_and_never_shown<P: Provider + Debug>(
    emulator: &dyn CloudEmulator,
    provider: &P,
    id: &str,
    secrets: &[&str],
) -> Error {
    let cloud = emulator.provider();
    let error = match provider.delete_instance(id).await {
        Err(error @ Error::CloudUnauthenticated { .. }) => error,
        other => panic!("{cloud}: expected CloudUnauthenticated, got {other:?}"),
    };
    assert!(
        emulator.vm_or_parts_exist(id),
        "{cloud}: {id} was deleted with refused credentials"
    );
    let health = provider.health().await;
    assert!(!health.healthy, "{cloud}: {}", health.message);
    for shown in [
        error.to_string(),
        format!("{error:?}"),
        health.message,
        format!("{provider:?}"),
    ] {
        for secret in secrets {
            assert!(!shown.contains(secret), "{cloud}: a secret in {shown}");
        }
    }
    error
}
