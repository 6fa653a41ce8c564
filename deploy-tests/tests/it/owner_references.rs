//! cloud-api-adaptor on a cluster that enforces owner-reference permissions (the `OwnerReferencesPermissionEnforcement`
//! admission plugin, on by default in OpenShift). CAA's PeerPod has an owner reference to its Pod with
//! `blockOwnerDeletion: true`; under that plugin whoever sets it needs `update` on `pods/finalizers`. CAA's own chart
//! (`peerpods` 0.4.0) does not grant it: installed beside it as docs/alongside-caa.md says, ours does. Runs on a
//! control plane of its own, the only one here with that plugin on.

use std::sync::OnceLock;

use crate::caa::*;
use crate::support::*;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};

/// The admission plugin that checks who may set `blockOwnerDeletion`.
const PLUGIN: &str = "OwnerReferencesPermissionEnforcement";

fn enforcing_control_plane() -> &'static testenv::ControlPlane {
    static CP: OnceLock<testenv::ControlPlane> = OnceLock::new();
    CP.get_or_init(|| {
        testenv::ControlPlane::start_with(testenv::Options {
            admission_plugins: vec![PLUGIN.to_owned()],
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("control plane with {PLUGIN}: {e}"))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn caa_creates_its_peerpod_with_block_owner_deletion_once_our_chart_is_installed() {
    let cp = enforcing_control_plane();
    let admin = cp.client().await;
    let work = tempfile::tempdir().expect("temp dir");
    let chart = install_caa(cp, work.path(), &[]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    wait_established(&crds, PEERPODS_CRD).await;
    let workloads = testenv::namespace(&admin, "workload").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &workloads);
    let pod = workload_pod(&pods, "confidential").await;
    let vm = uuid::Uuid::new_v4().to_string();

    // CAA's chart alone: its ServiceAccount may create PeerPods, but not block its Pod's deletion.
    let caa = caa_client(cp).await;
    match caa_creates_peerpod(&caa, &pod, &vm).await {
        Err(kube::Error::Api(status))
            if status.code == 403 && status.message.contains("cannot set blockOwnerDeletion") => {}
        other => panic!("with CAA's chart alone, {PLUGIN} refuses CAA's PeerPod: {other:?}"),
    }

    // Ours beside it, as docs/alongside-caa.md installs it.
    turn_off_upstream_controller(cp, &chart).await;
    helm_ok(cp, &[&INSTALL_CRDS[..], &["--take-ownership"][..]].concat()).await;
    install_ours(cp).await;

    let name = caa_creates_peerpod(&caa, &pod, &vm)
        .await
        .unwrap_or_else(|e| panic!("CAA creates its PeerPod under {PLUGIN}: {e}"));
    let peerpod = Api::<DynamicObject>::namespaced_with(admin, &workloads, &peerpod_resource())
        .get(&name)
        .await
        .expect("CAA's PeerPod");
    let owners = peerpod.metadata.owner_references.unwrap_or_default();
    assert!(
        owners.len() == 1
            && owners[0].uid == pod.metadata.uid.clone().unwrap_or_default()
            && owners[0].block_owner_deletion == Some(true),
        "the PeerPod blocks its Pod's deletion: {owners:?}"
    );
}
