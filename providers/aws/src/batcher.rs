//! The task that batches one kind of EC2 call: it owns a [`BatchQueue`], flushes batches when
//! they are due (each through the flush function it was given, in a task of its own) and answers
//! every waiting caller once its id's batch has finished.
//!
//! The flush function only calls EC2 and reads its answers per id (`ports.rs`); what an answer
//! means for a deletion is the deletion engine's to decide.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};
use tokio::task::{Id as TaskId, JoinSet};

use super::batch::{BatchPolicy, BatchQueue};
use super::failure::Failure;

/// One caller's answer.
pub type Answer<T> = Result<T, Failure>;
type Reply<T> = oneshot::Sender<Answer<T>>;

/// Handle to one batching task. The task ends once every handle is dropped and the requests it
/// already accepted are answered.
pub struct Batcher<T> {
    requests: mpsc::UnboundedSender<(String, Reply<T>)>,
    /// What the batches do, for the error of a task that stopped.
    what: &'static str,
}

impl<T: Clone + Send + 'static> Batcher<T> {
    /// Starts the batching task on the current tokio runtime. `flush` answers one batch: exactly
    /// one answer per id it was given (an id it leaves out is answered with an internal error).
    pub fn spawn<F, Fut>(what: &'static str, policy: BatchPolicy, flush: F) -> Self
    where
        F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<(String, Answer<T>)>> + Send + 'static,
    {
        let (requests, receiver) = mpsc::unbounded_channel();
        tokio::spawn(drive(receiver, policy, Arc::new(flush), what));
        Self { requests, what }
    }

    /// The answer about one instance (already validated), asked together with whatever else is
    /// being asked now.
    pub async fn ask(&self, instance_id: &str) -> Answer<T> {
        let (reply, answer) = oneshot::channel();
        let stopped = || Failure::Internal {
            detail: format!("the AWS task that batches {} has stopped", self.what),
            cause: None,
        };
        self.requests
            .send((instance_id.to_owned(), reply))
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn drive<T, F, Fut>(
    mut requests: mpsc::UnboundedReceiver<(String, Reply<T>)>,
    policy: BatchPolicy,
    flush: Arc<F>,
    what: &'static str,
) where
    T: Clone + Send + 'static,
    F: Fn(Vec<String>) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Vec<(String, Answer<T>)>> + Send + 'static,
{
    let mut queue: BatchQueue<Reply<T>> = BatchQueue::new(policy);
    let mut batches: JoinSet<Vec<(String, Answer<T>)>> = JoinSet::new();
    let mut in_flight: HashMap<TaskId, Vec<String>> = HashMap::new();
    let mut accepting = true;
    loop {
        while let Some(batch) = queue.take_batch(Instant::now()) {
            let task = batches.spawn(flush(batch.clone()));
            in_flight.insert(task.id(), batch);
        }
        if !accepting && queue.outstanding() == 0 {
            return;
        }
        // Without queued ids there is nothing to flush; sleep until something else happens.
        let flush_at = queue
            .deadline()
            .map(tokio::time::Instant::from_std)
            .unwrap_or_else(|| tokio::time::Instant::now() + policy.max_wait);
        tokio::select! {
            request = requests.recv(), if accepting => match request {
                Some((instance_id, reply)) => {
                    queue.enqueue(&instance_id, reply, Instant::now());
                }
                None => accepting = false,
            },
            Some(finished) = batches.join_next_with_id() => {
                queue.landed();
                let (ids, answers) = match finished {
                    Ok((task, answers)) => (in_flight.remove(&task).unwrap_or_default(), answers),
                    // A batch task that panicked still owes its callers an answer.
                    Err(error) => (in_flight.remove(&error.id()).unwrap_or_default(), Vec::new()),
                };
                let mut answers: HashMap<String, Answer<T>> = answers.into_iter().collect();
                for instance_id in ids {
                    let answer = answers.remove(&instance_id).unwrap_or_else(|| {
                        Err(Failure::Internal {
                            detail: format!("a batch of {what} gave no answer for {instance_id}"),
                            cause: None,
                        })
                    });
                    for reply in queue.complete(&instance_id) {
                        // A caller that gave up (dropped its future) needs no answer.
                        let _ = reply.send(answer.clone());
                    }
                }
            }
            () = tokio::time::sleep_until(flush_at), if queue.queued() > 0 => {}
            else => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    fn policy() -> BatchPolicy {
        BatchPolicy {
            idle: Duration::from_millis(20),
            max_wait: Duration::from_millis(200),
            max_ids: 10,
        }
    }

    #[tokio::test]
    async fn concurrent_asks_share_one_flush_and_each_gets_its_own_answer() {
        let flushes = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&flushes);
        let batcher = Batcher::spawn("lengths", policy(), move |ids: Vec<String>| {
            counted.fetch_add(1, Ordering::SeqCst);
            async move {
                ids.into_iter()
                    .map(|id| (id.clone(), Ok(id.len())))
                    .collect()
            }
        });
        let (a, b, c) = tokio::join!(batcher.ask("i-1"), batcher.ask("i-22"), batcher.ask("i-1"));
        assert_eq!((a, b, c), (Ok(3), Ok(4), Ok(3)));
        assert_eq!(flushes.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn an_id_the_flush_leaves_out_is_an_internal_failure() {
        let batcher: Batcher<()> = Batcher::spawn("nothing", policy(), |_ids: Vec<String>| async {
            Vec::new()
        });
        let answer = batcher.ask("i-1").await;
        assert!(
            matches!(&answer, Err(Failure::Internal { detail, .. }) if detail.contains("i-1")),
            "{answer:?}"
        );
    }
}
