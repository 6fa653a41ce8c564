//! The PeerPod cleanup story on every cloud that has a local emulator, and on a byom pool: a Pod's PeerPod is deleted while CAA failed
//! to delete the VM → peerpod-ctrl asks provider-service (in-process, the real backend and its real client code)
//! → the VM and every part created with it are gone from the emulator → the finalizer is released.

use std::time::Duration;

use crate::support::{Controller, ControllerOptions, ProviderService, Scenario};
use kube::api::DeleteParams;
use test_support::byom::Pool;
use test_support::cloud::{self, CloudEmulator};

const MINUTE: Duration = Duration::from_secs(60);

/// One emulator per cloud; provider-service is configured for all of them at once, as one serving several clouds
/// would be.
fn emulators() -> Vec<Box<dyn CloudEmulator>> {
    vec![
        Box::new(peerpods_emulator_azure::AzureEmulator::start()),
        Box::new(peerpods_emulator_gcp::GcpEmulator::start().unwrap()),
        Box::new(peerpods_emulator_ibmcloud::VpcEmulator::start().unwrap()),
        Box::new(peerpods_emulator_ibmcloud::PowerVsEmulator::start().unwrap()),
        Box::new(peerpods_emulator_alibabacloud::AlibabaCloudEmulator::start()),
    ]
}

#[tokio::test(flavor = "multi_thread")]
async fn on_every_cloud_deleting_the_pod_deletes_its_vm_with_its_parts_and_releases_the_peerpod() {
    let s = Scenario::start("clouds").await;
    let clouds = emulators();
    // byom's "cloud" is a machine pool in this cluster, as cloud-api-adaptor keeps it.
    let pool = Pool::start(&["192.0.2.20", "192.0.2.21"]).await;
    pool.caa_allocate("192.0.2.20", "web-byom", "worker-0")
        .await;
    let mut names: Vec<&str> = clouds.iter().map(|c| c.provider()).collect();
    names.push("byom");
    let config = cloud::merged_config(
        &names,
        clouds
            .iter()
            .flat_map(|c| c.config())
            .chain(pool.config())
            .chain([(
                "BYOM_KUBECONFIG".to_owned(),
                testenv::shared().kubeconfig_path().display().to_string(),
            )]),
    );
    let provider = ProviderService::start_with_config(&config).await;
    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(provider.addr)).await;

    let mut cases = Vec::new();
    for cloud in &clouds {
        let pod_name = format!("web-{}", cloud.provider());
        let pod = s.create_pod(&pod_name).await;
        let vm = cloud.create_vm(&format!("podvm-{pod_name}"), &[]);
        assert!(
            cloud.vm_or_parts_exist(&vm),
            "{}: arranged",
            cloud.provider()
        );
        let peerpod = format!("{pod_name}-resource-abcde");
        s.create_peerpod(&peerpod, Some(&pod), cloud.provider(), &vm)
            .await;
        cases.push((cloud, pod_name, peerpod, vm));
    }
    let byom_pod = s.create_pod("web-byom").await;
    s.create_peerpod(
        "web-byom-resource-abcde",
        Some(&byom_pod),
        "byom",
        "192.0.2.20",
    )
    .await;
    for pod_name in cases
        .iter()
        .map(|(_, pod_name, _, _)| pod_name.as_str())
        .chain(["web-byom"])
    {
        s.pods()
            .delete(pod_name, &DeleteParams::background())
            .await
            .unwrap();
    }
    for (cloud, _, peerpod, vm) in &cases {
        s.wait_peerpod_gone(peerpod, MINUTE).await;
        assert!(
            !cloud.vm_or_parts_exist(vm),
            "{}: the VM and its parts are deleted before the PeerPod goes",
            cloud.provider()
        );
        assert_eq!(
            provider.delete_calls(cloud.provider()),
            1,
            "{}",
            cloud.provider()
        );
        s.wait_event_reason(peerpod, "InstanceDeleted").await;
    }
    s.wait_peerpod_gone("web-byom-resource-abcde", MINUTE).await;
    assert_eq!(
        pool.available().await,
        ["192.0.2.20", "192.0.2.21"],
        "byom: the machine is back in the pool before the PeerPod goes"
    );
    ctrl.stop().await;
    s.cleanup().await;
}

/// An Azure VM deletion takes minutes; here, several polls a second apart, longer than peerpod-ctrl's deadline of
/// one call (2 s). provider-service runs the delete to its end detached from the calls and answers "in progress"
/// meanwhile; peerpod-ctrl keeps the finalizer, shows DeleteInProgress and asks again after the advice. The
/// PeerPod goes only once the VM, its interface, public IP address and OS disk are all gone, while a persistent
/// volume's disk (attached `Detach`) stays; the cloud saw one VM delete, and no call ever failed.
#[tokio::test(flavor = "multi_thread")]
async fn an_azure_delete_slower_than_the_callers_deadline_releases_only_once_everything_owned_is_gone()
 {
    use peerpods_emulator_azure::{AzureEmulator, VmOptions};

    let s = Scenario::start("azure-slow").await;
    let azure = AzureEmulator::start();
    azure.set_operation_polls(8, 1);
    // The deletion engine looks at a VM ARM is deleting every AZURE_POLL_INTERVAL_MS: at 1 s, 8 looks take
    // longer than the controller's 2 s calls, so the delete is answered in progress first.
    let config = azure
        .config()
        .into_iter()
        .map(|(key, value)| match key.as_str() {
            "AZURE_POLL_INTERVAL_MS" => (key, "1000".to_owned()),
            _ => (key, value),
        });
    let provider =
        ProviderService::start_with_config(&cloud::merged_config(&["azure"], config)).await;
    let mut options = ControllerOptions::new(provider.addr);
    options.provider_timeout = Duration::from_secs(2);
    options.retry_cap = Duration::from_secs(5);
    let ctrl = Controller::start(s.client.clone(), options).await;

    let pod = s.create_pod("web-slow").await;
    let vm = azure.create_vm_with(
        "podvm-web-slow",
        &[],
        VmOptions {
            public_ip: true,
            parts_deleted_with_vm: false,
        },
    );
    let parts = azure.parts_of("podvm-web-slow").unwrap();
    assert!(azure.attach_data_disk("podvm-web-slow", "pvc-volume", "Detach"));
    let peerpod = "web-slow-resource-abcde";
    s.create_peerpod(peerpod, Some(&pod), "azure", &vm).await;
    s.pods()
        .delete("web-slow", &DeleteParams::background())
        .await
        .unwrap();

    let everything_gone = || {
        !azure.vm_exists("podvm-web-slow")
            && !azure.network_interface_exists(&parts.network_interface)
            && !azure.disk_exists(&parts.disk)
            && !parts
                .public_ip
                .as_deref()
                .is_some_and(|ip| azure.public_ip_exists(ip))
    };
    // Watch the PeerPod until it goes; at the moment it is seen gone, everything the VM owned must be gone too.
    let api = s.peerpods();
    let in_progress_seen = std::sync::atomic::AtomicBool::new(false);
    testenv::wait_for(
        "the PeerPod to be released",
        Duration::from_secs(120),
        || {
            let api = api.clone();
            let seen = &in_progress_seen;
            async move {
                match api.get_opt(peerpod).await.unwrap() {
                    Some(p) => {
                        if p.cleaned_condition()
                            .is_some_and(|c| c.reason == "DeleteInProgress" && c.status == "False")
                        {
                            seen.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        None
                    }
                    None => Some(()),
                }
            }
        },
    )
    .await;
    assert!(
        everything_gone(),
        "the finalizer was released before the VM and every part it owns were gone"
    );
    assert!(
        azure.disk_exists("pvc-volume"),
        "a Detach data disk outlives the VM"
    );
    assert!(
        in_progress_seen.load(std::sync::atomic::Ordering::Relaxed),
        "the condition showed the delete in progress"
    );
    assert_eq!(
        azure.arm_requests_matching("DELETE", "/virtualMachines/podvm-web-slow"),
        1,
        "one cloud delete, however many calls"
    );
    s.wait_event_reason(peerpod, "DeleteInProgress").await;
    let reasons = s.wait_event_reason(peerpod, "InstanceDeleted").await;
    assert!(
        reasons
            .iter()
            .all(|r| r == "DeleteInProgress" || r == "InstanceDeleted"),
        "no call failed, not even at the callers' deadline: {reasons:?}"
    );
    assert!(
        provider.delete_calls("azure") >= 2,
        "asked again after in progress"
    );
    ctrl.stop().await;
    s.cleanup().await;
}

/// The condition says who failed: with provider-service working and the cloud behind it answering every request
/// with its 5xx, the reason is the cloud's (`CloudUnavailable`), not provider-service's; once the cloud answers
/// again the VM is deleted and the PeerPod released.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_cloud_is_named_as_the_cloud_not_provider_service() {
    use test_support::faults::Faults;

    let s = Scenario::start("cloud-down").await;
    let azure = peerpods_emulator_azure::AzureEmulator::start();
    let provider =
        ProviderService::start_with_config(&cloud::merged_config(&["azure"], azure.config())).await;
    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(provider.addr)).await;
    let vm = azure.create_vm("podvm-cloud-down", &[]);
    azure.set_faults(Faults {
        server_error_rate: 1.0,
        ..Faults::default()
    });
    s.create_peerpod("cloud-down", None, "azure", &vm).await;
    s.delete_peerpod("cloud-down").await;

    let held = s
        .wait_peerpod("cloud-down", "condition CloudUnavailable", |p| {
            p.cleaned_condition()
                .is_some_and(|c| c.status == "False" && c.reason == "CloudUnavailable")
        })
        .await;
    let message = &held.cleaned_condition().unwrap().message;
    assert!(message.chars().count() <= 400, "{message}");
    assert!(azure.vm_or_parts_exist(&vm));
    assert!(
        ctrl.metric(
            "peerpod_ctrl_reconcile_errors_total",
            &[("reason", "CloudUnavailable")]
        ) >= 1
    );

    azure.set_faults(Faults::default());
    s.wait_peerpod_gone("cloud-down", MINUTE * 2).await;
    assert!(!azure.vm_or_parts_exist(&vm));
}

/// Throttling is a rate, not an outage: with the cloud throttling every request, each PeerPod retries after the
/// cloud's Retry-After on its own, and the circuit breaker holds none of them back (it would stall cleanups
/// for minutes under partial throttling, where most calls meet one throttled request among several). Once the
/// cloud serves again, every VM is deleted and every PeerPod released.
#[tokio::test(flavor = "multi_thread")]
async fn a_throttling_cloud_slows_each_peerpod_but_the_circuit_breaker_holds_none_back() {
    use test_support::faults::Faults;
    const N: usize = 4;

    let s = Scenario::start("throttled").await;
    let azure = peerpods_emulator_azure::AzureEmulator::start();
    let provider =
        ProviderService::start_with_config(&cloud::merged_config(&["azure"], azure.config())).await;
    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(provider.addr)).await;
    let vms: Vec<String> = (0..N)
        .map(|i| azure.create_vm(&format!("podvm-throttled-{i}"), &[]))
        .collect();
    azure.set_faults(Faults {
        throttle_rate: 1.0,
        ..Faults::default()
    });
    for (i, vm) in vms.iter().enumerate() {
        let name = format!("throttled-{i}");
        s.create_peerpod(&name, None, "azure", vm).await;
        s.delete_peerpod(&name).await;
    }

    // Calls made and failed throttled, and calls the breaker held back, until there are three per PeerPod.
    let throttled = || {
        ctrl.metric(
            "peerpod_ctrl_instance_deletes_total",
            &[("provider", "azure"), ("result", "CloudThrottled")],
        )
    };
    let held = || {
        ctrl.metric(
            "peerpod_ctrl_instance_deletes_total",
            &[("provider", "azure"), ("result", "CircuitOpen")],
        )
    };
    testenv::wait_for("three answers per PeerPod", MINUTE * 2, || async {
        (throttled() + held() >= 3 * N as u64).then_some(())
    })
    .await;
    assert_eq!(held(), 0, "{} throttled calls", throttled());
    for i in 0..N {
        let p = s.peerpods().get(&format!("throttled-{i}")).await.unwrap();
        let condition = p.cleaned_condition().unwrap();
        assert_eq!(
            (condition.status.as_str(), condition.reason.as_str()),
            ("False", "CloudThrottled")
        );
    }
    assert!(vms.iter().all(|vm| azure.vm_or_parts_exist(vm)));

    azure.set_faults(Faults::default());
    for i in 0..N {
        s.wait_peerpod_gone(&format!("throttled-{i}"), MINUTE * 2)
            .await;
    }
    assert!(vms.iter().all(|vm| !azure.vm_or_parts_exist(vm)));
    ctrl.stop().await;
    s.cleanup().await;
}
