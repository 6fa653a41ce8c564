//! The libvirt calls on domains and volumes, each run on a live connection: look a domain up,
//! delete it, delete a volume, count the host's capacity, list the domains.

use std::collections::BTreeMap;

use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::{Error as VirtError, ErrorNumber};

use peerpods_provider_core::deletion::DeleteAnswer;
use peerpods_provider_core::{Capacity, Figure, Instance};

use crate::failure::is_busy;
use crate::metadata::{TAGS_NAMESPACE, file_disks, parse_tags};

/// A domain as a lookup shows it: what the delete needs of it before it is gone.
#[derive(Debug, Clone)]
pub(crate) struct Shown {
    pub(crate) name: String,
    pub(crate) tags: BTreeMap<String, String>,
    /// Its file-backed disks that are pool volumes: (path, volume name).
    pub(crate) volumes: Vec<(String, String)>,
}

impl Shown {
    /// Whether cloud-api-adaptor created the volume `name` for this domain: it names its root
    /// disk `<domain>-root.qcow2` and its cloud-init disk `<domain>-cloudinit.iso`.
    pub(crate) fn created_for_it(&self, volume: &str) -> bool {
        volume
            .strip_prefix(self.name.as_str())
            .is_some_and(|rest| CAA_VOLUME_SUFFIXES.contains(&rest))
    }
}

/// The suffixes of the volumes cloud-api-adaptor's libvirt provider creates for a domain, after
/// the domain's name (`CreateDomain`: `<name>-root.qcow2`, `<name>-cloudinit.iso`).
pub const CAA_VOLUME_SUFFIXES: [&str; 2] = ["-root.qcow2", "-cloudinit.iso"];

/// The domain `uuid` with its tags and pool volumes, `None` when libvirt does not know it.
pub(crate) fn look_up_domain(conn: &Connect, uuid: &str) -> Result<Option<Shown>, VirtError> {
    let gone = |e: &VirtError| e.code().is(ErrorNumber::NoDomain);
    let domain = match conn.lookup_domain_by_uuid_string(uuid) {
        Ok(d) => d,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let read = || -> Result<Shown, VirtError> {
        let tags = match domain.metadata(
            virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(TAGS_NAMESPACE),
            0,
        ) {
            Ok(xml) => parse_tags(&xml),
            Err(e) if e.code().is(ErrorNumber::NoDomainMetadata) => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        let mut volumes = Vec::new();
        for path in file_disks(&domain.xml_desc(0)?) {
            match conn.lookup_storage_vol_by_path(&path) {
                Ok(vol) => volumes.push((path, vol.name()?)),
                Err(e) if e.code().is(ErrorNumber::NoStorageVolume) => {
                    tracing::debug!(path, "disk file is not a pool volume; left alone");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Shown {
            name: domain.name()?,
            tags,
            volumes,
        })
    };
    match read() {
        Ok(shown) => Ok(Some(shown)),
        // It went away while read.
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Destroys the domain when it runs and undefines it: accepted, NotFound when libvirt does not
/// know it, WrongState while it is busy (another job holds it).
pub(crate) fn delete_domain(conn: &Connect, uuid: &str) -> Result<DeleteAnswer, VirtError> {
    let gone = |e: &VirtError| e.code().is(ErrorNumber::NoDomain);
    let busy = |e: &VirtError| {
        e.code().is_any(vec![
            ErrorNumber::ResourceBusy,
            ErrorNumber::OperationTimeout,
        ])
    };
    let domain = match conn.lookup_domain_by_uuid_string(uuid) {
        Ok(d) => d,
        Err(e) if gone(&e) => return Ok(DeleteAnswer::NotFound),
        Err(e) => return Err(e),
    };
    let stop_and_undefine = || -> Result<(), VirtError> {
        if domain.is_active()? {
            match domain.destroy() {
                Ok(()) => {}
                // It stopped between the check and the call: that is what we wanted.
                Err(e) if e.code().is(ErrorNumber::OperationInvalid) => {}
                Err(e) => return Err(e),
            }
        }
        // A transient domain is gone once destroyed (its lookup answers NoDomain).
        if domain.is_persistent()? {
            undefine(&domain)?;
        }
        Ok(())
    };
    match stop_and_undefine() {
        Ok(()) => Ok(DeleteAnswer::Accepted),
        Err(e) if gone(&e) => Ok(DeleteAnswer::Accepted),
        Err(e) if busy(&e) => {
            tracing::debug!(uuid, error = %e.message(), "domain busy; the delete waits");
            Ok(DeleteAnswer::WrongState)
        }
        Err(e) => Err(e),
    }
}

fn undefine(domain: &Domain) -> Result<(), VirtError> {
    match domain.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM) {
        Ok(()) => Ok(()),
        Err(e) if e.code().is(ErrorNumber::NoDomain) => Ok(()),
        Err(e) => {
            tracing::debug!(error = %e.message(), "undefine with NVRAM refused, plain undefine");
            match domain.undefine() {
                Err(e) if e.code().is(ErrorNumber::NoDomain) => Ok(()),
                other => other,
            }
        }
    }
}

/// Deletes the pool volume at `path`: accepted, NotFound when no pool has it, WrongState while
/// it is busy.
pub(crate) fn delete_volume(conn: &Connect, path: &str) -> Result<DeleteAnswer, VirtError> {
    let missing = |e: &VirtError| e.code().is(ErrorNumber::NoStorageVolume);
    let vol = match conn.lookup_storage_vol_by_path(path) {
        Ok(vol) => vol,
        Err(e) if missing(&e) => return Ok(DeleteAnswer::NotFound),
        Err(e) => return Err(e),
    };
    match vol.delete(0) {
        Ok(()) => Ok(DeleteAnswer::Accepted),
        Err(e) if missing(&e) => Ok(DeleteAnswer::NotFound),
        Err(e) if is_busy(&e) => Ok(DeleteAnswer::WrongState),
        Err(e) => Err(e),
    }
}

/// Whether a pool has a volume at `path`.
pub(crate) fn volume_exists(conn: &Connect, path: &str) -> Result<bool, VirtError> {
    match conn.lookup_storage_vol_by_path(path) {
        Ok(_) => Ok(true),
        Err(e) if e.code().is(ErrorNumber::NoStorageVolume) => Ok(false),
        Err(e) => Err(e),
    }
}

pub(crate) fn capacity(conn: &Connect) -> Result<Capacity, VirtError> {
    let node = conn.node_info()?;
    let domains = conn.list_all_domains(0)?;
    let (mut vcpus, mut memory_kib) = (0u64, 0u64);
    for d in &domains {
        let info = d.info()?;
        vcpus += u64::from(info.nr_virt_cpu);
        memory_kib += info.max_mem;
    }
    Ok(Capacity {
        // libvirt sets no limit on the number of domains; the host's CPUs and memory are the limit.
        instances: Figure {
            limit: None,
            in_use: Some(domains.len() as u64),
        },
        vcpus: Figure {
            limit: Some(u64::from(node.cpus)),
            in_use: Some(vcpus),
        },
        memory_mib: Figure {
            limit: Some(node.memory / 1024),
            in_use: Some(memory_kib / 1024),
        },
    })
}

pub(crate) fn list_domains(conn: &Connect) -> Result<Vec<Instance>, VirtError> {
    let mut out = Vec::new();
    for d in conn.list_all_domains(0)? {
        let id = d.uuid_string()?;
        let tags = match d.metadata(
            virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(TAGS_NAMESPACE),
            0,
        ) {
            Ok(xml) => parse_tags(&xml),
            Err(e) if e.code().is(ErrorNumber::NoDomainMetadata) => BTreeMap::new(),
            // The domain went away while listing: it is not an instance any more.
            Err(e) if e.code().is(ErrorNumber::NoDomain) => continue,
            Err(e) => return Err(e),
        };
        out.push(Instance {
            id,
            created: None,
            tags,
            // cloud-api-adaptor's name for the pod VM.
            name: d.name()?,
        });
    }
    Ok(out)
}
