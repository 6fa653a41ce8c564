//! The PeerPod cleanup story on every cloud that has a local emulator, and on a byom pool: a Pod's PeerPod is deleted while CAA failed
//! to delete the VM → peerpod-ctrl asks provider-service (in-process, the real backend and its real client code)
//! → the VM and every part created with it are gone from the emulator → the finalizer is released.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod support;

use std::time::Duration;

use kube::api::DeleteParams;
use support::{Controller, ControllerOptions, ProviderService, Scenario};
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
        let reasons = s.event_reasons(peerpod).await;
        assert!(
            reasons.contains(&"InstanceDeleted".to_string()),
            "{}: {reasons:?}",
            cloud.provider()
        );
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
