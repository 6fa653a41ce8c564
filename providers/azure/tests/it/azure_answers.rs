//! ARM's documented throttling and "another operation holds the resource" answers, each produced
//! by the emulator with ARM's real status, body and headers (`AzureEmulator::refuse_next`),
//! driven through the real azure_core pipeline, and classified by what ARM says: throttling is
//! `Throttled` with ARM's `Retry-After` and Compute's `RetryableError` `Unavailable` (retryable),
//! never a refusal the caller cannot retry, and once ARM stops refusing, the same delete
//! completes; a busy resource refuses the delete for its state, which the deletion engine waits
//! out within the call.

use std::time::Duration;

use crate::azure_support::provider;
use peerpods_emulator_azure::{ArmRefusal, AzureEmulator};
use peerpods_provider_core::{DeleteOutcome, Error, Provider};
use test_support::cloud::CloudEmulator;

/// The VM's DELETE is refused `count` times with `refusal`; returns the first answer, after
/// checking the VM is still there and that a later delete ends with it gone.
async fn refused_delete(name: &str, refusal: ArmRefusal, count: u32) -> Error {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm(name, &[]);
    let (provider, _) = provider(&emulator, &[("AZURE_MAX_RETRIES", "1")]);
    emulator.refuse_next("DELETE", count, refusal);

    let error = provider
        .delete_instance(&id)
        .await
        .expect_err("the DELETE was refused");

    assert!(emulator.vm_exists(name), "{refusal:?}: the VM must stay");
    emulator.refuse_next("DELETE", 0, refusal);
    assert_eq!(
        provider.delete_instance(&id).await.expect("later"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_exists(name));
    error
}

#[tokio::test(flavor = "multi_thread")]
async fn arms_subscription_throttling_is_throttled_with_its_retry_after() {
    let error = refused_delete(
        "podvm-sub-throttled",
        ArmRefusal::SubscriptionThrottled {
            retry_after_secs: 23,
        },
        1,
    )
    .await;
    assert!(
        matches!(&error, Error::Throttled { retry_after, message, .. } if *retry_after == Duration::from_secs(23) && message.contains("SubscriptionRequestsThrottled")),
        "{error:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn computes_throttling_is_throttled_not_an_operation_refusal() {
    let error = refused_delete(
        "podvm-crp-throttled",
        ArmRefusal::ComputeThrottled {
            retry_after_secs: 11,
        },
        1,
    )
    .await;
    assert!(
        matches!(&error, Error::Throttled { retry_after, .. } if *retry_after == Duration::from_secs(11)),
        "{error:?}"
    );
}

/// "Another operation holds the resource" refuses the delete for the VM's state now: the
/// deletion engine looks the VM up again after `AZURE_POLL_INTERVAL_MS` and asks again, within
/// the same call, until ARM accepts; the VM is then confirmed gone.
#[tokio::test(flavor = "multi_thread")]
async fn a_resource_another_operation_holds_is_asked_again_after_a_wait() {
    for (name, refusal) in [
        ("podvm-conflict", ArmRefusal::Conflict),
        ("podvm-in-progress", ArmRefusal::AnotherOperationInProgress),
        ("podvm-preempted", ArmRefusal::OperationPreempted),
        ("podvm-marked", ArmRefusal::MarkedForDeletion),
    ] {
        let emulator = AzureEmulator::start();
        let id = emulator.create_vm(name, &[]);
        let (provider, calls) = provider(&emulator, &[("AZURE_MAX_RETRIES", "1")]);
        emulator.refuse_next("DELETE", 2, refusal);

        let outcome = provider.delete_instance(&id).await;

        assert_eq!(outcome.ok(), Some(DeleteOutcome::Deleted), "{refusal:?}");
        assert!(!emulator.vm_exists(name), "{refusal:?}");
        // Refused twice (HTTP 409, not retried by the pipeline), accepted the third time.
        assert_eq!(
            emulator.arm_requests_matching("DELETE", "/virtualMachines/"),
            3,
            "{refusal:?}"
        );
        assert_eq!(
            calls.count("azure", "DeleteVirtualMachine", "error"),
            2,
            "{refusal:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn computes_retryable_error_is_retryable_after_the_sdks_own_retries() {
    // More refusals than the pipeline's attempts (AZURE_MAX_RETRIES 1: two).
    let error = refused_delete("podvm-retryable", ArmRefusal::RetryableError, 5).await;
    assert!(
        matches!(&error, Error::Unavailable { message, .. } if message.contains("RetryableError")),
        "{error:?}"
    );
}
