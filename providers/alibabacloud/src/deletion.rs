//! The deletion engine's ports for ECS: the calls that look an instance and its EIPs up, and
//! that delete them, each translating ECS's and VPC's answers into the engine's observations
//! ([`peerpods_provider_core::deletion`]). The engine decides what is gone and what may be
//! deleted; nothing here does.
//!
//! - Instance: `DescribeInstances` by id. Not listed → [`Sighting::NotFound`] (the engine judges
//!   it by `ALIBABACLOUD_NOT_FOUND_WINDOW_SECS`: right after `RunInstances` ECS may list nothing);
//!   `Stopping` → [`Sighting::Deleting`] (ECS shows an instance being released so; an instance a
//!   user stops ends `Stopped`, which is present and deleted then); any other status (`Pending`,
//!   `Starting`, `Running`, `Stopped`) → [`Sighting::Present`], with its tags.
//! - Delete: `DeleteInstance` with `Force=true`: accepted; `InvalidInstanceId.NotFound` →
//!   [`DeleteAnswer::NotFound`]; `IncorrectInstanceStatus` (a starting instance, one being
//!   released) and ECS's "busy" codes → [`DeleteAnswer::WrongState`]. Neither is an answer: the
//!   engine looks again.
//! - Parts: the EIPs cloud-api-adaptor bound to the instance's add-on NIC. CAA allocates each
//!   with the description [`CAA_EIP_DESCRIPTION`] (the same for every VM, no name, no tag), so an
//!   EIP bound to one of the VM's secondary NICs with that description was created for this VM
//!   ([`Tie::CreatedForVm`]); any other EIP bound there (an operator's) is [`Tie::NotTheVms`].
//!   The release of the instance takes the NIC with it and unbinds the EIP, the only link from
//!   the EIP to the VM; so listing the parts of a shown instance records that link on each of
//!   its EIPs first: the tag [`RELEASE_MARK`]`=<instance id>` (VPC `TagResources`), and this
//!   cluster's tag (`CLUSTER_TAG`) when one is required, since the EIP is the EIP of an instance
//!   that just passed the engine's guard. Once the instance is gone its EIPs are found by the
//!   mark (`DescribeEipAddresses` with `Tag.1.Key/Value`), also by a later call after a restart.
//!   An EIP carrying the do-not-delete tag is not marked (nothing touches it; the engine keeps it).
//! - Part delete: a bound EIP is unbound first (`UnassociateEipAddress`; answered
//!   [`DeleteAnswer::WrongState`]: VPC releases only an unbound EIP), an unbound one released
//!   (`ReleaseEipAddress`); part lookup: `DescribeEipAddresses` by allocation id, `Releasing` →
//!   [`Sighting::Deleting`].

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use peerpods_provider_core::deletion::{
    DeleteAnswer, Lookup, Part, PartId, PartKind, Sighting, Tie,
};
use peerpods_provider_core::{DeletionPorts, Error, InstanceKey, do_not_delete};

use super::answers::{self, EcsInstance, Eip};
use super::api::{Api, Service};
use super::failure::Failure;

/// EIPs per `DescribeEipAddresses` page: the API's maximum.
const EIP_PAGE_SIZE: usize = 100;

/// The description cloud-api-adaptor gives every EIP it allocates (`AllocateEipAddress` in its
/// alibabacloud provider): it tells CAA's EIPs from an operator's, not which VM one is for.
pub const CAA_EIP_DESCRIPTION: &str = "Peerpod External Network EIP";

/// The tag put on a VM's EIP while the VM is shown, valued with the instance id: once the
/// instance is released, nothing else links the EIP to it.
pub const RELEASE_MARK: &str = "peerpods.io/released-with";

/// ECS's status of an instance being released.
const RELEASING_INSTANCE: &str = "Stopping";
/// VPC's status of an EIP being released.
const RELEASING_EIP: &str = "Releasing";
/// VPC's status of an EIP bound to nothing.
const AVAILABLE_EIP: &str = "Available";

fn param(key: &str, value: impl Into<String>) -> (String, String) {
    (key.to_owned(), value.into())
}

/// What this delete has seen so far (the ports of one delete; nothing outlives it).
#[derive(Debug, Default)]
struct Seen {
    /// The instance as the latest lookup showed it; `None` when it was not listed.
    instance: Option<EcsInstance>,
    /// The instance was shown in this delete without secondary NICs: it has no EIP, bound or
    /// marked, to look for.
    without_nics: bool,
    /// Each EIP as last listed or looked up.
    eips: HashMap<String, Eip>,
    /// What ECS or VPC last answered that the engine waits out, for the bound's error.
    last_word: Option<String>,
}

/// The ports of one delete against ECS and VPC.
pub struct EcsPorts<'a> {
    api: &'a Api,
    region: &'a str,
    /// The tag the engine requires of what it deletes, recorded on the VM's EIPs with the mark.
    cluster_tag: Option<(&'a str, &'a str)>,
    seen: Mutex<Seen>,
}

impl<'a> EcsPorts<'a> {
    pub fn new(api: &'a Api, region: &'a str, cluster_tag: Option<(&'a str, &'a str)>) -> Self {
        EcsPorts {
            api,
            region,
            cluster_tag,
            seen: Mutex::new(Seen::default()),
        }
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn said(&self, word: String) {
        self.seen().last_word = Some(word);
    }

    async fn describe(&self, instance_id: &str) -> Result<Option<EcsInstance>, Error> {
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

    /// Every EIP matching `filter`, page by page: a secondary ENI in multi-EIP mode can hold
    /// more EIPs than one page (`PageSize` defaults to 10) shows.
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

    /// Every EIP carrying the release mark of this instance.
    async fn marked_eips(&self, instance_id: &str) -> Result<Vec<Eip>, Error> {
        self.eips_where(&[
            param("Tag.1.Key", RELEASE_MARK),
            param("Tag.1.Value", instance_id),
        ])
        .await
    }

    /// The tags that link `eip` to the instance: the mark, and the cluster's tag when required.
    fn link(&self, instance_id: &str) -> Vec<(String, String)> {
        let mut tags = vec![(RELEASE_MARK.to_owned(), instance_id.to_owned())];
        if let Some((key, value)) = self.cluster_tag {
            tags.push((key.to_owned(), value.to_owned()));
        }
        tags
    }

    /// Records the link on `eip` (unless it carries it already); `false` when VPC no longer
    /// knows the EIP.
    async fn mark(&self, eip: &mut Eip, instance_id: &str) -> Result<bool, Error> {
        let link = self.link(instance_id);
        if link.iter().all(|(k, v)| eip.tags.get(k) == Some(v)) {
            return Ok(true);
        }
        let mut params = vec![
            param("RegionId", self.region),
            param("ResourceType", "EIP"),
            param("ResourceId.1", eip.allocation_id.as_str()),
        ];
        for (n, (key, value)) in link.iter().enumerate() {
            params.push(param(&format!("Tag.{}.Key", n + 1), key.as_str()));
            params.push(param(&format!("Tag.{}.Value", n + 1), value.as_str()));
        }
        match self.api.call(Service::Vpc, "TagResources", &params).await {
            Ok(_) => {
                eip.tags.extend(link);
                Ok(true)
            }
            Err(Failure::NotFound { .. }) => Ok(false),
            Err(failure) => Err(failure.into_error("TagResources")),
        }
    }

    /// The EIPs of a shown instance: those marked for it and CAA's bound to its secondary NICs
    /// (marked now); an operator's bound there are listed as not the VM's.
    async fn eips_of_shown(&self, instance: &EcsInstance) -> Result<Vec<Part>, Error> {
        let mut parts: Vec<Part> = self
            .marked_eips(&instance.id)
            .await?
            .into_iter()
            .map(|eip| self.part(eip, Tie::CreatedForVm))
            .collect();
        for nic in &instance.secondary_nics {
            let bound = self
                .eips_where(&[
                    param("AssociatedInstanceType", "NetworkInterface"),
                    param("AssociatedInstanceId", nic),
                ])
                .await?;
            for mut eip in bound {
                if parts.iter().any(|p| p.id.id == eip.allocation_id) {
                    continue;
                }
                if eip.description != CAA_EIP_DESCRIPTION {
                    parts.push(self.part(eip, Tie::NotTheVms));
                    continue;
                }
                if do_not_delete(&eip.tags).is_none() && !self.mark(&mut eip, &instance.id).await? {
                    continue;
                }
                parts.push(self.part(eip, Tie::CreatedForVm));
            }
        }
        Ok(parts)
    }

    /// `eip` as a part tied so, remembered for its delete.
    fn part(&self, eip: Eip, tie: Tie) -> Part {
        let part = Part {
            id: PartId::new(PartKind::PublicAddress, eip.allocation_id.as_str()),
            tags: eip.tags.clone(),
            tie,
        };
        self.seen().eips.insert(eip.allocation_id.clone(), eip);
        part
    }
}

fn eip_only(part: &PartId) -> Result<&str, Error> {
    match part.kind {
        PartKind::PublicAddress => Ok(part.id.as_str()),
        kind => Err(Error::internal(format!(
            "ECS instances have no {} parts here, yet {} was asked about",
            kind.as_str(),
            part.id
        ))),
    }
}

#[async_trait]
impl DeletionPorts for EcsPorts<'_> {
    async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error> {
        let found = self.describe(instance.id()).await?;
        let sighting = match &found {
            None => Sighting::NotFound,
            Some(i) if i.status == RELEASING_INSTANCE => Sighting::Deleting(i.tags.clone()),
            Some(i) => Sighting::Present(i.tags.clone()),
        };
        let mut seen = self.seen();
        if let Some(i) = &found {
            seen.without_nics = i.secondary_nics.is_empty();
            if matches!(sighting, Sighting::Deleting(_)) {
                seen.last_word = Some(format!("ECS still lists {} {}", i.id, i.status));
            }
        }
        let created = found.as_ref().and_then(|i| i.created);
        seen.instance = found;
        Ok(Lookup::created(sighting, created))
    }

    /// What ECS or VPC last answered that the delete was waiting out, if anything.
    fn last_word(&self) -> Option<String> {
        self.seen().last_word.clone()
    }

    async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        let answer = self
            .api
            .call(
                Service::Ecs,
                "DeleteInstance",
                &[param("InstanceId", instance.id()), param("Force", "true")],
            )
            .await;
        match answer {
            Ok(_) => Ok(DeleteAnswer::Accepted),
            Err(Failure::NotFound { .. }) => Ok(DeleteAnswer::NotFound),
            Err(Failure::WrongState { code }) => {
                self.said(format!("DeleteInstance: ECS answers {code} for {instance}"));
                Ok(DeleteAnswer::WrongState)
            }
            Err(failure) => Err(failure.into_error("DeleteInstance")),
        }
    }

    async fn parts(&self, instance: &InstanceKey) -> Result<Vec<Part>, Error> {
        let (shown, without_nics) = {
            let seen = self.seen();
            (seen.instance.clone(), seen.without_nics)
        };
        match shown {
            // EIPs are bound to secondary NICs only, and the NIC stays attached until the
            // instance is released: without one there is no EIP, bound or marked.
            Some(i) if i.secondary_nics.is_empty() => Ok(Vec::new()),
            Some(i) => self.eips_of_shown(&i).await,
            None if without_nics => Ok(Vec::new()),
            None => Ok(self
                .marked_eips(instance.id())
                .await?
                .into_iter()
                .map(|eip| self.part(eip, Tie::CreatedForVm))
                .collect()),
        }
    }

    async fn delete_part(
        &self,
        instance: &InstanceKey,
        part: &PartId,
    ) -> Result<DeleteAnswer, Error> {
        let id = eip_only(part)?;
        let known = self.seen().eips.get(id).cloned();
        if let Some(eip) = &known
            && eip.status != AVAILABLE_EIP
            && let Some((bound_to, kind)) = &eip.bound_to
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
            return match answer {
                // VPC releases an unbound EIP only: the release comes once it is unbound.
                Ok(_) | Err(Failure::WrongState { .. }) => {
                    self.said(format!("EIP {id} of {instance} is being unbound"));
                    Ok(DeleteAnswer::WrongState)
                }
                Err(Failure::NotFound { .. }) => Ok(DeleteAnswer::NotFound),
                Err(failure) => Err(failure.into_error("UnassociateEipAddress")),
            };
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
            Ok(_) => Ok(DeleteAnswer::Accepted),
            Err(Failure::NotFound { .. }) => Ok(DeleteAnswer::NotFound),
            Err(Failure::WrongState { code }) => {
                self.said(format!(
                    "ReleaseEipAddress: VPC answers {code} for EIP {id} of {instance}"
                ));
                Ok(DeleteAnswer::WrongState)
            }
            Err(failure) => Err(failure.into_error("ReleaseEipAddress")),
        }
    }

    async fn look_up_part(&self, instance: &InstanceKey, part: &PartId) -> Result<Sighting, Error> {
        let id = eip_only(part)?;
        let answer = self
            .api
            .call(
                Service::Vpc,
                "DescribeEipAddresses",
                &[param("RegionId", self.region), param("AllocationId", id)],
            )
            .await
            .map_err(|f| f.into_error("DescribeEipAddresses"))?;
        let found = answers::eips(&answer)
            .map_err(Error::internal)?
            .into_iter()
            .find(|e| e.allocation_id == id);
        let mut seen = self.seen();
        Ok(match found {
            None => {
                seen.eips.remove(id);
                Sighting::NotFound
            }
            Some(eip) => {
                seen.last_word = Some(format!(
                    "VPC still lists EIP {id} of {instance} {}",
                    eip.status
                ));
                let tags = eip.tags.clone();
                let releasing = eip.status == RELEASING_EIP;
                seen.eips.insert(id.to_owned(), eip);
                if releasing {
                    Sighting::Deleting(tags)
                } else {
                    Sighting::Present(tags)
                }
            }
        })
    }
}
