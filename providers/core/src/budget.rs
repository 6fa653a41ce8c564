//! A call budget per backend: deletes and everything else (capacity, listing, health) draw on
//! separate semaphores, so a flood of capacity polls or listings queues behind its own bound and
//! never takes the slots cleanups need. Every backend is wrapped in one ([`Budgeted`]), whatever
//! the cloud; backends that bound their calls further (AWS's own semaphore and rate limit) keep
//! doing so inside it.
//!
//! A delete holds its slot while it asks the cloud, not while it waits between two asks (the
//! deletion driver's pace, [`without_delete_slot`]): a delete waiting seconds for the cloud to
//! confirm leaves its slot to the next delete's call, so a storm's deletes wait for the cloud
//! side by side, and its lookups and deletes reach the cloud together (where the backend batches
//! them, in one call), instead of 32 at a time each holding its slot through its waits.
//!
//! A delete's time bound ([`Budgeted::with_delete_bound`]) starts once the delete first holds its
//! slot: in a storm of slow deletes the ones queued for a slot wait as long as the slots stay
//! taken, and that wait is not theirs to be cut short for (they have not asked the cloud anything
//! yet). Nor are its waits to take a slot back after a pause: a delete is cut off at its bound
//! (answered retryably; the next call resumes it) for the time it spent asking and pausing, never
//! for the time other deletes held the slots.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use crate::{
    CallBudget, Capacity, DeleteOutcome, Error, Health, Instance, Provider, ProviderName,
    TagSelector,
};

/// A backend behind a [`CallBudget`].
pub struct Budgeted {
    inner: Arc<dyn Provider>,
    deletes: Arc<Semaphore>,
    reads: Semaphore,
    /// The longest one delete runs once it holds its slot; `None`: as long as the backend takes.
    delete_bound: Option<Duration>,
}

impl Budgeted {
    pub fn new(inner: Arc<dyn Provider>, budget: CallBudget) -> Self {
        Budgeted {
            inner,
            deletes: Arc::new(Semaphore::new(budget.deletes.max(1))),
            reads: Semaphore::new(budget.reads.max(1)),
            delete_bound: None,
        }
    }

    /// Each delete ends within `bound` of taking its slot: a backend still deleting then is
    /// answered `Unavailable` (retryable; every backend resumes a partial delete on the next
    /// call). The wait for a slot does not count.
    pub fn with_delete_bound(mut self, bound: Duration) -> Self {
        self.delete_bound = Some(bound);
        self
    }

    /// Delete slots free now (for tests and figures).
    pub fn free_delete_slots(&self) -> usize {
        self.deletes.available_permits()
    }
}

/// The semaphores are never closed; should that ever change, a call fails instead of running
/// unbounded.
fn closed() -> Error {
    Error::internal("call budget closed")
}

tokio::task_local! {
    /// The delete slot of the delete running in this task: set by [`Budgeted::delete_instance`]
    /// around the backend's delete, read by [`without_delete_slot`] in the deletion driver's
    /// pauses. A task-local, because the slot belongs to the budget wrapped around a backend and
    /// the pauses to the driver inside it, with the backend's own code between the two.
    static DELETE_SLOT: Arc<HeldSlot>;
}

/// The slot one delete holds, and how long it has queued to take it back after its pauses.
struct HeldSlot {
    slots: Arc<Semaphore>,
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    /// `None` while the delete pauses or queues.
    permit: Option<OwnedSemaphorePermit>,
    /// Since when the delete queues for its slot again, if it does now.
    queued_since: Option<Instant>,
    /// How long its earlier queueings took together.
    queued_for: Duration,
}

impl HeldSlot {
    fn holding(slots: Arc<Semaphore>, permit: OwnedSemaphorePermit) -> Self {
        HeldSlot {
            slots,
            state: Mutex::new(SlotState {
                permit: Some(permit),
                ..SlotState::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, SlotState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How long the delete has queued for its slot again by `now` (a queueing going on counts up
    /// to `now`): time the delete's bound does not count.
    fn queued(&self, now: Instant) -> Duration {
        let state = self.state();
        state.queued_for
            + state
                .queued_since
                .map_or(Duration::ZERO, |since| now.saturating_duration_since(since))
    }
}

/// Runs `pause` (a wait between two cloud calls of one delete) without the delete slot the delete
/// holds, and takes a slot again before returning, so the delete's next call is budgeted as its
/// first was; the queueing for it is left out of the delete's bound, as the first one is. Outside
/// a budgeted delete (a backend called directly, as in tests) it only waits.
pub(crate) async fn without_delete_slot<T>(pause: impl Future<Output = T>) -> Result<T, Error> {
    let held = DELETE_SLOT.try_with(Arc::clone).ok();
    if let Some(held) = &held {
        drop(held.state().permit.take());
    }
    let output = pause.await;
    if let Some(held) = held {
        held.state().queued_since = Some(Instant::now());
        let permit = held.slots.clone().acquire_owned().await;
        let mut state = held.state();
        let queued = state
            .queued_since
            .take()
            .map_or(Duration::ZERO, |since| since.elapsed());
        state.queued_for += queued;
        state.permit = Some(permit.map_err(|_| closed())?);
    }
    Ok(output)
}

#[async_trait]
impl Provider for Budgeted {
    fn name(&self) -> ProviderName {
        self.inner.name()
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        self.inner.validate_instance_id(instance_id)
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let permit = self
            .deletes
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| closed())?;
        // The slot goes with the delete (its pauses give it back a while, [`without_delete_slot`])
        // and is released when the delete ends or is cut off at its bound.
        let held = Arc::new(HeldSlot::holding(self.deletes.clone(), permit));
        let delete = DELETE_SLOT.scope(held.clone(), self.inner.delete_instance(instance_id));
        // The delete starts now, and so does its bound.
        let Some(bound) = self.delete_bound else {
            return delete.await;
        };
        let started = Instant::now();
        let mut delete = std::pin::pin!(delete);
        // The bound plus the time queued for the slot again: pushed back while the delete queues.
        let deadline = || started + bound + held.queued(Instant::now());
        loop {
            tokio::select! {
                outcome = &mut delete => return outcome,
                () = tokio::time::sleep_until(deadline()) => {
                    if Instant::now() >= deadline() {
                        break;
                    }
                }
            }
        }
        Err(Error::unavailable(format!(
            "the delete of {instance_id} did not end within {} s of its start; ask again to \
             resume it",
            bound.as_secs_f64()
        )))
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        let _slot = self.reads.acquire().await.map_err(|_| closed())?;
        self.inner.capacity().await
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let _slot = self.reads.acquire().await.map_err(|_| closed())?;
        self.inner.list_instances(selector).await
    }

    async fn health(&self) -> Health {
        match self.reads.acquire().await {
            Ok(_slot) => self.inner.health().await,
            Err(_) => Health {
                healthy: false,
                message: closed().to_string(),
            },
        }
    }

    async fn last_health(&self) -> Option<Health> {
        self.inner.last_health().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testing::{DeleteOnly, Deletes};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::sync::Notify;

    /// A backend whose reads wait until released, counting deletes: pure logic, no cloud.
    struct Stuck {
        release: Notify,
        deletes: AtomicUsize,
    }

    #[async_trait]
    impl Provider for Stuck {
        fn name(&self) -> ProviderName {
            ProviderName::Libvirt
        }
        fn validate_instance_id(&self, _: &str) -> Result<(), Error> {
            Ok(())
        }
        async fn delete_instance(&self, _: &str) -> Result<DeleteOutcome, Error> {
            self.deletes.fetch_add(1, Ordering::SeqCst);
            Ok(DeleteOutcome::Deleted)
        }
        async fn capacity(&self) -> Result<Capacity, Error> {
            self.release.notified().await;
            Ok(Capacity::default())
        }
        async fn list_instances(&self, _: &TagSelector) -> Result<Vec<Instance>, Error> {
            self.release.notified().await;
            Ok(Vec::new())
        }
        async fn health(&self) -> Health {
            self.release.notified().await;
            Health {
                healthy: true,
                message: String::new(),
            }
        }
    }

    #[tokio::test]
    async fn stuck_reads_leave_deletes_their_slots() {
        let stuck = Arc::new(Stuck {
            release: Notify::new(),
            deletes: AtomicUsize::new(0),
        });
        let budgeted = Arc::new(Budgeted::new(
            stuck.clone(),
            CallBudget {
                deletes: 2,
                reads: 2,
            },
        ));
        let reads: Vec<_> = (0..20)
            .map(|_| {
                let b = budgeted.clone();
                tokio::spawn(async move { b.capacity().await })
            })
            .collect();
        // Every read slot is taken by a read that does not end.
        while budgeted.reads.available_permits() > 0 {
            tokio::task::yield_now().await;
        }
        for i in 0..10 {
            // Generous: with one shared bound the deletes would wait for the stuck reads forever.
            let outcome = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                budgeted.delete_instance(&format!("vm-{i}")),
            )
            .await
            .expect("a delete is not held up by stuck reads");
            assert_eq!(outcome.unwrap(), DeleteOutcome::Deleted);
        }
        assert_eq!(stuck.deletes.load(Ordering::SeqCst), 10);
        assert_eq!(budgeted.free_delete_slots(), 2);
        for read in reads {
            read.abort();
        }
    }

    /// A backend whose deletes pause once ([`without_delete_slot`]) until `together` deletes
    /// pause at the same time.
    struct Pausing {
        together: tokio::sync::Barrier,
        /// The budget's delete slots, and how many were free as each delete went on after its pause.
        slots: std::sync::OnceLock<Arc<Semaphore>>,
        free_after_pause: std::sync::Mutex<Vec<usize>>,
    }

    #[async_trait]
    impl Deletes for Pausing {
        async fn delete(&self, _: &str) -> Result<DeleteOutcome, Error> {
            without_delete_slot(self.together.wait()).await?;
            if let Some(slots) = self.slots.get() {
                self.free_after_pause
                    .lock()
                    .unwrap()
                    .push(slots.available_permits());
            }
            Ok(DeleteOutcome::Deleted)
        }
    }

    #[tokio::test]
    async fn a_paused_delete_leaves_its_slot_to_the_next_delete_and_takes_one_back() {
        let pausing = Arc::new(DeleteOnly(Pausing {
            together: tokio::sync::Barrier::new(3),
            slots: std::sync::OnceLock::new(),
            free_after_pause: std::sync::Mutex::new(Vec::new()),
        }));
        let budgeted = Arc::new(Budgeted::new(
            pausing.clone(),
            CallBudget {
                deletes: 1,
                reads: 1,
            },
        ));
        pausing.0.slots.set(budgeted.deletes.clone()).unwrap();
        // Three deletes on one slot can only meet in their pauses if each pause gives the slot up.
        let deletes: Vec<_> = (0..3)
            .map(|i| {
                let b = budgeted.clone();
                tokio::spawn(async move { b.delete_instance(&format!("vm-{i}")).await })
            })
            .collect();
        for delete in deletes {
            let outcome = tokio::time::timeout(Duration::from_secs(10), delete)
                .await
                .expect("the deletes meet in their pauses")
                .unwrap();
            assert_eq!(outcome.unwrap(), DeleteOutcome::Deleted);
        }
        assert_eq!(
            *pausing.0.free_after_pause.lock().unwrap(),
            [0, 0, 0],
            "after its pause each delete holds the slot again"
        );
        assert_eq!(
            budgeted.free_delete_slots(),
            1,
            "every slot back after the deletes"
        );
    }

    /// A backend whose delete `pausing` pauses until `busy` has started, then works 1 s; `busy`
    /// works 1.6 s.
    struct Scripted {
        started: AtomicUsize,
        busy_started: Notify,
    }

    #[async_trait]
    impl Deletes for Scripted {
        async fn delete(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
            self.started.fetch_add(1, Ordering::SeqCst);
            if instance_id == "pausing" {
                without_delete_slot(self.busy_started.notified()).await?;
                tokio::time::sleep(Duration::from_secs(1)).await;
            } else {
                self.busy_started.notify_one();
                tokio::time::sleep(Duration::from_millis(1600)).await;
            }
            Ok(DeleteOutcome::Deleted)
        }
    }

    #[tokio::test]
    async fn the_time_a_delete_queues_to_take_its_slot_back_is_not_counted_against_its_bound() {
        let scripted = Arc::new(DeleteOnly(Scripted {
            started: AtomicUsize::new(0),
            busy_started: Notify::new(),
        }));
        let budgeted = Arc::new(
            Budgeted::new(
                scripted.clone(),
                CallBudget {
                    deletes: 1,
                    reads: 1,
                },
            )
            .with_delete_bound(Duration::from_secs(2)),
        );
        let started = Instant::now();
        let pausing = tokio::spawn({
            let b = budgeted.clone();
            async move { b.delete_instance("pausing").await }
        });
        while scripted.0.started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        // `busy` can only start in `pausing`'s pause, and keeps the slot 1.6 s: `pausing` ends 2.6 s
        // or more after its start, past its bound, having worked 1 s of it.
        let busy = tokio::spawn({
            let b = budgeted.clone();
            async move { b.delete_instance("busy").await }
        });
        assert_eq!(pausing.await.unwrap().unwrap(), DeleteOutcome::Deleted);
        assert!(
            started.elapsed() > Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(busy.await.unwrap().unwrap(), DeleteOutcome::Deleted);
        assert_eq!(budgeted.free_delete_slots(), 1);
    }

    #[tokio::test]
    async fn the_time_queued_adds_the_queueing_going_on_to_the_earlier_ones() {
        let held = HeldSlot {
            slots: Arc::new(Semaphore::new(1)),
            state: Mutex::new(SlotState {
                queued_for: Duration::from_secs(1),
                ..SlotState::default()
            }),
        };
        let now = Instant::now();
        assert_eq!(held.queued(now), Duration::from_secs(1));
        held.state().queued_since = Some(now);
        assert_eq!(
            held.queued(now + Duration::from_secs(2)),
            Duration::from_secs(3)
        );
    }

    /// A backend whose every answer can be told from a default one.
    struct Telling;

    #[async_trait]
    impl Provider for Telling {
        fn name(&self) -> ProviderName {
            ProviderName::Aws
        }
        fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
            Err(Error::invalid("instance_id", instance_id))
        }
        async fn delete_instance(&self, _: &str) -> Result<DeleteOutcome, Error> {
            Ok(DeleteOutcome::AlreadyGone)
        }
        async fn capacity(&self) -> Result<Capacity, Error> {
            Ok(Capacity::default())
        }
        async fn list_instances(&self, _: &TagSelector) -> Result<Vec<Instance>, Error> {
            Ok(vec![Instance {
                id: "i-1".into(),
                created: None,
                tags: Default::default(),
                name: String::new(),
            }])
        }
        async fn health(&self) -> Health {
            Health {
                healthy: false,
                message: "checked".into(),
            }
        }
        async fn last_health(&self) -> Option<Health> {
            Some(self.health().await)
        }
    }

    #[tokio::test]
    async fn every_call_reaches_the_backend_and_its_answer_comes_back() {
        let budgeted = Budgeted::new(Arc::new(Telling), CallBudget::default());
        assert_eq!(budgeted.name(), ProviderName::Aws);
        assert!(budgeted.validate_instance_id("x").is_err());
        assert_eq!(
            budgeted.delete_instance("x").await.unwrap(),
            DeleteOutcome::AlreadyGone
        );
        assert_eq!(
            budgeted
                .list_instances(&TagSelector::default())
                .await
                .unwrap()[0]
                .id,
            "i-1"
        );
        assert_eq!(budgeted.health().await.message, "checked");
        assert_eq!(budgeted.last_health().await.unwrap().message, "checked");
    }

    #[tokio::test]
    async fn outside_a_budgeted_delete_a_pause_only_waits() {
        assert_eq!(without_delete_slot(async { 7 }).await.unwrap(), 7);
    }

    /// A backend whose deletes take as many milliseconds as their id says (`hang`: forever).
    struct Timed {
        started: AtomicUsize,
    }

    #[async_trait]
    impl Deletes for Timed {
        async fn delete(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
            self.started.fetch_add(1, Ordering::SeqCst);
            match instance_id.parse() {
                Ok(millis) => tokio::time::sleep(std::time::Duration::from_millis(millis)).await,
                Err(_) => std::future::pending::<()>().await,
            }
            Ok(DeleteOutcome::Deleted)
        }
    }

    #[tokio::test]
    async fn the_delete_bound_starts_with_the_delete_not_with_the_wait_for_its_slot() {
        let timed = Arc::new(DeleteOnly(Timed {
            started: AtomicUsize::new(0),
        }));
        let bound = Duration::from_secs(2);
        let budgeted = Arc::new(
            Budgeted::new(
                timed.clone(),
                CallBudget {
                    deletes: 1,
                    reads: 1,
                },
            )
            .with_delete_bound(bound),
        );
        // The one slot goes to a delete that never ends; the next one queues behind it.
        let hung = tokio::spawn({
            let b = budgeted.clone();
            async move { b.delete_instance("hang").await }
        });
        while timed.0.started.load(Ordering::SeqCst) == 0 {
            tokio::task::yield_now().await;
        }
        let queued = tokio::spawn({
            let b = budgeted.clone();
            // Half the bound: it ends within its own bound, but only 1.5 bounds after it queued.
            async move { b.delete_instance("1000").await }
        });
        let hung = hung.await.unwrap();
        assert!(
            matches!(&hung, Err(Error::Unavailable { .. })),
            "a hung delete ends at its bound: {hung:?}"
        );
        assert_eq!(queued.await.unwrap().unwrap(), DeleteOutcome::Deleted);
        assert_eq!(timed.0.started.load(Ordering::SeqCst), 2);
        assert_eq!(budgeted.free_delete_slots(), 1);
    }
}
