//! A DELETE answered 404 right after a lookup found the instance proves nothing (a lookup and a
//! deletion may see a new instance differently for a while, the fault layer's per-call
//! visibility): on both backends the delete goes on looking and asking, answers nothing while
//! the VM exists, and completes once the cloud deletes it. (Both used to answer AlreadyGone at
//! once, the VM still running.)

use std::sync::Arc;
use std::time::Duration;

use crate::ibm_support::Backend;
use peerpods_emulator_ibmcloud::{PowerVsEmulator, VpcEmulator};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Provider};
use test_support::faults::{CallKind, Faults, Visibility};

async fn a_delete_answered_404_after_a_found_lookup_is_held<B: Backend>(delete_route: &str)
where
    B::Provider: 'static,
{
    let emulator = B::started();
    let provider = Arc::new(emulator.backend(&CloudCalls::default()));
    let id = emulator.create_vm("podvm-delete-404", &[]);
    emulator.set_faults(Faults {
        invisible: Visibility::only(&[CallKind::Delete], Duration::from_secs(3600)),
        ..Faults::default()
    });

    let deleting = tokio::spawn({
        let (provider, id) = (Arc::clone(&provider), id.clone());
        async move { provider.delete_instance(&id).await }
    });
    let asked = tokio::time::timeout(Duration::from_secs(5), async {
        while emulator.requests_to(delete_route) < 3 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(
        asked.is_ok(),
        "the DELETE was not asked again after its 404"
    );
    assert!(
        !deleting.is_finished(),
        "answered while the VM exists: {:?}",
        deleting.await
    );
    assert!(emulator.vm_or_parts_exist(&id));
    assert!(emulator.injected().not_found >= 3);

    emulator.set_faults(Faults::default());
    let answer = tokio::time::timeout(Duration::from_secs(30), deleting)
        .await
        .expect("the delete completes once the cloud deletes")
        .expect("the delete's task");
    assert_eq!(answer.expect("deleted"), DeleteOutcome::Deleted);
    assert!(!emulator.vm_or_parts_exist(&id));
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
