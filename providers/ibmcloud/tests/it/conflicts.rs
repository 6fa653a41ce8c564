//! IBM's 409 Conflict (a VPC instance or a PVM instance whose status does not allow the delete
//! yet), served by the emulators with the cloud's error body (`examples::VPC_ERROR_CONFLICT`,
//! `examples::POWER_ERROR_CONFLICT`) through each backend's real HTTP client: a refusal for the
//! instance's state, which the deletion engine waits out and asks again; the same delete
//! completes once the status allows it, and nothing is answered before the instance is gone.
//! (Throttling, 429 with `Retry-After`, is `Throttled` in `vpc.rs` and `powervs.rs`.)

use crate::ibm_support::{Backend, assert_deleted};
use peerpods_emulator_ibmcloud::{PowerVsEmulator, VpcEmulator, examples};
use peerpods_provider_core::CloudCalls;

/// The next two DELETEs (`route`) answer 409 with `conflict`: waited out, asked again, and the
/// third DELETE deletes the instance within the same call.
async fn a_conflict_is_waited_out_then_deleted<B: Backend>(route: &str, conflict: &str) {
    let emulator = B::started();
    let provider = emulator.backend(&CloudCalls::default());
    let id = emulator.create_vm("podvm-busy", &[]);
    emulator.answer_next_verbatim(route, 409, conflict);
    emulator.answer_next_verbatim(route, 409, conflict);

    assert_deleted(&emulator, &provider, &id).await;
    assert_eq!(emulator.requests_to(route), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vpc_instance_in_a_conflicting_status_is_waited_out_then_deleted() {
    a_conflict_is_waited_out_then_deleted::<VpcEmulator>(
        "DELETE /v1/instances/{id}",
        examples::VPC_ERROR_CONFLICT,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pvm_instance_in_a_transitional_state_is_waited_out_then_deleted() {
    a_conflict_is_waited_out_then_deleted::<PowerVsEmulator>(
        "DELETE pvm-instances/{id}",
        examples::POWER_ERROR_CONFLICT,
    )
    .await;
}
