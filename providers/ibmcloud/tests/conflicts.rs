//! IBM's 409 Conflict (a VPC instance or a PVM instance whose status does not allow the delete
//! yet), served by the emulators with the cloud's error body (`examples::VPC_ERROR_CONFLICT`,
//! `examples::POWER_ERROR_CONFLICT`) through each backend's real HTTP client: the answer is
//! `Unavailable` (retryable), not a refusal the caller cannot retry, nothing is deleted, and the
//! same delete completes once the status allows it. (Throttling, 429 with `Retry-After`, is
//! `Throttled` in `vpc.rs` and `powervs.rs`.)

use peerpods_emulator_ibmcloud::{IbmEmulator, PowerVsEmulator, VpcEmulator, examples};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider, ProviderConfig};
use peerpods_provider_ibmcloud::{IbmCloudVpcProvider, PowerVsProvider};
use test_support::cloud::CloudEmulator;

fn assert_conflict_is_retryable(answer: Result<DeleteOutcome, Error>) {
    assert!(
        matches!(&answer, Err(Error::Unavailable { message }) if message.contains("HTTP 409") && message.contains("try again")),
        "{answer:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vpc_instance_in_a_conflicting_status_is_retryable_then_deleted() {
    let emulator = VpcEmulator::start().expect("emulator");
    let provider = IbmCloudVpcProvider::from_config(
        &ProviderConfig::from_pairs(emulator.config()),
        CloudCalls::default(),
    )
    .expect("provider");
    let id = emulator.create_vm("podvm-busy", &[]);
    emulator.answer_next_verbatim(
        "DELETE /v1/instances/{id}",
        409,
        examples::VPC_ERROR_CONFLICT,
    );

    assert_conflict_is_retryable(provider.delete_instance(&id).await);
    assert!(emulator.vm_or_parts_exist(&id));

    assert_eq!(
        provider.delete_instance(&id).await.expect("later"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pvm_instance_in_a_transitional_state_is_retryable_then_deleted() {
    let emulator = PowerVsEmulator::start().expect("emulator");
    let provider = PowerVsProvider::from_config(
        &ProviderConfig::from_pairs(emulator.config()),
        CloudCalls::default(),
    )
    .expect("provider");
    let id = emulator.create_vm("podvm-busy", &[]);
    emulator.answer_next_verbatim(
        "DELETE pvm-instances/{id}",
        409,
        examples::POWER_ERROR_CONFLICT,
    );

    assert_conflict_is_retryable(provider.delete_instance(&id).await);
    assert!(emulator.vm_or_parts_exist(&id));

    assert_eq!(
        provider.delete_instance(&id).await.expect("later"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
}
