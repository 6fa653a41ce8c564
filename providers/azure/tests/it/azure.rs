//! The Azure provider against the Azure emulator, through the `Provider` trait, with the real
//! azure_core pipeline and azure_identity credentials (tokens from the emulator's Entra ID).

use crate::azure_support::{provider, unknown_id};
use peerpods_emulator_azure::{AzureEmulator, VmOptions, VmParts};
use peerpods_provider_core::{DeleteOutcome, Error, Figure, Provider, TagSelector};
use test_support::cloud::CloudEmulator;
use test_support::provider_checks;

fn selector(pairs: &[(&str, &str)]) -> TagSelector {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A VM as cloud-api-adaptor creates it with a public IP (and a network interface and an OS
/// disk); `parts_deleted_with_vm` is their deleteOption: Delete, or Detach (ARM leaves them
/// behind). Returns its id.
fn vm_with_public_ip(emulator: &AzureEmulator, name: &str, parts_deleted_with_vm: bool) -> String {
    emulator.create_vm_with(
        name,
        &[],
        VmOptions {
            public_ip: true,
            parts_deleted_with_vm,
        },
    )
}

/// Neither the VM named `name` nor its network interface, public IP or OS disk exists.
fn assert_vm_and_parts_gone(emulator: &AzureEmulator, name: &str, parts: &VmParts) {
    assert!(!emulator.vm_exists(name), "{name}");
    assert!(
        !emulator.network_interface_exists(&parts.network_interface),
        "{name}: {parts:?}"
    );
    assert!(
        !emulator.public_ip_exists(parts.public_ip.as_deref().expect("ip")),
        "{name}: {parts:?}"
    );
    assert!(!emulator.disk_exists(&parts.disk), "{name}: {parts:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_vm_removes_it_and_the_parts_caa_created_with_it() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-web-1a2b3c4d", &[("cluster", "c1")]);
    let (provider, calls) = provider(&emulator, &[]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(!emulator.vm_or_parts_exist(&id));
    // ARM's 202 is not followed: the VM is looked up at the pace while ARM shows it Deleting.
    assert_eq!(calls.count("azure", "DeleteVirtualMachine", "ok"), 1);
    assert_eq!(calls.count("azure", "GetOperationStatus", "ok"), 0);
    assert_eq!(calls.count("azure", "GetVirtualMachine", "ok"), 2);
    // Confirmed by lookups: the VM, its interface and its OS disk answer 404 (ARM removed the
    // parts marked Delete with it, so nothing is deleted twice). What one confirmed delete
    // costs: GET VM, GET interface and disk (their tags, for the guard), DELETE VM, GET VM
    // (Deleting), then 3 GETs answered 404.
    assert_eq!(calls.count("azure", "GetVirtualMachine", "error"), 1);
    assert_eq!(calls.count("azure", "GetNetworkInterface", "error"), 1);
    assert_eq!(calls.count("azure", "GetDisk", "error"), 1);
    assert_eq!(calls.count("azure", "DeleteNetworkInterface", "ok"), 0);
    assert_eq!(emulator.arm_requests().len(), 8);
}

#[tokio::test(flavor = "multi_thread")]
async fn parts_that_arm_keeps_are_deleted_explicitly_in_dependency_order() {
    let emulator = AzureEmulator::start();
    // deleteOption: Detach — ARM leaves the network interface, public IP and disk behind.
    let id = vm_with_public_ip(&emulator, "podvm-db-5e6f7a8b", false);
    let parts = emulator.parts_of("podvm-db-5e6f7a8b").expect("parts");
    let (provider, calls) = provider(&emulator, &[]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_vm_and_parts_gone(&emulator, "podvm-db-5e6f7a8b", &parts);
    assert!(!emulator.vm_or_parts_exist(&id));
    for operation in [
        "DeleteNetworkInterface",
        "DeletePublicIPAddress",
        "DeleteDisk",
    ] {
        assert_eq!(calls.count("azure", operation, "ok"), 1, "{operation}");
        assert_eq!(calls.count("azure", operation, "error"), 0, "{operation}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_long_deletion_is_looked_up_at_the_pace_until_arm_shows_it_gone() {
    let emulator = AzureEmulator::start();
    emulator.set_operation_polls(3, 1);
    let id = emulator.create_vm("podvm-slow", &[]);
    let (provider, calls) = provider(&emulator, &[("AZURE_POLL_INTERVAL_MS", "200")]);

    let started = std::time::Instant::now();
    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(!emulator.vm_or_parts_exist(&id));
    // No operation polls: the VM itself, shown Deleting three times, then 404.
    assert_eq!(calls.count("azure", "GetOperationStatus", "ok"), 0);
    assert_eq!(calls.count("azure", "GetVirtualMachine", "ok"), 4);
    assert_eq!(calls.count("azure", "GetVirtualMachine", "error"), 1);
    assert_eq!(calls.count("azure", "DeleteVirtualMachine", "ok"), 1);
    // AZURE_POLL_INTERVAL_MS before each of the four looks after the DELETE.
    assert!(started.elapsed() >= std::time::Duration::from_millis(800));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_persistent_volumes_detached_disk_survives_and_only_the_vms_own_parts_go() {
    let emulator = AzureEmulator::start();
    // As cloud-api-adaptor creates it: interface, public IP and OS disk with deleteOption
    // Delete. The Azure Disk CSI driver then attached a PVC's pre-existing managed disk as a
    // data disk with deleteOption Detach; a scratch data disk goes with the VM.
    let name = "podvm-db-5e6f7a8b";
    let id = vm_with_public_ip(&emulator, name, true);
    let volume = "pvc-3f2a9c1e-7b4d-4e55-9a61-0c2b8d7e6f10";
    assert!(emulator.attach_data_disk(name, volume, "Detach"));
    assert!(emulator.attach_data_disk(name, "podvm-db-scratch", "Delete"));
    let parts = emulator.parts_of(name).expect("parts");
    let (provider, _) = provider(&emulator, &[]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(
        emulator.disk_exists(volume),
        "the user's volume was deleted"
    );
    assert_eq!(
        emulator.arm_requests_matching("DELETE", &format!("/disks/{volume}")),
        0
    );
    assert_vm_and_parts_gone(&emulator, name, &parts);
    assert!(!emulator.disk_exists("podvm-db-scratch"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delete_cut_off_by_its_caller_resumes_without_a_second_delete() {
    let emulator = AzureEmulator::start();
    // ARM takes six looks at 300 ms each to delete the VM: longer than the caller lets the
    // first call run (provider-service's detached delete bounds each attempt).
    emulator.set_operation_polls(6, 1);
    let name = "podvm-slow-9c8d7e6f";
    let id = vm_with_public_ip(&emulator, name, true);
    let parts = emulator.parts_of(name).expect("parts");
    // AZURE_DELETE_TIMEOUT_SECONDS is still accepted, and bounds nothing any more.
    let (provider, _) = provider(
        &emulator,
        &[
            ("AZURE_POLL_INTERVAL_MS", "300"),
            ("AZURE_DELETE_TIMEOUT_SECONDS", "1"),
        ],
    );

    let cut_off = tokio::time::timeout(
        std::time::Duration::from_millis(700),
        provider.delete_instance(&id),
    )
    .await;
    assert!(cut_off.is_err(), "the first call cannot have seen the end");
    assert!(emulator.vm_exists(name), "ARM is still deleting it");

    let started = std::time::Instant::now();
    let outcome = provider.delete_instance(&id).await.expect("resumed");

    // The answer of done comes only when the VM and each of its parts is gone, past the old
    // one-second bound.
    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(started.elapsed() > std::time::Duration::from_secs(1));
    assert_vm_and_parts_gone(&emulator, name, &parts);
    // The second call follows the deletion (ARM shows it Deleting) instead of asking again.
    assert_eq!(
        emulator.arm_requests_matching("DELETE", "/virtualMachines/"),
        1
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn parts_a_vanished_vm_left_behind_are_found_by_caa_names_and_deleted() {
    let emulator = AzureEmulator::start();
    // A deletion cut off after ARM removed the VM but before its Detach parts went: the VM is
    // gone, its interface, public IP and OS disk remain.
    emulator.set_operation_polls(0, 0);
    let name = "podvm-cut-1f2e3d4c";
    let id = vm_with_public_ip(&emulator, name, false);
    let parts = emulator.parts_of(name).expect("parts");
    assert!(emulator.start_deleting(name));
    // A VM an earlier process deleted: its 404 is believed at once here (the window at zero);
    // the window's own rule is checked in deleting_twice_is_already_gone_and_an_unknown_vm_only_after_the_window.
    let (provider, _) = provider(&emulator, &[("AZURE_NOT_FOUND_WINDOW_SECS", "0")]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    // Not shown in this call: already gone, once what it left behind is gone too.
    assert_eq!(outcome, DeleteOutcome::AlreadyGone);
    assert!(!emulator.vm_or_parts_exist(&id));
    assert_vm_and_parts_gone(&emulator, name, &parts);
    for operation in ["/networkInterfaces/", "/publicIPAddresses/", "/disks/"] {
        assert_eq!(
            emulator.arm_requests_matching("DELETE", operation),
            1,
            "{operation}"
        );
    }
    assert_eq!(
        provider.delete_instance(&id).await.expect("again"),
        DeleteOutcome::AlreadyGone
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn an_interface_arm_still_reserves_for_the_deleted_vm_is_asked_again() {
    let emulator = AzureEmulator::start();
    emulator.reserve_nics_after_delete(2);
    let name = "podvm-held-7a6b5c4d";
    let id = emulator.create_vm_with(
        name,
        &[],
        VmOptions {
            public_ip: false,
            parts_deleted_with_vm: false,
        },
    );
    let parts = emulator.parts_of(name).expect("parts");
    let (provider, calls) = provider(&emulator, &[]);

    let outcome = provider.delete_instance(&id).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(!emulator.network_interface_exists(&parts.network_interface));
    assert!(!emulator.vm_or_parts_exist(&id));
    // Refused twice while reserved, then deleted.
    assert_eq!(calls.count("azure", "DeleteNetworkInterface", "error"), 2);
    assert_eq!(calls.count("azure", "DeleteNetworkInterface", "ok"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_twice_is_already_gone_and_an_unknown_vm_only_after_the_window() {
    let emulator = AzureEmulator::start();
    let (provider, _) = provider(&emulator, &[]);

    provider_checks::deleting_twice_is_already_gone(&emulator, &provider, "podvm-twice").await;
    // A VM never seen deleted by this process is not believed gone on its first 404 (it may be
    // one created moments ago, whose parts must not be deleted under it): retryable.
    provider_checks::an_unknown_vm_is_not_gone_inside_the_not_found_window(
        &emulator,
        &provider,
        &unknown_id("never-existed"),
        "AZURE_NOT_FOUND_WINDOW_SECS",
    )
    .await;
    // With the window at zero a 404 is trusted at once.
    let (trusting, _) =
        crate::azure_support::provider(&emulator, &[("AZURE_NOT_FOUND_WINDOW_SECS", "0")]);
    provider_checks::already_gone(&emulator, &trusting, &unknown_id("never-existed")).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_already_being_deleted_counts_as_deleted_without_a_second_delete() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-going", &[]);
    assert!(emulator.start_deleting("podvm-going"));
    let (provider, _) = provider(&emulator, &[]);

    // Answered only once ARM's deletion ended and the VM and its parts are gone.
    provider_checks::a_vm_the_cloud_is_deleting_is_deleted_once_gone(&emulator, &provider, &id)
        .await;
    assert_eq!(emulator.arm_requests_matching("DELETE", ""), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn ids_are_case_insensitive_as_in_arm() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-case", &[]);
    let (provider, _) = provider(&emulator, &[]);
    let shouted = id
        .replace("resourceGroups", "RESOURCEGROUPS")
        .replace("Microsoft.Compute", "microsoft.compute")
        .replace("podvm-case", "PODVM-CASE");

    assert_eq!(
        provider.delete_instance(&shouted).await.expect("delete"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_or_foreign_ids_are_invalid_without_any_request() {
    let emulator = AzureEmulator::start();
    let (provider, _) = provider(&emulator, &[]);
    let other_group = unknown_id("vm").replace("peerpods-rg", "someone-elses-rg");
    let cases = [
        ("", "empty"),
        ("i-0123456789abcdef0", "must start with '/'"),
        ("podvm-web-1a2b3c4d", "must start with '/'"),
        (
            "/subscriptions/not-a-guid/resourceGroups/peerpods-rg/providers/Microsoft.Compute/virtualMachines/vm",
            "GUID",
        ),
        (
            &unknown_id("vm").replace("virtualMachines", "disks"),
            "virtualMachines",
        ),
        (&unknown_id("vm?api-version=1"), "'?'"),
        (&format!("{}/extensions/x", unknown_id("vm")), "segments"),
        (&other_group, "someone-elses-rg"),
    ];
    let ids: Vec<&str> = cases.iter().map(|(id, _)| *id).collect();
    let messages = provider_checks::malformed_ids_are_invalid_without_any_request(
        &emulator,
        &provider,
        &ids,
        &unknown_id("podvm-ok"),
    )
    .await;
    for ((id, expected), message) in cases.iter().zip(&messages) {
        assert!(message.contains(expected), "{id}: {message}");
    }
    assert!(emulator.arm_requests().is_empty());
    assert_eq!(emulator.token_requests(), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_is_reported_with_arms_retry_after() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-busy", &[]);
    let (provider, calls) = provider(&emulator, &[]);
    emulator.throttle_next(1, 17);

    let error = provider_checks::throttling_is_reported_with_the_clouds_wait(
        &emulator,
        &provider,
        &id,
        std::time::Duration::from_secs(17),
    )
    .await;

    assert!(error.to_string().contains("TooManyRequests"), "{error}");
    assert!(emulator.vm_exists("podvm-busy"));
    assert_eq!(calls.count("azure", "GetVirtualMachine", "throttled"), 1);
    // Not retried inside: the caller decides when to come back.
    assert_eq!(emulator.arm_requests().len(), 1);
    provider_checks::deleted(&emulator, &provider, &id).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_then_succeed() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-flaky", &[]);
    let (provider, calls) = provider(&emulator, &[]);
    emulator.fail_next(2, 503);

    assert_eq!(
        provider.delete_instance(&id).await.expect("retried"),
        DeleteOutcome::Deleted
    );
    assert!(!emulator.vm_or_parts_exist(&id));
    // Two 503s retried, then the VM read (and read Deleting); the last lookup's 404 confirms it
    // gone.
    assert_eq!(calls.count("azure", "GetVirtualMachine", "error"), 3);
    assert_eq!(calls.count("azure", "GetVirtualMachine", "ok"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn lasting_server_errors_end_as_unavailable_after_bounded_retries() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-down", &[]);
    let (provider, calls) = provider(&emulator, &[("AZURE_MAX_RETRIES", "2")]);
    emulator.fail_next(10, 500);

    let error = provider.delete_instance(&id).await.expect_err("down");

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(error.to_string().contains("InternalServerError"), "{error}");
    assert_eq!(calls.count("azure", "GetVirtualMachine", "error"), 3);
    assert_eq!(emulator.arm_requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_reports_the_regional_vm_and_vcpu_quotas() {
    let emulator = AzureEmulator::start();
    emulator.set_quota(40, 64);
    for name in ["a", "b", "c"] {
        emulator.create_vm(&format!("podvm-{name}"), &[]);
    }
    let (provider, calls) = provider(&emulator, &[]);

    let capacity = provider.capacity().await.expect("capacity");

    assert_eq!(
        capacity.instances,
        Figure {
            limit: Some(40),
            in_use: Some(3)
        }
    );
    assert_eq!(
        capacity.vcpus,
        Figure {
            limit: Some(64),
            in_use: Some(6)
        }
    );
    assert_eq!(
        capacity.memory_mib,
        Figure::default(),
        "ARM has no memory quota"
    );
    assert_eq!(calls.count("azure", "ListUsages", "ok"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn listing_follows_next_link_and_keeps_only_vms_with_every_selected_tag() {
    let emulator = AzureEmulator::start();
    emulator.set_page_size(2);
    let mine: Vec<String> = ["m3", "m1", "m2"]
        .iter()
        .map(|n| {
            emulator.create_vm(
                &format!("podvm-{n}"),
                &[("cluster", "c1"), ("team", "pods")],
            )
        })
        .collect();
    emulator.create_vm("podvm-other", &[("cluster", "c2"), ("team", "pods")]);
    emulator.create_vm("podvm-untagged", &[]);
    emulator.create_vm("podvm-half", &[("cluster", "c1")]);
    let (provider, calls) = provider(&emulator, &[]);

    let listed = provider
        .list_instances(&selector(&[("cluster", "c1"), ("team", "pods")]))
        .await
        .expect("list");

    let mut expected = mine.clone();
    expected.sort();
    let ids: Vec<&str> = listed.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, expected);
    assert!(listed.iter().all(|i| i.created.is_some()));
    assert_eq!(listed[0].tags.get("team").map(String::as_str), Some("pods"));
    // Six VMs at two per page.
    assert_eq!(calls.count("azure", "ListVirtualMachines", "ok"), 3);

    let everything = provider
        .list_instances(&TagSelector::new())
        .await
        .expect("all");
    assert_eq!(everything.len(), 6);
}

#[tokio::test(flavor = "multi_thread")]
async fn health_is_one_authenticated_call() {
    let emulator = AzureEmulator::start();
    let (provider, calls) = provider(&emulator, &[]);

    provider_checks::health_is_one_request(&emulator, &provider).await;

    assert_eq!(emulator.arm_requests().len(), 1);
    assert_eq!(calls.count("azure", "ListUsages", "ok"), 1);
    assert_eq!(calls.count("azure", "AcquireToken", "ok"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn one_token_serves_many_calls_and_every_call_is_counted() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-count", &[]);
    let (provider, calls) = provider(&emulator, &[]);

    provider.delete_instance(&id).await.expect("delete");
    provider.capacity().await.expect("capacity");

    assert_eq!(emulator.token_requests(), 1);
    assert_eq!(calls.count("azure", "AcquireToken", "ok"), 1);
    // Every answer counted once: ok, or error for the 404s that confirm a part gone.
    let counted: u64 = [
        "GetVirtualMachine",
        "GetNetworkInterface",
        "GetDisk",
        "DeleteVirtualMachine",
        "GetOperationStatus",
        "ListUsages",
    ]
    .iter()
    .flat_map(|op| ["ok", "error"].map(|result| calls.count("azure", op, result)))
    .sum();
    assert_eq!(counted, emulator.arm_requests().len() as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_tag_protects_other_vms_from_deletion() {
    let emulator = AzureEmulator::start();
    let ours = emulator.create_vm("podvm-ours", &[("peerpods.io/cluster", "prod")]);
    let theirs = emulator.create_vm("podvm-theirs", &[("peerpods.io/cluster", "dev")]);
    let (provider, _) = provider(&emulator, &[("CLUSTER_TAG", "peerpods.io/cluster=prod")]);

    provider_checks::another_clusters_vm_is_refused_and_kept(
        &emulator,
        &provider,
        &ours,
        &[&theirs],
    )
    .await;
    assert!(emulator.vm_exists("podvm-theirs"));
}

/// A VM tagged `peerpods-do-not-delete` (the spelling Azure tag names allow) is refused with
/// `DoNotDelete` even when untagged deletes are allowed, and stays; `false` does not protect.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_marked_do_not_delete_is_never_deleted() {
    let emulator = AzureEmulator::start();
    let (provider, _) = provider(
        &emulator,
        &[
            ("CLUSTER_TAG", "peerpods.io/cluster=prod"),
            ("DELETE_UNTAGGED", "allow"),
        ],
    );

    let checked =
        provider_checks::a_vm_marked_do_not_delete_is_refused_and_kept(&emulator, &provider).await;

    assert!(emulator.vm_exists("podvm-kept"));
    assert_eq!(checked.requests_for_the_refusal, 1, "only the lookup");
    assert!(!emulator.vm_exists("podvm-unmarked"));
}

/// The case: a DeleteInstance caller names a VM that does not exist, and a managed disk
/// carries the name cloud-api-adaptor would have given its OS disk. Past the window such a disk
/// is the VM's leftover only if the guard allows it, as for any part: without this cluster's
/// tag, or marked do-not-delete, it survives (and is never sent a DELETE); with the tag it goes.
#[tokio::test(flavor = "multi_thread")]
async fn a_leftover_disk_without_this_clusters_tag_or_marked_do_not_delete_survives() {
    let emulator = AzureEmulator::start();
    let ours = [("peerpods-cluster", "prod")];
    emulator.create_disk("podvm-untagged-disk", &[("peerpods-cluster", "dev")]);
    emulator.create_disk(
        "podvm-marked-disk",
        &[
            ("peerpods-cluster", "prod"),
            ("peerpods-do-not-delete", "true"),
        ],
    );
    emulator.create_disk("podvm-left-disk", &ours);
    let (provider, calls) = provider(
        &emulator,
        &[
            ("CLUSTER_TAG", "peerpods-cluster=prod"),
            ("AZURE_NOT_FOUND_WINDOW_SECS", "0"),
        ],
    );

    for vm in ["podvm-untagged", "podvm-marked"] {
        let outcome = provider
            .delete_instance(&unknown_id(vm))
            .await
            .expect("delete");
        assert_eq!(outcome, DeleteOutcome::AlreadyGone, "{vm}");
        assert!(emulator.disk_exists(&format!("{vm}-disk")), "{vm}-disk");
    }
    assert_eq!(emulator.arm_requests_matching("DELETE", "/disks/"), 0);
    assert_eq!(calls.count("azure", "DeleteDisk", "ok"), 0);

    // A leftover that carries this cluster's tag and no mark is deleted.
    assert_eq!(
        provider
            .delete_instance(&unknown_id("podvm-left"))
            .await
            .expect("delete"),
        DeleteOutcome::AlreadyGone
    );
    assert!(!emulator.disk_exists("podvm-left-disk"));
    assert_eq!(emulator.arm_requests_matching("DELETE", "/disks/"), 1);
}

/// The same guard holds when the disk is left behind by a VM this process deleted: with a
/// cluster tag required, a part that lacks it is kept even though cloud-api-adaptor's name ties
/// it to the VM.
#[tokio::test(flavor = "multi_thread")]
async fn a_detached_part_without_this_clusters_tag_is_kept_when_its_vm_goes() {
    let emulator = AzureEmulator::start();
    let name = "podvm-mixed-2b3c4d5e";
    // Parts ARM keeps (Detach), with the VM's tags; then its OS disk loses them (creating a
    // disk of an existing name replaces its tags).
    let id = emulator.create_vm_with(
        name,
        &[("peerpods-cluster", "prod")],
        VmOptions {
            public_ip: false,
            parts_deleted_with_vm: false,
        },
    );
    let parts = emulator.parts_of(name).expect("parts");
    emulator.create_disk(&parts.disk, &[]);
    let (provider, _) = provider(&emulator, &[("CLUSTER_TAG", "peerpods-cluster=prod")]);

    assert_eq!(
        provider.delete_instance(&id).await.expect("delete"),
        DeleteOutcome::Deleted
    );

    assert!(!emulator.vm_exists(name));
    // The interface carries the VM's tags and goes; the untagged disk stays.
    assert!(!emulator.network_interface_exists(&parts.network_interface));
    assert!(emulator.disk_exists(&parts.disk));
    assert_eq!(emulator.arm_requests_matching("DELETE", "/disks/"), 0);
}

/// The not-found window is keyed by the VM's full identity in ARM's canonical (case-insensitive)
/// form, not by the name as one caller spelt it: a VM deleted under one spelling is gone under
/// any other at once, and an id of another resource group is not this provider's at all (the
/// deleter's keys of two same-named VMs in different groups are checked in the crate's unit
/// tests).
#[tokio::test(flavor = "multi_thread")]
async fn the_not_found_window_is_keyed_by_the_vms_full_identity() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-spelled", &[]);
    let (provider, _) = provider(&emulator, &[]);

    provider_checks::deleted(&emulator, &provider, &id).await;

    let shouted = id
        .replace("resourceGroups", "resourcegroups")
        .replace("peerpods-rg", "PEERPODS-RG")
        .replace("podvm-spelled", "PODVM-Spelled");
    assert_eq!(
        provider.delete_instance(&shouted).await.expect("again"),
        DeleteOutcome::AlreadyGone,
        "the same VM: its accepted delete confirms the 404"
    );
    // Another VM's 404 is judged on its own.
    provider_checks::an_unknown_vm_is_not_gone_inside_the_not_found_window(
        &emulator,
        &provider,
        &unknown_id("podvm-spelled-2"),
        "AZURE_NOT_FOUND_WINDOW_SECS",
    )
    .await;
    let other_group = id.replace("peerpods-rg", "other-rg");
    assert!(matches!(
        provider.delete_instance(&other_group).await,
        Err(Error::InvalidArgument { .. })
    ));
}
