//! Our chart beside the CoCo umbrella chart (`confidential-containers`), which carries cloud-api-adaptor's chart as
//! its `peerpods` subchart (confidential-containers/charts#54). The subchart's objects are CAA's chart's under other
//! owners: the umbrella's release (`coco`) in the umbrella's namespace (`kube-system`, as its README installs it),
//! with CAA's values under `peerpods.`. Installed as `examples/beside-coco-umbrella.yaml` says, ours cleans up the
//! PeerPods CAA records there. The same support as `alongside_caa.rs` (`caa`), with [`COCO_UMBRELLA`]. Runs on a
//! control plane of its own: it installs cluster-wide CRDs and CAA's fixed-name ClusterRoles.

use crate::caa::*;
use crate::support::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};

#[tokio::test(flavor = "multi_thread")]
async fn our_chart_installs_beside_the_coco_umbrella_chart_and_cleans_up_the_peerpods_caa_records()
{
    let cp = testenv::shared_for(module_path!());
    let admin = cp.client().await;
    let at = &COCO_UMBRELLA;
    let work = tempfile::tempdir().expect("temp dir");
    let kept_vm = uuid::Uuid::new_v4().to_string();
    let cleaned_vm = uuid::Uuid::new_v4().to_string();
    let chart =
        install_coco_umbrella(cp, work.path(), &[kept_vm.clone(), cleaned_vm.clone()]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    wait_established(&crds, PEERPODS_CRD).await;

    // CAA (its ServiceAccount is the umbrella release's) records the VM of a live Pod.
    let workloads = testenv::namespace(&admin, "workload").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &workloads);
    let caa = caa_client_at(cp, at).await;
    let live = workload_pod(&pods, "live").await;
    let live_peerpod = caa_records_vm(&caa, &live, &kept_vm).await;

    // 1. The subchart's cleanup controller off: CAA's own switch at the top of the umbrella's values reaches
    //    nothing; under `peerpods.` it removes upstream's peerpod-ctrl.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), at.namespace);
    let top_level = Beside {
        values_prefix: "",
        ..COCO_UMBRELLA
    };
    turn_off_upstream_controller_at(cp, &top_level, &chart).await;
    assert!(
        exists(&deployments, "peerpodctrl-controller-manager").await,
        "resourceCtrl.enabled=false at the umbrella's top level left the subchart alone"
    );
    turn_off_upstream_controller_at(cp, at, &chart).await;
    assert!(
        !exists(&deployments, "peerpodctrl-controller-manager").await,
        "peerpods.resourceCtrl.enabled=false removes upstream's peerpod-ctrl"
    );

    // 2. The CRDs, taken over from the subchart's crds/ as beside CAA's own chart.
    helm_ok(cp, &[&INSTALL_CRDS[..], &["--take-ownership"][..]].concat()).await;

    // 3. Ours in the umbrella's namespace with the example's values.
    install_ours_beside(cp, at).await;
    let peerpods: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &workloads, &peerpod_resource());
    assert!(exists(&peerpods, &live_peerpod).await);

    let ours = Ours::start_beside(cp, at, work.path()).await;
    let vms = ours.vms().await;
    assert!(
        vms.contains(&kept_vm) && vms.contains(&cleaned_vm),
        "{vms:?}"
    );
    caa_vm_cleaned_up(&caa, &pods, &peerpods, "doomed", &cleaned_vm).await;
    let vms = ours.vms().await;
    assert!(!vms.contains(&cleaned_vm), "VM {cleaned_vm} left: {vms:?}");
    assert!(vms.contains(&kept_vm), "the live Pod's VM went: {vms:?}");
    assert!(
        ours.peerpod_ctrl_caller
            .starts_with(&format!("{}/", at.namespace)),
        "our peerpod-ctrl runs in the umbrella's namespace: {}",
        ours.peerpod_ctrl_caller
    );
    assert_eq!(
        ours.delete_answers(),
        vec![(
            cleaned_vm.clone(),
            "deleted".to_owned(),
            ours.peerpod_ctrl_caller.clone()
        )],
        "one delete, of the deleted Pod's VM, by our peerpod-ctrl"
    );
    assert!(
        exists(&peerpods, &live_peerpod).await,
        "the live Pod's PeerPod stays"
    );
}
