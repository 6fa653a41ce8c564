//! The Azure ports of the deletion engine ([`peerpods_provider_core::deletion`]): the ARM calls
//! that look a VM up, ask ARM to delete it, list its parts and delete and look up one part, each
//! translating ARM's answer and nothing more. What "deleted" means, the owner and do-not-delete
//! guard on the VM and on every part, the consistency window and every wait are the engine's and
//! its driver's ([`peerpods_provider_core::Deleter`]).
//!
//! Translation:
//! - a `GET` answered 404 is [`Sighting::NotFound`]; a VM or part whose `provisioningState` is
//!   `Deleting` is [`Sighting::Deleting`] with its tags; anything else ARM shows is
//!   [`Sighting::Present`] with its tags;
//! - a `DELETE` answered 200/201/202 is [`DeleteAnswer::Accepted`] (ARM's asynchronous operation
//!   is not followed: the engine confirms by later lookups, at the driver's pace), 204 (ARM's
//!   answer for an absent resource) or 404 is [`DeleteAnswer::NotFound`]; ARM's "another
//!   operation holds the resource" (409 [`CONFLICT_CODES`]) and, for a part, "still held by what
//!   is going" ([`HELD_CODES`]: an interface reserved for the VM just deleted, an address still
//!   on an interface, a disk still attached) are [`DeleteAnswer::WrongState`];
//! - every other answer is the crate's [`Error`] as `arm` maps it (throttling, outages,
//!   credentials).
//!
//! Parts: while ARM shows the VM, its body names what is attached: each interface, the OS disk
//! and data disks, with their `deleteOption` ([`Tie::GoesWithVm`] when `Delete`), the names
//! cloud-api-adaptor gives what it creates ([`CaaNames`], [`Tie::CreatedForVm`]), or neither
//! ([`Tie::NotTheVms`]: never deleted, not even read). Each part that may be the VM's is read
//! for its tags, so that the guard applies to it, and each interface for its public IP
//! addresses (the address read too: its `deleteOption` and tags). Once the VM is gone nothing is
//! attached to it: a VM this call read has had its parts listed, and the engine looks each of
//! them up again; a VM this call never saw (deleted earlier, or never there) has what it may
//! have left behind looked for by cloud-api-adaptor's names, each under the same guard, and an
//! interface, address or disk of those names that another VM uses is not its.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use azure_core::http::Method;
use peerpods_provider_core::deletion::{
    DeleteAnswer, DeletionPorts, Lookup, Part, PartId, PartKind, Sighting, Tie,
};
use peerpods_provider_core::{Error, InstanceKey};

use crate::answer::{self, CONFLICT_CODES};
use crate::arm::{Answer, Arm, COMPUTE_API, DISK_API, NETWORK_API};
use crate::instance_id::VmId;
use crate::resources::{
    Attached, CaaNames, NetworkInterface, ProvisionedResource, PublicIpAddress, Vm, resource_name,
    tie,
};

/// How long ARM must keep answering 404 for a VM before it counts as gone, unless this process
/// saw it older than that (`AZURE_NOT_FOUND_WINDOW_SECS`). ARM does not promise that
/// every instance serving a read already knows a VM created moments ago, and a VM taken for gone
/// has its leftover parts looked for by name; the window only costs time on a VM that never
/// existed.
pub const NOT_FOUND_WINDOW: Duration = Duration::from_secs(120);
/// The setting of [`NOT_FOUND_WINDOW`].
pub const NOT_FOUND_WINDOW_SETTING: &str = "AZURE_NOT_FOUND_WINDOW_SECS";

/// ARM's codes (400 or 409) for a part that cannot go yet because something that is itself going
/// holds it: an interface reserved for the VM just deleted (for up to 180 s) or still attached,
/// an address still on an interface, a disk still attached.
const HELD_CODES: [&str; 4] = [
    "NicReservedForAnotherVm",
    "NicInUse",
    "PublicIPAddressInUse",
    "OperationNotAllowed",
];

/// What this call has learnt of the VM.
#[derive(Debug, Default)]
struct Seen {
    /// What the VM's body named as attached, when the latest lookup showed it; `None` once ARM
    /// answered 404.
    attached: Option<Vec<Attached>>,
    /// The parts were listed from the VM's body in this call.
    listed_from_vm: bool,
}

/// The ports of one deletion of VM `vm`.
#[derive(Debug)]
pub struct VmPorts<'a> {
    arm: &'a Arm,
    vm: VmId,
    caa: CaaNames,
    seen: Mutex<Seen>,
}

impl<'a> VmPorts<'a> {
    pub fn new(arm: &'a Arm, vm: VmId) -> Self {
        VmPorts {
            arm,
            caa: CaaNames::of(&vm.name),
            vm,
            seen: Mutex::new(Seen::default()),
        }
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn vm_url(&self) -> String {
        self.arm.url(&self.vm.path(), COMPUTE_API)
    }

    /// The id of resource `name` of `collection` (e.g. `Microsoft.Compute/disks`) in the VM's
    /// resource group.
    fn sibling(&self, collection: &str, name: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/{collection}/{name}",
            self.vm.subscription, self.vm.resource_group
        )
    }

    /// Whether `id` names this VM (another VM's interface or disk is not this one's).
    fn is_this_vm(&self, id: &str) -> bool {
        resource_name(id).eq_ignore_ascii_case(&self.vm.name)
    }

    /// A part's body, or `None` when ARM answers 404.
    async fn get<T: serde::de::DeserializeOwned>(
        &self,
        kind: PartKind,
        id: &str,
    ) -> Result<Option<T>, Error> {
        let reading = format!("reading {} {}", noun(kind), resource_name(id));
        let url = part_url(self.arm, kind, id, &reading)?;
        let answer = self
            .arm
            .call(get_operation(kind), Method::Get, &url, &reading)
            .await?;
        if answer.status == 404 {
            return Ok(None);
        }
        if !answer.is_success() {
            return Err(self.arm.failure(&answer, &reading));
        }
        self.arm.json(&answer, &reading).map(Some)
    }

    /// The parts the VM's body named, each that may be the VM's read for its tags (and each
    /// interface for its public IP addresses). A part ARM no longer shows is left out.
    async fn read_attached(&self, attached: Vec<Attached>) -> Result<Vec<Part>, Error> {
        let mut parts = Listing::default();
        for part in attached {
            if !plausible(&part.id) {
                tracing::warn!(vm = %self.vm.name, part = %part.id, "a part whose id is not an ARM resource path: left alone");
                continue;
            }
            if part.tie == Tie::NotTheVms {
                parts.add(part.kind, part.id, Default::default(), Tie::NotTheVms);
                continue;
            }
            match part.kind {
                PartKind::NetworkInterface => {
                    let Some(interface) = self.get::<NetworkInterface>(part.kind, &part.id).await?
                    else {
                        continue;
                    };
                    self.add_interface(&mut parts, part.id, part.tie, &interface)
                        .await?;
                }
                _ => {
                    let Some(found) = self.get::<ProvisionedResource>(part.kind, &part.id).await?
                    else {
                        continue;
                    };
                    parts.add(part.kind, part.id, found.string_tags(), part.tie);
                }
            }
        }
        Ok(parts.parts)
    }

    /// Interface `id` tied to the VM by `tie`, and its public IP addresses, each read for its
    /// tags and `deleteOption`.
    async fn add_interface(
        &self,
        parts: &mut Listing,
        id: String,
        tie_of_interface: Tie,
        interface: &NetworkInterface,
    ) -> Result<(), Error> {
        parts.add(
            PartKind::NetworkInterface,
            id,
            interface.string_tags(),
            tie_of_interface,
        );
        for ip in interface.public_ip_addresses() {
            if !plausible(&ip.id) || parts.has(PartKind::PublicAddress, &ip.id) {
                continue;
            }
            let Some(address) = self
                .get::<PublicIpAddress>(PartKind::PublicAddress, &ip.id)
                .await?
            else {
                continue;
            };
            // The interface's answer says whether ARM deletes the address with the VM; when it
            // does not say, the address itself does.
            let delete_option = match ip.goes_with_vm {
                Some(true) => Some("Delete"),
                Some(false) => Some("Detach"),
                None => address.properties.delete_option.as_deref(),
            };
            let tie_of_address = match tie_of_interface {
                // Another VM's interface: its addresses are not this VM's either.
                Tie::NotTheVms => Tie::NotTheVms,
                _ => tie(delete_option, self.caa.is_public_ip(&ip.id)),
            };
            parts.add(
                PartKind::PublicAddress,
                ip.id,
                address.string_tags(),
                tie_of_address,
            );
        }
        Ok(())
    }

    /// What a VM this call never saw may have left behind, by cloud-api-adaptor's names: its
    /// interfaces (and their addresses), its addresses, its OS disk. What another VM uses is
    /// not its.
    async fn leftovers(&self) -> Result<Vec<Part>, Error> {
        let mut parts = Listing::default();
        for name in &self.caa.network_interfaces {
            let id = self.sibling("Microsoft.Network/networkInterfaces", name);
            let Some(interface) = self
                .get::<NetworkInterface>(PartKind::NetworkInterface, &id)
                .await?
            else {
                continue;
            };
            let tie = match interface.virtual_machine() {
                Some(user) if !self.is_this_vm(user) => {
                    tracing::warn!(network_interface = %id, used_by = user, "an interface named like this VM's is used by another VM");
                    Tie::NotTheVms
                }
                _ => Tie::CreatedForVm,
            };
            self.add_interface(&mut parts, id, tie, &interface).await?;
        }
        for name in &self.caa.public_ips {
            let id = self.sibling("Microsoft.Network/publicIPAddresses", name);
            if parts.has(PartKind::PublicAddress, &id) {
                continue;
            }
            let Some(address) = self
                .get::<PublicIpAddress>(PartKind::PublicAddress, &id)
                .await?
            else {
                continue;
            };
            let tie = match address.holder() {
                Some(interface) if !self.caa.is_network_interface(interface) => Tie::NotTheVms,
                _ => Tie::CreatedForVm,
            };
            parts.add(PartKind::PublicAddress, id, address.string_tags(), tie);
        }
        let id = self.sibling("Microsoft.Compute/disks", &self.caa.os_disk);
        if let Some(disk) = self.get::<ProvisionedResource>(PartKind::Disk, &id).await? {
            let tie = match disk.managed_by.as_deref() {
                Some(vm) if !self.is_this_vm(vm) => Tie::NotTheVms,
                _ => Tie::CreatedForVm,
            };
            parts.add(PartKind::Disk, id, disk.string_tags(), tie);
        }
        Ok(parts.parts)
    }
}

/// The parts of one listing, each once (ARM ids compare case-insensitively).
#[derive(Debug, Default)]
struct Listing {
    parts: Vec<Part>,
}

impl Listing {
    fn has(&self, kind: PartKind, id: &str) -> bool {
        self.parts
            .iter()
            .any(|part| part.id.kind == kind && part.id.id.eq_ignore_ascii_case(id))
    }

    fn add(
        &mut self,
        kind: PartKind,
        id: String,
        tags: std::collections::BTreeMap<String, String>,
        tie: Tie,
    ) {
        if !self.has(kind, &id) {
            self.parts.push(Part {
                id: PartId::new(kind, id),
                tags,
                tie,
            });
        }
    }
}

#[async_trait]
impl DeletionPorts for VmPorts<'_> {
    async fn look_up(&self, _instance: &InstanceKey) -> Result<Lookup, Error> {
        let reading = format!("reading VM {}", self.vm.name);
        let answer = self
            .arm
            .call("GetVirtualMachine", Method::Get, &self.vm_url(), &reading)
            .await?;
        if answer.status == 404 {
            self.seen().attached = None;
            return Ok(Lookup::of(Sighting::NotFound));
        }
        if !answer.is_success() {
            return Err(self.arm.failure(&answer, &reading));
        }
        let vm: Vm = self.arm.json(&answer, &reading)?;
        let tags = vm.string_tags();
        self.seen().attached = Some(vm.attached(&self.caa));
        let sighting = if vm.is_deleting() {
            Sighting::Deleting(tags)
        } else {
            Sighting::Present(tags)
        };
        Ok(Lookup::created(sighting, vm.created()))
    }

    async fn request_delete(&self, _instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        let what = format!("deleting VM {}", self.vm.name);
        let answer = self
            .arm
            .call(
                "DeleteVirtualMachine",
                Method::Delete,
                &self.vm_url(),
                &what,
            )
            .await?;
        delete_answer(self.arm, &answer, &what, &CONFLICT_CODES)
    }

    async fn parts(&self, _instance: &InstanceKey) -> Result<Vec<Part>, Error> {
        let (attached, listed_from_vm) = {
            let mut seen = self.seen();
            let attached = seen.attached.clone();
            if attached.is_some() {
                seen.listed_from_vm = true;
            }
            (attached, seen.listed_from_vm)
        };
        match attached {
            Some(attached) => self.read_attached(attached).await,
            // Gone: nothing is attached to it any more, and the engine looks up each part the
            // VM's body named.
            None if listed_from_vm => Ok(Vec::new()),
            None => self.leftovers().await,
        }
    }

    async fn delete_part(
        &self,
        _instance: &InstanceKey,
        part: &PartId,
    ) -> Result<DeleteAnswer, Error> {
        let what = format!("deleting {} {}", noun(part.kind), resource_name(&part.id));
        let url = part_url(self.arm, part.kind, &part.id, &what)?;
        let answer = self
            .arm
            .call(delete_operation(part.kind), Method::Delete, &url, &what)
            .await?;
        delete_answer(
            self.arm,
            &answer,
            &what,
            &[&CONFLICT_CODES[..], &HELD_CODES[..]].concat(),
        )
    }

    async fn look_up_part(
        &self,
        _instance: &InstanceKey,
        part: &PartId,
    ) -> Result<Sighting, Error> {
        Ok(
            match self.get::<ProvisionedResource>(part.kind, &part.id).await? {
                None => Sighting::NotFound,
                Some(found) if found.is_deleting() => Sighting::Deleting(found.string_tags()),
                Some(found) => Sighting::Present(found.string_tags()),
            },
        )
    }
}

/// ARM's answer to a `DELETE`; `wrong_state` are the codes (at 400 or 409) that refuse it for
/// the resource's state now.
fn delete_answer(
    arm: &Arm,
    answer: &Answer,
    what: &str,
    wrong_state: &[&str],
) -> Result<DeleteAnswer, Error> {
    match answer.status {
        200..=202 => Ok(DeleteAnswer::Accepted),
        204 | 404 => Ok(DeleteAnswer::NotFound),
        400 | 409 if refused_for_state(&answer.body, wrong_state) => {
            tracing::debug!(
                what,
                status = answer.status,
                "ARM refused the delete for now"
            );
            Ok(DeleteAnswer::WrongState)
        }
        _ => Err(arm.failure(answer, what)),
    }
}

/// Whether ARM's error body carries one of `codes`.
fn refused_for_state(body: &[u8], codes: &[&str]) -> bool {
    answer::error_detail(body).is_some_and(|detail| {
        codes
            .iter()
            .any(|code| detail.code.eq_ignore_ascii_case(code))
    })
}

/// The URL of part `id`, which must be an ARM resource path (no query, fragment or
/// whitespace): the token goes nowhere else.
fn part_url(arm: &Arm, kind: PartKind, id: &str, what: &str) -> Result<String, Error> {
    if !plausible(id) {
        return Err(Error::internal(format!(
            "{what}: {id:?} is not an ARM resource path"
        )));
    }
    Ok(arm.url(id, api_version(kind)))
}

/// Whether `id` is an ARM resource path.
fn plausible(id: &str) -> bool {
    id.starts_with("/subscriptions/")
        && !id.contains(['?', '#'])
        && !id.contains(char::is_whitespace)
}

fn api_version(kind: PartKind) -> &'static str {
    match kind {
        PartKind::NetworkInterface | PartKind::PublicAddress => NETWORK_API,
        PartKind::Disk | PartKind::Volume => DISK_API,
    }
}

fn get_operation(kind: PartKind) -> &'static str {
    match kind {
        PartKind::NetworkInterface => "GetNetworkInterface",
        PartKind::PublicAddress => "GetPublicIPAddress",
        PartKind::Disk | PartKind::Volume => "GetDisk",
    }
}

fn delete_operation(kind: PartKind) -> &'static str {
    match kind {
        PartKind::NetworkInterface => "DeleteNetworkInterface",
        PartKind::PublicAddress => "DeletePublicIPAddress",
        PartKind::Disk | PartKind::Volume => "DeleteDisk",
    }
}

fn noun(kind: PartKind) -> &'static str {
    match kind {
        PartKind::NetworkInterface => "network interface",
        PartKind::PublicAddress => "public IP address",
        PartKind::Disk | PartKind::Volume => "disk",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_still_held_or_busy_are_refused_for_their_state() {
        let codes = [&CONFLICT_CODES[..], &HELD_CODES[..]].concat();
        assert!(refused_for_state(
            br#"{"error":{"code":"NicReservedForAnotherVm","message":"Nic(s) in request is reserved for another Virtual Machine for 180 seconds."}}"#,
            &codes
        ));
        assert!(refused_for_state(
            br#"{"error":{"code":"OperationNotAllowed","message":"Disk d is attached to VM v."}}"#,
            &codes
        ));
        assert!(!refused_for_state(
            br#"{"error":{"code":"AuthorizationFailed","message":"no"}}"#,
            &codes
        ));
        assert!(!refused_for_state(b"not json", &codes));
        // A VM's delete is refused for its state only by ARM's "busy" codes.
        assert!(!refused_for_state(
            br#"{"error":{"code":"NicInUse","message":"m"}}"#,
            &CONFLICT_CODES
        ));
    }

    #[test]
    fn only_resource_paths_are_followed() {
        let nic =
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n";
        assert!(plausible(nic));
        assert!(!plausible("https://evil.example/x"));
        assert!(!plausible("/subscriptions/s/x?api-version=1"));
        assert!(!plausible("/subscriptions/s/x y"));
    }
}
