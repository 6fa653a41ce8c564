//! The CRDs' upgrade path: the `peerpods-crds` chart owns the CRDs as ordinary templates, so `helm upgrade`
//! applies a changed CRD (Helm never upgrades a chart's crds/ directory), existing objects survive the upgrade,
//! and uninstalling the release keeps the CRDs (and so every PeerPod). The application chart installs next to
//! it, skipping the CRDs that already exist. Runs on a control plane of its own (`testenv::shared_for`): it
//! changes cluster-wide CRDs.

use std::path::Path;

use crate::support::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};

const CRD_CHART: &str = "deploy/chart/peerpods-crds";
const PEERPODS_CRD: &str = "peerpods.confidentialcontainers.org";
const COLUMN: &str = "Cloud provider that runs the VM";

/// A copy of the CRD chart with its CRD files in place of the link; `edit` may change the PeerPod CRD's text.
fn chart_copy(dir: &Path, version: &str, edit: impl Fn(String) -> String) {
    let root = testenv::repo_root();
    std::fs::create_dir_all(dir.join("templates")).expect("chart dirs");
    std::fs::create_dir_all(dir.join("files")).expect("chart dirs");
    let chart =
        std::fs::read_to_string(root.join(CRD_CHART).join("Chart.yaml")).expect("Chart.yaml");
    std::fs::write(
        dir.join("Chart.yaml"),
        chart.replace("version: 0.1.0", &format!("version: {version}")),
    )
    .expect("Chart.yaml");
    for file in ["values.yaml", "templates/crds.yaml"] {
        std::fs::copy(root.join(CRD_CHART).join(file), dir.join(file)).expect("chart file");
    }
    for crd in ["peerpods.yaml", "peerpodconfigs.yaml"] {
        let text = std::fs::read_to_string(root.join("deploy/crds").join(crd)).expect("CRD");
        let text = if crd == "peerpods.yaml" {
            edit(text)
        } else {
            text
        };
        std::fs::write(dir.join("files").join(crd), text).expect("CRD copy");
    }
}

fn provider_column(crd: &CustomResourceDefinition) -> Option<String> {
    crd.spec.versions[0]
        .additional_printer_columns
        .as_ref()?
        .iter()
        .find(|c| c.name == "Cloud Provider")?
        .description
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn helm_upgrade_of_the_crd_chart_changes_the_crds_and_keeps_the_objects() {
    let cp = testenv::shared_for(module_path!());
    let admin = cp.client().await;
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let helm = tool("helm");
    let work = tempfile::tempdir().expect("temp dir");
    let (v1, v2) = (work.path().join("v1"), work.path().join("v2"));
    chart_copy(&v1, "0.1.0", |text| text);
    chart_copy(&v2, "0.2.0", |text| {
        assert!(
            text.contains(COLUMN),
            "the PeerPod CRD has no column {COLUMN:?}"
        );
        text.replace(COLUMN, &format!("{COLUMN} (upgraded)"))
    });
    let helm_args = |verb: &'static str, chart: &Path| {
        vec![
            verb.to_owned(),
            "crds".to_owned(),
            chart.display().to_string(),
            "--namespace".to_owned(),
            "default".to_owned(),
            "--kubeconfig".to_owned(),
            kubeconfig.clone(),
            "--wait".to_owned(),
        ]
    };
    let run_helm = |args: Vec<String>| {
        let helm = helm.clone();
        async move {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            run_ok(&helm, &args, None).await
        }
    };

    run_helm(helm_args("install", &v1)).await;
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let installed = crds.get(PEERPODS_CRD).await.expect("PeerPod CRD installed");
    assert_eq!(provider_column(&installed).as_deref(), Some(COLUMN));
    assert_eq!(
        installed
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get("helm.sh/resource-policy"))
            .map(String::as_str),
        Some("keep")
    );
    wait_established(&crds, PEERPODS_CRD).await;

    // An object made before the upgrade.
    let kind = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "confidentialcontainers.org",
        "v1alpha1",
        "PeerPod",
    ));
    let peerpods: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "default", &kind);
    let peerpod: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPod",
        "metadata": {"name": "before-upgrade"},
        "spec": {"cloudProvider": "libvirt", "instanceID": uuid::Uuid::new_v4().to_string()},
    }))
    .expect("PeerPod object");
    peerpods
        .create(&PostParams::default(), &peerpod)
        .await
        .expect("PeerPod");

    run_helm(helm_args("upgrade", &v2)).await;
    let upgraded = crds.get(PEERPODS_CRD).await.expect("PeerPod CRD");
    assert_eq!(
        provider_column(&upgraded).as_deref(),
        Some(format!("{COLUMN} (upgraded)").as_str()),
        "helm upgrade did not change the CRD"
    );
    assert!(
        peerpods
            .get_opt("before-upgrade")
            .await
            .expect("get")
            .is_some()
    );

    // The application chart installs beside it: its crds/ are skipped because they exist.
    let app_ns = testenv::namespace(&admin, "app").await;
    run_ok(
        &helm,
        &[
            "install",
            "app",
            CHART,
            "--namespace",
            &app_ns,
            "--kubeconfig",
            &kubeconfig,
            // A release must say whose VMs it may delete; the development values serve libvirt only.
            "-f",
            &testenv::repo_root()
                .join("deploy/tests/values-dev.yaml")
                .display()
                .to_string(),
        ],
        None,
    )
    .await;

    // Uninstalling the CRD release keeps the CRDs and every object.
    run_ok(
        &helm,
        &[
            "uninstall",
            "crds",
            "--namespace",
            "default",
            "--kubeconfig",
            &kubeconfig,
        ],
        None,
    )
    .await;
    assert!(crds.get_opt(PEERPODS_CRD).await.expect("get CRD").is_some());
    assert!(
        peerpods
            .get_opt("before-upgrade")
            .await
            .expect("get")
            .is_some()
    );
}
