//! What the reconciles of one leadership term share: the clients, the PeerPod cache, the metrics, and what this
//! controller remembers of each PeerPod between passes (failures, deletes in progress, when its deletion was
//! first seen, when its Warning Event was last published).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::Instant;

use kube::Resource;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::{ObjectRef, Store};
use peerpods_runtime::backoff::{Backoff, Failures};
use peerpods_runtime::events::Events;
use tokio::sync::Semaphore;

use crate::cleanup::reminders::Reminders;
use crate::cleanup::rules::InProgress;
use crate::developer_mode::Mode;
use crate::index::OwnerIndex;
use crate::metrics::Metrics;
use crate::provider::Provider;
use peerpods_api::peerpod::PeerPod;

/// The default bound of the reconciles' API writes in flight ([`Context::write`]).
pub const DEFAULT_API_WRITES: u16 = 32;

/// Everything a reconcile needs. One per leadership term: a new term starts with fresh watches.
pub struct Context {
    pub client: kube::Client,
    pub provider: Provider,
    /// Events are queued and written behind the reconciles (peerpods_runtime::events).
    pub events: Events,
    pub metrics: Metrics,
    pub backoff: Backoff,
    pub store: Store<PeerPod>,
    pub index: OwnerIndex,
    /// Consecutive failures per PeerPod, for the exponential backoff. Cleared on success and on deletion.
    pub(crate) failures: Failures<ObjectRef<PeerPod>>,
    /// When this controller first saw each PeerPod waiting for cleanup: the release latency is measured
    /// from here (deletionTimestamp has whole seconds only). Cleared when the object is gone.
    deletion_seen: Mutex<HashMap<ObjectRef<PeerPod>, Instant>>,
    /// Deletes provider-service answered "still in progress" for, per PeerPod: when to ask again. Cleared
    /// when the VM is confirmed gone and when the object is gone.
    in_progress: Mutex<HashMap<ObjectRef<PeerPod>, InProgress>>,
    /// When each failing PeerPod's Warning Event was last published.
    pub(crate) reminders: Reminders<ObjectRef<PeerPod>>,
    /// cloud-api-adaptor's developer mode as last read.
    pub(crate) developer_mode: Mode,
    /// The reconciles' API writes in flight ([`Context::write`]).
    writes: WriteBound,
}

impl Context {
    /// A context with nothing remembered yet, reading the PeerPods from `store` and `index`.
    pub(crate) fn new(
        client: kube::Client,
        provider: Provider,
        events: Events,
        metrics: Metrics,
        backoff: Backoff,
        (store, index): (Store<PeerPod>, OwnerIndex),
        developer_mode: Mode,
    ) -> Self {
        Context {
            client,
            // A fresh circuit breaker per term.
            provider: provider.with_breaker(),
            events,
            metrics,
            backoff,
            store,
            index,
            failures: Failures::default(),
            deletion_seen: Mutex::default(),
            in_progress: Mutex::default(),
            reminders: Reminders::default(),
            developer_mode,
            writes: WriteBound::new(DEFAULT_API_WRITES),
        }
    }

    /// At most `at_once` API writes of the reconciles in flight (at least one).
    pub(crate) fn with_api_writes(mut self, at_once: u16) -> Self {
        self.writes = WriteBound::new(at_once);
        self
    }

    /// Runs one API write of a reconcile once fewer than the bound of writes are in flight: a storm of
    /// cleanups whose VMs the cloud confirms together writes to the API server at a steady rate, not all at
    /// once.
    pub(crate) async fn write<T>(&self, write: impl Future<Output = T>) -> T {
        self.writes.run(write).await
    }

    pub(crate) fn deletion_seen(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<PeerPod>, Instant>> {
        self.deletion_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn forget(&self, key: &ObjectRef<PeerPod>) {
        self.failures.forget(key);
    }

    pub(crate) fn in_progress(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<PeerPod>, InProgress>> {
        self.in_progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object is gone: nothing of it is kept.
    pub(crate) fn forget_object(&self, key: &ObjectRef<PeerPod>) {
        self.failures.forget(key);
        self.deletion_seen().remove(key);
        self.in_progress().remove(key);
        self.reminders.retain(|k| k != key);
    }

    /// After a re-list: forgets every object the new list did not bring back. Its Delete event was missed (the
    /// watch was down meanwhile), so nothing else would ever forget it.
    pub(crate) fn forget_absent(&self, listed: impl Fn(&ObjectRef<PeerPod>) -> bool) {
        self.failures.retain(|key| listed(key));
        self.deletion_seen().retain(|key, _| listed(key));
        self.in_progress().retain(|key, _| listed(key));
        self.reminders.retain(|key| listed(key));
    }
}

/// At most so many writes in flight at once.
struct WriteBound(Semaphore);

impl WriteBound {
    fn new(at_once: u16) -> Self {
        WriteBound(Semaphore::new(usize::from(at_once.max(1))))
    }

    async fn run<T>(&self, write: impl Future<Output = T>) -> T {
        // Never closed; were it ever, the write would go ahead unbounded rather than not at all.
        let _permit = self.0.acquire().await.ok();
        write.await
    }
}

/// Publishes an Event about `peerpod`; best effort. Queued, not written here: the reconcile goes on (to the
/// finalizer's release) without waiting for the API server to take it.
pub(crate) fn publish(
    ctx: &Context,
    peerpod: &PeerPod,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    ctx.events.publish(event, peerpod.object_ref(&()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn no_more_writes_than_the_bound_are_in_flight() {
        let bound = WriteBound::new(2);
        let (in_flight, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let write = || async {
            let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(now, Ordering::SeqCst);
            for _ in 0..3 {
                tokio::task::yield_now().await;
            }
            in_flight.fetch_sub(1, Ordering::SeqCst);
        };
        futures::future::join_all((0..5).map(|_| bound.run(write()))).await;
        assert_eq!(most.load(Ordering::SeqCst), 2);
        // Zero is no bound that stops every write: one at a time.
        let one = WriteBound::new(0);
        assert_eq!(one.run(async { 7 }).await, 7);
    }
}
