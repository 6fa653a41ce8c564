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
//! 1. `DescribeInstances` for the id: absent → already gone (no other call) once believed (after
//!    this process's accepted delete, or when it stays absent for `ALIBABACLOUD_NOT_FOUND_WINDOW_SECS`:
//!    ECS documents that a new instance may be unlisted for a while); present without the
//!    cluster tag (`CLUSTER_TAG`) → refused, nothing deleted.
//! 2. For each secondary NIC: `DescribeEipAddresses` bound to it (every page); unassociate,
//!    wait for `Available`, release, wait until gone (each bounded).
//! 3. `DeleteInstance` with `Force=true`; `IncorrectInstanceStatus` (e.g. an instance another
//!    caller is releasing, or still starting) is retried until the wait bound.
//! 4. `DescribeInstances` until the instance is no longer listed (bounded; the deletion was
//!    accepted either way).

use std::time::Duration;

use peerpods_provider_core::{DeleteOutcome, Error, NotFoundWindow, OwnerTag};
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

fn param(key: &str, value: impl Into<String>) -> (String, String) {
    (key.to_owned(), value.into())
}

impl Deletion<'_> {
    pub async fn run(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let Some(instance) = self.describe(instance_id).await? else {
            // Believed only after this process's own accepted delete, or once it persisted.
            return self
                .not_found
                .answer(instance_id, std::time::Instant::now());
        };
        self.not_found.found(instance_id);
        self.owner.check(instance_id, &instance.tags)?;
        for nic in &instance.secondary_nics {
            for eip in self.eips_bound_to(nic).await? {
                self.release_eip(&eip).await?;
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
                Err(Failure::NotFound { .. }) => return Ok(DeleteOutcome::AlreadyGone),
                Err(Failure::WrongState { code }) => {
                    if Instant::now() >= deadline {
                        return Err(Error::Unavailable {
                            message: format!(
                                "DeleteInstance: ECS still answers {code} for {instance_id} after {:?}",
                                self.wait_timeout
                            ),
                        });
                    }
                    tokio::time::sleep(self.poll_interval).await;
                    // Released meanwhile (e.g. by cloud-api-adaptor itself)?
                    if self.describe(instance_id).await?.is_none() {
                        return Ok(DeleteOutcome::Deleted);
                    }
                }
                Err(failure) => return Err(failure.into_error("DeleteInstance")),
            }
        }
        self.wait_until_gone(instance_id).await?;
        Ok(DeleteOutcome::Deleted)
    }

    pub async fn describe(&self, instance_id: &str) -> Result<Option<EcsInstance>, Error> {
        let ids = serde_json::to_string(&[instance_id]).map_err(|e| Error::Internal {
            message: e.to_string(),
        })?;
        let answer = self
            .api
            .call(
                Service::Ecs,
                "DescribeInstances",
                &[param("RegionId", self.region), param("InstanceIds", ids)],
            )
            .await
            .map_err(|f| f.into_error("DescribeInstances"))?;
        let page =
            answers::instances_page(&answer).map_err(|message| Error::Internal { message })?;
        Ok(page.instances.into_iter().find(|i| i.id == instance_id))
    }

    async fn wait_until_gone(&self, instance_id: &str) -> Result<(), Error> {
        let deadline = Instant::now() + self.wait_timeout;
        while self.describe(instance_id).await?.is_some() {
            // Gone is confirmed by a lookup, never inferred from the accepted request: a
            // release still under way at the bound is retryable, and the next call resumes it.
            if Instant::now() >= deadline {
                return Err(Error::Unavailable {
                    message: format!(
                        "DeleteInstance: ECS accepted the deletion but still lists {instance_id} after {:?}",
                        self.wait_timeout
                    ),
                });
            }
            tokio::time::sleep(self.poll_interval).await;
        }
        Ok(())
    }

    /// Every EIP bound to the NIC, page by page: a secondary ENI in multi-EIP mode can hold
    /// more EIPs than one page (`PageSize` defaults to 10) shows.
    async fn eips_bound_to(&self, nic: &str) -> Result<Vec<Eip>, Error> {
        let mut found = Vec::new();
        for page_number in 1u32.. {
            let answer = self
                .api
                .call(
                    Service::Vpc,
                    "DescribeEipAddresses",
                    &[
                        param("RegionId", self.region),
                        param("AssociatedInstanceType", "NetworkInterface"),
                        param("AssociatedInstanceId", nic),
                        param("PageSize", EIP_PAGE_SIZE.to_string()),
                        param("PageNumber", page_number.to_string()),
                    ],
                )
                .await
                .map_err(|f| f.into_error("DescribeEipAddresses"))?;
            let page = answers::eips(&answer).map_err(|message| Error::Internal { message })?;
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
        let eips = answers::eips(&answer).map_err(|message| Error::Internal { message })?;
        Ok(eips.into_iter().find(|e| e.allocation_id == allocation_id))
    }

    async fn release_eip(&self, eip: &Eip) -> Result<(), Error> {
        let id = eip.allocation_id.as_str();
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
            return Err(Error::Unavailable {
                message: format!(
                    "EIP {id} did not become Available within {:?}",
                    self.wait_timeout
                ),
            });
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
            tracing::warn!(
                allocation_id = id,
                "VPC accepted the EIP release but still lists it"
            );
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
