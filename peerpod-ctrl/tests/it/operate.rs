//! What an operator sees and relies on, against the real control plane and provider-service (libvirt's test
//! driver): the columns `kubectl get peerpods` prints (the API server's own Table rendering, which kubectl
//! shows as is), the reason of each refusal, where orphan Events land, and reverse collection (a live
//! PeerPod whose VM vanished behind everyone's back).

use std::collections::BTreeMap;
use std::time::Duration;

use crate::support::{Controller, ControllerOptions, ProviderService, Scenario};
use k8s_openapi::api::events::v1::Event;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use peerpod_ctrl::orphans::OrphanPolicy;
use peerpods_api::peerpod::FINALIZER;

const MINUTE: Duration = Duration::from_secs(60);

/// `kubectl get peerpods [-o wide]` as the API server renders it: column names (with their priority) and,
/// per PeerPod name, its cells by column name.
struct Table {
    columns: Vec<(String, i64)>,
    rows: BTreeMap<String, BTreeMap<String, String>>,
}

async fn table(s: &Scenario) -> Table {
    let request = http::Request::get(format!(
        "/apis/confidentialcontainers.org/v1alpha1/namespaces/{}/peerpods",
        s.ns
    ))
    .header(
        "Accept",
        "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
    )
    .body(Vec::new())
    .expect("request");
    let body: serde_json::Value = s.client.request(request).await.expect("Table answer");
    let columns: Vec<(String, i64)> = body["columnDefinitions"]
        .as_array()
        .expect("columns")
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap_or_default().to_string(),
                c["priority"].as_i64().unwrap_or_default(),
            )
        })
        .collect();
    let rows = body["rows"]
        .as_array()
        .expect("rows")
        .iter()
        .map(|row| {
            let cells: BTreeMap<String, String> = columns
                .iter()
                .zip(row["cells"].as_array().expect("cells"))
                .map(|((name, _), cell)| {
                    let text = match cell {
                        serde_json::Value::String(s) => s.clone(),
                        serde_json::Value::Null => String::new(),
                        other => other.to_string(),
                    };
                    (name.clone(), text)
                })
                .collect();
            (cells["Name"].clone(), cells)
        })
        .collect();
    Table { columns, rows }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_shows_a_state_for_live_waiting_held_and_released_peerpods() {
    let s = Scenario::start("columns").await;
    let provider = ProviderService::start(None).await;
    let live_vm = s.define_domain(true);
    let released_vm = s.define_domain(true);
    s.create_peerpod("live", None, "libvirt", &live_vm).await;
    // Waits for the cloud: a provider provider-service does not know is refused on every attempt.
    s.create_peerpod("waiting", None, "nowhere", "vm-0").await;
    let held = s.create_peerpod("held", None, "libvirt", &live_vm).await;
    s.peerpods()
        .patch(
            &held.name_any(),
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"metadata": {"annotations": {"peerpods.io/do-not-delete": "true"}}})),
        )
        .await
        .expect("annotate");
    // Kept after its release by a finalizer of someone else, so its final state can be read.
    s.create_peerpod_with(
        "released",
        None,
        "libvirt",
        &released_vm,
        vec![FINALIZER.to_string(), "example.com/keep".to_string()],
    )
    .await;

    let before = table(&s).await;
    assert_eq!(
        before.columns,
        [
            ("Name".to_string(), 0),
            ("State".to_string(), 0),
            ("Cloud Provider".to_string(), 0),
            ("Instance ID".to_string(), 0),
            ("Age".to_string(), 0),
            ("Reason".to_string(), 1),
            ("Last Attempt".to_string(), 1),
            ("Waiting Since".to_string(), 1),
        ],
        "the default view has the state and upstream's columns (cloud, instance, age); -o wide adds the reason, \
         the last attempt and since when a cleanup waits"
    );
    // A PeerPod nobody wrote status for (as cloud-api-adaptor creates it) reads Live, at no API write.
    assert_eq!(before.rows["live"]["State"], "Live");
    assert_eq!(before.rows["live"]["Cloud Provider"], "libvirt");
    assert_eq!(before.rows["live"]["Instance ID"], live_vm);

    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(provider.addr)).await;
    for name in ["waiting", "held", "released"] {
        s.delete_peerpod(name).await;
    }
    let after = testenv::wait_for("every state written", MINUTE, || async {
        let t = table(&s).await;
        let state = |n: &str| {
            t.rows
                .get(n)
                .map(|r| r["State"].clone())
                .unwrap_or_default()
        };
        (state("waiting") == "WaitingForCloud"
            && state("held") == "Held"
            && state("released") == "Released")
            .then_some(t)
    })
    .await;
    assert_eq!(after.rows["live"]["State"], "Live");
    assert_eq!(after.rows["live"]["Reason"], "");
    assert_eq!(after.rows["waiting"]["Reason"], "ProviderRejected");
    assert_eq!(after.rows["held"]["Reason"], "DoNotDelete");
    assert_eq!(after.rows["released"]["Reason"], "InstanceDeleted");
    for name in ["waiting", "held", "released"] {
        assert!(
            !after.rows[name]["Last Attempt"].is_empty(),
            "{name}: the age of the last attempt is shown"
        );
    }
    for name in ["waiting", "held"] {
        assert!(
            !after.rows[name]["Waiting Since"].is_empty(),
            "{name}: a cleanup that waits shows since when"
        );
    }
    for name in ["live", "released"] {
        assert_eq!(
            after.rows[name]["Waiting Since"], "",
            "{name}: nothing waits"
        );
    }
    assert!(s.domain_exists(&live_vm), "the held PeerPod's VM stays");
    assert!(!s.domain_exists(&released_vm));
    ctrl.stop().await;
    s.remove_domains([&live_vm]);
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refusal_by_the_cluster_tag_guard_says_so() {
    use test_support::moto;

    let s = Scenario::start("guard").await;
    let (_moto_serial, ec2) = moto::alone().await;
    let foreign = moto::run_instances(&ec2, 1, &[]).await.remove(0);
    let tag = format!("{}={}", crate::support::TAG_KEY, crate::support::TAG_VALUE);
    let provider = ProviderService::start_with_config(
        &moto::moto().config(&[("CLUSTER_TAG", tag.as_str()), ("DELETE_UNTAGGED", "deny")]),
    )
    .await;
    s.create_peerpod("foreign", None, "aws", &foreign).await;
    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(provider.addr)).await;
    s.delete_peerpod("foreign").await;
    let p = s
        .wait_peerpod("foreign", "refused by the cluster-tag guard", |p| {
            p.cleaned_condition()
                .is_some_and(|c| c.status == "False" && c.reason == "NotOwnedByCluster")
        })
        .await;
    assert!(p.finalizers().contains(&FINALIZER.to_string()));
    assert_eq!(
        moto::state_of(&ec2, &foreign).await,
        "running",
        "an instance without the cluster tag is never deleted"
    );
    testenv::wait_for(
        "a Warning Event with the guard's reason",
        MINUTE,
        || async {
            s.event_reasons("foreign")
                .await
                .contains(&"NotOwnedByCluster".to_string())
                .then_some(())
        },
    )
    .await;
    ctrl.stop().await;
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn orphan_events_land_in_the_controllers_namespace() {
    let s = Scenario::start("orphan-ns").await;
    let provider = ProviderService::start(None).await;
    let orphan = s.define_domain(true);
    let mut options = ControllerOptions::scanning_orphans(provider.addr, OrphanPolicy::Report);
    options.namespace = s.ns.clone();
    let ctrl = Controller::start(s.client.clone(), options).await;
    let related = format!("libvirt/{orphan}");
    s.wait_event(
        &s.ns,
        "the orphan Event in the controller's namespace",
        |e| {
            e.reason.as_deref() == Some("OrphanInstanceFound")
                && e.related.as_ref().and_then(|r| r.name.as_deref()) == Some(related.as_str())
        },
    )
    .await;
    let in_default: Api<Event> = Api::namespaced(s.client.clone(), "default");
    assert!(
        !in_default
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .iter()
            .any(|e| e.related.as_ref().and_then(|r| r.name.as_deref()) == Some(related.as_str())),
        "nothing about it in default"
    );
    ctrl.stop().await;
    s.remove_domains([&orphan]);
    s.cleanup().await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_live_peerpod_whose_vm_vanished_is_reported_and_nothing_is_deleted() {
    let s = Scenario::start("reverse").await;
    let provider = ProviderService::start(None).await;
    let vanishing = s.define_domain(true);
    let healthy = s.define_domain(true);
    s.create_peerpod("vanishing", None, "libvirt", &vanishing)
        .await;
    s.create_peerpod("healthy", None, "libvirt", &healthy).await;
    let mut options = ControllerOptions::new(provider.addr);
    options.reverse_interval = Duration::from_millis(300);
    options.reverse_grace = Duration::from_secs(2);
    let ctrl = Controller::start(s.client.clone(), options).await;
    // Scans run and find both VMs before anything happens.
    testenv::wait_for("a reverse scan", MINUTE, || async {
        (provider_list_calls(&provider) >= 2).then_some(())
    })
    .await;

    // Behind the controller's back, as an operator in the cloud console would.
    let started = std::time::Instant::now();
    s.remove_domains([&vanishing]);
    let p = s
        .wait_peerpod("vanishing", "reported missing", |p| {
            p.status.as_ref().is_some_and(|st| {
                st.conditions.iter().any(|c| {
                    c.type_ == "InstancePresent"
                        && c.status == "False"
                        && c.reason == "InstanceNotFound"
                })
            })
        })
        .await;
    assert!(
        started.elapsed() >= Duration::from_secs(2),
        "reported only after the grace period"
    );
    assert_eq!(
        serde_json::to_value(p.status.as_ref().expect("status").state).expect("json"),
        "InstanceMissing"
    );
    // Applied under reverse collection's own field manager: the InstancePresent condition and the state.
    let applied = crate::support::applied_status_fields(&p, peerpod_ctrl::reverse::FIELD_MANAGER)
        .expect("reverse collection applied the status");
    assert!(
        applied["f:conditions"]
            .get(r#"k:{"type":"InstancePresent"}"#)
            .is_some()
            && applied.get("f:state").is_some()
            && applied.get("f:cleand").is_none(),
        "{applied:#}"
    );
    assert!(
        p.metadata.deletion_timestamp.is_none(),
        "nothing is deleted"
    );
    assert!(p.finalizers().contains(&FINALIZER.to_string()));
    testenv::wait_for("a Warning Event", MINUTE, || async {
        s.event_reasons("vanishing")
            .await
            .contains(&"InstanceNotFound".to_string())
            .then_some(())
    })
    .await;
    testenv::wait_for("the reverse-orphan gauge", MINUTE, || async {
        (ctrl.metric("peerpod_ctrl_reverse_orphans", &[("provider", "libvirt")]) == 1).then_some(())
    })
    .await;
    let healthy_now = s.peerpods().get("healthy").await.expect("healthy");
    assert!(
        healthy_now
            .status
            .as_ref()
            .is_none_or(|st| st.conditions.is_empty()),
        "a PeerPod whose VM exists is not written to"
    );
    assert!(s.domain_exists(&healthy));
    assert_eq!(
        provider.delete_calls("libvirt"),
        0,
        "reverse collection deletes nothing"
    );
    // Once no live PeerPod names the cloud any more, its gauge reads 0 again rather than the last count. (A
    // PeerPod of another cloud stays, so the controller still has PeerPods to export metrics about.)
    s.create_peerpod("elsewhere", None, "aws", "i-0123456789abcdef0")
        .await;
    s.delete_peerpod("vanishing").await;
    s.delete_peerpod("healthy").await;
    s.wait_peerpod_gone("vanishing", MINUTE).await;
    s.wait_peerpod_gone("healthy", MINUTE).await;
    testenv::wait_for("the reverse-orphan gauge back to 0", MINUTE, || async {
        (ctrl.metric("peerpod_ctrl_reverse_orphans", &[("provider", "libvirt")]) == 0).then_some(())
    })
    .await;
    ctrl.stop().await;
    s.remove_domains([&healthy]);
    s.cleanup().await;
}

/// ListInstances calls provider-service answered, any provider.
fn provider_list_calls(provider: &ProviderService) -> u64 {
    crate::support::count_metric(
        &provider.registry,
        "provider_service_grpc_calls_total",
        &[("method", "ListInstances")],
    )
}
