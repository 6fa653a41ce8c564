//! The switch from upstream's peerpod-ctrl (cloud-api-adaptor's chart, its `resourceCtrl` subchart) to ours, as
//! docs/migrating.md does it, on a cluster with live PeerPods and PeerPods being deleted (held by
//! `peer.pod/finalizer`), one of them after upstream's controller had already deleted its VM. Afterwards no PeerPod
//! is lost, every terminating one is cleaned up and released only once its VM is gone, no VM is deleted twice or
//! left behind, and the live PeerPods keep their VMs. Runs on a control plane of its own (`testenv::shared_for`): it
//! installs cluster-wide CRDs.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::caa::*;
use crate::support::{
    exists, helm_ok, kubectl_ok, peerpod_resource, wait_established, wait_gone, workload_pod,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRole;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams};

/// docs/migrating.md, step 1, for Helm before 3.17: the ownership metadata `peerpods-crds` (in `default`) needs.
const ADOPT_PATCH: &str = r#"{"metadata":{"labels":{"app.kubernetes.io/managed-by":"Helm"},"annotations":{"meta.helm.sh/release-name":"peerpods-crds","meta.helm.sh/release-namespace":"default"}}}"#;

fn uuids(n: usize) -> Vec<String> {
    (0..n).map(|_| uuid::Uuid::new_v4().to_string()).collect()
}

fn has_finalizer(peerpod: &DynamicObject) -> bool {
    peerpod
        .metadata
        .finalizers
        .as_ref()
        .is_some_and(|f| f.iter().any(|f| f == FINALIZER))
}

/// The last chart whose provider-service ran in the release namespace (this repository's commit).
const CHART_BEFORE_PROVIDER_NAMESPACE: &str = "45a2a6211c5797cb6a1276ad5ccb78b2aafbf3cf";

/// docs/migrating.md, "Upgrading a release whose provider-service ran in the release namespace": `helm upgrade`
/// of such a release (the chart at [`CHART_BEFORE_PROVIDER_NAMESPACE`]) ends with one provider-service, in its own
/// namespace (Deployment, Service, ServiceAccount, TLS Secret), nothing of it left in the release namespace but
/// the CA its callers verify it with, and the callers pointed at it: the controllers' endpoint names the new
/// namespace and peer-pod-config-ctrl hands CAA's DaemonSet the published CA. On a control plane of its own (the
/// whole chart is installed, cluster-wide objects included), without CRDs (`--skip-crds`).
#[tokio::test(flavor = "multi_thread")]
async fn upgrading_a_release_with_provider_service_in_the_release_namespace_leaves_one_in_its_own()
{
    use crate::support::{CHART, container_env, provider_namespace, run_ok, secret_files};
    use k8s_openapi::api::core::v1::{Secret, Service, ServiceAccount};
    let cp = testenv::shared_for(concat!(module_path!(), "::provider_namespace_upgrade"));
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "ps-move").await;
    let ps_ns = provider_namespace(&ns);
    let release = ns.clone();
    let provider = format!("{release}-peerpods-provider-service");
    let work = tempfile::tempdir().expect("temp dir");
    let archive = work.path().join("chart.tar");
    let root = testenv::repo_root().display().to_string();
    let archive_path = archive.display().to_string();
    run_ok(
        std::path::Path::new("git"),
        &[
            "-C",
            &root,
            "archive",
            "--output",
            &archive_path,
            CHART_BEFORE_PROVIDER_NAMESPACE,
            "deploy/chart/peerpods",
            // The chart's crds/ links there.
            "deploy/crds",
        ],
        None,
    )
    .await;
    let old = work.path().display().to_string();
    run_ok(
        std::path::Path::new("tar"),
        &["-x", "-f", &archive_path, "-C", &old],
        None,
    )
    .await;
    let old_chart = work
        .path()
        .join("deploy/chart/peerpods")
        .display()
        .to_string();
    let values = testenv::repo_root().join(DEV_VALUES).display().to_string();
    let deploy = |chart: String, verb: &'static str| {
        let (release, ns, values) = (release.clone(), ns.clone(), values.clone());
        async move {
            helm_ok(
                cp,
                &[
                    verb,
                    &release,
                    &chart,
                    "--skip-crds",
                    "-f",
                    &values,
                    "--namespace",
                    &ns,
                ],
            )
            .await
        }
    };
    deploy(old_chart, "install").await;
    let in_release: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    assert!(
        exists(&in_release, &provider).await,
        "the older chart runs provider-service in the release namespace"
    );

    deploy(
        testenv::repo_root().join(CHART).display().to_string(),
        "upgrade",
    )
    .await;
    let everywhere: Api<Deployment> = Api::all(admin.clone());
    let providers: Vec<(String, String)> = everywhere
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={release},app.kubernetes.io/name=provider-service"
        )))
        .await
        .expect("list Deployments")
        .items
        .into_iter()
        .map(|d| {
            (
                d.metadata.namespace.unwrap_or_default(),
                d.metadata.name.unwrap_or_default(),
            )
        })
        .collect();
    assert_eq!(
        providers,
        vec![(ps_ns.clone(), provider.clone())],
        "one provider-service, in its own namespace"
    );
    assert!(
        exists(
            &Api::<Service>::namespaced(admin.clone(), &ps_ns),
            &provider
        )
        .await
    );
    assert!(
        exists(
            &Api::<ServiceAccount>::namespaced(admin.clone(), &ps_ns),
            &provider
        )
        .await
    );
    assert!(
        exists(
            &Api::<Secret>::namespaced(admin.clone(), &ps_ns),
            &format!("{provider}-tls")
        )
        .await
    );
    for (what, gone) in [
        (
            "Service",
            exists(&Api::<Service>::namespaced(admin.clone(), &ns), &provider).await,
        ),
        (
            "ServiceAccount",
            exists(
                &Api::<ServiceAccount>::namespaced(admin.clone(), &ns),
                &provider,
            )
            .await,
        ),
        (
            "TLS Secret",
            exists(
                &Api::<Secret>::namespaced(admin.clone(), &ns),
                &format!("{provider}-tls"),
            )
            .await,
        ),
    ] {
        assert!(
            !gone,
            "provider-service's {what} left in the release namespace"
        );
    }
    let ca = Api::<Secret>::namespaced(admin.clone(), &ns)
        .get(&format!("{provider}-tls-ca"))
        .await
        .expect("provider-service's CA published in the release namespace");
    assert_eq!(
        secret_files(&ca).into_keys().collect::<Vec<_>>(),
        vec!["ca.crt".to_owned()]
    );
    // The callers follow: each controller dials the new namespace; CAA's DaemonSet gets the published CA.
    for controller in ["peerpod-ctrl", "peer-pod-config-ctrl"] {
        let deployment = in_release
            .get(&format!("{release}-peerpods-{controller}"))
            .await
            .expect("controller Deployment");
        let env = container_env(&deployment, controller);
        assert_eq!(
            env["PROVIDER_ENDPOINT"],
            format!("https://{provider}.{ps_ns}.svc:50051"),
            "{controller}"
        );
        if controller == "peer-pod-config-ctrl" {
            assert_eq!(env["CAA_PROVIDER_CA_SECRET"], format!("{provider}-tls-ca"));
        }
    }
    crate::uninstall::uninstall_uncounted(cp, &release, &ns).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn switching_from_upstreams_peerpod_ctrl_loses_no_peerpod_and_deletes_each_vm_once() {
    let cp = testenv::shared_for(module_path!());
    let admin = cp.client().await;
    let work = tempfile::tempdir().expect("temp dir");
    // Live Pods' VMs; VMs of Pods being deleted; one VM upstream's controller deleted before it stopped (its
    // PeerPod still holds the finalizer); a VM CAA creates after the switch.
    let live_vms = uuids(3);
    let doomed_vms = uuids(3);
    let deleted_by_upstream = uuid::Uuid::new_v4().to_string();
    let later_vm = uuid::Uuid::new_v4().to_string();
    let on_host: Vec<String> = [&live_vms[..], &doomed_vms[..], &[later_vm.clone()][..]].concat();

    // Before: CAA's chart as its users run it, upstream's peerpod-ctrl included.
    let chart = install_caa(cp, work.path(), &on_host).await;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), CAA_NS);
    let cluster_roles: Api<ClusterRole> = Api::all(admin.clone());
    assert!(exists(&deployments, "peerpodctrl-controller-manager").await);
    assert!(exists(&cluster_roles, "peerpodctrl-manager-role").await);
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    wait_established(&crds, PEERPODS_CRD).await;

    // The workloads: CAA (its chart's ServiceAccount and RBAC) records each VM in a PeerPod owned by its Pod.
    let workloads = testenv::namespace(&admin, "workload").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &workloads);
    let peerpods: Api<DynamicObject> =
        Api::namespaced_with(admin.clone(), &workloads, &peerpod_resource());
    let caa = caa_client(cp).await;
    let mut live = BTreeSet::new();
    for (i, vm) in live_vms.iter().enumerate() {
        let pod = workload_pod(&pods, &format!("live-{i}")).await;
        live.insert(caa_records_vm(&caa, &pod, vm).await);
    }
    let mut terminating = Vec::new();
    for (i, vm) in doomed_vms
        .iter()
        .chain(std::iter::once(&deleted_by_upstream))
        .enumerate()
    {
        let name = format!("doomed-{i}");
        let pod = workload_pod(&pods, &name).await;
        terminating.push(caa_records_vm(&caa, &pod, vm).await);
        pods.delete(&name, &DeleteParams::background())
            .await
            .expect("delete Pod");
    }
    // The garbage collector deletes each deleted Pod's PeerPod; the finalizer holds it (upstream's controller has
    // no Pod to run in here: the cleanup waits, as during a switch).
    for name in &terminating {
        testenv::wait_for(
            &format!("PeerPod {name} terminating"),
            Duration::from_secs(60),
            || async {
                let p = peerpods.get_opt(name).await.ok().flatten()?;
                (p.metadata.deletion_timestamp.is_some() && has_finalizer(&p)).then_some(())
            },
        )
        .await;
    }

    // The switch, docs/migrating.md.
    // 1. peerpods-crds takes the PeerPod CRD over (the Helm-before-3.17 way: ownership metadata, then install).
    kubectl_ok(
        cp,
        &[
            "patch",
            "crd",
            PEERPODS_CRD,
            "--type",
            "merge",
            "-p",
            ADOPT_PATCH,
        ],
    )
    .await;
    helm_ok(cp, &INSTALL_CRDS).await;
    // 2. Upstream's controller off, and gone before ours starts.
    turn_off_upstream_controller(cp, &chart).await;
    kubectl_ok(
        cp,
        &[
            "wait",
            "--for=delete",
            "pod",
            "-l",
            "control-plane=controller-manager",
            "--namespace",
            CAA_NS,
            "--timeout=120s",
        ],
    )
    .await;
    assert!(!exists(&deployments, "peerpodctrl-controller-manager").await);
    assert!(
        !exists(&cluster_roles, "peerpodctrl-manager-role").await,
        "upstream's controller keeps no RBAC"
    );
    // 3. Ours, beside CAA's chart.
    install_ours(cp).await;
    let mut ours = Ours::prepare(cp, work.path()).await;
    // The cloud calls are counted from provider-service's metrics below; how the chart serves them (TLS, a
    // reader's token) is prometheus.rs's test, not this one's.
    ours.plain_metrics();

    // peerpod-ctrl before provider-service answers (its Pods still starting): with no VM deleted, no PeerPod is
    // released. The first failed delete is reported with a Warning Event; the others may be held back by the
    // controller's circuit breaker (which writes nothing for them), so the Event is awaited for any one of them and
    // then every terminating PeerPod must still be there with its finalizer.
    ours.start_peerpod_ctrl().await;
    let events: Api<Event> = Api::namespaced(admin.clone(), &workloads);
    testenv::wait_for_event(
        "a Warning Event about a terminating PeerPod",
        &events,
        Duration::from_secs(60),
        |e| {
            e.type_.as_deref() == Some("Warning")
                && e.regarding
                    .as_ref()
                    .and_then(|r| r.name.as_ref())
                    .is_some_and(|n| terminating.contains(n))
        },
    )
    .await;
    for name in &terminating {
        let held = peerpods
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("PeerPod {name} released without a delete: {e}"));
        assert!(has_finalizer(&held), "{name} lost its finalizer");
    }

    // provider-service up: every terminating PeerPod is cleaned up.
    ours.start_provider().await;
    for name in &terminating {
        wait_gone(
            &format!("PeerPod {name} cleaned up and gone"),
            &peerpods,
            name,
            Duration::from_secs(120),
        )
        .await;
    }

    // CAA goes on as before: a new VM, its Pod deleted, cleaned up by ours.
    let caa = caa_client(cp).await;
    caa_vm_cleaned_up(&caa, &pods, &peerpods, "later", &later_vm).await;

    // No PeerPod lost: exactly the live ones remain, untouched.
    let remaining = peerpods
        .list(&ListParams::default())
        .await
        .expect("list PeerPods")
        .items;
    let names: BTreeSet<String> = remaining
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, live, "the PeerPods left are the live ones");
    for p in &remaining {
        assert!(
            p.metadata.deletion_timestamp.is_none() && has_finalizer(p),
            "live PeerPod {:?} changed",
            p.metadata.name
        );
    }
    // No VM left behind, the live ones kept.
    let mut vms = ours.vms().await;
    vms.sort();
    let mut want = live_vms.clone();
    want.sort();
    assert_eq!(vms, want, "libvirt holds exactly the live Pods' VMs");
    // Each VM deleted once, by our peerpod-ctrl; upstream's already deleted one answered as gone, never deleted
    // again; the live ones never asked for.
    let answers = ours.delete_answers();
    let deleted = |vm: &str| {
        answers
            .iter()
            .filter(|(id, outcome, _)| id == vm && outcome == "deleted")
            .count()
    };
    for vm in doomed_vms.iter().chain(std::iter::once(&later_vm)) {
        assert_eq!(deleted(vm), 1, "VM {vm} deletes: {answers:?}");
    }
    assert_eq!(deleted(&deleted_by_upstream), 0, "{answers:?}");
    assert!(
        answers
            .iter()
            .any(|(id, outcome, _)| id == &deleted_by_upstream && outcome == "already_gone"),
        "the VM upstream deleted was looked up: {answers:?}"
    );
    for vm in &live_vms {
        assert!(
            answers.iter().all(|(id, _, _)| id != vm),
            "a live Pod's VM {vm} was asked to be deleted: {answers:?}"
        );
    }
    assert!(
        answers
            .iter()
            .all(|(_, _, caller)| caller == &ours.peerpod_ctrl_caller),
        "{answers:?}"
    );
    // The cloud calls provider-service counts agree: one libvirt domain delete per VM its log says deleted (the
    // deletion engine only looks up a VM that is already gone).
    let deletes = answers
        .iter()
        .filter(|(_, outcome, _)| outcome == "deleted")
        .count();
    assert_eq!(
        ours.metric(
            "provider_service_cloud_api_calls_total",
            &[("provider", "libvirt"), ("operation", "delete_domain")],
        )
        .await,
        deletes as f64,
        "provider-service's count of libvirt deletes against its log: {answers:?}"
    );
}
