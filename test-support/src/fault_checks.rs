//! One set of checks, run by every cloud backend's tests against its emulator's fault layer
//! ([`crate::faults`]): each knob driven through the backend's real client code, and what the
//! backend makes of it. A throttled cloud is [`Error::Throttled`] (retryable, with a wait), a
//! cloud failing with 5xx is retried and then [`Error::Unavailable`], a hung request ends at the
//! backend's own deadline as [`Error::Unavailable`], and once the faults stop the same delete
//! ends with the VM and its parts gone. None of them is ever an answer that the VM is gone while
//! it still exists. And every request the backend sent is counted in `cloud_api_attempts`,
//! classified as the cloud answered it.
#![allow(clippy::unwrap_used)] // test support: a failed check ends the test with its message

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// What a suite's provider counts its calls in (named here for [`fault_suite!`]'s expansion).
pub use peerpods_provider_core::CloudCalls;
use peerpods_provider_core::{ATTEMPT_RESULTS, DeleteOutcome, Error, Provider};

use crate::cloud::CloudEmulator;
use crate::faults::Faults;
use crate::metrics::Scrape;

/// The longest any one check waits for the backend: generous, and far below a hang (600 s).
pub const PATIENCE: Duration = Duration::from_secs(120);

/// `config` with `extra` keys added or replaced.
pub fn with(config: Vec<(String, String)>, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = config
        .into_iter()
        .filter(|(k, _)| !extra.iter().any(|(key, _)| key == k))
        .collect();
    pairs.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    pairs
}

async fn delete_once(provider: &dyn Provider, id: &str) -> Result<DeleteOutcome, Error> {
    tokio::time::timeout(PATIENCE, provider.delete_instance(id))
        .await
        .unwrap_or_else(|_| panic!("DeleteInstance of {id} did not answer within {PATIENCE:?}"))
}

/// Asks again, as peerpod-ctrl does, while the answer is retryable (or a wait: not yet
/// visible), until the VM is answered gone; then checks the emulator agrees.
pub async fn delete_until_gone(emulator: &dyn CloudEmulator, provider: &dyn Provider, id: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match delete_once(provider, id).await {
            Ok(DeleteOutcome::Deleted | DeleteOutcome::AlreadyGone) => break,
            Ok(DeleteOutcome::NotYetVisible { .. } | DeleteOutcome::InProgress)
            | Err(Error::Throttled { .. } | Error::Unavailable { .. })
                if Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("{}: {id}: unexpected answer {other:?}", emulator.provider()),
        }
    }
    assert!(
        !emulator.vm_or_parts_exist(id),
        "{}: answered gone while the VM or a part of it exists",
        emulator.provider()
    );
}

/// Every request throttled: the backend answers [`Error::Throttled`] (retryable) and deletes
/// nothing; once the throttling stops, the delete completes.
pub async fn throttling_is_retryable(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    name: &str,
) {
    let id = emulator.create_vm(name, &[]);
    emulator.set_faults(Faults {
        throttle_rate: 1.0,
        ..Faults::default()
    });
    let answer = delete_once(provider, &id).await;
    assert!(
        matches!(answer, Err(Error::Throttled { .. })),
        "{}: a throttled delete answered {answer:?}",
        emulator.provider()
    );
    assert!(emulator.injected().throttled >= 1);
    assert!(emulator.vm_or_parts_exist(&id));
    emulator.set_faults(Faults::default());
    delete_until_gone(emulator, provider, &id).await;
}

/// Every request failing with the cloud's 5xx: the backend retries (more than one attempt
/// reaches the cloud) and answers [`Error::Unavailable`]; afterwards the delete completes.
pub async fn server_errors_are_retried_then_unavailable(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    name: &str,
) {
    let id = emulator.create_vm(name, &[]);
    emulator.set_faults(Faults {
        server_error_rate: 1.0,
        ..Faults::default()
    });
    let answer = delete_once(provider, &id).await;
    assert!(
        matches!(answer, Err(Error::Unavailable { .. })),
        "{}: a delete failing with 5xx answered {answer:?}",
        emulator.provider()
    );
    let injected = emulator.injected();
    assert!(
        injected.server_errors >= 2,
        "{}: the backend did not retry a 5xx ({injected:?})",
        emulator.provider()
    );
    assert!(emulator.vm_or_parts_exist(&id));
    emulator.set_faults(Faults::default());
    delete_until_gone(emulator, provider, &id).await;
}

/// Every request hanging (600 s): the backend's own deadline ends the call as
/// [`Error::Unavailable`] well before the hang would; afterwards the delete completes.
/// `provider` must be built with a short request timeout.
pub async fn a_hang_ends_at_the_deadline_as_unavailable(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    name: &str,
) {
    let id = emulator.create_vm(name, &[]);
    emulator.set_faults(Faults {
        hang_rate: 1.0,
        hang_for: Duration::from_secs(600),
        ..Faults::default()
    });
    let answer = delete_once(provider, &id).await;
    assert!(
        matches!(answer, Err(Error::Unavailable { .. })),
        "{}: a delete whose requests hang answered {answer:?}",
        emulator.provider()
    );
    assert!(emulator.injected().hangs >= 1);
    assert!(emulator.vm_or_parts_exist(&id));
    emulator.set_faults(Faults::default());
    delete_until_gone(emulator, provider, &id).await;
}

/// Slow answers and a deletion that takes several polls still end with the VM gone.
pub async fn slow_answers_and_long_operations_complete(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    name: &str,
) {
    let id = emulator.create_vm(name, &[]);
    emulator.set_faults(Faults {
        latency: Duration::from_millis(30),
        operation_polls: Some(3),
        ..Faults::default()
    });
    delete_until_gone(emulator, provider, &id).await;
    assert!(emulator.injected().requests >= 2);
    emulator.set_faults(Faults::default());
}

/// A VM created moments ago that the cloud does not show yet (NotFound for its first seconds)
/// is never answered gone while it exists: the answer is retryable, or a wait (not yet
/// visible, from a backend on the deletion engine).
pub async fn a_new_vm_the_cloud_does_not_show_yet_is_not_gone(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    name: &str,
) {
    emulator.set_faults(Faults {
        invisible_after_create: Duration::from_secs(3600),
        ..Faults::default()
    });
    let id = emulator.create_vm(name, &[]);
    let answer = delete_once(provider, &id).await;
    assert!(
        matches!(
            answer,
            Ok(DeleteOutcome::NotYetVisible { .. })
                | Err(Error::Unavailable { .. } | Error::Throttled { .. })
        ),
        "{}: a VM not yet visible was answered {answer:?}",
        emulator.provider()
    );
    assert!(emulator.injected().not_found >= 1);
    assert!(emulator.vm_or_parts_exist(&id));
    // Shown now, and new: its NotFound after the delete is believed once the window (the suite's
    // `not_shown_yet` keys set a short one) has passed since it was first shown.
    emulator.set_faults(Faults::default());
    delete_until_gone(emulator, provider, &id).await;
}

/// The storm's mix (20% 5xx, 10% throttling, 5% hangs of `hang_for`): asking again while the
/// answer is retryable, every VM ends gone, and none is answered gone while it exists.
pub async fn a_storm_ends_with_every_vm_gone(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    names: &[&str],
    hang_for: Duration,
) {
    let ids: Vec<String> = names.iter().map(|n| emulator.create_vm(n, &[])).collect();
    emulator.set_faults(Faults::storm(hang_for, 20));
    for id in &ids {
        delete_until_gone(emulator, provider, id).await;
    }
    emulator.set_faults(Faults::default());
}

/// Attempts of `provider` in the `cloud_api_attempts` exposition of `calls`, by result (every
/// operation summed), read as a scrape would read them.
pub fn attempts_by_result(calls: &CloudCalls, provider: &str) -> BTreeMap<String, u64> {
    let mut registry = prometheus_client::registry::Registry::default();
    calls.register(registry.sub_registry_with_prefix("provider_service"));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    let scrape = Scrape::parse(&text).unwrap();
    let mut by_result = BTreeMap::new();
    for sample in scrape
        .samples("provider_service_cloud_api_attempts_total")
        .filter(|s| s.label("provider") == provider)
    {
        *by_result
            .entry(sample.label("result").to_owned())
            .or_default() += sample.value as u64;
    }
    by_result
}

/// Throttling and 5xx at a rate (the storm's, without hangs), asked again until every VM is gone:
/// each HTTP attempt the backend sent, its client's own retries included, is counted in
/// `cloud_api_attempts` and classified by what the cloud answered. The attempts counted
/// `throttled` and `server_error` are exactly the throttling answers and 5xx the fault layer
/// injected, and no fewer attempts are counted than requests reached the layer (requests it
/// spares, such as token requests, come on top). `provider` must count its calls in `calls`.
pub async fn every_attempt_is_counted_as_the_cloud_answered(
    emulator: &dyn CloudEmulator,
    provider: &dyn Provider,
    calls: &CloudCalls,
    names: &[&str],
) {
    let ids: Vec<String> = names.iter().map(|n| emulator.create_vm(n, &[])).collect();
    emulator.set_faults(Faults {
        throttle_rate: 0.10,
        server_error_rate: 0.20,
        seed: 23,
        ..Faults::default()
    });
    for id in &ids {
        delete_until_gone(emulator, provider, id).await;
    }
    let injected = emulator.injected();
    emulator.set_faults(Faults::default());
    let cloud = emulator.provider();
    let counted = attempts_by_result(calls, cloud);
    let of = |result: &str| counted.get(result).copied().unwrap_or(0);
    println!("{cloud}: attempts counted {counted:?}; the fault layer injected {injected:?}");
    assert!(
        injected.throttled > 0 && injected.server_errors > 0,
        "{cloud}: both faults occurred ({injected:?})"
    );
    assert_eq!(
        of("throttled"),
        injected.throttled,
        "{cloud}: every throttling answer is a throttled attempt: {counted:?} against {injected:?}"
    );
    assert_eq!(
        of("server_error"),
        injected.server_errors,
        "{cloud}: every 5xx is a server_error attempt: {counted:?} against {injected:?}"
    );
    assert!(
        counted.values().sum::<u64>() >= injected.requests,
        "{cloud}: every request is an attempt: {counted:?} against {injected:?}"
    );
    assert!(
        counted
            .keys()
            .all(|result| ATTEMPT_RESULTS.contains(&result.as_str())),
        "{cloud}: results outside ATTEMPT_RESULTS: {counted:?}"
    );
}

/// The checks above as the fault suite of one cloud backend: one test per check, each with its
/// own emulator, so what one check injects or counts never reaches another.
///
/// - `emulator`: a `fn() -> E` that starts the backend's emulator (`E:` [`CloudEmulator`]).
/// - `provider`: an `async fn(&E, &[(&str, &str)], CloudCalls) -> P` that builds the backend
///   (`P:` [`Provider`]) from the emulator's configuration with the given keys added or
///   replaced, counting its calls in the given [`CloudCalls`].
/// - `hang_config`: the keys that give the backend a short request deadline; left out, there is
///   no hang check (for a backend whose client cannot be given one).
/// - `not_shown_yet`: the name of the test of a VM the cloud does not show yet (with its doc
///   comment, if any) and the keys it adds.
#[macro_export]
macro_rules! fault_suite {
    (
        emulator: $emulator:ident,
        provider: $provider:ident,
        $(hang_config: $hang_config:expr,)?
        $(#[$not_shown_meta:meta])*
        not_shown_yet: $not_shown:ident($not_shown_config:expr) $(,)?
    ) => {
        $crate::fault_suite!(@check $emulator, $provider, throttling_is_retryable(&[], "podvm-throttled"));
        $crate::fault_suite!(@check $emulator, $provider,
            server_errors_are_retried_then_unavailable(&[], "podvm-5xx"));
        $(
            $crate::fault_suite!(@check $emulator, $provider,
                a_hang_ends_at_the_deadline_as_unavailable($hang_config, "podvm-hang"));
        )?
        $crate::fault_suite!(@check $emulator, $provider,
            slow_answers_and_long_operations_complete(&[], "podvm-slow"));

        #[tokio::test(flavor = "multi_thread")]
        async fn every_attempt_is_counted_as_the_cloud_answered() {
            let emulator = $emulator();
            let calls = $crate::fault_checks::CloudCalls::default();
            let provider = $provider(&emulator, &[], calls.clone()).await;
            $crate::fault_checks::every_attempt_is_counted_as_the_cloud_answered(
                &emulator,
                &provider,
                &calls,
                &["podvm-counted-1", "podvm-counted-2", "podvm-counted-3"],
            )
            .await;
        }

        $crate::fault_suite!(@check $emulator, $provider, $(#[$not_shown_meta])*
            $not_shown: a_new_vm_the_cloud_does_not_show_yet_is_not_gone($not_shown_config, "podvm-new"));
    };
    // A test named after the check it runs.
    (@check $emulator:ident, $provider:ident, $check:ident($config:expr, $vm_name:literal)) => {
        $crate::fault_suite!(@check $emulator, $provider, $check: $check($config, $vm_name));
    };
    // One test running `check` on a VM called `vm_name`, against a fresh emulator and a provider built with
    // `config` added to the emulator's.
    (
        @check $emulator:ident, $provider:ident, $(#[$meta:meta])*
        $test:ident: $check:ident($config:expr, $vm_name:literal)
    ) => {
        $(#[$meta])*
        #[tokio::test(flavor = "multi_thread")]
        async fn $test() {
            let emulator = $emulator();
            let provider = $provider(
                &emulator,
                $config,
                $crate::fault_checks::CloudCalls::default(),
            )
            .await;
            $crate::fault_checks::$check(&emulator, &provider, $vm_name).await;
        }
    };
}
