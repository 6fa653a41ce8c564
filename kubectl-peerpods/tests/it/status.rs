//! `status`, `orphans` and `describe` on a cluster holding one PeerPod of every kind peerpod-ctrl records:
//! live, reverse orphan (VM gone, PeerPod live), terminating with nothing recorded, delete in progress, stuck
//! (failing, and held), orphan and adoptable VMs reported by the orphan scan (one since deleted, one tracked
//! again), and nodes with peer-pods capacity. The states, conditions and Events are written as peerpod-ctrl
//! writes them (its reasons, condition types and Event shapes), at times chosen relative to one `now`, and the
//! output is compared with the files in `tests/golden/` (regenerate with `UPDATE_GOLDEN=1`).

use std::collections::BTreeMap;
use std::path::PathBuf;

use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, Resource};
use kubectl_peerpods::render::{self, Style};
use kubectl_peerpods::{facts, gather};
use peerpods_api::peerpod::{
    CONDITION_CLEANED, CONDITION_INSTANCE_PRESENT, FINALIZER, INSTANCE_API_VERSION, PeerPod,
    PeerPodSpec,
};
use peerpods_api::peerpod::{CleanedReason, EventReason, InstancePresentReason};
use serde_json::json;

/// How long before `now` the PeerPods were deleted: long enough that the few seconds between the deletes never
/// change the minute shown.
const DELETED_AGO: SignedDuration = SignedDuration::from_mins(10);

#[tokio::test]
async fn every_case_lands_in_its_place() {
    // status reads every namespace: a control plane of its own, where no other test's PeerPods show.
    let cp = testenv::shared_for(module_path!());
    let client = cp.client().await;
    testenv::apply_crds(&client, "deploy/crds/peerpods.yaml").await;
    let ns = testenv::namespace(&client, "plugin").await;
    let peerpods: Api<PeerPod> = Api::namespaced(client.clone(), &ns);

    for (name, provider, instance) in [
        ("live-a", "libvirt", "vm-live"),
        ("live-b", "aws", "i-live"),
        ("reverse", "libvirt", "vm-gone"),
        ("in-progress", "aws", "i-deleting"),
        ("stuck", "aws", "i-stuck"),
        ("held", "libvirt", "vm-held"),
        ("terminating", "libvirt", "vm-term"),
    ] {
        create(&peerpods, name, provider, instance).await;
    }
    // The terminating one last: `now` follows from its deletion time, and the others' are a little older.
    for name in ["in-progress", "stuck", "held", "terminating"] {
        peerpods
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let deleted = peerpods.get("terminating").await.unwrap();
    let now = deleted.metadata.deletion_timestamp.unwrap().0 + DELETED_AGO;
    let ago = |mins: i64| now - SignedDuration::from_mins(mins);

    // What peerpod-ctrl records: the reverse scan's condition, the reconciler's Cleaned condition and state.
    write_status(
        &peerpods,
        "reverse",
        json!({
            "state": "InstanceMissing", "reason": InstancePresentReason::InstanceNotFound.as_str(), "lastAttemptTime": ago(30),
            "conditions": [condition(CONDITION_INSTANCE_PRESENT, "False", InstancePresentReason::InstanceNotFound.as_str(), ago(30),
                "libvirt instance vm-gone is not listed by the cloud")],
        }),
    )
    .await;
    write_status(
        &peerpods,
        "in-progress",
        json!({
            "state": "WaitingForCloud", "reason": CleanedReason::DeleteInProgress.as_str(),
            "waitingSince": ago(9), "lastAttemptTime": ago(1),
            "conditions": [condition(CONDITION_CLEANED, "False", CleanedReason::DeleteInProgress.as_str(), ago(9),
                "provider-service is deleting aws instance i-deleting; the finalizer stays until the VM is confirmed gone")],
        }),
    )
    .await;
    write_status(
        &peerpods,
        "stuck",
        json!({
            "state": "WaitingForCloud", "reason": "ProviderUnavailable",
            "waitingSince": ago(150), "lastAttemptTime": ago(3),
            "conditions": [condition(CONDITION_CLEANED, "False", "ProviderUnavailable", ago(150),
                "Instance not deleted yet, finalizer kept: provider-service unavailable")],
        }),
    )
    .await;
    write_status(
        &peerpods,
        "held",
        json!({
            "state": "Held", "reason": CleanedReason::DoNotDelete.as_str(), "waitingSince": ago(8),
            "conditions": [condition(CONDITION_CLEANED, "False", CleanedReason::DoNotDelete.as_str(), ago(8),
                "Annotation peerpods.io/do-not-delete is set")],
        }),
    )
    .await;

    // The reconciler's Events about the stuck PeerPod, and one about an earlier PeerPod of the same name.
    let stuck = peerpods.get("stuck").await.unwrap();
    let stuck_ref = stuck.object_ref(&());
    event(
        &client,
        &ns,
        "stuck-1",
        stuck_ref.clone(),
        None,
        "Warning",
        "ProviderUnavailable",
        "Instance not deleted yet, finalizer kept: provider-service unavailable",
        ago(150),
    )
    .await;
    event(
        &client,
        &ns,
        "stuck-2",
        stuck_ref.clone(),
        None,
        "Normal",
        "PeerPodDeleted",
        "PeerPod deleted; deleting aws instance i-stuck",
        ago(151),
    )
    .await;
    let earlier = ObjectReference {
        uid: Some("00000000-0000-0000-0000-000000000000".into()),
        ..stuck_ref
    };
    event(
        &client,
        &ns,
        "stuck-earlier",
        earlier,
        None,
        "Normal",
        "InstanceDeleted",
        "an earlier PeerPod of the same name",
        ago(300),
    )
    .await;

    // The orphan scan's Events on the controller's Namespace, each about one VM.
    let namespace_ref = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Namespace".into()),
        name: Some(ns.clone()),
        namespace: Some(ns.clone()),
        ..Default::default()
    };
    for (name, vm, type_, reason, note, mins) in [
        (
            "orphan",
            "libvirt/vm-orphan",
            "Warning",
            "OrphanInstanceFound",
            "libvirt instance vm-orphan carries this cluster's tag and no PeerPod refers to it",
            4,
        ),
        (
            "adoptable",
            "aws/i-adopt",
            "Warning",
            EventReason::AdoptableInstanceFound.as_str(),
            "aws instance i-adopt (podvm-web-0-1234abcd) is cloud-api-adaptor's for the VM of Pod default/web-0",
            6,
        ),
        (
            "reaped-found",
            "libvirt/vm-reaped",
            "Warning",
            "OrphanInstanceFound",
            "libvirt instance vm-reaped carries this cluster's tag and no PeerPod refers to it",
            20,
        ),
        (
            "reaped-deleted",
            "libvirt/vm-reaped",
            "Normal",
            "OrphanInstanceDeleted",
            "Deleted orphan libvirt instance vm-reaped",
            19,
        ),
        (
            "tracked-again",
            "aws/i-live",
            "Warning",
            "OrphanInstanceFound",
            "aws instance i-live carries this cluster's tag and no PeerPod refers to it",
            40,
        ),
    ] {
        let instance = ObjectReference {
            api_version: Some(INSTANCE_API_VERSION.into()),
            kind: Some("Instance".into()),
            name: Some(vm.into()),
            ..Default::default()
        };
        event(
            &client,
            &ns,
            name,
            namespace_ref.clone(),
            Some(instance),
            type_,
            reason,
            note,
            ago(mins),
        )
        .await;
    }

    // Capacity as peer-pod-config-ctrl advertises it; a node without peer pods is left out.
    node(&client, "node-a", Some(("10", "8"))).await;
    node(&client, "node-b", Some(("2", "2"))).await;
    node(&client, "node-plain", None).await;

    let mut cluster = gather::cluster(&client).await.unwrap();
    for pp in &mut cluster.peerpods {
        pp.namespace = same_namespace(&pp.namespace, &ns);
    }
    let style = Style::default();
    golden("status.txt", &render::status(&cluster, now, style));
    golden("orphans.txt", &render::orphans(&cluster, now, style));
    let (mut pp, events) = gather::peerpod_story(&client, &ns, "stuck").await.unwrap();
    pp.namespace = same_namespace(&pp.namespace, &ns);
    golden(
        "describe-stuck.txt",
        &render::describe(&pp, &events, now, style),
    );
    assert_eq!(facts::place(&pp), facts::Place::Stuck);

    // The binary wires its arguments to the same library: its own `now`, so only the places are compared.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-peerpods"))
        .args(["status", "--colour", "never"])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    for section in [
        "Stuck deletes (2)",
        "Deletes in progress (1)",
        "Terminating (1)",
        "Reverse orphans (VM gone, PeerPod live) (1)",
        "Orphan VMs (no PeerPod) (2)",
    ] {
        assert!(text.contains(section), "{section} missing from:\n{text}");
    }
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-peerpods"))
        .args(["describe", &format!("{ns}/no-such-peerpod")])
        .env("KUBECONFIG", cp.kubeconfig_path())
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not found"));
}

async fn create(api: &Api<PeerPod>, name: &str, provider: &str, instance_id: &str) {
    let mut pp = PeerPod::new(
        name,
        PeerPodSpec {
            cloud_provider: provider.into(),
            instance_id: instance_id.into(),
        },
    );
    pp.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
    api.create(&PostParams::default(), &pp).await.unwrap();
}

async fn write_status(api: &Api<PeerPod>, name: &str, status: serde_json::Value) {
    api.patch_status(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({ "status": status })),
    )
    .await
    .unwrap();
}

fn condition(
    type_: &str,
    status: &str,
    reason: &str,
    since: Timestamp,
    message: &str,
) -> serde_json::Value {
    json!({
        "type": type_, "status": status, "reason": reason, "message": message,
        "lastTransitionTime": since.strftime("%Y-%m-%dT%H:%M:%SZ").to_string(),
    })
}

/// An Event as kube's `Recorder` writes it (events.k8s.io/v1), at a given time.
#[allow(clippy::too_many_arguments)]
async fn event(
    client: &Client,
    ns: &str,
    name: &str,
    regarding: ObjectReference,
    related: Option<ObjectReference>,
    type_: &str,
    reason: &str,
    note: &str,
    at: Timestamp,
) {
    let event = Event {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            ..Default::default()
        },
        event_time: Some(MicroTime(at)),
        action: Some("DeleteInstance".into()),
        reason: Some(reason.into()),
        note: Some(note.into()),
        type_: Some(type_.into()),
        regarding: Some(regarding),
        related,
        reporting_controller: Some("peerpod-ctrl".into()),
        reporting_instance: Some("peerpod-ctrl-0".into()),
        ..Default::default()
    };
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &event).await.unwrap();
}

async fn node(client: &Client, name: &str, vms: Option<(&str, &str)>) {
    let api: Api<Node> = Api::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &node).await.unwrap();
    let Some((capacity, allocatable)) = vms else {
        return;
    };
    let amount =
        |q: &str| BTreeMap::from([("kata.peerpods.io/vm".to_string(), Quantity(q.into()))]);
    let status =
        json!({"status": {"capacity": amount(capacity), "allocatable": amount(allocatable)}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await
        .unwrap();
}

/// The scenario's namespace (a random name) as `scenario`, so that the output, column widths included, is
/// the same on every run.
fn same_namespace(namespace: &str, scenario: &str) -> String {
    if namespace == scenario {
        "scenario".to_string()
    } else {
        namespace.to_string()
    }
}

/// Compares `text` with `tests/golden/<file>`.
fn golden(file: &str, text: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(file);
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, text).unwrap();
    }
    let expected = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (UPDATE_GOLDEN=1 writes it)", path.display()));
    assert!(
        text == expected,
        "{file} differs from the golden file.\n--- expected\n{expected}\n--- got\n{text}"
    );
}
