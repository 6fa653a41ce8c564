//! The chart's uninstall protection (templates/uninstall-protection.yaml, docs/operating.md "Uninstalling"): while
//! a PeerPod holds `peer.pod/finalizer`, `helm uninstall` stops before deleting anything, and deletes of
//! provider-service, its credential and its RBAC are refused, whoever asks; once none does, the uninstall leaves
//! nothing behind. Run on an installed release whose peerpod-ctrl publishes the count (`alongside_caa`), so it
//! costs no install of its own.

use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::{
    ValidatingAdmissionPolicy, ValidatingAdmissionPolicyBinding,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};

use crate::support::*;

/// What the policy says in every refusal.
const HELD: &str = "PeerPod(s) hold peer.pod/finalizer";

/// Waits until peerpod-ctrl's ConfigMap `name` in `ns` counts `count` PeerPods holding the finalizer.
async fn count_is(admin: &kube::Client, ns: &str, name: &str, count: &str) -> ConfigMap {
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    testenv::wait_for(
        &format!("{ns}/{name} counting {count} PeerPod(s) with the finalizer"),
        Duration::from_secs(30),
        || async {
            let cm = config_maps.get_opt(name).await.ok()??;
            (cm.data.as_ref()?.get("count")? == count).then_some(cm)
        },
    )
    .await
}

/// A delete the policy must refuse: the API server's answer names the object and the PeerPod.
async fn refused<K>(api: &Api<K>, name: &str, peerpod: &str)
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    let result = api.delete(name, &DeleteParams::default()).await;
    assert!(
        matches!(&result, Err(kube::Error::Api(e)) if e.code == 403
            && e.message.contains("refused to delete ") && e.message.contains(HELD)
            && e.message.contains(peerpod) && e.message.contains(name)),
        "deleting {name} while {peerpod} holds the finalizer: {result:?}"
    );
    assert!(exists(api, name).await, "{name} is still there");
}

/// Waits until the API server's admission lets `helm uninstall` of `release` (full name `fullname`) in `ns` past
/// its pre-delete hook: a server-side dry run of the hook's create. The policy reads its parameter and bindings
/// from caches, a moment behind what was written.
async fn uninstall_admitted(admin: &kube::Client, fullname: &str, ns: &str) {
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let hook: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{fullname}-uninstall-check")}
    }))
    .expect("ConfigMap");
    testenv::wait_for(
        "helm uninstall's pre-delete hook admitted",
        Duration::from_secs(30),
        || async {
            let dry_run = PostParams {
                dry_run: true,
                ..PostParams::default()
            };
            config_maps.create(&dry_run, &hook).await.ok().map(drop)
        },
    )
    .await;
}

/// `helm uninstall` of release `release` in `ns` by a test that does not mean to keep its PeerPods' cleanup: its
/// peerpod-ctrl never counted them (it never ran here) or was stopped with some still holding the finalizer, and
/// the uninstall protection refuses the uninstall (it fails closed). So this takes the documented override first
/// (docs/operating.md, "Uninstalling"): delete the protection's binding, then uninstall.
pub async fn uninstall_uncounted(cp: &testenv::ControlPlane, release: &str, ns: &str) {
    let admin = cp.client().await;
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    let ours = bindings
        .list(&ListParams::default().labels(&format!("app.kubernetes.io/instance={release}")))
        .await
        .expect("list bindings");
    let mut fullname = None;
    for binding in ours.items {
        let name = binding.metadata.name.unwrap_or_default();
        if let Some(full) = name.strip_suffix("-provider-service-in-use") {
            bindings
                .delete(&name, &DeleteParams::default())
                .await
                .expect("delete the uninstall protection's binding");
            fullname = Some(full.to_owned());
        }
    }
    if let Some(fullname) = fullname {
        uninstall_admitted(&admin, &fullname, ns).await;
    }
    helm_ok(cp, &["uninstall", release, "--namespace", ns]).await;
}

/// Release `release` (full name `release`, in `ns`, provider-service in its default namespace) with peerpod-ctrl
/// running; `live` is a Pod whose PeerPod `peerpod` (in `pods`' namespace) holds the finalizer and whose VM
/// provider-service can delete.
pub async fn refused_while_a_peerpod_holds_the_finalizer_then_clean(
    cp: &testenv::ControlPlane,
    release: &str,
    ns: &str,
    pods: &Api<Pod>,
    live: &str,
    peerpod: &str,
) {
    let started = std::time::Instant::now();
    let admin = cp.client().await;
    let in_use = format!("{release}-provider-service-in-use");
    let workload_ns = pods.namespace().unwrap_or_default().to_owned();
    let provider_ns = &provider_namespace(ns);
    let peerpods: &Api<DynamicObject> =
        &Api::namespaced_with(admin.clone(), &workload_ns, &peerpod_resource());
    let held = format!("{workload_ns}/{peerpod}");
    let cm = count_is(&admin, ns, &in_use, "1").await;
    assert_eq!(
        cm.data.unwrap_or_default().get("peerpods"),
        Some(&held),
        "the ConfigMap names the PeerPod"
    );

    let ps_deployments: Api<Deployment> = Api::namespaced(admin.clone(), provider_ns);
    let ps_deploy = deployment_of(&ps_deployments, release, "provider-service").await;
    let credential = secret_of(&ps_deploy, "credentials");
    let ps_name = format!("{release}-provider-service");
    let policies: Api<ValidatingAdmissionPolicy> = Api::all(admin.clone());
    let bindings: Api<ValidatingAdmissionPolicyBinding> = Api::all(admin.clone());
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), provider_ns);
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), provider_ns);
    let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
    let cluster_role_bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    if !exists(&secrets, &credential).await {
        // The operator's Secret (the chart mounts it, optional, but does not create it).
        let secret: Secret =
            serde_json::from_value(serde_json::json!({"metadata": {"name": credential}}))
                .expect("Secret");
        secrets
            .create(&Default::default(), &secret)
            .await
            .expect("provider-service's credential");
    }

    // helm uninstall stops at its pre-delete hook, with the policy's message, and deletes nothing.
    let (ok, out, err) = helm(cp, &["uninstall", release, "--namespace", ns]).await;
    assert!(
        !ok && err.contains("helm uninstall refused before deleting anything: 1 ")
            && err.contains(HELD)
            && err.contains(&held)
            && err.contains("kubectl peerpods release"),
        "helm uninstall while {held} holds the finalizer:\n{err}\n{out}"
    );
    eprintln!("refused helm uninstall:\n{err}");
    // Nothing was deleted: provider-service, its credential, its RBAC and namespace, the controllers, the policy.
    for (what, there) in [
        (
            "provider-service's Deployment",
            exists(&ps_deployments, &ps_name).await,
        ),
        ("its credential", exists(&secrets, &credential).await),
        (
            "its ServiceAccount",
            exists(&accounts, &service_account_of(&ps_deploy)).await,
        ),
        ("its ClusterRole", exists(&cluster_roles, &ps_name).await),
        (
            "its ClusterRoleBinding",
            exists(&cluster_role_bindings, &ps_name).await,
        ),
        ("its namespace", exists(&namespaces, provider_ns).await),
        (
            "peerpod-ctrl's Deployment",
            exists(&deployments, &format!("{release}-peerpod-ctrl")).await,
        ),
        ("the policy", exists(&policies, &in_use).await),
        ("the binding", exists(&bindings, &in_use).await),
        ("the count", exists(&config_maps, &in_use).await),
    ] {
        assert!(there, "{what} deleted by the refused helm uninstall");
    }
    // Helm records the release as uninstalling before it runs the hook, deleted nothing, and cannot upgrade such a
    // release; a rollback to its revision makes it deployed again (docs/operating.md, "Uninstalling").
    let status = helm_ok(cp, &["status", release, "--namespace", ns, "-o", "json"]).await;
    assert!(
        status.contains("\"status\":\"uninstalling\""),
        "Helm's record of the refused uninstall: {status}"
    );
    let history = helm_ok(cp, &["history", release, "--namespace", ns, "-o", "json"]).await;
    let history: serde_json::Value = serde_json::from_str(&history).expect("helm history JSON");
    let revision = history
        .as_array()
        .and_then(|revisions| revisions.last())
        .and_then(|last| last["revision"].as_u64())
        .expect("a revision")
        .to_string();
    helm_ok(cp, &["rollback", release, &revision, "--namespace", ns]).await;
    let status = helm_ok(cp, &["status", release, "--namespace", ns, "-o", "json"]).await;
    assert!(
        status.contains("\"status\":\"deployed\""),
        "deployed again after the rollback: {status}"
    );

    // A cluster-admin's deletes (the admin's client) are refused the same way, each with the message.
    refused(&ps_deployments, &ps_name, &held).await;
    refused(&secrets, &credential, &held).await;
    refused(&accounts, &service_account_of(&ps_deploy), &held).await;
    refused(&cluster_roles, &ps_name, &held).await;
    refused(&cluster_role_bindings, &ps_name, &held).await;
    refused(&namespaces, provider_ns, &held).await;
    refused(&config_maps, &in_use, &held).await;

    // The Pod goes, peerpod-ctrl deletes its VM through provider-service and releases the finalizer.
    pods.delete(live, &DeleteParams::background())
        .await
        .expect("delete Pod");
    wait_gone(
        "the PeerPod released after its VM's delete",
        peerpods,
        peerpod,
        Duration::from_secs(60),
    )
    .await;
    count_is(&admin, ns, &in_use, "0").await;
    uninstall_admitted(&admin, release, ns).await;

    // Now the uninstall goes through and leaves nothing: the count goes with the binding owning it.
    helm_ok(cp, &["uninstall", release, "--namespace", ns]).await;
    for (what, gone) in [
        (
            "provider-service's Deployment",
            exists(&ps_deployments, &ps_name).await,
        ),
        ("the policy", exists(&policies, &in_use).await),
        ("the binding", exists(&bindings, &in_use).await),
        ("the ClusterRole", exists(&cluster_roles, &ps_name).await),
    ] {
        assert!(!gone, "{what} left after helm uninstall");
    }
    wait_gone(
        "the count, garbage-collected with its binding",
        &config_maps,
        &in_use,
        Duration::from_secs(60),
    )
    .await;
    wait_gone(
        "provider-service's namespace, with its credential",
        &namespaces,
        provider_ns,
        Duration::from_secs(60),
    )
    .await;
    eprintln!("uninstall protection: {:?}", started.elapsed());
}
