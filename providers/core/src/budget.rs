//! A call budget per backend: deletes and everything else (capacity, listing, health) draw on
//! separate semaphores, so a flood of capacity polls or listings queues behind its own bound and
//! never takes the slots cleanups need. Every backend is wrapped in one ([`Budgeted`]), whatever
//! the cloud; backends that bound their calls further (AWS's own semaphore and rate limit) keep
//! doing so inside it.
//!
//! A delete's time bound ([`Budgeted::with_delete_bound`]) starts once the delete holds its slot:
//! in a storm of slow deletes the ones queued for a slot wait as long as the slots stay taken,
//! and that wait is not theirs to be cut short for (they have not asked the cloud anything yet).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;

use crate::{
    Capacity, DeleteOutcome, Error, Health, Instance, Provider, ProviderName, TagSelector,
};

/// How many calls of each kind may run against one backend at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallBudget {
    /// Deletes in flight at most.
    pub deletes: usize,
    /// Capacity, listing and health calls in flight at most. Answers of capacity and health are
    /// cached above the backend, so few reach it; listings are rare (orphan scans).
    pub reads: usize,
}

impl Default for CallBudget {
    fn default() -> Self {
        CallBudget {
            deletes: 32,
            reads: 4,
        }
    }
}

/// A backend behind a [`CallBudget`].
pub struct Budgeted {
    inner: Arc<dyn Provider>,
    deletes: Semaphore,
    reads: Semaphore,
    /// The longest one delete runs once it holds its slot; `None`: as long as the backend takes.
    delete_bound: Option<Duration>,
}

impl Budgeted {
    pub fn new(inner: Arc<dyn Provider>, budget: CallBudget) -> Self {
        Budgeted {
            inner,
            deletes: Semaphore::new(budget.deletes.max(1)),
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

#[async_trait]
impl Provider for Budgeted {
    fn name(&self) -> ProviderName {
        self.inner.name()
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        self.inner.validate_instance_id(instance_id)
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let _slot = self.deletes.acquire().await.map_err(|_| closed())?;
        // The delete starts now, and so does its bound.
        let Some(bound) = self.delete_bound else {
            return self.inner.delete_instance(instance_id).await;
        };
        match tokio::time::timeout(bound, self.inner.delete_instance(instance_id)).await {
            Ok(outcome) => outcome,
            Err(_elapsed) => Err(Error::unavailable(format!(
                "the delete of {instance_id} did not end within {} s of its start; ask again to \
                 resume it",
                bound.as_secs_f64()
            ))),
        }
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

    /// A backend whose deletes take as many milliseconds as their id says (`hang`: forever).
    struct Timed {
        started: AtomicUsize,
    }

    #[async_trait]
    impl Provider for Timed {
        fn name(&self) -> ProviderName {
            ProviderName::Libvirt
        }
        fn validate_instance_id(&self, _: &str) -> Result<(), Error> {
            Ok(())
        }
        async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
            self.started.fetch_add(1, Ordering::SeqCst);
            match instance_id.parse() {
                Ok(millis) => tokio::time::sleep(std::time::Duration::from_millis(millis)).await,
                Err(_) => std::future::pending::<()>().await,
            }
            Ok(DeleteOutcome::Deleted)
        }
        async fn capacity(&self) -> Result<Capacity, Error> {
            Ok(Capacity::default())
        }
        async fn list_instances(&self, _: &TagSelector) -> Result<Vec<Instance>, Error> {
            Ok(Vec::new())
        }
        async fn health(&self) -> Health {
            Health {
                healthy: true,
                message: String::new(),
            }
        }
    }

    #[tokio::test]
    async fn the_delete_bound_starts_with_the_delete_not_with_the_wait_for_its_slot() {
        let timed = Arc::new(Timed {
            started: AtomicUsize::new(0),
        });
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
        while timed.started.load(Ordering::SeqCst) == 0 {
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
        assert_eq!(timed.started.load(Ordering::SeqCst), 2);
        assert_eq!(budgeted.free_delete_slots(), 1);
    }
}
