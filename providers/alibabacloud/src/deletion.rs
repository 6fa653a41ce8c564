//! Deleting one ECS instance with the EIP cloud-api-adaptor bound to it.
//!
//! cloud-api-adaptor's `DeleteInstance` calls ECS `DeleteInstance` with `Force=true` (retrying
//! `IncorrectInstanceStatus` for up to 30 s, `InvalidInstanceId.NotFound` = done), then releases
//! the EIP it allocated for the instance's add-on NIC (multi-NIC + public IP setups) by
//! `UnassociateEipAddress`, waiting until `Available`, and `ReleaseEipAddress`, waiting until gone.
//! It finds that EIP in an in-memory map, so an EIP of an instance created before CAA restarted
//! leaks. Here the EIP is found from the cloud instead, and released FIRST: the add-on NIC is
//! deleted with the instance (`DeleteOnRelease`), after which nothing links the EIP to it.
//!
//! Which EIPs are the VM's: CAA allocates each with the description [`CAA_EIP_DESCRIPTION`]
//! (the same for every VM, no name, no tag) and binds it to the VM's add-on NIC; so an EIP bound
//! to one of the VM's secondary NICs with that description is the VM's, and any other (an
//! operator's EIP bound to the NIC) is left alone. Unbinding loses the only link to the VM, so
//! before unbinding an EIP this backend tags it [`RELEASE_MARK`]`=<instance id>`
//! (`TagResources`): a release that fails after the unbind is found again by that tag
//! (`DescribeEipAddresses` with `Tag.1.Key/Value`), on the next call, even once the instance is
//! gone.
//!
//! 1. `DescribeInstances` for the id: absent → its marked EIPs are released, then already gone
//!    once believed (after this process's accepted delete, or when it stays absent for
//!    `ALIBABACLOUD_NOT_FOUND_WINDOW_SECS`: ECS documents that a new instance may be unlisted for
//!    a while); present without the cluster tag (`CLUSTER_TAG`) → refused, nothing deleted.
//! 2. With secondary NICs: the EIPs marked for it (an earlier attempt's) and CAA's EIPs bound to
//!    each NIC (every page): mark, unassociate, wait for `Available`, release, wait until gone
//!    (each bounded; a release still listed at the bound is a retryable Unavailable).
//! 3. `DeleteInstance` with `Force=true`; `IncorrectInstanceStatus` (e.g. an instance another
//!    caller is releasing, or still starting) is retried until the wait bound.
//! 4. `DescribeInstances` until the instance is no longer listed (bounded; at the bound a
//!    retryable Unavailable), then one `DescribeEipAddresses` by the mark confirms no EIP of it
//!    is left: only then Deleted.

use std::time::Duration;

use peerpods_provider_core::{DeleteOutcome, Error, NotFoundWindow, OwnerTag, do_not_delete};
use tokio::time::Instant;

use super::answers::{self, EcsInstance, Eip};
use super::api::{Api, Service};
use super::failure::Failure;

pub struct Deletion<'a> {
    pub api: &'a Api,
    pub region: &'a str,
    pub wait_timeout: Duration,
    pub poll_interval: Duration,
    /// The tag an instance must carry to be deleted.
    pub owner: &'a OwnerTag,
    /// When an instance `DescribeInstances` does not list is gone (ECS is eventually consistent
    /// after `RunInstances`).
    pub not_found: &'a NotFoundWindow,
}

/// EIPs per `DescribeEipAddresses` page: the API's maximum.
const EIP_PAGE_SIZE: usize = 100;

/// The description cloud-api-adaptor gives every EIP it allocates (`AllocateEipAddress` in its
/// alibabacloud provider): it tells CAA's EIPs from an operator's, not which VM one is for.
pub const CAA_EIP_DESCRIPTION: &str = "Peerpod External Network EIP";

/// The tag put on a VM's EIP before it is unbound, valued with the instance id: once unbound,
/// nothing else links the EIP to the VM.
pub const RELEASE_MARK: &str = "peerpods.io/released-with";

/// Whether `eip`, bound to one of the instance's secondary NICs or found by the mark, is the
/// VM's to release: marked for this instance, or allocated by cloud-api-adaptor; never one
/// carrying the do-not-delete tag.
fn owned_by(eip: &Eip, instance_id: &str) -> bool {
    if do_not_delete(&eip.tags).is_some() {
        return false;
    }
    eip.tags.get(RELEASE_MARK).map(String::as_str) == Some(instance_id)
        || eip.description == CAA_EIP_DESCRIPTION
}

fn param(key: &str, value: impl Into<String>) -> (String, String) {
    (key.to_owned(), value.into())
}

impl Deletion<'_> {
    pub async fn run(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let Some(instance) = self.describe(instance_id).await? else {
            // Its EIPs an earlier attempt unbound but did not release go first: gone means
            // the instance and each of its parts.
            self.release_marked(instance_id).await?;
            // Believed only after this process's own accepted delete, or once it persisted.
            return self
                .not_found
                .answer(instance_id, std::time::Instant::now());
        };
        self.not_found.found(instance_id);
        self.owner.check(instance_id, &instance.tags)?;
        // EIPs are bound to secondary NICs only, and the NIC stays attached until the instance
        // is released: without one there is no EIP, bound or marked, to look for.
        let has_eips = !instance.secondary_nics.is_empty();
        if has_eips {
            // A partial delete resumes: the EIPs an earlier attempt unbound carry the mark.
            let mut eips = self.marked_eips(instance_id).await?;
            for nic in &instance.secondary_nics {
                for eip in self.eips_bound_to(nic).await? {
                    if !owned_by(&eip, instance_id) {
                        tracing::info!(
                            instance_id,
                            allocation_id = eip.allocation_id,
                            "EIP bound to the instance's NIC is not cloud-api-adaptor's: left allocated"
                        );
                        continue;
                    }
                    if !eips.iter().any(|e| e.allocation_id == eip.allocation_id) {
                        eips.push(eip);
                    }
                }
            }
            for eip in &eips {
                self.release_eip(eip, instance_id).await?;
            }
        }
        let deadline = Instant::now() + self.wait_timeout;
        loop {
            let answer = self
                .api
                .call(
                    Service::Ecs,
                    "DeleteInstance",
                    &[param("InstanceId", instance_id), param("Force", "true")],
                )
                .await;
            match answer {
                Ok(_) => {
                    self.not_found
                        .delete_accepted(instance_id, std::time::Instant::now());
                    break;
                }
                Err(Failure::NotFound { .. }) => {
                    if has_eips {
                        self.release_marked(instance_id).await?;
                    }
                    return Ok(DeleteOutcome::AlreadyGone);
                }
                Err(Failure::WrongState { code }) => {
                    if Instant::now() >= deadline {
                        return Err(Error::unavailable(format!(
                            "DeleteInstance: ECS still answers {code} for {instance_id} after {:?}",
                            self.wait_timeout
                        )));
                    }
                    tokio::time::sleep(self.poll_interval).await;
                    // Released meanwhile (e.g. by cloud-api-adaptor itself)?
                    if self.describe(instance_id).await?.is_none() {
                        if has_eips {
                            self.release_marked(instance_id).await?;
                        }
                        return Ok(DeleteOutcome::Deleted);
                    }
                }
                Err(failure) => return Err(failure.into_error("DeleteInstance")),
            }
        }
        self.wait_until_gone(instance_id).await?;
        if has_eips {
            // The later lookup that proves no EIP of it is left.
            self.release_marked(instance_id).await?;
        }
        Ok(DeleteOutcome::Deleted)
    }

    pub async fn describe(&self, instance_id: &str) -> Result<Option<EcsInstance>, Error> {
        let ids = serde_json::to_string(&[instance_id])
            .map_err(|e| Error::internal(e.to_string()).with_source(e))?;
        let answer = self
            .api
            .call(
                Service::Ecs,
                "DescribeInstances",
                &[param("RegionId", self.region), param("InstanceIds", ids)],
            )
            .await
            .map_err(|f| f.into_error("DescribeInstances"))?;
        let page = answers::instances_page(&answer).map_err(Error::internal)?;
        Ok(page.instances.into_iter().find(|i| i.id == instance_id))
    }

    async fn wait_until_gone(&self, instance_id: &str) -> Result<(), Error> {
        let deadline = Instant::now() + self.wait_timeout;
        while self.describe(instance_id).await?.is_some() {
            // Gone is confirmed by a lookup, never inferred from the accepted request: a
            // release still under way at the bound is retryable, and the next call resumes it.
            if Instant::now() >= deadline {
                return Err(Error::unavailable(format!(
                    "DeleteInstance: ECS accepted the deletion but still lists {instance_id} after {:?}",
                    self.wait_timeout
                )));
            }
            tokio::time::sleep(self.poll_interval).await;
        }
        Ok(())
    }

    /// Every EIP bound to the NIC, page by page: a secondary ENI in multi-EIP mode can hold
    /// more EIPs than one page (`PageSize` defaults to 10) shows.
    async fn eips_bound_to(&self, nic: &str) -> Result<Vec<Eip>, Error> {
        self.eips_where(&[
            param("AssociatedInstanceType", "NetworkInterface"),
            param("AssociatedInstanceId", nic),
        ])
        .await
    }

    /// Every EIP carrying the release mark of this instance, page by page.
    async fn marked_eips(&self, instance_id: &str) -> Result<Vec<Eip>, Error> {
        self.eips_where(&[
            param("Tag.1.Key", RELEASE_MARK),
            param("Tag.1.Value", instance_id),
        ])
        .await
    }

    /// Releases every EIP marked for this instance (each confirmed gone by a lookup).
    async fn release_marked(&self, instance_id: &str) -> Result<(), Error> {
        for eip in self.marked_eips(instance_id).await? {
            if owned_by(&eip, instance_id) {
                self.release_eip(&eip, instance_id).await?;
            } else {
                tracing::warn!(
                    instance_id,
                    allocation_id = eip.allocation_id,
                    "EIP marked for release carries the do-not-delete tag: left allocated"
                );
            }
        }
        Ok(())
    }

    /// Every EIP matching `filter`, page by page.
    async fn eips_where(&self, filter: &[(String, String)]) -> Result<Vec<Eip>, Error> {
        let mut found = Vec::new();
        for page_number in 1u32.. {
            let mut params = vec![param("RegionId", self.region)];
            params.extend_from_slice(filter);
            params.push(param("PageSize", EIP_PAGE_SIZE.to_string()));
            params.push(param("PageNumber", page_number.to_string()));
            let answer = self
                .api
                .call(Service::Vpc, "DescribeEipAddresses", &params)
                .await
                .map_err(|f| f.into_error("DescribeEipAddresses"))?;
            let page = answers::eips(&answer).map_err(Error::internal)?;
            let count = page.len();
            found.extend(page);
            let total = answers::total_count(&answer);
            if count < EIP_PAGE_SIZE || total.is_none_or(|total| found.len() >= total) {
                break;
            }
        }
        Ok(found)
    }

    async fn eip(&self, allocation_id: &str) -> Result<Option<Eip>, Error> {
        let answer = self
            .api
            .call(
                Service::Vpc,
                "DescribeEipAddresses",
                &[
                    param("RegionId", self.region),
                    param("AllocationId", allocation_id),
                ],
            )
            .await
            .map_err(|f| f.into_error("DescribeEipAddresses"))?;
        let eips = answers::eips(&answer).map_err(Error::internal)?;
        Ok(eips.into_iter().find(|e| e.allocation_id == allocation_id))
    }

    /// Marks the EIP as the instance's (unless it is already), unbinds and releases it, and
    /// confirms by a lookup that it is gone.
    async fn release_eip(&self, eip: &Eip, instance_id: &str) -> Result<(), Error> {
        let id = eip.allocation_id.as_str();
        if eip.tags.get(RELEASE_MARK).map(String::as_str) != Some(instance_id) {
            // Before the unbind, which loses the last link from the EIP to the instance.
            let answer = self
                .api
                .call(
                    Service::Vpc,
                    "TagResources",
                    &[
                        param("RegionId", self.region),
                        param("ResourceType", "EIP"),
                        param("ResourceId.1", id),
                        param("Tag.1.Key", RELEASE_MARK),
                        param("Tag.1.Value", instance_id),
                    ],
                )
                .await;
            match answer {
                Ok(_) => {}
                Err(Failure::NotFound { .. }) => return Ok(()),
                Err(failure) => return Err(failure.into_error("TagResources")),
            }
        }
        if let Some((bound_to, kind)) = &eip.bound_to
            && eip.status != "Available"
        {
            let answer = self
                .api
                .call(
                    Service::Vpc,
                    "UnassociateEipAddress",
                    &[
                        param("RegionId", self.region),
                        param("AllocationId", id),
                        param("InstanceId", bound_to.as_str()),
                        param("InstanceType", kind.as_str()),
                    ],
                )
                .await;
            match answer {
                Ok(_) | Err(Failure::WrongState { .. }) => {}
                Err(Failure::NotFound { .. }) => return Ok(()),
                Err(failure) => return Err(failure.into_error("UnassociateEipAddress")),
            }
        }
        if !self
            .wait_for_eip(id, |eip| eip.is_none_or(|e| e.status == "Available"))
            .await?
        {
            return Err(Error::unavailable(format!(
                "EIP {id} did not become Available within {:?}",
                self.wait_timeout
            )));
        }
        let answer = self
            .api
            .call(
                Service::Vpc,
                "ReleaseEipAddress",
                &[param("RegionId", self.region), param("AllocationId", id)],
            )
            .await;
        match answer {
            Ok(_) | Err(Failure::NotFound { .. }) => {}
            Err(failure) => return Err(failure.into_error("ReleaseEipAddress")),
        }
        if !self.wait_for_eip(id, |eip| eip.is_none()).await? {
            // Gone is confirmed, never inferred: the next call finds it again by the mark.
            return Err(Error::unavailable(format!(
                "VPC accepted the release of EIP {id} of {instance_id} but still lists it after {:?}",
                self.wait_timeout
            )));
        }
        Ok(())
    }

    /// Polls the EIP until `done` holds (true) or the wait bound passes (false).
    async fn wait_for_eip(
        &self,
        allocation_id: &str,
        done: impl Fn(Option<&Eip>) -> bool,
    ) -> Result<bool, Error> {
        let deadline = Instant::now() + self.wait_timeout;
        loop {
            if done(self.eip(allocation_id).await?.as_ref()) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            tokio::time::sleep(self.poll_interval).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_provider_core::DO_NOT_DELETE_TAG;

    fn eip(description: &str, tags: &[(&str, &str)]) -> Eip {
        Eip {
            allocation_id: "eip-2zeexample0001".into(),
            status: "InUse".into(),
            bound_to: Some(("eni-addon".into(), "NetworkInterface".into())),
            description: description.into(),
            tags: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn only_caas_or_marked_eips_are_the_vms() {
        let vm = "i-2zeexample0001";
        assert!(owned_by(&eip(CAA_EIP_DESCRIPTION, &[]), vm));
        assert!(owned_by(&eip("", &[(RELEASE_MARK, vm)]), vm));
        // An operator's EIP on the VM's NIC, or one marked for another instance.
        assert!(!owned_by(&eip("reserved egress address", &[]), vm));
        assert!(!owned_by(
            &eip("", &[(RELEASE_MARK, "i-2zeother00002")]),
            vm
        ));
        // The do-not-delete tag wins over both.
        assert!(!owned_by(
            &eip(CAA_EIP_DESCRIPTION, &[(DO_NOT_DELETE_TAG, "true")]),
            vm
        ));
        assert!(!owned_by(
            &eip("", &[(RELEASE_MARK, vm), (DO_NOT_DELETE_TAG, "")]),
            vm
        ));
    }
}
