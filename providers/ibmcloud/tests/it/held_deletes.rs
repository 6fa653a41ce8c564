//! A DELETE answered 404 right after a lookup found the instance proves nothing (a lookup and a
//! deletion may see a new instance differently for a while, the fault layer's per-call
//! visibility): on both backends the delete goes on looking and asking, answers nothing while
//! the VM exists, and completes once the cloud deletes it. (Both used to answer AlreadyGone at
//! once, the VM still running.)

use std::sync::Arc;
use std::time::Duration;

use crate::ibm_support::Backend;
use peerpods_emulator_ibmcloud::{PowerVsEmulator, VpcEmulator};
use peerpods_provider_core::CloudCalls;
use test_support::provider_checks;

async fn a_delete_answered_404_after_a_found_lookup_is_held<B: Backend>(delete_route: &str)
where
    B::Provider: 'static,
{
    let emulator = B::started();
    let provider = Arc::new(emulator.backend(&CloudCalls::default()));
    let id = emulator.create_vm("podvm-delete-404", &[]);
    provider_checks::a_delete_answered_404_after_a_found_lookup_is_held(
        &emulator,
        provider,
        &id,
        Duration::from_secs(5),
        || emulator.requests_to(delete_route),
        || emulator.vm_or_parts_exist(&id),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vpc_delete_answered_404_after_a_found_lookup_is_held_until_the_vm_is_gone() {
    a_delete_answered_404_after_a_found_lookup_is_held::<VpcEmulator>("DELETE /v1/instances/{id}")
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_pvm_delete_answered_404_after_a_found_lookup_is_held_until_the_vm_is_gone() {
    a_delete_answered_404_after_a_found_lookup_is_held::<PowerVsEmulator>(
        "DELETE pvm-instances/{id}",
    )
    .await;
}
