//! Events written behind the work they describe, as client-go's event broadcaster writes them: a publish queues the
//! Event and returns at once, and one writer creates the queued Events one after another.
//!
//! Why not in line: an Event about a cleanup is read by people and tools later, while the finalizer's release
//! is what a deleted Pod, its namespace and the node wait for. Written in line, every cleanup waited for two API
//! writes instead of one, and a storm of cleanups took twice the API server's time for its releases. Queued, the
//! release goes first and the Events follow at one write at a time, a small share of the server beside the
//! reconciles' writes.
//!
//! A bounded queue, as client-go's (1,000 Events there): when the API server cannot keep up, an Event that finds
//! the queue full is dropped, counted on the `dropped` counter and logged with its object, rather than holding
//! memory without bound or holding up the work it is about. Conditions, metrics and logs carry the same outcome.
//! The writer ends once every [`Events`] handle is dropped and the queue is empty, so a stopping controller
//! writes what it queued (see [`EventWriter::run`]).

use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event, Recorder};
use prometheus_client::metrics::counter::Counter;
use tokio::sync::mpsc;
use tracing::warn;

/// How many Events wait for the writer at most: client-go's bound (`maxQueuedEvents`, 1,000), rounded up.
pub const DEFAULT_QUEUED_EVENTS: usize = 1024;

/// One Event waiting to be written, and the object it is about.
pub struct Queued {
    pub event: Event,
    pub about: ObjectReference,
}

/// The publishing side: cheap to clone, never waits for the API server.
#[derive(Clone, Debug)]
pub struct Events {
    queue: mpsc::Sender<Queued>,
    dropped: Counter,
}

impl Events {
    /// Queues `event` about `about` for the writer; returns whether it was queued. A full queue (the writer
    /// behind the API server) or a stopped writer drops the Event: counted on `dropped` and logged.
    pub fn publish(&self, event: Event, about: ObjectReference) -> bool {
        match self.queue.try_send(Queued { event, about }) {
            Ok(()) => true,
            Err(
                mpsc::error::TrySendError::Full(queued) | mpsc::error::TrySendError::Closed(queued),
            ) => {
                self.dropped.inc();
                warn!(
                    reason = queued.event.reason,
                    kind = queued.about.kind.as_deref().unwrap_or_default(),
                    namespace = queued.about.namespace.as_deref().unwrap_or_default(),
                    name = queued.about.name.as_deref().unwrap_or_default(),
                    "Event dropped: the queue of Events to write is full, or its writer has stopped"
                );
                false
            }
        }
    }
}

/// The writing side: creates the queued Events through a [`Recorder`], one at a time.
pub struct EventWriter {
    queue: mpsc::Receiver<Queued>,
    recorder: Recorder,
}

impl EventWriter {
    /// Writes the queued Events until every [`Events`] handle is dropped and the queue is empty. A failed write
    /// is logged and not retried: Events are best effort, and the next one of a series counts up in its place.
    pub async fn run(mut self) {
        while let Some(Queued { event, about }) = self.queue.recv().await {
            if let Err(error) = self.recorder.publish(&event, &about).await {
                warn!(
                    %error,
                    reason = event.reason,
                    kind = about.kind.as_deref().unwrap_or_default(),
                    namespace = about.namespace.as_deref().unwrap_or_default(),
                    name = about.name.as_deref().unwrap_or_default(),
                    "cannot publish Event"
                );
            }
        }
    }
}

/// A queue of at most `capacity` Events (at least one) written through `recorder`; Events dropped because it is
/// full count on `dropped`.
pub fn queue(recorder: Recorder, capacity: usize, dropped: Counter) -> (Events, EventWriter) {
    let (tx, rx) = channel(capacity, dropped);
    (
        tx,
        EventWriter {
            queue: rx,
            recorder,
        },
    )
}

fn channel(capacity: usize, dropped: Counter) -> (Events, mpsc::Receiver<Queued>) {
    let (tx, rx) = mpsc::channel(capacity.max(1));
    (Events { queue: tx, dropped }, rx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::events::EventType;

    fn event(reason: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: None,
            action: "Test".into(),
            secondary: None,
        }
    }

    fn about(name: &str) -> ObjectReference {
        ObjectReference {
            kind: Some("PeerPod".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            ..ObjectReference::default()
        }
    }

    #[test]
    fn a_publish_queues_without_waiting_and_a_full_queue_drops_and_counts() {
        let dropped = Counter::default();
        let (events, mut rx) = channel(2, dropped.clone());
        // Nothing reads the queue: a publish that waited for the writer would never return.
        assert!(events.publish(event("First"), about("a")));
        assert!(events.clone().publish(event("Second"), about("b")));
        assert!(!events.publish(event("Third"), about("c")));
        assert_eq!(dropped.get(), 1);
        // The queued ones come out in order, the dropped one not at all.
        let first = rx.try_recv().expect("first queued");
        assert_eq!(
            (first.event.reason.as_str(), first.about.name.as_deref()),
            ("First", Some("a"))
        );
        assert_eq!(rx.try_recv().expect("second queued").event.reason, "Second");
        assert!(rx.try_recv().is_err());
        // Room again once the writer took them.
        assert!(events.publish(event("Fourth"), about("d")));
        assert_eq!(dropped.get(), 1);
    }

    #[test]
    fn a_stopped_writer_drops_and_counts() {
        let dropped = Counter::default();
        let (events, rx) = channel(0, dropped.clone());
        drop(rx);
        assert!(!events.publish(event("Late"), about("a")));
        assert_eq!(dropped.get(), 1);
    }

    #[test]
    fn a_queue_holds_at_least_one_event() {
        let (events, mut rx) = channel(0, Counter::default());
        assert!(events.publish(event("One"), about("a")));
        assert_eq!(rx.try_recv().expect("queued").event.reason, "One");
    }
}
