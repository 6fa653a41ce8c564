//! Our chart beside cloud-api-adaptor's own (`peerpods` 0.4.0, CAA v0.22), installed as docs/alongside-caa.md
//! says: CAA's chart with `resourceCtrl.enabled=false`, the PeerPod CRD CAA's chart created from its `crds/`
//! directory taken over by `peerpods-crds` (`helm --take-ownership`), ours in CAA's namespace with
//! `examples/alongside-caa.yaml`. A PeerPod CAA's ServiceAccount records (with the RBAC of CAA's chart) is cleaned up
//! by our peerpod-ctrl. Each step that the documentation adds is first shown failing without it. Runs on a control
//! plane of its own (`testenv::shared_for`): it installs cluster-wide CRDs.

use crate::caa::*;
use crate::support::*;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject};

fn helm_owner(crd: &CustomResourceDefinition) -> (Option<String>, Option<String>) {
    let labels = crd.metadata.labels.clone().unwrap_or_default();
    let annotations = crd.metadata.annotations.clone().unwrap_or_default();
    (
        labels.get("app.kubernetes.io/managed-by").cloned(),
        annotations.get("meta.helm.sh/release-name").cloned(),
    )
}

fn printer_columns(crd: &CustomResourceDefinition) -> Vec<String> {
    crd.spec.versions[0]
        .additional_printer_columns
        .iter()
        .flatten()
        .map(|c| c.name.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn our_chart_installs_beside_caas_chart_and_cleans_up_the_peerpods_caa_records() {
    let cp = testenv::shared_for(module_path!());
    let admin = cp.client().await;
    let work = tempfile::tempdir().expect("temp dir");
    let kept_vm = uuid::Uuid::new_v4().to_string();
    let cleaned_vm = uuid::Uuid::new_v4().to_string();
    // CAA as its users run it today: upstream's peerpod-ctrl on, the PeerPod CRD from crds/ (no Helm metadata).
    let chart = install_caa(cp, work.path(), &[kept_vm.clone(), cleaned_vm.clone()]).await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd = crds.get(PEERPODS_CRD).await.expect("CAA's PeerPod CRD");
    assert_eq!(
        helm_owner(&crd),
        (None, None),
        "Helm installs a crds/ directory without ownership metadata"
    );
    wait_established(&crds, PEERPODS_CRD).await;

    // A workload CAA already runs: its PeerPod, recorded with the RBAC of CAA's chart.
    let workloads = testenv::namespace(&admin, "workload").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &workloads);
    let caa = caa_client(cp).await;
    let live = workload_pod(&pods, "live").await;
    let live_peerpod = caa_records_vm(&caa, &live, &kept_vm).await;

    // 1. CAA's cleanup controller off, so only ours acts on PeerPods.
    turn_off_upstream_controller(cp, &chart).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), CAA_NS);
    assert!(
        !exists(&deployments, "peerpodctrl-controller-manager").await,
        "resourceCtrl.enabled=false removes upstream's peerpod-ctrl"
    );

    // 2. The CRDs: Helm will not adopt CAA's PeerPod CRD by itself; with --take-ownership it does, and the
    //    CRD becomes ours (our schema and columns) with every PeerPod kept.
    let (ok, _, err) = helm(cp, &INSTALL_CRDS).await;
    assert!(
        !ok && err.contains("invalid ownership metadata"),
        "peerpods-crds installed over CAA's CRD without taking it over: {err}"
    );
    assert!(
        printer_columns(&crds.get(PEERPODS_CRD).await.expect("CRD")).is_empty(),
        "the refused install left CAA's CRD alone"
    );
    helm_ok(cp, &[&INSTALL_CRDS[..], &["--take-ownership"][..]].concat()).await;
    let crd = crds.get(PEERPODS_CRD).await.expect("PeerPod CRD");
    assert_eq!(
        helm_owner(&crd),
        (Some("Helm".into()), Some("peerpods-crds".into())),
        "peerpods-crds owns the PeerPod CRD"
    );
    let ours: CustomResourceDefinition = serde_saphyr::from_str(
        &std::fs::read_to_string(testenv::repo_root().join("deploy/crds/peerpods.yaml"))
            .expect("our PeerPod CRD"),
    )
    .expect("CRD YAML");
    assert!(
        !printer_columns(&ours).is_empty() && printer_columns(&crd) == printer_columns(&ours),
        "the CRD has our schema: {:?}",
        printer_columns(&crd)
    );
    assert!(
        exists(&crds, "peerpodconfigs.confidentialcontainers.org").await,
        "peerpods-crds installs the CRD CAA's chart lacks"
    );
    let peerpods: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &workloads, &peerpod_resource());
    assert!(
        exists(&peerpods, &live_peerpod).await,
        "the PeerPod made before the CRD changed hands is kept"
    );

    // 3. Ours in CAA's namespace. With the chart's defaults Helm refuses (CAA's chart owns ServiceAccount
    //    cloud-api-adaptor); with the example's values it installs, and renders nothing of peer-pod-config-ctrl.
    let (ok, _, err) = helm(
        cp,
        &[
            "install",
            "without-example",
            CHART,
            "--namespace",
            CAA_NS,
            "-f",
            DEV_VALUES,
        ],
    )
    .await;
    assert!(
        !ok && err.contains("\"cloud-api-adaptor\"") && err.contains("invalid ownership metadata"),
        "the chart's defaults installed beside CAA's chart: {err}"
    );
    install_ours(cp).await;
    let manifest = helm_ok(cp, &["get", "manifest", OUR_RELEASE, "--namespace", CAA_NS]).await;
    let config_ctrl: Vec<&str> = manifest
        .lines()
        .filter(|l| !l.trim_start().starts_with('#') && l.contains("peer-pod-config-ctrl"))
        .collect();
    assert!(
        config_ctrl.is_empty(),
        "peerPodConfigCtrl.enabled=false still renders: {config_ctrl:?}"
    );
    assert!(!exists(&deployments, &format!("{OUR_RELEASE}-peer-pod-config-ctrl")).await);
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), CAA_NS);
    assert!(
        !exists(&accounts, "peer-pods-webhook").await,
        "no webhook ServiceAccount without peer-pod-config-ctrl"
    );

    // Our provider-service (CAA's peer-pods-cm, its own credential) and peerpod-ctrl, as their ServiceAccounts.
    let ours = Ours::start(cp, work.path()).await;
    let vms = ours.vms().await;
    assert!(
        vms.contains(&kept_vm) && vms.contains(&cleaned_vm),
        "{vms:?}"
    );

    // The cleanup story: CAA (still caa_client: its ServiceAccount is CAA's chart's) records a VM; the Pod goes;
    // the garbage collector deletes the PeerPod; our peerpod-ctrl deletes the VM and releases the finalizer.
    let caa = caa_client(cp).await;
    caa_vm_cleaned_up(&caa, &pods, &peerpods, "doomed", &cleaned_vm).await;
    let vms = ours.vms().await;
    assert!(!vms.contains(&cleaned_vm), "VM {cleaned_vm} left: {vms:?}");
    assert!(vms.contains(&kept_vm), "the live Pod's VM went: {vms:?}");
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

    // The live Pod's PeerPod holds the finalizer: our release cannot be uninstalled until it is cleaned up.
    crate::uninstall::refused_while_a_peerpod_holds_the_finalizer_then_clean(
        cp,
        OUR_RELEASE,
        CAA_NS,
        &pods,
        "live",
        &live_peerpod,
    )
    .await;
    drop(ours);
}
