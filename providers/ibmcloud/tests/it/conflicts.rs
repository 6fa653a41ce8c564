//! IBM's 409 Conflict (a VPC instance or a PVM instance whose status does not allow the delete
//! yet), served by the emulators with the cloud's error body (`examples::VPC_ERROR_CONFLICT`,
//! `examples::POWER_ERROR_CONFLICT`) through each backend's real HTTP client: the answer is
//! `Unavailable` (retryable), not a refusal the caller cannot retry, nothing is deleted, and the
//! same delete completes once the status allows it. (Throttling, 429 with `Retry-After`, is
//! `Throttled` in `vpc.rs` and `powervs.rs`.)

use crate::ibm_support::{Backend, assert_deleted};
use peerpods_emulator_ibmcloud::{PowerVsEmulator, VpcEmulator, examples};
use peerpods_provider_core::{CloudCalls, Error, Provider};

/// The next DELETE (`route`) answers 409 with `conflict`: retryable, the instance kept; the
/// same delete asked again deletes it.
async fn a_conflict_is_retryable_then_deleted<B: Backend>(route: &str, conflict: &str) {
    let emulator = B::started();
    let provider = emulator.backend(&CloudCalls::default());
    let id = emulator.create_vm("podvm-busy", &[]);
    emulator.answer_next_verbatim(route, 409, conflict);

    let answer = provider.delete_instance(&id).await;
    assert!(
        matches!(&answer, Err(Error::Unavailable { message, .. }) if message.contains("HTTP 409") && message.contains("try again")),
        "{answer:?}"
    );
    assert!(emulator.vm_or_parts_exist(&id));

    assert_deleted(&emulator, &provider, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vpc_instance_in_a_conflicting_status_is_retryable_then_deleted() {
    a_conflict_is_retryable_then_deleted::<VpcEmulator>(
        "DELETE /v1/instances/{id}",
        examples::VPC_ERROR_CONFLICT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pvm_instance_in_a_transitional_state_is_retryable_then_deleted() {
    a_conflict_is_retryable_then_deleted::<PowerVsEmulator>(
        "DELETE pvm-instances/{id}",
        examples::POWER_ERROR_CONFLICT,
    )
    .await;
}
