//! The deletion engine's ports ([`DeletionPorts`]) for one libvirt delete: the domain, then the
//! volumes cloud-api-adaptor created for it.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;

use peerpods_provider_core::deletion::{
    DeleteAnswer, Lookup, Part, PartId, PartKind, Sighting, Tie,
};
use peerpods_provider_core::{DeletionPorts, Error, InstanceKey};

use crate::connection::Connection;
use crate::domains::{Shown, delete_domain, delete_volume, look_up_domain, volume_exists};

/// What this delete has seen of the domain (the ports of one delete; nothing outlives it).
#[derive(Debug, Default)]
struct Seen {
    /// The domain as the latest lookup showed it; `None` when libvirt did not know it.
    latest: Option<Shown>,
    /// The tags of the domain as last shown in this delete: its volumes' guard.
    tags: BTreeMap<String, String>,
}

/// The deletion engine's ports for one libvirt delete. Each port is one blocking libvirt call
/// on the shared connection (counted as one call by its operation name).
pub struct DomainPorts<'a> {
    connection: &'a Connection,
    seen: Mutex<Seen>,
}

impl<'a> DomainPorts<'a> {
    /// The ports of one delete over `connection`, having seen nothing yet.
    pub(crate) fn new(connection: &'a Connection) -> Self {
        DomainPorts {
            connection,
            seen: Mutex::default(),
        }
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn volume_only(part: &PartId) -> Result<String, Error> {
    match part.kind {
        PartKind::Volume => Ok(part.id.clone()),
        kind => Err(Error::internal(format!(
            "libvirt domains have no {} parts here, yet {} was asked about",
            kind.as_str(),
            part.id
        ))),
    }
}

#[async_trait]
impl DeletionPorts for DomainPorts<'_> {
    /// A domain has no creation time libvirt reports: its age is known from its first sighting.
    async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error> {
        let uuid = instance.id().to_owned();
        let shown = self
            .connection
            .with_conn("look_up_domain", move |c| look_up_domain(c, &uuid))
            .await?;
        let mut seen = self.seen();
        let sighting = match &shown {
            Some(domain) => {
                seen.tags = domain.tags.clone();
                Sighting::Present(domain.tags.clone())
            }
            None => Sighting::NotFound,
        };
        seen.latest = shown;
        Ok(Lookup::of(sighting))
    }

    async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        let uuid = instance.id().to_owned();
        self.connection
            .with_conn("delete_domain", move |c| delete_domain(c, &uuid))
            .await
    }

    /// The volumes of the domain the latest lookup showed (read then, before a transient domain
    /// vanishes with its destroy); none once libvirt does not know the domain.
    async fn parts(&self, _instance: &InstanceKey) -> Result<Vec<Part>, Error> {
        let seen = self.seen();
        let Some(domain) = &seen.latest else {
            return Ok(Vec::new());
        };
        Ok(domain
            .volumes
            .iter()
            .map(|(path, name)| Part {
                id: PartId::new(PartKind::Volume, path.as_str()),
                tags: domain.tags.clone(),
                tie: if domain.created_for_it(name) {
                    Tie::CreatedForVm
                } else {
                    Tie::NotTheVms
                },
            })
            .collect())
    }

    async fn delete_part(
        &self,
        _instance: &InstanceKey,
        part: &PartId,
    ) -> Result<DeleteAnswer, Error> {
        let path = volume_only(part)?;
        self.connection
            .with_conn("delete_volume", move |c| delete_volume(c, &path))
            .await
    }

    async fn look_up_part(
        &self,
        _instance: &InstanceKey,
        part: &PartId,
    ) -> Result<Sighting, Error> {
        let path = volume_only(part)?;
        let exists = self
            .connection
            .with_conn("look_up_volume", move |c| volume_exists(c, &path))
            .await?;
        Ok(if exists {
            Sighting::Present(self.seen().tags.clone())
        } else {
            Sighting::NotFound
        })
    }
}
