//! peerpod-ctrl against the real control plane and the real provider-service (libvirt test driver).
//! Each scenario reads like the story it checks.

use std::time::{Duration, Instant};

use crate::support::{
    Controller, ControllerOptions, ProviderService, Scenario, applied_status_fields, unused_addr,
};
use kube::ResourceExt;
use kube::api::{DeleteParams, Patch, PatchParams};
use peerpod_ctrl::orphans::{OrphanCap, OrphanPolicy};
use peerpods_api::peerpod::CleanedReason;
use peerpods_api::peerpod::{FINALIZER, PeerPod};
use peerpods_runtime::status::apply_status;

const MINUTE: Duration = Duration::from_secs(60);

fn cleaned(p: &PeerPod) -> Option<(String, String)> {
    p.cleaned_condition()
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Waits until the cleanup of PeerPod `name` is held for `reason` (its Cleaned condition False), and checks
/// that our finalizer stays. Returns the PeerPod as it was then.
async fn wait_held(s: &Scenario, name: &str, reason: &str) -> PeerPod {
    let held = s
        .wait_peerpod(name, &format!("condition {reason}"), |p| {
            cleaned(p) == Some(("False".into(), reason.into()))
        })
        .await;
    assert_eq!(held.finalizers(), [FINALIZER.to_string()]);
    held
}

#[tokio::test(flavor = "multi_thread")]
async fn caa_create_body_and_release_patch_are_accepted() {
    let s = Scenario::start("caa-wire").await;
    let pod = s.create_pod("nginx").await;
    // Exactly CAA's body, with the name, namespace and owner replaced as the fixture's README says.
    let body = include_str!("../../../api/tests/fixtures/caa-peerpod.json")
        .replace(
            "\"namespace\":\"default\"",
            &format!("\"namespace\":\"{}\"", s.ns),
        )
        .replace(
            "00000000-0000-0000-0000-000000000000",
            &pod.uid().expect("uid"),
        );
    let url = format!(
        "/apis/confidentialcontainers.org/v1alpha1/namespaces/{}/peerpods",
        s.ns
    );
    let request = http::Request::post(url)
        .header("content-type", "application/json")
        .body(body.into_bytes())
        .expect("request");
    s.client
        .request_text(request)
        .await
        .expect("CAA's create body is accepted");
    let created = s
        .peerpods()
        .get("nginx-resource-q7z9r")
        .await
        .expect("created");
    assert_eq!(created.spec.cloud_provider, "aws");
    assert_eq!(created.spec.instance_id, "i-0123456789abcdef0");
    assert_eq!(created.finalizers(), [FINALIZER.to_string()]);

    // CAA's release: delete, then its JSON patch removing every finalizer.
    s.delete_peerpod("nginx-resource-q7z9r").await;
    let patch = include_str!("../fixtures/caa-release-patch.json");
    let url = format!(
        "/apis/confidentialcontainers.org/v1alpha1/namespaces/{}/peerpods/nginx-resource-q7z9r",
        s.ns
    );
    let request = http::Request::patch(url)
        .header("content-type", "application/json-patch+json")
        .body(patch.as_bytes().to_vec())
        .expect("request");
    s.client
        .request_text(request)
        .await
        .expect("CAA's release patch is accepted");
    s.wait_peerpod_gone("nginx-resource-q7z9r", MINUTE).await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_the_pod_deletes_its_vm_and_releases_the_peerpod() {
    let (s, provider, ctrl) = Scenario::with_controller("story").await;

    let pod = s.create_pod("web").await;
    let vm = s.define_domain(true);
    s.create_peerpod("web-resource-abcde", Some(&pod), "libvirt", &vm)
        .await;
    assert!(s.domain_exists(&vm));

    s.pods()
        .delete("web", &DeleteParams::background())
        .await
        .expect("delete Pod");
    // The garbage collector deletes the PeerPod, the controller deletes the VM and releases it.
    s.wait_peerpod_gone("web-resource-abcde", MINUTE).await;
    assert!(
        !s.domain_exists(&vm),
        "the VM is deleted before the PeerPod goes"
    );
    assert_eq!(provider.delete_calls("libvirt"), 1);
    s.wait_event_reason("web-resource-abcde", "InstanceDeleted")
        .await;
    assert_eq!(
        ctrl.metric(
            "peerpod_ctrl_instance_deletes_total",
            &[("result", "deleted")]
        ),
        1
    );
    assert_eq!(
        ctrl.metric("peerpod_ctrl_finalizer_release_seconds_count", &[]),
        1
    );
    s.finish(ctrl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_peerpod_released_by_caa_needs_no_provider_call() {
    let (s, provider, ctrl) = Scenario::with_controller("released").await;
    // Another party's finalizer keeps the object visible while Terminating; ours is already gone.
    let hold = "example.com/hold".to_string();
    s.create_peerpod_with(
        "released",
        None,
        "libvirt",
        &uuid::Uuid::new_v4().to_string(),
        vec![hold],
    )
    .await;
    s.delete_peerpod("released").await;
    // A marker PeerPod being cleaned up after it proves the controller has been through the watch events.
    let marker_vm = s.define_domain(false);
    s.create_peerpod("marker", None, "libvirt", &marker_vm)
        .await;
    s.delete_peerpod("marker").await;
    s.wait_peerpod_gone("marker", MINUTE).await;
    testenv::wait_for("the released PeerPod to be reconciled", MINUTE, || async {
        (ctrl.metric("peerpod_ctrl_reconciles_total", &[]) >= 2).then_some(())
    })
    .await;
    assert_eq!(
        provider.delete_calls("libvirt"),
        1,
        "only the marker's VM was deleted"
    );
    let released = s
        .peerpods()
        .get("released")
        .await
        .expect("still held by the other finalizer");
    assert!(
        released.status.is_none_or(|st| st.conditions.is_empty()),
        "nothing was written"
    );
    s.finish(ctrl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_already_gone_vm_is_released_in_one_pass() {
    let (s, provider, ctrl) = Scenario::with_controller("gone").await;
    let never_existed = uuid::Uuid::new_v4().to_string();
    s.create_peerpod("gone", None, "libvirt", &never_existed)
        .await;
    s.delete_peerpod("gone").await;
    s.wait_peerpod_gone("gone", MINUTE).await;
    assert_eq!(provider.delete_calls("libvirt"), 1);
    assert_eq!(
        ctrl.metric(
            "peerpod_ctrl_instance_deletes_total",
            &[("result", "already_gone")]
        ),
        1
    );
    s.wait_event_reason("gone", "InstanceAlreadyGone").await;
    s.finish(ctrl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn provider_service_down_keeps_the_finalizer_until_it_is_back() {
    let s = Scenario::start("down").await;
    let addr = unused_addr();
    let ctrl = s.start_controller(ControllerOptions::new(addr)).await;
    let vm = s.define_domain(false);
    s.create_peerpod("waiting", None, "libvirt", &vm).await;
    s.delete_peerpod("waiting").await;

    wait_held(&s, "waiting", "ProviderUnavailable").await;
    assert!(s.domain_exists(&vm));
    s.wait_event_reason("waiting", "ProviderUnavailable").await;
    assert!(
        ctrl.metric(
            "peerpod_ctrl_reconcile_errors_total",
            &[("reason", "ProviderUnavailable")]
        ) >= 1
    );

    let provider = ProviderService::start(Some(addr)).await;
    s.wait_peerpod_gone("waiting", MINUTE).await;
    assert!(!s.domain_exists(&vm));
    assert_eq!(provider.delete_calls("libvirt"), 1);
    s.finish(ctrl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_provider_and_empty_id_are_reported_without_a_hot_loop() {
    let (s, provider) = Scenario::with_provider("invalid").await;
    let mut options = ControllerOptions::new(provider.addr);
    options.retry_cap = Duration::from_secs(300);
    let ctrl = s.start_controller(options).await;
    s.create_peerpod("unknown", None, "made-up-cloud", "vm-1")
        .await;
    s.create_peerpod("empty", None, "libvirt", "").await;
    s.delete_peerpod("unknown").await;
    s.delete_peerpod("empty").await;

    let unknown = s
        .wait_peerpod("unknown", "a False condition", |p| {
            cleaned(p).is_some_and(|(status, _)| status == "False")
        })
        .await;
    assert_eq!(
        cleaned(&unknown),
        Some(("False".into(), "ProviderRejected".into()))
    );
    assert_eq!(unknown.finalizers(), [FINALIZER.to_string()]);
    wait_held(&s, "empty", "InvalidInstance").await;

    // Give a hot loop every chance to show: with backoff, nothing more happens for the full cap.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        provider.delete_calls("unknown"),
        1,
        "permanent errors are not retried hot"
    );
    assert_eq!(
        provider.delete_calls("libvirt"),
        0,
        "an empty instance ID is never sent"
    );
    assert_eq!(
        ctrl.metric(
            "peerpod_ctrl_reconcile_errors_total",
            &[("reason", "InvalidInstance")]
        ),
        1
    );
    s.finish(ctrl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn another_finalizer_survives_the_release() {
    let (s, _provider, ctrl) = Scenario::with_controller("shared").await;
    let vm = s.define_domain(false);
    let finalizers = vec![
        "example.com/first".to_string(),
        FINALIZER.to_string(),
        "example.com/last".to_string(),
    ];
    s.create_peerpod_with("shared", None, "libvirt", &vm, finalizers)
        .await;
    s.delete_peerpod("shared").await;
    let released = s
        .wait_peerpod("shared", "our finalizer released", |p| {
            !p.finalizers().contains(&FINALIZER.to_string())
        })
        .await;
    assert_eq!(
        released.finalizers(),
        [
            "example.com/first".to_string(),
            "example.com/last".to_string()
        ]
    );
    assert!(!s.domain_exists(&vm));
    let status = released.status.clone().expect("status");
    assert!(status.cleand);
    assert_eq!(
        cleaned(&released),
        Some(("True".into(), "InstanceDeleted".into()))
    );
    s.finish(ctrl).await;
}

/// Status is written by server-side apply: `managedFields` name peerpod-ctrl's field manager as the owner of
/// what it wrote and of nothing else, and a condition another manager applied stays as it was (the conditions
/// are a map keyed by type). A merge patch would show as an Update and rewrite the whole list.
#[tokio::test(flavor = "multi_thread")]
async fn status_is_applied_under_our_field_manager_and_other_conditions_stay() {
    let (s, _provider, ctrl) = Scenario::with_controller("applied").await;
    let vm = s.define_domain(false);
    // Another party's finalizer keeps the PeerPod, and with it the status written, after the release.
    let finalizers = vec![FINALIZER.to_string(), "example.com/hold".to_string()];
    let created = s
        .create_peerpod_with("applied", None, "libvirt", &vm, finalizers)
        .await;
    // Another party's condition, applied under its own field manager before the cleanup.
    let audited = serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPod",
        "status": {"conditions": [{
            "type": "Audited",
            "status": "True",
            "reason": "Checked",
            "message": "seen by the auditor",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }]},
    });
    s.peerpods()
        .patch_status(
            "applied",
            &PatchParams::apply("example-auditor"),
            &Patch::Apply(&audited),
        )
        .await
        .expect("the auditor applies its condition");

    s.delete_peerpod("applied").await;
    let released = s
        .wait_peerpod("applied", "our finalizer released", |p| {
            !p.finalizers().contains(&FINALIZER.to_string())
        })
        .await;
    assert!(!s.domain_exists(&vm));
    assert_eq!(
        cleaned(&released),
        Some(("True".into(), "InstanceDeleted".into()))
    );
    let audited = released
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Audited"))
        .expect("the auditor's condition stays");
    assert_eq!(
        (
            audited.status.as_str(),
            audited.reason.as_str(),
            audited.message.as_str()
        ),
        ("True", "Checked", "seen by the auditor")
    );

    let ours = applied_status_fields(&released, peerpod_ctrl::FIELD_MANAGER)
        .expect("peerpod-ctrl applied the status");
    for field in [
        "f:cleand",
        "f:state",
        "f:reason",
        "f:lastAttemptTime",
        "f:observedGeneration",
    ] {
        assert!(ours.get(field).is_some(), "{field} is ours: {ours:#}");
    }
    assert!(
        ours["f:conditions"]
            .get(r#"k:{"type":"Cleaned"}"#)
            .is_some(),
        "the Cleaned condition is ours: {ours:#}"
    );
    assert!(
        ours["f:conditions"]
            .get(r#"k:{"type":"Audited"}"#)
            .is_none(),
        "the auditor's condition is not ours: {ours:#}"
    );
    let theirs =
        applied_status_fields(&released, "example-auditor").expect("the auditor's entry stays");
    assert!(
        theirs["f:conditions"]
            .get(r#"k:{"type":"Audited"}"#)
            .is_some(),
        "the auditor still owns its condition: {theirs:#}"
    );

    // The precondition reverse collection relies on: an apply carrying an older resourceVersion is refused.
    let stale = created.resource_version().expect("resourceVersion");
    let refused = apply_status(
        &s.peerpods(),
        "applied",
        peerpod_ctrl::reverse::FIELD_MANAGER,
        &serde_json::json!({"reason": "Stale"}),
        Some(&stale),
    )
    .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.is_conflict()),
        "{refused:?}"
    );
    let now = s.peerpods().get("applied").await.expect("still held");
    assert_eq!(
        now.status.and_then(|st| st.reason).as_deref(),
        Some("InstanceDeleted")
    );
    s.finish(ctrl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn an_older_peerpod_of_the_same_pod_is_deleted_and_its_vm_reaped() {
    let (s, _provider, ctrl) = Scenario::with_controller("stale").await;
    let pod = s.create_pod("app").await;
    let old_vm = s.define_domain(false);
    let old = s
        .create_peerpod("app-resource-old00", Some(&pod), "libvirt", &old_vm)
        .await;
    // Creation timestamps have one-second resolution: the newer one must be created in a later second.
    let old_created = old
        .metadata
        .creation_timestamp
        .clone()
        .expect("timestamp")
        .0;
    testenv::wait_for("the next second", Duration::from_secs(5), || async {
        (jiff::Timestamp::now().as_second() > old_created.as_second()).then_some(())
    })
    .await;
    let new_vm = s.define_domain(false);
    s.create_peerpod("app-resource-new00", Some(&pod), "libvirt", &new_vm)
        .await;

    s.wait_peerpod_gone("app-resource-old00", MINUTE).await;
    assert!(
        !s.domain_exists(&old_vm),
        "the stale PeerPod's VM is reaped"
    );
    assert!(s.domain_exists(&new_vm), "the current VM stays");
    let current = s
        .peerpods()
        .get("app-resource-new00")
        .await
        .expect("current PeerPod stays");
    assert!(current.metadata.deletion_timestamp.is_none());
    assert_eq!(
        ctrl.metric("peerpod_ctrl_stale_peerpods_deleted_total", &[]),
        1
    );
    s.finish(ctrl).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn peerpods_without_owners_are_left_alone() {
    let (s, _provider, ctrl) = Scenario::with_controller("ownerless").await;
    let first_vm = s.define_domain(false);
    s.create_peerpod("orphaned-a", None, "libvirt", &first_vm)
        .await;
    let second_vm = s.define_domain(false);
    s.create_peerpod("orphaned-b", None, "libvirt", &second_vm)
        .await;
    // The controller keeps working: a cleanup right after goes through.
    s.delete_a_peerpod_of_a_new_vm("after").await;
    for name in ["orphaned-a", "orphaned-b"] {
        let p = s
            .peerpods()
            .get(name)
            .await
            .expect("ownerless PeerPods are not deleted");
        assert!(p.metadata.deletion_timestamp.is_none());
    }
    assert!(s.domain_exists(&first_vm) && s.domain_exists(&second_vm));
    assert_eq!(
        ctrl.metric("peerpod_ctrl_stale_peerpods_deleted_total", &[]),
        0
    );
    s.finish(ctrl).await;
}

/// Orphans on two clouds: libvirt's test driver and AWS (the real SDK against moto). Every orphan VM gets an Event
/// of its own naming it, and only the delete policy deletes them.
#[tokio::test(flavor = "multi_thread")]
async fn orphan_scan_reports_untracked_tagged_vms_and_deletes_only_with_the_delete_policy() {
    use test_support::moto;

    let s = Scenario::start("orphans").await;
    let (_moto_serial, ec2) = moto::alone().await;
    let aws_orphan = moto::run_instances(
        &ec2,
        1,
        &[(crate::support::TAG_KEY, crate::support::TAG_VALUE)],
    )
    .await
    .remove(0);
    let aws_foreign = moto::run_instances(&ec2, 1, &[]).await.remove(0);
    let clouds = moto::moto().config(&[("CLOUD_PROVIDER", "libvirt,aws")]);
    let provider = ProviderService::start_with_config(&clouds).await;
    let untracked = s.define_domain(true);
    let untracked_too = s.define_domain(true);
    let tracked = s.define_domain(true);
    let foreign = s.define_domain(false);
    s.create_peerpod("tracked", None, "libvirt", &tracked).await;

    let options = ControllerOptions::scanning_orphans(provider.addr, OrphanPolicy::Report);
    let ctrl = s.start_controller(options).await;
    testenv::wait_for("an orphan report", MINUTE, || async {
        (ctrl.metric("peerpod_ctrl_orphan_instances", &[("provider", "libvirt")]) == 2
            && ctrl.metric("peerpod_ctrl_orphan_instances", &[("provider", "aws")]) == 1)
            .then_some(())
    })
    .await;
    // One Event per orphan VM, each naming its VM (note and related object), not one Event for both.
    let everyone = [
        ("libvirt", &untracked),
        ("libvirt", &untracked_too),
        ("aws", &aws_orphan),
    ];
    for (cloud, vm) in everyone {
        let found = s
            .wait_event("default", "an Event per orphan VM", |e| {
                e.reason.as_deref() == Some("OrphanInstanceFound")
                    && e.related.as_ref().and_then(|r| r.name.clone())
                        == Some(format!("{cloud}/{vm}"))
            })
            .await;
        let note = found.note.unwrap_or_default();
        assert!(note.contains(vm.as_str()), "{note}");
        for (_, other) in everyone.iter().filter(|(_, o)| o != &vm) {
            assert!(!note.contains(other.as_str()), "{note}");
        }
    }
    assert_eq!(moto::state_of(&ec2, &aws_orphan).await, "running");
    assert!(s.domain_exists(&untracked), "report policy never deletes");
    assert!(
        s.domain_exists(&untracked_too),
        "report policy never deletes"
    );
    assert_eq!(provider.delete_calls("libvirt"), 0);
    ctrl.stop().await;

    let mut options = ControllerOptions::scanning_orphans(provider.addr, OrphanPolicy::Delete);
    // Two of three libvirt VMs and the one AWS VM are orphans: above the default share, on purpose here.
    options.orphan_cap = OrphanCap {
        max: 10,
        max_percent: 100,
    };
    let ctrl = s.start_controller(options).await;
    // The deletes are answered once the engine has confirmed each domain and its volumes gone, a moment
    // after the domains themselves are.
    testenv::wait_for("the orphan VMs deleted", MINUTE, || async {
        (!s.domain_exists(&untracked)
            && !s.domain_exists(&untracked_too)
            && moto::state_of(&ec2, &aws_orphan).await == "terminated"
            && provider.delete_calls("libvirt") >= 2)
            .then_some(())
    })
    .await;
    assert_eq!(
        moto::state_of(&ec2, &aws_foreign).await,
        "running",
        "an AWS instance without this cluster's tag is never touched"
    );
    assert!(s.domain_exists(&tracked), "a VM with a PeerPod stays");
    assert!(
        s.domain_exists(&foreign),
        "a VM without this cluster's tag is never touched"
    );
    assert_eq!(provider.delete_calls("libvirt"), 2);
    assert_eq!(
        ctrl.metric("peerpod_ctrl_orphan_instances_deleted_total", &[]),
        3
    );
    ctrl.stop().await;
    // Leave the test driver as we found it.
    s.remove_domains([&tracked, &foreign]);
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn with_two_replicas_only_the_leader_acts_and_stopping_it_hands_over() {
    let (s, provider) = Scenario::with_provider("ha").await;
    // Far longer than any wait below: the leader never misses a renewal on a loaded machine, and the standby
    // taking over within the wait proves the handover follows the release, not the expiry.
    let lease = |identity| s.lease(identity, Duration::from_secs(300), MINUTE);
    let mut a = ControllerOptions::new(provider.addr);
    a.leader = Some(lease("replica-a"));
    let first = s.start_controller(a).await;
    s.wait_lease_holder("replica-a to lead", "replica-a").await;
    let mut b = ControllerOptions::new(provider.addr);
    b.leader = Some(lease("replica-b"));
    let second = s.start_controller(b).await;

    s.delete_a_peerpod_of_a_new_vm("one").await;
    assert_eq!(first.metric("peerpod_ctrl_instance_deletes_total", &[]), 1);
    assert_eq!(
        second.metric("peerpod_ctrl_reconciles_total", &[]),
        0,
        "the standby does nothing"
    );
    assert_eq!(s.lease_holder().await.as_deref(), Some("replica-a"));

    // SIGTERM-like stop of the leader: it releases the Lease, the standby takes over.
    first.stop().await;
    s.wait_lease_holder("replica-b to lead", "replica-b").await;
    let vm = s.delete_a_peerpod_of_a_new_vm("two").await;
    assert!(!s.domain_exists(&vm));
    assert_eq!(second.metric("peerpod_ctrl_instance_deletes_total", &[]), 1);
    second.stop().await;
    s.cleanup().await;
}

/// Figures for the report: how long a storm of PeerPod deletions takes to drain.
#[tokio::test(flavor = "multi_thread")]
async fn a_storm_of_deleted_peerpods_is_drained() {
    const N: usize = 200;
    let (s, provider, ctrl) = Scenario::with_controller("storm").await;
    let mut vms = Vec::with_capacity(N);
    for i in 0..N {
        let vm = s.define_domain(false);
        s.create_peerpod(&format!("storm-{i}"), None, "libvirt", &vm)
            .await;
        vms.push(vm);
    }
    let api = s.peerpods();
    let started = Instant::now();
    api.delete_collection(&DeleteParams::default(), &Default::default())
        .await
        .expect("delete all");
    testenv::wait_for(
        "every PeerPod released",
        Duration::from_secs(300),
        || async {
            api.list(&Default::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        },
    )
    .await;
    let elapsed = started.elapsed();
    let reconciles = ctrl.metric("peerpod_ctrl_reconciles_total", &[]);
    eprintln!(
        "storm: {N} PeerPods released in {:.2}s ({:.1} PeerPods/s, {reconciles} reconciles)",
        elapsed.as_secs_f64(),
        N as f64 / elapsed.as_secs_f64()
    );
    assert!(
        vms.iter().all(|vm| !s.domain_exists(vm)),
        "every VM is deleted"
    );
    assert_eq!(provider.delete_calls("libvirt"), N as u64);
    s.finish(ctrl).await;
}

/// Chaos: while a storm of PeerPods is being deleted, the controller and provider-service are killed and
/// restarted several times. In the end every deleted PeerPod's VM is gone, every other VM is still there, and
/// every finalizer of a deleted PeerPod is released.
#[tokio::test(flavor = "multi_thread")]
async fn kills_and_restarts_during_a_storm_lose_nothing_and_delete_nothing_else() {
    const DELETED: usize = 200;
    const KEPT: usize = 20;
    let (s, mut provider) = Scenario::with_provider("chaos").await;
    let addr = provider.addr;
    let mut ctrl = s.start_controller(ControllerOptions::new(addr)).await;
    let mut doomed = Vec::with_capacity(DELETED);
    for i in 0..DELETED {
        let vm = s.define_domain(false);
        s.create_peerpod(&format!("doomed-{i}"), None, "libvirt", &vm)
            .await;
        doomed.push(vm);
    }
    let mut kept = Vec::with_capacity(KEPT);
    for i in 0..KEPT {
        let vm = s.define_domain(false);
        s.create_peerpod(&format!("kept-{i}"), None, "libvirt", &vm)
            .await;
        kept.push(vm);
    }
    let api = s.peerpods();
    let deleter = {
        let api = api.clone();
        tokio::spawn(async move {
            for i in 0..DELETED {
                api.delete(&format!("doomed-{i}"), &DeleteParams::default())
                    .await
                    .expect("delete PeerPod");
            }
        })
    };
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        ctrl.kill().await;
        tokio::time::sleep(Duration::from_millis(150)).await;
        provider.stop();
        ctrl = s.start_controller(ControllerOptions::new(addr)).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        provider = ProviderService::start(Some(addr)).await;
    }
    deleter.await.expect("deleter");
    testenv::wait_for(
        "every deleted PeerPod released",
        Duration::from_secs(180),
        || async {
            let left = api.list(&Default::default()).await.ok()?;
            left.items
                .iter()
                .all(|p| p.name_any().starts_with("kept-"))
                .then_some(())
        },
    )
    .await;
    let leaked: Vec<_> = doomed.iter().filter(|vm| s.domain_exists(vm)).collect();
    assert!(
        leaked.is_empty(),
        "VMs of deleted PeerPods left running: {leaked:?}"
    );
    assert!(
        kept.iter().all(|vm| s.domain_exists(vm)),
        "a VM whose PeerPod was not deleted was deleted"
    );
    for i in 0..KEPT {
        let p = api.get(&format!("kept-{i}")).await.expect("kept PeerPod");
        assert!(p.metadata.deletion_timestamp.is_none());
        assert_eq!(p.finalizers(), [FINALIZER.to_string()]);
    }
    ctrl.stop().await;
    s.remove_domains(&kept);
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_crashed_leader_is_replaced_once_its_lease_expires() {
    let (s, provider) = Scenario::with_provider("crash").await;
    let lease = |identity| s.lease(identity, Duration::from_secs(8), Duration::from_secs(3));
    let mut x = ControllerOptions::new(provider.addr);
    x.leader = Some(lease("replica-x"));
    let crashing = s.start_controller(x).await;
    s.wait_lease_holder("replica-x to lead", "replica-x").await;
    let mut y = ControllerOptions::new(provider.addr);
    y.leader = Some(lease("replica-y"));
    let survivor = s.start_controller(y).await;

    // A crash releases nothing: the Lease still names replica-x until it expires.
    crashing.kill().await;
    assert_eq!(s.lease_holder().await.as_deref(), Some("replica-x"));
    s.wait_lease_holder("replica-y to take over the expired Lease", "replica-y")
        .await;
    let vm = s.delete_a_peerpod_of_a_new_vm("after-crash").await;
    assert!(!s.domain_exists(&vm));
    assert_eq!(
        survivor.metric("peerpod_ctrl_instance_deletes_total", &[]),
        1
    );
    survivor.stop().await;
    s.cleanup().await;
}

/// The success path writes what a user needs and nothing else: the finalizer's release is the one write to the
/// PeerPod, and the outcome goes to one Event. No status write lands on an object that is gone milliseconds later
/// (it had to, in the past: three writes per cleanup). Counted from the API server's audit log, on a control plane
/// of its own: every write the server accepted, whoever made it.
#[tokio::test(flavor = "multi_thread")]
async fn a_cleanup_costs_one_peerpod_write_the_finalizer_release() {
    let cp = testenv::ControlPlane::start_audited()
        .await
        .expect("audited control plane");
    let s = Scenario::start_on(&cp, "writes").await;
    let provider = ProviderService::start(None).await;
    let ctrl = s
        .start_controller(ControllerOptions::new(provider.addr))
        .await;
    let vm = s.define_domain(false);
    s.create_peerpod("counted", None, "libvirt", &vm).await;
    s.wait_peerpod("counted", "created", |_| true).await;

    s.delete_peerpod("counted").await;
    s.wait_peerpod_gone("counted", MINUTE).await;
    assert!(!s.domain_exists(&vm));
    s.wait_event_reason("counted", "InstanceDeleted").await;

    let writes: Vec<_> = cp
        .audit_events()
        .expect("audit events")
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete" && matches!(e.verb.as_str(), "patch" | "update"))
        .filter(|e| e.object_ref.as_ref().is_some_and(|o| o.namespace == s.ns))
        .collect();
    let peerpod_writes: Vec<_> = writes
        .iter()
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.resource == "peerpods" && o.name == "counted")
        })
        .map(|e| {
            (
                e.object_ref.clone().unwrap_or_default().subresource,
                e.code(),
            )
        })
        .collect();
    // The test's own writes are the create and the delete; the one patch is the release, on the object itself.
    assert_eq!(
        peerpod_writes,
        [(String::new(), Some(200))],
        "one write to the PeerPod on the success path, the finalizer's release"
    );
    let event_creates = cp
        .audit_events()
        .expect("audit events")
        .into_iter()
        .filter(|e| e.stage == "ResponseComplete" && e.verb == "create")
        .filter(|e| {
            e.object_ref
                .as_ref()
                .is_some_and(|o| o.namespace == s.ns && o.resource == "events")
        })
        .count();
    assert_eq!(event_creates, 1, "one Event carries the outcome");
    s.finish(ctrl).await;
}

/// Ready once the PeerPod watch has listed; an idle but connected controller stays live, because its heartbeat
/// watch is renewed three times per bound; a stopped controller no longer tracks the watch.
#[tokio::test(flavor = "multi_thread")]
async fn ready_after_the_first_list_and_live_while_idle() {
    use peerpods_runtime::admin::Readiness;
    use peerpods_runtime::health::{Health, Liveness};

    let s = Scenario::start("health").await;
    let bound = Duration::from_secs(3);
    let health = Health {
        readiness: Readiness::default(),
        liveness: Liveness::new(bound),
    };
    let controller = Controller::start(
        s.client.clone(),
        ControllerOptions {
            health: Some(health.clone()),
            ..ControllerOptions::new(unused_addr())
        },
    )
    .await;
    testenv::wait_for("ready after the first list", MINUTE, || async {
        health.readiness.is_ready().then_some(())
    })
    .await;
    assert_eq!(
        health.readiness.report(),
        "watch/peerpods: ok: initial list done\n"
    );
    let idle_since = Instant::now();
    while idle_since.elapsed() < 2 * bound {
        assert!(health.liveness.is_live(), "{}", health.liveness.report());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    controller.stop().await;
    assert_eq!(health.liveness.report(), "ok\n");
    assert!(
        !health.readiness.is_ready(),
        "nothing runs, nothing is ready"
    );
    s.cleanup().await;
}

/// A restore or a copy makes two PeerPods name one VM. Deleting one of them must not take the VM from the
/// other, live one: the deleted PeerPod is released without a DeleteInstance, and says why. Once no live
/// PeerPod names it, the VM is deleted as usual.
#[tokio::test(flavor = "multi_thread")]
async fn two_peerpods_naming_one_vm_keep_it_while_one_is_live() {
    let (s, provider, ctrl) = Scenario::with_controller("namesakes").await;
    let vm = s.define_domain(false);
    // Another party's finalizer keeps the first one readable after the release, so its condition can be read.
    let hold = "example.com/hold".to_string();
    s.create_peerpod_with(
        "original",
        None,
        "libvirt",
        &vm,
        vec![FINALIZER.to_string(), hold.clone()],
    )
    .await;
    // The copy names the same VM, spelt in upper case: libvirt UUIDs compare without case.
    s.create_peerpod("restored", None, "libvirt", &vm.to_uppercase())
        .await;
    s.wait_peerpod("restored", "cached", |_| true).await;

    s.delete_peerpod("original").await;
    let released = s
        .wait_peerpod("original", "our finalizer released", |p| {
            !p.finalizers().contains(&FINALIZER.to_string())
        })
        .await;
    assert_eq!(released.finalizers(), [hold]);
    assert_eq!(
        cleaned(&released),
        Some(("True".into(), "InstanceStillReferenced".into()))
    );
    assert!(
        !released.status.as_ref().is_some_and(|st| st.cleand),
        "cleand says the VM is gone; it is not"
    );
    assert!(s.domain_exists(&vm), "the live PeerPod's VM stays");
    assert_eq!(
        provider.delete_calls("libvirt"),
        0,
        "no DeleteInstance at all"
    );
    let events = s.events("original").await;
    let (_, note) = events
        .iter()
        .find(|(reason, _)| reason == "InstanceStillReferenced")
        .unwrap_or_else(|| panic!("an InstanceStillReferenced Event: {events:?}"));
    assert!(
        note.contains(&format!("{}/restored", s.ns)),
        "the Event names the live PeerPod: {note}"
    );

    // The last PeerPod naming it goes: now the VM is deleted.
    s.delete_peerpod("restored").await;
    s.wait_peerpod_gone("restored", MINUTE).await;
    assert!(!s.domain_exists(&vm));
    assert_eq!(provider.delete_calls("libvirt"), 1);
    s.finish(ctrl).await;
}

/// `peerpods.io/do-not-delete` on a PeerPod keeps its VM on every path: the cleanup of the PeerPod (finalizer
/// kept, condition and Event say why, until the annotation is removed), the reaping of older PeerPods of the
/// same Pod; and the same tag on a VM keeps the orphan scan's delete policy away from it.
#[tokio::test(flavor = "multi_thread")]
async fn a_do_not_delete_peerpod_or_vm_survives_every_path() {
    use kube::api::{Patch, PatchParams};

    let (s, provider) = Scenario::with_provider("do-not-delete").await;
    let options = ControllerOptions::scanning_orphans(provider.addr, OrphanPolicy::Delete);
    let ctrl = s.start_controller(options).await;
    let protect = |value: Option<&str>| serde_json::json!({"metadata": {"annotations": {"peerpods.io/do-not-delete": value}}});
    let annotate = |name: &'static str, value: Option<&'static str>| {
        let api = s.peerpods();
        let patch = protect(value);
        async move {
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("annotate PeerPod");
        }
    };

    // Cleanup path.
    let held_vm = s.define_domain(false);
    s.create_peerpod("held", None, "libvirt", &held_vm).await;
    annotate("held", Some("true")).await;
    s.delete_peerpod("held").await;
    wait_held(&s, "held", "DoNotDelete").await;
    assert!(s.domain_exists(&held_vm));
    s.wait_event_reason("held", "DoNotDelete").await;

    // Reaping path: of two older PeerPods of one Pod, only the unprotected one is reaped.
    let pod = s.create_pod("app").await;
    let kept_vm = s.define_domain(false);
    let reaped_vm = s.define_domain(false);
    let kept = s
        .create_peerpod("app-resource-kept0", Some(&pod), "libvirt", &kept_vm)
        .await;
    annotate("app-resource-kept0", Some("")).await;
    s.create_peerpod("app-resource-old00", Some(&pod), "libvirt", &reaped_vm)
        .await;
    let created = kept
        .metadata
        .creation_timestamp
        .clone()
        .expect("timestamp")
        .0;
    testenv::wait_for("the next second", Duration::from_secs(5), || async {
        (jiff::Timestamp::now().as_second() > created.as_second() + 1).then_some(())
    })
    .await;
    let new_vm = s.define_domain(false);
    s.create_peerpod("app-resource-new00", Some(&pod), "libvirt", &new_vm)
        .await;
    s.wait_peerpod_gone("app-resource-old00", MINUTE).await;
    assert!(!s.domain_exists(&reaped_vm));
    let kept = s
        .peerpods()
        .get("app-resource-kept0")
        .await
        .expect("the protected older PeerPod is not reaped");
    assert!(kept.metadata.deletion_timestamp.is_none());
    assert!(s.domain_exists(&kept_vm));

    // Orphan path: of two orphans with this cluster's tag, the one tagged do-not-delete stays.
    let protected_orphan = s.define_domain_with_tags(&[
        (crate::support::TAG_KEY, crate::support::TAG_VALUE),
        ("peerpods.io/do-not-delete", "true"),
    ]);
    let orphan = s.define_domain(true);
    testenv::wait_for("the unprotected orphan deleted", MINUTE, || async {
        (!s.domain_exists(&orphan)).then_some(())
    })
    .await;
    // A whole scan started after that one: the protected orphan is seen again and still left alone.
    let scans = ctrl.metric("peerpod_ctrl_orphan_scans_total", &[]);
    testenv::wait_for("two more orphan scans", MINUTE, || async {
        (ctrl.metric("peerpod_ctrl_orphan_scans_total", &[]) >= scans + 2).then_some(())
    })
    .await;
    assert!(s.domain_exists(&protected_orphan));
    assert_eq!(
        ctrl.metric("peerpod_ctrl_orphan_instances", &[("provider", "libvirt")]),
        1,
        "the protected VM is still reported as an orphan"
    );
    assert_eq!(
        ctrl.metric("peerpod_ctrl_orphan_instances_deleted_total", &[]),
        1
    );

    // Lifting the hold lets the held cleanup proceed.
    annotate("held", None).await;
    s.wait_peerpod_gone("held", MINUTE).await;
    assert!(!s.domain_exists(&held_vm));
    // Deletes: the reaped VM, the orphan, the held VM once released; never a protected one.
    assert_eq!(provider.delete_calls("libvirt"), 3);
    assert!(s.domain_exists(&kept_vm) && s.domain_exists(&protected_orphan));
    ctrl.stop().await;
    s.remove_domains([&kept_vm, &new_vm, &protected_orphan]);
    s.cleanup().await;
}

/// When a scan finds more orphans than the cap allows, something is wrong with how the controller sees the
/// cluster, not with that many VMs: it deletes none of them and says why (Event on the controller's
/// namespace, log, metric).
#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_scan_over_its_cap_deletes_nothing_and_says_why() {
    let (s, provider) = Scenario::with_provider("orphan-cap").await;
    let orphans: Vec<String> = (0..3).map(|_| s.define_domain(true)).collect();
    let mut options = ControllerOptions::scanning_orphans(provider.addr, OrphanPolicy::Delete);
    options.orphan_cap = OrphanCap {
        max: 2,
        max_percent: 100,
    };
    let ctrl = s.start_controller(options).await;
    testenv::wait_for("two refused scans", MINUTE, || async {
        (ctrl.metric(
            "peerpod_ctrl_orphan_deletions_refused_total",
            &[
                ("provider", "libvirt"),
                ("reason", "OrphanDeleteCapExceeded"),
            ],
        ) >= 2)
            .then_some(())
    })
    .await;
    assert!(orphans.iter().all(|vm| s.domain_exists(vm)));
    assert_eq!(provider.delete_calls("libvirt"), 0);
    assert!(
        ctrl.metric("peerpod_ctrl_orphan_instances", &[("provider", "libvirt")]) >= 3,
        "they are still reported"
    );
    let refused = s
        .wait_event("default", "an Event saying why", |e| {
            e.reason.as_deref() == Some("OrphanDeleteCapExceeded")
        })
        .await;
    let note = refused.note.unwrap_or_default();
    assert!(
        note.contains("look orphaned") && note.contains("at most 2"),
        "{note}"
    );
    ctrl.stop().await;
    s.remove_domains(&orphans);
    s.cleanup().await;
}

/// The scan itself refuses to act on a PeerPod cache that has not completed its first list, where every VM
/// looks orphaned: nothing is listed, nothing deleted.
#[tokio::test(flavor = "multi_thread")]
async fn an_orphan_scan_before_the_first_list_deletes_nothing() {
    use kube::runtime::events::{Recorder, Reporter};
    use peerpod_ctrl::orphans::DeletionRefused;
    use peerpod_ctrl::orphans::{FirstSeen, OrphanSettings, Scanner};
    use peerpod_ctrl::provider::{Provider, ProviderClientConfig};

    let (s, provider) = Scenario::with_provider("unsynced").await;
    let tracked_elsewhere = s.define_domain(true);
    let (events, event_writer) = peerpods_runtime::events::queue(
        Recorder::new(
            s.client.clone(),
            Reporter {
                controller: "peerpod-ctrl".into(),
                instance: None,
            },
        ),
        peerpods_runtime::events::DEFAULT_QUEUED_EVENTS,
        Default::default(),
    );
    tokio::spawn(event_writer.run());
    let mut scanner = Scanner {
        client: s.client.clone(),
        provider: Provider::connect(&ProviderClientConfig {
            endpoint: format!("http://{}", provider.addr),
            timeout: Some(Duration::from_secs(10)),
            ..Default::default()
        })
        .expect("provider client"),
        events,
        metrics: Default::default(),
        settings: OrphanSettings {
            interval: Duration::from_secs(3600),
            grace: Duration::ZERO,
            policy: OrphanPolicy::Delete,
            cluster_tag: Some((
                crate::support::TAG_KEY.into(),
                crate::support::TAG_VALUE.into(),
            )),
            event_namespace: "default".into(),
            cap: OrphanCap {
                max: 100,
                max_percent: 100,
            },
        },
        first_seen: FirstSeen::default(),
        developer_mode: peerpod_ctrl::developer_mode::Mode::fixed(
            peerpod_ctrl::cleanup::rules::DeveloperMode::Off,
        ),
    };
    // A cache whose watch has not listed yet.
    let store = peerpod_ctrl::cache::Cache::default().store();
    let report = scanner.scan(&store).await;
    assert_eq!(
        report.refused,
        [("*".to_string(), DeletionRefused::CacheNotSynced)]
    );
    assert!(report.deleted.is_empty() && report.orphans.is_empty());
    assert!(s.domain_exists(&tracked_elsewhere));
    assert_eq!(provider.delete_calls("libvirt"), 0);
    s.remove_domains([&tracked_elsewhere]);
    s.cleanup().await;
}

/// provider-service refuses to delete a VM tagged `peerpods.io/do-not-delete` (AWS on moto, through the real
/// SDK): the PeerPod keeps its finalizer with a condition saying so, and the refusal is a hold, not retried
/// hot.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_tagged_do_not_delete_holds_the_cleanup_without_a_retry_storm() {
    use test_support::moto;

    let s = Scenario::start("tagged-hold").await;
    let (_moto_serial, ec2) = moto::alone().await;
    let protected = moto::run_instances(&ec2, 1, &[("peerpods.io/do-not-delete", "true")])
        .await
        .remove(0);
    let clouds = moto::moto().config(&[("CLOUD_PROVIDER", "libvirt,aws")]);
    let provider = ProviderService::start_with_config(&clouds).await;
    let mut options = ControllerOptions::new(provider.addr);
    options.retry_cap = Duration::from_secs(300);
    let ctrl = s.start_controller(options).await;

    s.create_peerpod("tagged", None, "aws", &protected).await;
    s.delete_peerpod("tagged").await;
    let held = wait_held(&s, "tagged", "DoNotDelete").await;
    let message = held.cleaned_condition().map(|c| c.message.clone());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("do-not-delete")),
        "{message:?}"
    );
    // A later cleanup going through shows the controller moved on; the held one was not asked again.
    let marker = s.define_domain(false);
    s.create_peerpod("marker", None, "libvirt", &marker).await;
    s.delete_peerpod("marker").await;
    s.wait_peerpod_gone("marker", MINUTE).await;
    // Give a hot loop every chance to show, as for the other permanent refusals.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(provider.delete_calls("aws"), 1, "a hold is not retried hot");
    assert_eq!(moto::state_of(&ec2, &protected).await, "running");
    s.wait_event_reason("tagged", "DoNotDelete").await;
    s.finish(ctrl).await;
}

/// "Not yet visible" is a wait, not an outage. PeerPods whose VMs the cloud does not show yet (new VMs inside the
/// cloud's consistency window; here libvirt domains that do not exist, with a 3 s window) keep their finalizers,
/// and their condition says what they wait for and since when; none writes a Warning Event, none counts as a
/// failure, and more of them than open a cloud's circuit breaker hold nothing back: a PeerPod of a VM the cloud
/// shows is cleaned up meanwhile as always. Once the window has passed they are released, their VMs already gone.
#[tokio::test(flavor = "multi_thread")]
async fn vms_the_cloud_does_not_show_yet_are_waited_for_without_a_warning_or_the_breaker() {
    use k8s_openapi::api::events::v1::Event;
    use kube::api::{Api, ListParams};

    let unseen: Vec<String> = (0..=peerpods_provider_client::breaker::CLOUD_THRESHOLD)
        .map(|i| format!("unseen-{i}"))
        .collect();
    let s = Scenario::start("not-yet-visible").await;
    let provider = ProviderService::start_with_config(&[(
        "LIBVIRT_NOT_FOUND_WINDOW_SECS".to_owned(),
        "3".to_owned(),
    )])
    .await;
    let ctrl = s
        .start_controller(ControllerOptions::new(provider.addr))
        .await;
    for name in &unseen {
        let vm = uuid::Uuid::new_v4().to_string();
        s.create_peerpod(name, None, "libvirt", &vm).await;
        s.delete_peerpod(name).await;
    }
    for name in &unseen {
        let waiting = wait_held(&s, name, CleanedReason::InstanceNotYetVisible.as_str()).await;
        let message = waiting
            .cleaned_condition()
            .map(|c| c.message.clone())
            .unwrap_or_default();
        assert!(
            message.contains("waiting for the cloud to show") && message.contains("since "),
            "the condition names the wait and since when: {message}"
        );
    }
    // The breaker stays closed: a VM the cloud shows is deleted at once.
    let shown = s.define_domain(false);
    s.create_peerpod("shown", None, "libvirt", &shown).await;
    s.delete_peerpod("shown").await;
    s.wait_peerpod_gone("shown", MINUTE).await;
    assert!(!s.domain_exists(&shown));

    for name in &unseen {
        s.wait_peerpod_gone(name, MINUTE).await;
    }
    for name in &unseen {
        s.wait_event_reason(name, "InstanceAlreadyGone").await;
    }
    let events: Api<Event> = Api::namespaced(s.client.clone(), &s.ns);
    let warnings: Vec<(Option<String>, Option<String>)> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| (e.reason, e.note))
        .collect();
    assert!(warnings.is_empty(), "no Warning Event: {warnings:?}");
    for name in &unseen {
        let reasons = s.event_reasons(name).await;
        assert!(
            reasons
                .iter()
                .all(|r| r == CleanedReason::InstanceNotYetVisible.as_str()
                    || r == "InstanceAlreadyGone"),
            "{name}: {reasons:?}"
        );
    }
    assert_eq!(
        ctrl.metric(
            "peerpod_ctrl_instance_deletes_total",
            &[("result", "CircuitOpen")]
        ),
        0,
        "no call was held back by the breaker"
    );
    assert_eq!(
        ctrl.metric("peerpod_ctrl_reconcile_errors_total", &[]),
        0,
        "a wait is no failure"
    );
    assert!(
        ctrl.metric(
            "peerpod_ctrl_instance_deletes_total",
            &[("result", "in_progress")]
        ) >= unseen.len() as u64
    );
    s.finish(ctrl).await;
}

/// cloud-api-adaptor's ConfigMap in the scenario's namespace, with `PODVM_DEVELOPER_MODE` set to `value`
/// (created or replaced), and controller options that read it there.
async fn set_developer_mode(s: &Scenario, value: &str) {
    use k8s_openapi::api::core::v1::ConfigMap;
    let api: kube::Api<ConfigMap> = kube::Api::namespaced(s.client.clone(), &s.ns);
    let cm = serde_json::json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "peer-pods-cm"},
        "data": {"CLOUD_PROVIDER": "libvirt", "PODVM_DEVELOPER_MODE": value},
    });
    api.patch(
        "peer-pods-cm",
        &PatchParams::apply("scenario").force(),
        &Patch::Apply(&cm),
    )
    .await
    .expect("apply peer-pods-cm");
}

fn reading_developer_mode(s: &Scenario, provider: &ProviderService) -> ControllerOptions {
    ControllerOptions {
        developer_mode: peerpod_ctrl::developer_mode::DeveloperModeSettings {
            namespace: s.ns.clone(),
            name: "peer-pods-cm".into(),
        },
        ..ControllerOptions::new(provider.addr)
    }
}

fn waiting_since(p: &PeerPod) -> Option<jiff::Timestamp> {
    p.status.as_ref()?.waiting_since.as_ref().map(|t| t.0)
}

/// CAA in developer mode keeps a failed pod's VM and its PeerPod's finalizer for debugging: the cleanup is held
/// (the VM named), not carried out; a mode that cannot be read holds it too (fail closed, retried); switched
/// off, the cleanup resumes. The wait is dated from its start throughout.
#[tokio::test(flavor = "multi_thread")]
async fn developer_mode_keeps_the_vm_until_it_is_switched_off() {
    let (s, provider) = Scenario::with_provider("devmode").await;
    set_developer_mode(&s, "true").await;
    let ctrl = s
        .start_controller(reading_developer_mode(&s, &provider))
        .await;
    let vm = s.define_domain(false);
    s.create_peerpod("debugged", None, "libvirt", &vm).await;
    s.delete_peerpod("debugged").await;

    let held = wait_held(&s, "debugged", "DeveloperMode").await;
    let status = held.status.clone().expect("status");
    assert_eq!(status.state, peerpods_api::peerpod::PeerPodState::Held);
    let since = waiting_since(&held).expect("waitingSince set when the hold begins");
    s.wait_event_reason("debugged", "DeveloperMode").await;
    let (_, note) = s
        .events("debugged")
        .await
        .into_iter()
        .find(|(reason, _)| reason == "DeveloperMode")
        .expect("a DeveloperMode Event");
    assert!(note.contains(&vm), "the Event names the VM: {note}");
    assert!(s.domain_exists(&vm), "the VM survives");
    assert_eq!(provider.delete_calls("libvirt"), 0);

    // A value CAA could not parse: the mode is unknown, nothing is deleted, the PeerPod says so and is retried.
    set_developer_mode(&s, "maybe").await;
    wait_held(&s, "debugged", "DeveloperModeUnknown").await;
    let retries = |n| {
        let ctrl = &ctrl;
        async move {
            testenv::wait_for("retries while the mode is unknown", MINUTE, || async {
                (ctrl.metric(
                    "peerpod_ctrl_reconcile_errors_total",
                    &[("reason", "DeveloperModeUnknown")],
                ) >= n)
                    .then_some(())
            })
            .await
        }
    };
    retries(3).await;
    let still = s.peerpods().get("debugged").await.expect("PeerPod");
    assert_eq!(
        waiting_since(&still),
        Some(since),
        "the same wait goes on across reasons and retries"
    );
    assert!(s.domain_exists(&vm));
    assert_eq!(provider.delete_calls("libvirt"), 0);

    set_developer_mode(&s, "false").await;
    s.wait_peerpod_gone("debugged", MINUTE).await;
    assert!(!s.domain_exists(&vm));
    assert_eq!(provider.delete_calls("libvirt"), 1);
    s.finish(ctrl).await;
}

/// A failing cleanup says since when it waits, and keeps saying the same while it is retried.
#[tokio::test(flavor = "multi_thread")]
async fn a_failing_cleanup_keeps_its_waiting_since_across_retries() {
    let s = Scenario::start("waiting-since").await;
    let addr = unused_addr();
    let ctrl = s.start_controller(ControllerOptions::new(addr)).await;
    let vm = s.define_domain(false);
    // Another finalizer keeps the object after the release: the end of the wait shows on it.
    s.create_peerpod_with(
        "failing",
        None,
        "libvirt",
        &vm,
        vec![FINALIZER.to_string(), "example.com/keep".to_string()],
    )
    .await;
    s.delete_peerpod("failing").await;

    let failing = s
        .wait_peerpod("failing", "condition ProviderUnavailable", |p| {
            cleaned(p) == Some(("False".into(), "ProviderUnavailable".into()))
        })
        .await;
    let since = waiting_since(&failing).expect("waitingSince set when the wait begins");
    let attempts = ctrl.metric(
        "peerpod_ctrl_reconcile_errors_total",
        &[("reason", "ProviderUnavailable")],
    );
    testenv::wait_for("two more failed attempts", MINUTE, || async {
        (ctrl.metric(
            "peerpod_ctrl_reconcile_errors_total",
            &[("reason", "ProviderUnavailable")],
        ) >= attempts + 2)
            .then_some(())
    })
    .await;
    let still = s.peerpods().get("failing").await.expect("PeerPod");
    assert_eq!(waiting_since(&still), Some(since));

    let provider = ProviderService::start(Some(addr)).await;
    let done = s
        .wait_peerpod("failing", "cleaned", |p| {
            cleaned(p).is_some_and(|(status, _)| status == "True")
        })
        .await;
    assert_eq!(waiting_since(&done), None, "cleared when the wait ends");
    assert!(!s.domain_exists(&vm));
    assert_eq!(provider.delete_calls("libvirt"), 1);
    s.peerpods()
        .patch(
            "failing",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"finalizers": null}})),
        )
        .await
        .expect("release the other finalizer");
    s.finish(ctrl).await;
}

/// The escape hatch `peerpods.io/release`: never a delete of a VM that is there. On a live PeerPod it is
/// ignored and says so; an unknown value holds; `instance-gone` holds while provider-service still lists the VM
/// and releases once provider-service confirms it gone; `operator` releases at once, the VM untouched, with an
/// Event naming the choice and the VM.
#[tokio::test(flavor = "multi_thread")]
async fn the_release_annotation_releases_without_deleting_a_vm_that_is_there() {
    let (s, provider, ctrl) = Scenario::with_controller("release").await;
    let ask = |name: &'static str, value: &'static str| {
        let api = s.peerpods();
        let patch =
            serde_json::json!({"metadata": {"annotations": {"peerpods.io/release": value}}});
        async move {
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .expect("annotate PeerPod");
        }
    };

    // Asked on a live PeerPod: ignored, and an Event says so.
    let kept_vm = s.define_domain(false);
    s.create_peerpod("typo", None, "libvirt", &kept_vm).await;
    ask("typo", "yes").await;
    s.wait_event_reason("typo", "ReleaseIgnored").await;
    let live = s.peerpods().get("typo").await.expect("PeerPod");
    assert!(live.metadata.deletion_timestamp.is_none());

    // An unknown value: nothing deleted, nothing released.
    s.delete_peerpod("typo").await;
    wait_held(&s, "typo", "UnknownReleaseValue").await;
    s.wait_event_reason("typo", "UnknownReleaseValue").await;
    assert!(s.domain_exists(&kept_vm));

    // instance-gone while provider-service still lists the VM: neither deleted nor released.
    let listed_vm = s.define_domain(false);
    s.create_peerpod("still-there", None, "libvirt", &listed_vm)
        .await;
    ask("still-there", "instance-gone").await;
    s.delete_peerpod("still-there").await;
    wait_held(&s, "still-there", "InstanceStillListed").await;
    assert!(s.domain_exists(&listed_vm));
    assert_eq!(provider.delete_calls("libvirt"), 0);

    // instance-gone on a VM that is gone: provider-service's "already gone" releases it.
    let never_existed = uuid::Uuid::new_v4().to_string();
    s.create_peerpod("gone", None, "libvirt", &never_existed)
        .await;
    ask("gone", "instance-gone").await;
    s.delete_peerpod("gone").await;
    s.wait_peerpod_gone("gone", MINUTE).await;
    s.wait_event_reason("gone", "InstanceAlreadyGone").await;
    assert_eq!(provider.delete_calls("libvirt"), 1);

    // operator: released at once, without a DeleteInstance, recorded as an Event naming the choice and the VM.
    ask("typo", "operator").await;
    s.wait_peerpod_gone("typo", MINUTE).await;
    s.wait_event_reason("typo", "ReleasedByOperator").await;
    let (_, note) = s
        .events("typo")
        .await
        .into_iter()
        .find(|(reason, _)| reason == "ReleasedByOperator")
        .expect("a ReleasedByOperator Event");
    assert!(
        note.contains("operator") && note.contains(&kept_vm),
        "the Event names the choice and the VM: {note}"
    );
    assert!(s.domain_exists(&kept_vm) && s.domain_exists(&listed_vm));
    assert_eq!(
        provider.delete_calls("libvirt"),
        1,
        "no DeleteInstance for the released VM"
    );

    ask("still-there", "operator").await;
    s.wait_peerpod_gone("still-there", MINUTE).await;
    assert_eq!(provider.delete_calls("libvirt"), 1);
    s.remove_domains([&kept_vm, &listed_vm]);
    s.finish(ctrl).await;
}
