//! The AWS backend's [`DeletionPorts`]: EC2's calls and answers, translated for the deletion
//! engine (`peerpods_provider_core::Deleter`), which alone decides what is deleted and when an
//! instance is gone.
//!
//! Batching stays here, below the ports: a lookup joins the next `DescribeInstances` (filtered by
//! `instance-id`, up to 200 ids a call; a filter never fails for an id EC2 does not know, it just
//! does not list it), a delete request the next `TerminateInstances` (up to `max_ids` ids; EC2's
//! answer is split per id again, `terminate.rs`), a listing of an instance's Elastic IPs the next
//! `DescribeAddresses`. Concurrent deletions thus share calls, as before the engine.
//!
//! What EC2 shows, as the engine reads it:
//! - an instance `pending`, `running`, `stopping` or `stopped`: present (`TerminateInstances`
//!   accepts every one of them); `shutting-down`: being deleted; `terminated` (EC2 keeps showing it
//!   for about an hour): gone; not listed: not found, which the engine believes at once only
//!   for an instance known older than the consistency window, otherwise once it persisted for
//!   the window.
//! - its parts: the Elastic IPs associated with it. cloud-api-adaptor's AWS provider allocates no
//!   Elastic IP (its public address is the one EC2 assigns to the interface it creates with
//!   `DeleteOnTermination`, which EC2 deletes with the instance), and it tags what it creates with
//!   `Name=<the VM's name>` and its `TAGS`. So an address is [`Tie::CreatedForVm`] only when it is
//!   tagged so for this VM (the instance's own non-empty `Name`, and every `TAGS` pair); any other
//!   address, an operator's above all, is [`Tie::NotTheVms`] and never released. The engine's
//!   guard (the cluster tag, do-not-delete) applies to the address's own tags as well.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use aws_sdk_ec2::types::Filter;
use futures::future::join_all;
use peerpods_provider_core::deletion::{
    DeleteAnswer, Lookup, Part, PartId, PartKind, Sighting, Tie,
};
use peerpods_provider_core::{DeletionPorts, Error, InstanceKey};

use super::batch::BatchPolicy;
use super::batcher::{Answer, Batcher};
use super::ec2::{Ec2, Ec2Instance, ElasticIp, MAX_FILTER_VALUES};
use super::failure::{Failure, into_error};
use super::settings::NAME;
use super::terminate::{NextStep, after_failure, resolve_success, single_answer};

/// Tags of an instance or an address.
type Tags = BTreeMap<String, String>;

/// The tag cloud-api-adaptor names its VMs with (and would name anything it made for one).
const NAME_TAG: &str = "Name";

/// How often a batch may shrink by EC2-named unknown ids before we ask per id instead. Each
/// round removes at least one id, so this only bounds pathological answers.
const MAX_DROP_ROUNDS: usize = 3;

/// The batched EC2 calls of one provider, shared by all its deletions.
pub struct Calls {
    ec2: Arc<Ec2>,
    describe: Batcher<Option<Ec2Instance>>,
    terminate: Batcher<DeleteAnswer>,
    addresses: Batcher<Vec<ElasticIp>>,
    /// `TAGS`: the tags cloud-api-adaptor puts on what it creates for this cluster.
    cluster_tags: BTreeMap<String, String>,
}

impl Calls {
    /// Starts the batching tasks on the current tokio runtime.
    pub fn spawn(
        ec2: Arc<Ec2>,
        policy: BatchPolicy,
        cluster_tags: BTreeMap<String, String>,
    ) -> Self {
        let describe = {
            let ec2 = Arc::clone(&ec2);
            Batcher::spawn("instance lookups", policy, move |ids| {
                let ec2 = Arc::clone(&ec2);
                async move { describe_batch(&ec2, ids).await }
            })
        };
        let terminate = {
            let ec2 = Arc::clone(&ec2);
            Batcher::spawn("instance deletions", policy, move |ids| {
                let ec2 = Arc::clone(&ec2);
                async move { terminate_batch(&ec2, ids).await }
            })
        };
        let addresses = {
            let ec2 = Arc::clone(&ec2);
            Batcher::spawn("Elastic IP listings", policy, move |ids| {
                let ec2 = Arc::clone(&ec2);
                async move { addresses_batch(&ec2, ids).await }
            })
        };
        Calls {
            ec2,
            describe,
            terminate,
            addresses,
            cluster_tags,
        }
    }
}

/// The ports of one deletion: the shared calls, and the tags of the instance as last shown (an
/// address is CAA's only when named for this instance).
pub struct Ec2Ports<'a> {
    calls: &'a Calls,
    instance_tags: Mutex<Option<Tags>>,
}

impl<'a> Ec2Ports<'a> {
    pub fn new(calls: &'a Calls) -> Self {
        Ec2Ports {
            calls,
            instance_tags: Mutex::new(None),
        }
    }

    fn remember(&self, tags: &Tags) {
        *self
            .instance_tags
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(tags.clone());
    }

    /// How `address` is tied to the instance: see the module's documentation.
    fn tie_of(&self, address: &Tags) -> Tie {
        let instance = self
            .instance_tags
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let named_for_it = instance
            .as_ref()
            .and_then(|tags| tags.get(NAME_TAG))
            .is_some_and(|name| !name.is_empty() && address.get(NAME_TAG) == Some(name));
        let tagged_as_caa_tags = self
            .calls
            .cluster_tags
            .iter()
            .all(|(key, value)| address.get(key) == Some(value));
        if named_for_it && tagged_as_caa_tags {
            Tie::CreatedForVm
        } else {
            Tie::NotTheVms
        }
    }

    /// The Elastic IP with this allocation id, if EC2 shows one.
    async fn address(&self, allocation_id: &str) -> Result<Option<ElasticIp>, Error> {
        let filter = Filter::builder()
            .name("allocation-id")
            .values(allocation_id)
            .build();
        let found = self
            .calls
            .ec2
            .describe_addresses(filter)
            .await
            .map_err(into_error)?;
        Ok(found
            .into_iter()
            .find(|address| address.allocation_id.as_deref() == Some(allocation_id)))
    }
}

fn tags_of(pairs: &[(String, String)]) -> Tags {
    pairs.iter().cloned().collect()
}

/// An address associated with an instance other than the one being deleted is that instance's
/// now, whatever it was before.
fn moved_elsewhere(address: &ElasticIp, instance: &InstanceKey) -> bool {
    address
        .instance_id
        .as_deref()
        .is_some_and(|other| other != instance.id())
}

fn only_addresses(part: &PartId) -> Result<&str, Error> {
    match part.kind {
        PartKind::PublicAddress => Ok(&part.id),
        other => Err(Error::internal(format!(
            "the AWS backend lists only Elastic IPs as parts, yet was asked about a {} ({})",
            other.as_str(),
            part.id
        ))),
    }
}

#[async_trait]
impl DeletionPorts for Ec2Ports<'_> {
    async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error> {
        let Some(found) = self
            .calls
            .describe
            .ask(instance.id())
            .await
            .map_err(into_error)?
        else {
            return Ok(Lookup::of(Sighting::NotFound));
        };
        let tags = tags_of(&found.tags);
        self.remember(&tags);
        let sighting = match found.state.as_deref() {
            Some("terminated") => Sighting::Gone,
            Some("shutting-down") => Sighting::Deleting(tags),
            // pending, running, stopping, stopped: TerminateInstances accepts each.
            _ => Sighting::Present(tags),
        };
        Ok(Lookup::created(sighting, found.created()))
    }

    async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        self.calls
            .terminate
            .ask(instance.id())
            .await
            .map_err(into_error)
    }

    async fn parts(&self, instance: &InstanceKey) -> Result<Vec<Part>, Error> {
        let addresses = self
            .calls
            .addresses
            .ask(instance.id())
            .await
            .map_err(into_error)?;
        Ok(addresses
            .into_iter()
            .filter_map(|address| {
                let tags = tags_of(&address.tags);
                // An address without an allocation id (EC2-Classic's) cannot be released by id:
                // listed, so that it shows as left alone, never deleted.
                let (id, tie) = match address.allocation_id {
                    Some(allocation) => (allocation, self.tie_of(&tags)),
                    None => (address.public_ip?, Tie::NotTheVms),
                };
                Some(Part {
                    id: PartId::new(PartKind::PublicAddress, id),
                    tags,
                    tie,
                })
            })
            .collect())
    }

    async fn delete_part(
        &self,
        instance: &InstanceKey,
        part: &PartId,
    ) -> Result<DeleteAnswer, Error> {
        let allocation_id = only_addresses(part)?;
        let Some(address) = self.address(allocation_id).await? else {
            return Ok(DeleteAnswer::NotFound);
        };
        if moved_elsewhere(&address, instance) {
            // Not released: the lookup that follows tells the engine it is no longer this VM's.
            return Ok(DeleteAnswer::WrongState);
        }
        if let Some(association) = &address.association_id {
            self.calls
                .ec2
                .disassociate_address(association)
                .await
                .map_err(into_error)?;
        }
        match self.calls.ec2.release_address(allocation_id).await {
            Ok(()) => Ok(DeleteAnswer::Accepted),
            Err(Failure::ResourceNotFound { .. }) => Ok(DeleteAnswer::NotFound),
            Err(failure) => single_answer(failure).map_err(into_error),
        }
    }

    async fn look_up_part(&self, instance: &InstanceKey, part: &PartId) -> Result<Sighting, Error> {
        let allocation_id = only_addresses(part)?;
        Ok(match self.address(allocation_id).await? {
            None => Sighting::NotFound,
            Some(address) if moved_elsewhere(&address, instance) => {
                tracing::info!(
                    instance = %instance,
                    allocation_id,
                    now_with = address.instance_id.as_deref().unwrap_or_default(),
                    "an Elastic IP of the VM is associated with another instance now: left alone"
                );
                Sighting::Gone
            }
            Some(address) => Sighting::Present(tags_of(&address.tags)),
        })
    }
}

/// The filter of what belongs to one of `ids` (`instance-id`).
fn instance_ids(ids: &[String]) -> Filter {
    Filter::builder()
        .name("instance-id")
        .set_values(Some(ids.to_vec()))
        .build()
}

/// One `DescribeInstances` per 200 ids, filtered by `instance-id`: each id's instance, or `None`
/// when EC2 does not list it.
async fn describe_batch(
    ec2: &Ec2,
    batch: Vec<String>,
) -> Vec<(String, Answer<Option<Ec2Instance>>)> {
    let mut answers = Vec::with_capacity(batch.len());
    for chunk in batch.chunks(MAX_FILTER_VALUES) {
        match ec2.describe_instances(vec![instance_ids(chunk)]).await {
            Ok(instances) => {
                let mut by_id: HashMap<String, Ec2Instance> = instances
                    .into_iter()
                    .map(|instance| (instance.id.clone(), instance))
                    .collect();
                answers.extend(chunk.iter().map(|id| (id.clone(), Ok(by_id.remove(id)))));
            }
            Err(failure) => {
                answers.extend(chunk.iter().map(|id| (id.clone(), Err(failure.clone()))));
            }
        }
    }
    answers
}

/// One `DescribeAddresses` per 200 ids, filtered by `instance-id`: each id's Elastic IPs.
async fn addresses_batch(ec2: &Ec2, batch: Vec<String>) -> Vec<(String, Answer<Vec<ElasticIp>>)> {
    let mut answers = Vec::with_capacity(batch.len());
    for chunk in batch.chunks(MAX_FILTER_VALUES) {
        match ec2.describe_addresses(instance_ids(chunk)).await {
            Ok(addresses) => {
                let mut by_id: HashMap<String, Vec<ElasticIp>> = HashMap::new();
                for address in addresses {
                    if let Some(id) = address.instance_id.clone() {
                        by_id.entry(id).or_default().push(address);
                    }
                }
                answers.extend(
                    chunk
                        .iter()
                        .map(|id| (id.clone(), Ok(by_id.remove(id).unwrap_or_default()))),
                );
            }
            Err(failure) => {
                answers.extend(chunk.iter().map(|id| (id.clone(), Err(failure.clone()))));
            }
        }
    }
    answers
}

/// One `TerminateInstances` for the batch; if EC2 rejects it because of unknown ids, the ids it
/// names are answered NotFound and the rest is retried as a batch; if the answer does not say
/// which id is at fault, each id is asked alone (`terminate.rs`).
async fn terminate_batch(ec2: &Ec2, batch: Vec<String>) -> Vec<(String, Answer<DeleteAnswer>)> {
    ec2.cloud_calls().record_batch(NAME, batch.len());
    tracing::debug!(
        instances = batch.len(),
        "terminating a batch of EC2 instances"
    );
    let mut answers = Vec::with_capacity(batch.len());
    let mut remaining = batch;
    let mut rounds = 0;
    while !remaining.is_empty() {
        match ec2.terminate_instances(&remaining).await {
            Ok(terminating) => {
                let terminating: Vec<String> = terminating.into_iter().map(|(id, _)| id).collect();
                let (accepted, unmentioned) = resolve_success(&remaining, &terminating);
                answers.extend(
                    accepted
                        .into_iter()
                        .map(|id| (id, Ok(DeleteAnswer::Accepted))),
                );
                answers.extend(terminate_each(ec2, unmentioned).await);
                break;
            }
            Err(failure) => match after_failure(&remaining, &failure) {
                NextStep::DropUnknown { unknown, retry } if rounds < MAX_DROP_ROUNDS => {
                    answers.extend(
                        unknown
                            .into_iter()
                            .map(|id| (id, Ok(DeleteAnswer::NotFound))),
                    );
                    remaining = retry;
                    rounds += 1;
                }
                NextStep::DropUnknown { .. } | NextStep::PerId => {
                    answers.extend(terminate_each(ec2, std::mem::take(&mut remaining)).await);
                }
                NextStep::FailAll => {
                    answers.extend(
                        remaining
                            .drain(..)
                            .map(|id| (id, single_answer(failure.clone()))),
                    );
                }
            },
        }
    }
    answers
}

/// Terminates each instance in its own call, so each gets its own answer.
async fn terminate_each(
    ec2: &Ec2,
    instance_ids: Vec<String>,
) -> Vec<(String, Answer<DeleteAnswer>)> {
    join_all(instance_ids.into_iter().map(|id| async move {
        let answer = terminate_one(ec2, &id).await;
        (id, answer)
    }))
    .await
}

async fn terminate_one(ec2: &Ec2, instance_id: &str) -> Answer<DeleteAnswer> {
    let ids = [instance_id.to_owned()];
    match ec2.terminate_instances(&ids).await {
        Ok(terminating) if terminating.iter().any(|(id, _)| id == instance_id) => {
            Ok(DeleteAnswer::Accepted)
        }
        Ok(_) => Err(Failure::Internal {
            detail: "EC2 accepted TerminateInstances but did not mention the instance".into(),
            cause: None,
        }),
        Err(failure) => single_answer(failure),
    }
}
