//! Deleting a VM and the resources cloud-api-adaptor created with it, honouring ARM's
//! asynchronous-operation protocol.
//!
//! cloud-api-adaptor creates each VM with its network interface (and, with `USE_PUBLIC_IP`, a
//! public IP address) declared inline with `deleteOption: Delete`, and its OS disk with
//! `deleteOption: Delete`; its own DeleteInstance only deletes the VM and relies on ARM to remove
//! those parts. Here the parts are read from the VM before it is deleted and deleted explicitly
//! afterwards, so VMs whose parts were created otherwise (older cloud-api-adaptor versions,
//! `Detach`) leave nothing behind either; parts ARM already removed answer 204/404.

use std::time::{Duration, Instant};

use azure_core::http::Method;
use peerpods_provider_core::{DeleteOutcome, Error};

use crate::answer::{self, PollTarget, Progress};
use crate::arm::{Answer, Arm, COMPUTE_API, DISK_API, NETWORK_API};
use crate::instance_id::VmId;
use crate::resources::{NetworkInterface, Vm};

/// The longest wait between two polls, whatever `Retry-After` asks.
const MAX_POLL_WAIT: Duration = Duration::from_secs(60);

/// How a deletion waits for ARM.
#[derive(Clone, Copy, Debug)]
pub struct Waiting {
    /// When ARM sends no `Retry-After`.
    pub poll_interval: Duration,
    /// Overall bound of one deletion.
    pub timeout: Duration,
}

/// What a deletion may do beyond deleting.
#[derive(Clone, Debug)]
pub struct Policy {
    pub waiting: Waiting,
    /// `CLUSTER_TAG`: a VM without it is not deleted.
    pub owner_tag: Option<(String, String)>,
}

/// Deletes `vm` and its network interfaces, public IP addresses and managed disks.
pub async fn delete_vm(arm: &Arm, vm: &VmId, policy: &Policy) -> Result<DeleteOutcome, Error> {
    let deadline = Instant::now() + policy.waiting.timeout;
    let path = vm.path();
    let url = arm.url(&path, COMPUTE_API);
    let reading = format!("reading VM {}", vm.name);
    let answer = arm
        .call("GetVirtualMachine", Method::Get, &url, &reading)
        .await?;
    if answer.status == 404 {
        return Ok(DeleteOutcome::AlreadyGone);
    }
    if !answer.is_success() {
        return Err(arm.failure(&answer, &reading));
    }
    let found: Vm = arm.json(&answer, &reading)?;
    if let Some((key, value)) = &policy.owner_tag
        && found.string_tags().get(key) != Some(value)
    {
        return Err(Error::NotOwnedByCluster {
            message: format!(
                "VM {} does not carry this cluster's tag {key}={value}",
                vm.name
            ),
        });
    }
    if found.is_deleting() {
        // ARM is already deleting it (and the parts marked deleteOption: Delete with it).
        return Ok(DeleteOutcome::Deleted);
    }
    let parts = found.parts();
    let mut public_ips = Vec::new();
    for nic in &parts.network_interfaces {
        public_ips.extend(public_ips_of(arm, nic).await?);
    }

    let deleting = format!("deleting VM {}", vm.name);
    let answer = arm
        .call("DeleteVirtualMachine", Method::Delete, &url, &deleting)
        .await?;
    match answer.status {
        // Gone between our read and our delete: someone else deleted it.
        404 => return Ok(DeleteOutcome::AlreadyGone),
        200 | 204 => {}
        201 | 202 => wait(arm, &answer, &deleting, policy.waiting, deadline).await?,
        _ => return Err(arm.failure(&answer, &deleting)),
    }

    // A public IP address cannot be deleted while a network interface holds it, so interfaces
    // go first.
    for nic in &parts.network_interfaces {
        delete_part(
            arm,
            "DeleteNetworkInterface",
            nic,
            NETWORK_API,
            policy.waiting,
            deadline,
        )
        .await?;
    }
    for ip in &public_ips {
        delete_part(
            arm,
            "DeletePublicIPAddress",
            ip,
            NETWORK_API,
            policy.waiting,
            deadline,
        )
        .await?;
    }
    for disk in &parts.disks {
        delete_part(arm, "DeleteDisk", disk, DISK_API, policy.waiting, deadline).await?;
    }
    Ok(DeleteOutcome::Deleted)
}

/// The public IP addresses attached to network interface `nic` (none if it is gone).
async fn public_ips_of(arm: &Arm, nic: &str) -> Result<Vec<String>, Error> {
    let Some(path) = resource_path(nic) else {
        return Ok(Vec::new());
    };
    let reading = format!("reading network interface {}", last_segment(nic));
    let answer = arm
        .call(
            "GetNetworkInterface",
            Method::Get,
            &arm.url(path, NETWORK_API),
            &reading,
        )
        .await?;
    if answer.status == 404 {
        return Ok(Vec::new());
    }
    if !answer.is_success() {
        return Err(arm.failure(&answer, &reading));
    }
    let interface: NetworkInterface = arm.json(&answer, &reading)?;
    Ok(interface.public_ip_addresses())
}

/// Deletes one part; already gone (204 or 404) is fine.
async fn delete_part(
    arm: &Arm,
    operation: &'static str,
    id: &str,
    api_version: &str,
    waiting: Waiting,
    deadline: Instant,
) -> Result<(), Error> {
    let Some(path) = resource_path(id) else {
        tracing::warn!(
            id,
            "skipping a VM part whose id is not an ARM resource path"
        );
        return Ok(());
    };
    let what = format!("deleting {}", last_segment(id));
    let answer = arm
        .call(
            operation,
            Method::Delete,
            &arm.url(path, api_version),
            &what,
        )
        .await?;
    match answer.status {
        200 | 204 | 404 => Ok(()),
        201 | 202 => wait(arm, &answer, &what, waiting, deadline).await,
        _ => Err(arm.failure(&answer, &what)),
    }
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
            return Err(Error::Unavailable {
                message: format!(
                    "{what}: ARM has not finished after {} s; asking again later finds it done or still deleting",
                    waiting.timeout.as_secs()
                ),
            });
        }
        tokio::time::sleep(delay).await;
        let answer = arm
            .call("GetOperationStatus", Method::Get, target.url(), what)
            .await?;
        let progress = match &target {
            PollTarget::AsyncOperation(_) if answer.is_success() => {
                answer::async_operation_progress(&answer.body).map_err(|problem| {
                    Error::Internal {
                        message: format!("{what}: {problem}"),
                    }
                })?
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
                return Err(Error::Unavailable {
                    message: format!("{what}: ARM reports the operation {status}{detail}"),
                });
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
    id.rsplit('/').next().unwrap_or(id)
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
    fn only_resource_paths_are_followed() {
        let nic =
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n";
        assert_eq!(resource_path(nic), Some(nic));
        assert_eq!(resource_path("https://evil.example/x"), None);
        assert_eq!(resource_path("/subscriptions/s/x?api-version=1"), None);
        assert_eq!(last_segment(nic), "n");
    }
}
