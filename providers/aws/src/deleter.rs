//! The task that batches instance deletions: it owns a [`DeleteQueue`], flushes batches when
//! they are due and answers every waiting caller once its id's batch has finished.
//!
//! One batch: read the tags of the instances that exist (one `DescribeInstances` per 200 ids) and
//! set apart those the shared owner check refuses ([`OwnerTag::check`]: marked do-not-delete, or
//! lacking this cluster's tag when one is configured; they are refused, never terminated); release the Elastic IPs
//! of the rest (one `DescribeAddresses` per 200 ids), then terminate them in one
//! `TerminateInstances` call. If EC2 rejects the call because
//! of unknown ids, the ids it names are answered (gone once EC2 has not known them for the
//! consistency window, see `visibility.rs`; until then "try again") and the rest is retried as a
//! batch; if the answer
//! does not say which id is at fault, each id is asked alone (see `terminate.rs`).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Instant;

use futures::future::join_all;
use tokio::sync::{mpsc, oneshot};
use tokio::task::{Id as TaskId, JoinSet};

use super::batch::{BatchPolicy, DeleteQueue};
use super::ec2::Ec2;
use super::failure::Failure;
use super::terminate::{NextStep, after_failure, resolve_success};
use peerpods_provider_core::{DeleteOutcome, Error, OwnerTag};

/// How often a batch may shrink by EC2-named unknown ids before we ask per id instead. Each
/// round removes at least one id, so this only bounds pathological answers.
const MAX_DROP_ROUNDS: usize = 3;

pub type Answer = Result<DeleteOutcome, Failure>;
type Reply = oneshot::Sender<Answer>;

/// Handle to the batching task. The task ends once every handle is dropped and the deletions it
/// already accepted are answered.
#[derive(Clone)]
pub struct Deleter {
    requests: mpsc::UnboundedSender<(String, Reply)>,
}

impl Deleter {
    /// Starts the batching task on the current tokio runtime. `owner`: the tag (key, value) an
    /// instance must carry to be deleted; `None` deletes any instance not marked do-not-delete.
    pub fn spawn(ec2: Arc<Ec2>, policy: BatchPolicy, owner: Option<(String, String)>) -> Self {
        let (requests, receiver) = mpsc::unbounded_channel();
        tokio::spawn(drive(
            receiver,
            ec2,
            policy,
            Arc::new(OwnerTag::requiring(owner)),
        ));
        Self { requests }
    }

    /// Deletes one instance (already validated) together with whatever else is being deleted now.
    pub async fn delete(&self, instance_id: &str) -> Answer {
        let (reply, answer) = oneshot::channel();
        let stopped = || Failure::Internal {
            detail: "the AWS deletion task has stopped".into(),
            cause: None,
        };
        self.requests
            .send((instance_id.to_owned(), reply))
            .map_err(|_| stopped())?;
        answer.await.map_err(|_| stopped())?
    }
}

async fn drive(
    mut requests: mpsc::UnboundedReceiver<(String, Reply)>,
    ec2: Arc<Ec2>,
    policy: BatchPolicy,
    owner: Arc<OwnerTag>,
) {
    let mut queue: DeleteQueue<Reply> = DeleteQueue::new(policy);
    let mut batches: JoinSet<Vec<(String, Answer)>> = JoinSet::new();
    let mut in_flight: HashMap<TaskId, Vec<String>> = HashMap::new();
    let mut accepting = true;
    loop {
        while let Some(batch) = queue.take_batch(Instant::now()) {
            let ec2 = Arc::clone(&ec2);
            let owner = Arc::clone(&owner);
            let ids = batch.clone();
            let task = batches.spawn(async move { delete_batch(&ec2, ids, &owner).await });
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
                let answers = match finished {
                    Ok((task, answers)) => {
                        in_flight.remove(&task);
                        answers
                    }
                    // A batch task that panicked still owes its callers an answer.
                    Err(error) => in_flight
                        .remove(&error.id())
                        .unwrap_or_default()
                        .into_iter()
                        .map(|id| {
                            let failure = Failure::Internal { detail: "deleting this batch of instances failed unexpectedly".into(), cause: None };
                            (id, Err(failure))
                        })
                        .collect(),
                };
                for (instance_id, answer) in answers {
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

/// Deletes one batch and returns exactly one answer per id.
async fn delete_batch(ec2: &Ec2, batch: Vec<String>, owner: &OwnerTag) -> Vec<(String, Answer)> {
    ec2.cloud_calls().record_batch(super::NAME, batch.len());
    tracing::debug!(instances = batch.len(), "deleting a batch of EC2 instances");
    let mut answers: Vec<(String, Answer)> = Vec::with_capacity(batch.len());

    // Only instances the owner check lets go: one marked do-not-delete, or (with a cluster tag
    // configured) one that exists without it, is refused.
    let batch = match refused_by_tags(ec2, &batch, owner).await {
        Ok(mut refused) => {
            let mut allowed = Vec::with_capacity(batch.len());
            for id in batch {
                match refused.remove(&id) {
                    Some(failure) => answers.push((id, Err(failure))),
                    None => allowed.push(id),
                }
            }
            allowed
        }
        Err(failure) => {
            return batch
                .into_iter()
                .map(|id| (id, Err(failure.clone())))
                .collect();
        }
    };
    if batch.is_empty() {
        return answers;
    }

    // Elastic IPs first, as cloud-api-adaptor does: a terminated instance's address would
    // otherwise stay allocated (and billed). An instance whose addresses could not be released
    // is not terminated, so the caller sees the failure and retries the whole deletion.
    let blocked = match release_elastic_ips(ec2, &batch).await {
        Ok(blocked) => blocked,
        Err(failure) => {
            return batch
                .into_iter()
                .map(|id| (id, Err(failure.clone())))
                .collect();
        }
    };
    let mut remaining: Vec<String> = Vec::with_capacity(batch.len());
    for id in batch {
        match blocked.get(&id) {
            Some(failure) => answers.push((id, Err(failure.clone()))),
            None => remaining.push(id),
        }
    }

    let mut rounds = 0;
    while !remaining.is_empty() {
        match ec2.terminate_instances(&remaining).await {
            Ok(terminating) => {
                let (answered, unmentioned) = resolve_success(&remaining, &terminating);
                for (id, _) in &answered {
                    ec2.not_found_window().found(id);
                }
                answers.extend(answered.into_iter().map(|(id, outcome)| (id, Ok(outcome))));
                answers.extend(terminate_each(ec2, unmentioned).await);
                break;
            }
            Err(failure) => match after_failure(&remaining, &failure) {
                NextStep::DropUnknown { unknown, retry } if rounds < MAX_DROP_ROUNDS => {
                    // Unknown is not yet gone: EC2 may not show a new instance everywhere.
                    let now = Instant::now();
                    answers.extend(unknown.into_iter().map(|id| {
                        let answer = ec2.not_found_window().answer(&id, now);
                        (id, answer)
                    }));
                    remaining = retry;
                    rounds += 1;
                }
                NextStep::DropUnknown { .. } | NextStep::PerId => {
                    answers.extend(terminate_each(ec2, std::mem::take(&mut remaining)).await);
                }
                NextStep::FailAll => {
                    answers.extend(remaining.drain(..).map(|id| (id, Err(failure.clone()))));
                }
            },
        }
    }
    answers
}

/// Terminates each instance in its own call, so each gets its own answer.
async fn terminate_each(ec2: &Ec2, instance_ids: Vec<String>) -> Vec<(String, Answer)> {
    join_all(instance_ids.into_iter().map(|id| async move {
        let answer = terminate_one(ec2, &id).await;
        (id, answer)
    }))
    .await
}

async fn terminate_one(ec2: &Ec2, instance_id: &str) -> Answer {
    let ids = [instance_id.to_owned()];
    match ec2.terminate_instances(&ids).await {
        Ok(terminating) => {
            ec2.not_found_window().found(instance_id);
            let (answered, _) = resolve_success(&ids, &terminating);
            answered
                .into_iter()
                .next()
                .map(|(_, outcome)| outcome)
                .ok_or_else(|| Failure::Internal {
                    detail: "EC2 accepted TerminateInstances but did not mention the instance"
                        .into(),
                    cause: None,
                })
        }
        Err(failure) => match after_failure(&ids, &failure) {
            NextStep::DropUnknown { .. } => {
                ec2.not_found_window().answer(instance_id, Instant::now())
            }
            NextStep::PerId | NextStep::FailAll => Err(failure),
        },
    }
}

/// The batch's instances that exist (not terminated) and that [`OwnerTag::check`] refuses, each with
/// its refusal. Instances EC2 does not list are left to TerminateInstances, which tells gone from
/// unknown.
async fn refused_by_tags(
    ec2: &Ec2,
    batch: &[String],
    owner: &OwnerTag,
) -> Result<HashMap<String, Failure>, Failure> {
    let mut refused = HashMap::new();
    for chunk in batch.chunks(200) {
        let filter = aws_sdk_ec2::types::Filter::builder()
            .name("instance-id")
            .set_values(Some(chunk.to_vec()))
            .build();
        for instance in ec2.describe_instances(vec![filter]).await? {
            let gone = matches!(
                instance.state.as_deref(),
                Some("terminated" | "shutting-down")
            );
            if gone {
                continue;
            }
            let tags: BTreeMap<String, String> = instance.tags.into_iter().collect();
            if let Err(error) = owner.check(&instance.id, &tags) {
                tracing::warn!(instance_id = %instance.id, reason = error.reason(), %error, "refusing to delete an instance");
                let failure = match error {
                    Error::DoNotDelete {
                        instance_id,
                        tag,
                        value,
                    } => Failure::DoNotDelete {
                        instance_id,
                        tag,
                        value,
                    },
                    Error::NotOwnedByCluster { .. } => Failure::NotOwned {
                        tag: owner
                            .required()
                            .map(|(k, v)| format!("{k}={v}"))
                            .unwrap_or_default(),
                    },
                    other => Failure::Internal {
                        detail: other.to_string(),
                        cause: None,
                    },
                };
                refused.insert(instance.id, failure);
            }
        }
    }
    Ok(refused)
}

/// Releases the Elastic IPs bound to the batch's instances. Returns the instances whose
/// addresses could not all be released; fails as a whole only if the lookup itself failed.
async fn release_elastic_ips(
    ec2: &Ec2,
    batch: &[String],
) -> Result<HashMap<String, Failure>, Failure> {
    let addresses = ec2.elastic_ips_of(batch).await?;
    let wanted: BTreeSet<&str> = batch.iter().map(String::as_str).collect();
    let mut blocked = HashMap::new();
    for address in addresses {
        // EC2 filtered by instance id already; this only guards against a surprising answer.
        if !wanted.contains(address.instance_id.as_str()) {
            continue;
        }
        let mut result = Ok(());
        if let Some(association) = &address.association_id {
            result = ec2.disassociate_address(association).await;
        }
        if result.is_ok()
            && let Some(allocation) = &address.allocation_id
        {
            result = ec2.release_address(allocation).await;
        }
        if let Err(failure) = result {
            tracing::warn!(
                instance_id = %address.instance_id,
                ?failure,
                "could not release an Elastic IP of an instance being deleted"
            );
            blocked.insert(address.instance_id, failure);
        }
    }
    Ok(blocked)
}
