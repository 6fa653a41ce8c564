//! The Event queue against the real API server (the local control plane): what was queued is written, in order,
//! and the writer ends once every publisher is gone, so a stopping controller writes what it queued.

use std::time::Duration;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as EventObject;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use peerpods_runtime::events::queue;
use prometheus_client::metrics::counter::Counter;

const MINUTE: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread")]
async fn queued_events_are_written_in_order_and_the_writer_ends_with_its_publishers() {
    let client = testenv::shared().client().await;
    let ns = testenv::namespace(&client, "events").await;
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "events-test".into(),
            instance: None,
        },
    );
    let dropped = Counter::default();
    let (events, writer) = queue(recorder, 8, dropped.clone());
    let about = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("ConfigMap".into()),
        name: Some("queued".into()),
        namespace: Some(ns.clone()),
        ..ObjectReference::default()
    };
    // Published before the writer runs: a publish never waits for it.
    // Not in alphabetical order, so the order checked is the queue's.
    for reason in ["Start", "Progress", "End"] {
        assert!(events.publish(
            Event {
                type_: EventType::Normal,
                reason: reason.into(),
                note: Some(format!("{reason} of the test")),
                action: "Test".into(),
                secondary: None,
            },
            about.clone(),
        ));
    }
    drop(events);
    tokio::time::timeout(MINUTE, writer.run())
        .await
        .expect("the writer ends once its publishers are gone and the queue is written");

    let written = Api::<EventObject>::namespaced(client, &ns)
        .list(&ListParams::default())
        .await
        .expect("list Events");
    let mut reasons: Vec<_> = written
        .items
        .iter()
        .map(|e| {
            (
                e.event_time.as_ref().map(|t| t.0),
                e.reason.clone().unwrap_or_default(),
            )
        })
        .collect();
    reasons.sort();
    assert_eq!(
        reasons.into_iter().map(|(_, r)| r).collect::<Vec<_>>(),
        ["Start", "Progress", "End"],
        "every queued Event written, in the order queued"
    );
    assert_eq!(dropped.get(), 0);
}
