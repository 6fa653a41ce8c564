//! Deleting a VM and only the parts it owns, and answering only once a later lookup shows all of
//! them gone.
//!
//! Ownership: a part is the VM's when ARM deletes it with the VM (`deleteOption: Delete`) or
//! when cloud-api-adaptor created it for this VM (its names, see [`CaaNames`]). A persistent
//! volume's managed disk, which the CSI driver attaches as a data disk with `deleteOption:
//! Detach` so that it outlives the VM, and anything else attached is never deleted.
//!
//! Confirmation: the answer is `Deleted` (or `AlreadyGone`) only after `GET` answered 404 for
//! the VM and for each owned network interface, public IP address and disk. A VM that ARM is
//! already deleting is waited for, not deleted twice. When the bound of one call passes first,
//! the call fails with a retryable error and the next call resumes: if the VM is gone by then,
//! its leftover parts are found by the names cloud-api-adaptor gives them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use azure_core::http::Method;
use peerpods_provider_core::{DeleteOutcome, Error, NotFoundWindow, OwnerTag, ProviderConfig};

use crate::answer::{self, PollTarget, Progress};
use crate::arm::{Answer, Arm, COMPUTE_API, DISK_API, NETWORK_API};
use crate::instance_id::VmId;
use crate::resources::{
    CaaNames, NetworkInterface, ProvisionedResource, PublicIpAddress, Vm, goes_with_vm,
    resource_name,
};

/// How long ARM must keep answering 404 for a VM this process never saw deleted before it counts
/// as gone (`AZURE_NOT_FOUND_WINDOW_SECS`). ARM does not promise that every instance serving a
/// read already knows a VM created moments ago, and a VM taken for gone has its parts looked for
/// by name and deleted; the window only costs time on a VM that never existed.
pub const NOT_FOUND_WINDOW: Duration = Duration::from_secs(120);
/// The setting of [`NOT_FOUND_WINDOW`].
pub const NOT_FOUND_WINDOW_SETTING: &str = "AZURE_NOT_FOUND_WINDOW_SECS";

/// The window of `config` ([`NOT_FOUND_WINDOW_SETTING`]), or the default without one.
pub fn not_found_window(config: Option<&ProviderConfig>) -> Result<Arc<NotFoundWindow>, Error> {
    const CLOUD: &str = "Azure Resource Manager";
    Ok(Arc::new(match config {
        Some(config) => {
            NotFoundWindow::from_config(config, CLOUD, NOT_FOUND_WINDOW_SETTING, NOT_FOUND_WINDOW)?
        }
        None => NotFoundWindow::new(CLOUD, NOT_FOUND_WINDOW_SETTING, NOT_FOUND_WINDOW),
    }))
}

/// The longest wait between two polls, whatever `Retry-After` asks.
const MAX_POLL_WAIT: Duration = Duration::from_secs(60);

/// How a deletion waits for ARM.
#[derive(Clone, Copy, Debug)]
pub struct Waiting {
    /// When ARM sends no `Retry-After`, and between lookups of a resource ARM is deleting.
    pub poll_interval: Duration,
    /// Overall bound of one deletion call.
    pub timeout: Duration,
}

/// What a deletion may do beyond deleting.
#[derive(Clone, Debug)]
pub struct Policy {
    pub waiting: Waiting,
    /// `CLUSTER_TAG`: a VM without it is not deleted (a VM marked do-not-delete never is).
    pub owner_tag: OwnerTag,
    /// When a 404 of the VM proves it gone (see [`NotFoundWindow`]).
    pub not_found: Arc<NotFoundWindow>,
}

/// The kinds of parts, in the order they are deleted: an interface holds its public IP
/// address, and a disk is attached until its VM is gone.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    NetworkInterface,
    PublicIp,
    Disk,
}

impl Kind {
    fn api_version(self) -> &'static str {
        match self {
            Kind::NetworkInterface | Kind::PublicIp => NETWORK_API,
            Kind::Disk => DISK_API,
        }
    }

    fn get_operation(self) -> &'static str {
        match self {
            Kind::NetworkInterface => "GetNetworkInterface",
            Kind::PublicIp => "GetPublicIPAddress",
            Kind::Disk => "GetDisk",
        }
    }

    fn delete_operation(self) -> &'static str {
        match self {
            Kind::NetworkInterface => "DeleteNetworkInterface",
            Kind::PublicIp => "DeletePublicIPAddress",
            Kind::Disk => "DeleteDisk",
        }
    }

    fn noun(self) -> &'static str {
        match self {
            Kind::NetworkInterface => "network interface",
            Kind::PublicIp => "public IP address",
            Kind::Disk => "disk",
        }
    }
}

/// The owned parts still to be confirmed gone, in deletion order.
#[derive(Debug, Default)]
struct Owned {
    parts: Vec<(Kind, String)>,
}

impl Owned {
    fn add(&mut self, kind: Kind, id: String) {
        let known = self
            .parts
            .iter()
            .any(|(k, existing)| *k == kind && existing.eq_ignore_ascii_case(&id));
        if !known {
            self.parts.push((kind, id));
        }
    }

    fn in_order(mut self) -> Vec<(Kind, String)> {
        // Stable: within a kind, the VM's own order.
        self.parts.sort_by_key(|(kind, _)| match kind {
            Kind::NetworkInterface => 0,
            Kind::PublicIp => 1,
            Kind::Disk => 2,
        });
        self.parts
    }
}

/// The retryable error of a deletion that has not finished within this call's bound: the next
/// call resumes it.
fn still_deleting(what: &str, waiting: Waiting) -> Error {
    Error::unavailable(format!(
        "{what}: not confirmed gone within {} s; ARM is still deleting, ask again in {} s to resume and confirm",
        waiting.timeout.as_secs(),
        waiting.poll_interval.as_secs().max(1)
    ))
}

/// Deletes `vm` and the network interfaces, public IP addresses and managed disks it owns,
/// answering once each is confirmed gone.
pub async fn delete_vm(arm: &Arm, vm: &VmId, policy: &Policy) -> Result<DeleteOutcome, Error> {
    let deadline = Instant::now() + policy.waiting.timeout;
    let url = arm.url(&vm.path(), COMPUTE_API);
    let caa = CaaNames::of(&vm.name);
    let mut owned = Owned::default();
    let existed = match get_vm(arm, vm, &url).await? {
        Some(found) => {
            policy.not_found.found(&vm.name);
            // The shared owner check, on the tags of the VM this lookup just read: a VM marked
            // do-not-delete is refused on every configuration, one without this cluster's tag
            // when deletes are restricted.
            policy.owner_tag.check(&vm.name, &found.string_tags())?;
            let parts = found.parts(&vm.name);
            if !parts.kept.is_empty() {
                tracing::info!(
                    vm = %vm.name,
                    kept = ?parts.kept,
                    "parts attached to the VM that are not its own are left in place"
                );
            }
            for nic in &parts.network_interfaces {
                for ip in owned_public_ips(arm, nic, &caa).await? {
                    owned.add(Kind::PublicIp, ip);
                }
                owned.add(Kind::NetworkInterface, nic.clone());
            }
            for disk in parts.disks {
                owned.add(Kind::Disk, disk);
            }
            until_vm_gone(arm, vm, &url, found.is_deleting(), policy, deadline).await?;
            true
        }
        None => {
            // A VM created moments ago may not be shown yet: its parts, found by name, would be
            // deleted under it. Believed only after this process's own accepted delete, or once
            // the 404 persisted.
            policy
                .not_found
                .answer(&vm.name, std::time::Instant::now())?;
            // Gone already (an earlier call, ARM, or someone else deleted it): what it owned
            // and may have left behind carries the names cloud-api-adaptor gave it.
            leftovers(arm, vm, &caa, &mut owned).await?;
            false
        }
    };
    let mut removed = false;
    for (kind, id) in owned.in_order() {
        removed |= until_part_gone(arm, kind, &id, policy.waiting, deadline).await?;
    }
    Ok(if existed || removed {
        DeleteOutcome::Deleted
    } else {
        DeleteOutcome::AlreadyGone
    })
}

/// The VM, or `None` when ARM answers 404.
async fn get_vm(arm: &Arm, vm: &VmId, url: &str) -> Result<Option<Vm>, Error> {
    let reading = format!("reading VM {}", vm.name);
    let answer = arm
        .call("GetVirtualMachine", Method::Get, url, &reading)
        .await?;
    if answer.status == 404 {
        return Ok(None);
    }
    if !answer.is_success() {
        return Err(arm.failure(&answer, &reading));
    }
    arm.json(&answer, &reading).map(Some)
}

/// Deletes the VM unless ARM is already deleting it, then looks it up until ARM answers 404.
async fn until_vm_gone(
    arm: &Arm,
    vm: &VmId,
    url: &str,
    mut deleting: bool,
    policy: &Policy,
    deadline: Instant,
) -> Result<(), Error> {
    let waiting = policy.waiting;
    let what = format!("deleting VM {}", vm.name);
    loop {
        if deleting {
            // ARM is deleting it: its later 404 confirms that delete.
            policy
                .not_found
                .delete_accepted(&vm.name, std::time::Instant::now());
        } else {
            let answer = arm
                .call("DeleteVirtualMachine", Method::Delete, url, &what)
                .await?;
            match answer.status {
                200 | 204 => policy
                    .not_found
                    .delete_accepted(&vm.name, std::time::Instant::now()),
                404 => {}
                201 | 202 => {
                    policy
                        .not_found
                        .delete_accepted(&vm.name, std::time::Instant::now());
                    wait(arm, &answer, &what, waiting, deadline).await?;
                }
                _ => return Err(arm.failure(&answer, &what)),
            }
        }
        // The operation's end is ARM's word; the VM's absence is confirmed by a lookup.
        match get_vm(arm, vm, url).await? {
            None => return Ok(()),
            Some(found) => deleting = found.is_deleting(),
        }
        pause(&what, waiting, deadline).await?;
    }
}

/// Sleeps one poll interval, or fails retryably when that would pass the deadline.
async fn pause(what: &str, waiting: Waiting, deadline: Instant) -> Result<(), Error> {
    if Instant::now() + waiting.poll_interval > deadline {
        return Err(still_deleting(what, waiting));
    }
    tokio::time::sleep(waiting.poll_interval).await;
    Ok(())
}

/// The public IP addresses of network interface `nic` that belong to the VM: ARM deletes them
/// with it, or cloud-api-adaptor named them. None if the interface is gone.
async fn owned_public_ips(arm: &Arm, nic: &str, caa: &CaaNames) -> Result<Vec<String>, Error> {
    let Some(interface) = get_part::<NetworkInterface>(arm, Kind::NetworkInterface, nic).await?
    else {
        return Ok(Vec::new());
    };
    let mut owned = Vec::new();
    for ip in interface.public_ip_addresses() {
        let owned_by_vm = if caa.is_public_ip(&ip.id) {
            true
        } else if let Some(answer) = ip.goes_with_vm {
            answer
        } else {
            // The interface's answer does not say: the address itself does.
            get_part::<PublicIpAddress>(arm, Kind::PublicIp, &ip.id)
                .await?
                .is_some_and(|address| goes_with_vm(address.properties.delete_option.as_deref()))
        };
        if owned_by_vm {
            owned.push(ip.id);
        } else {
            tracing::info!(public_ip = %ip.id, "public IP address not the VM's: left in place");
        }
    }
    Ok(owned)
}

/// The parts a VM that is already gone may have left behind, by the names cloud-api-adaptor
/// gives them; an interface another VM uses is not one of them.
async fn leftovers(arm: &Arm, vm: &VmId, caa: &CaaNames, owned: &mut Owned) -> Result<(), Error> {
    let group = format!(
        "/subscriptions/{}/resourceGroups/{}/providers",
        vm.subscription, vm.resource_group
    );
    for name in &caa.network_interfaces {
        let id = format!("{group}/Microsoft.Network/networkInterfaces/{name}");
        let Some(interface) =
            get_part::<NetworkInterface>(arm, Kind::NetworkInterface, &id).await?
        else {
            continue;
        };
        if let Some(user) = interface.virtual_machine()
            && !resource_name(user).eq_ignore_ascii_case(&vm.name)
        {
            tracing::warn!(network_interface = %id, used_by = user, "an interface named like this VM's is used by another VM: left in place");
            continue;
        }
        for ip in interface.public_ip_addresses() {
            if ip.goes_with_vm == Some(true) || caa.is_public_ip(&ip.id) {
                owned.add(Kind::PublicIp, ip.id);
            }
        }
        owned.add(Kind::NetworkInterface, id);
    }
    for name in &caa.public_ips {
        owned.add(
            Kind::PublicIp,
            format!("{group}/Microsoft.Network/publicIPAddresses/{name}"),
        );
    }
    owned.add(
        Kind::Disk,
        format!("{group}/Microsoft.Compute/disks/{}", caa.os_disk),
    );
    Ok(())
}

/// A part, or `None` when ARM answers 404.
async fn get_part<T: serde::de::DeserializeOwned>(
    arm: &Arm,
    kind: Kind,
    id: &str,
) -> Result<Option<T>, Error> {
    let Some(path) = resource_path(id) else {
        return Ok(None);
    };
    let reading = format!("reading {} {}", kind.noun(), last_segment(id));
    let answer = arm
        .call(
            kind.get_operation(),
            Method::Get,
            &arm.url(path, kind.api_version()),
            &reading,
        )
        .await?;
    if answer.status == 404 {
        return Ok(None);
    }
    if !answer.is_success() {
        return Err(arm.failure(&answer, &reading));
    }
    arm.json(&answer, &reading).map(Some)
}

/// Deletes one owned part unless ARM is already deleting it, until a lookup answers 404.
/// Whether it existed when this call looked.
async fn until_part_gone(
    arm: &Arm,
    kind: Kind,
    id: &str,
    waiting: Waiting,
    deadline: Instant,
) -> Result<bool, Error> {
    let Some(path) = resource_path(id) else {
        tracing::warn!(
            id,
            "skipping a VM part whose id is not an ARM resource path"
        );
        return Ok(false);
    };
    let what = format!("deleting {} {}", kind.noun(), last_segment(id));
    let mut existed = false;
    let mut just_asked = false;
    loop {
        let Some(part) = get_part::<ProvisionedResource>(arm, kind, id).await? else {
            return Ok(existed);
        };
        existed = true;
        if !part.is_deleting() && !just_asked {
            let answer = arm
                .call(
                    kind.delete_operation(),
                    Method::Delete,
                    &arm.url(path, kind.api_version()),
                    &what,
                )
                .await?;
            match answer.status {
                200 | 204 | 404 => {}
                201 | 202 => wait(arm, &answer, &what, waiting, deadline).await?,
                400 | 409 if still_held(&answer.body) => {
                    // Held a while longer by the VM just deleted (ARM keeps an interface
                    // reserved for up to 180 s): asked again after a pause, within the bound.
                    let refusal = arm.failure(&answer, &what);
                    if pause(&what, waiting, deadline).await.is_err() {
                        return Err(Error::unavailable(format!("{refusal}; ask again later")));
                    }
                    continue;
                }
                _ => return Err(arm.failure(&answer, &what)),
            }
            just_asked = true;
            continue;
        }
        // ARM is deleting it, or has just accepted our request: give it time, then look again
        // (and ask again if it is still there and no longer being deleted).
        pause(&what, waiting, deadline).await?;
        just_asked = false;
    }
}

/// ARM's answers that a part cannot go yet because something that is itself going holds it:
/// an interface reserved for the VM just deleted or still attached, an address still on an
/// interface, a disk still attached.
fn still_held(body: &[u8]) -> bool {
    answer::error_detail(body).is_some_and(|detail| {
        [
            "NicReservedForAnotherVm",
            "NicInUse",
            "PublicIPAddressInUse",
            "OperationNotAllowed",
        ]
        .iter()
        .any(|code| detail.code.eq_ignore_ascii_case(code))
    })
}

/// Polls an accepted operation until it ends, waiting `Retry-After` (or the poll interval)
/// between polls, at most until `deadline`.
async fn wait(
    arm: &Arm,
    accepted: &Answer,
    what: &str,
    waiting: Waiting,
    deadline: Instant,
) -> Result<(), Error> {
    // An accepted operation without a poll target cannot be followed; ARM accepted it.
    let Some(target) = accepted.poll_target() else {
        return Ok(());
    };
    let mut delay = next_wait(accepted.retry_after(), waiting.poll_interval);
    loop {
        if Instant::now() + delay > deadline {
            return Err(still_deleting(what, waiting));
        }
        tokio::time::sleep(delay).await;
        let answer = arm
            .call("GetOperationStatus", Method::Get, target.url(), what)
            .await?;
        let progress = match &target {
            PollTarget::AsyncOperation(_) if answer.is_success() => {
                answer::async_operation_progress(&answer.body, what)?
            }
            PollTarget::AsyncOperation(_) => return Err(arm.failure(&answer, what)),
            PollTarget::Location(_) => match answer::location_progress(answer.status) {
                Some(progress) => progress,
                None => return Err(arm.failure(&answer, what)),
            },
        };
        match progress {
            Progress::Succeeded => return Ok(()),
            Progress::Running => delay = next_wait(answer.retry_after(), waiting.poll_interval),
            Progress::Failed { status, error } => {
                let detail = error
                    .map(|e| format!(": {}: {}", e.code, e.message))
                    .unwrap_or_default();
                return Err(Error::unavailable(format!(
                    "{what}: ARM reports the operation {status}{detail}"
                )));
            }
        }
    }
}

fn next_wait(retry_after: Option<Duration>, default: Duration) -> Duration {
    retry_after.unwrap_or(default).min(MAX_POLL_WAIT)
}

/// The path of an ARM resource id, if it is one (no query, fragment or whitespace).
fn resource_path(id: &str) -> Option<&str> {
    let plausible = id.starts_with("/subscriptions/")
        && !id.contains(['?', '#'])
        && !id.contains(char::is_whitespace);
    plausible.then_some(id)
}

fn last_segment(id: &str) -> &str {
    resource_name(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poll_waits_follow_retry_after_within_bounds() {
        let default = Duration::from_secs(5);
        assert_eq!(next_wait(None, default), default);
        assert_eq!(
            next_wait(Some(Duration::from_secs(1)), default),
            Duration::from_secs(1)
        );
        assert_eq!(
            next_wait(Some(Duration::from_secs(3600)), default),
            MAX_POLL_WAIT
        );
    }

    #[test]
    fn parts_still_held_by_a_vm_going_away_are_asked_again() {
        assert!(still_held(
            br#"{"error":{"code":"NicReservedForAnotherVm","message":"Nic(s) in request is reserved for another Virtual Machine for 180 seconds."}}"#
        ));
        assert!(still_held(
            br#"{"error":{"code":"OperationNotAllowed","message":"Disk d is attached to VM v."}}"#
        ));
        assert!(!still_held(
            br#"{"error":{"code":"AuthorizationFailed","message":"no"}}"#
        ));
        assert!(!still_held(b"not json"));
    }

    #[test]
    fn only_resource_paths_are_followed() {
        let nic =
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n";
        assert_eq!(resource_path(nic), Some(nic));
        assert_eq!(resource_path("https://evil.example/x"), None);
        assert_eq!(resource_path("/subscriptions/s/x?api-version=1"), None);
        assert_eq!(last_segment(nic), "n");
    }
}
