//! The deletion engine's ports on the pool ConfigMap: the lookup is a read of the pool state, the
//! delete request is the release (CAA's read-modify-write with the read's resourceVersion as
//! precondition). Each translates what the ConfigMap says and nothing more: the engine
//! (`peerpods_provider_core::Deleter`) decides what "deleted" means, confirming a release by a
//! later read.
//!
//! - The instance is the allocation, not the machine: a released machine goes back to the pool
//!   and CAA hands it to the next pod, under a new allocation id. The allocations one delete first
//!   sees on the machine are the ones it looks up and releases; an allocation made after that
//!   belongs to another pod: the lookup answers NotFound for ours, and it is never released.
//! - A lookup shows the allocation with the tags `list_instances` shows for the machine (CAA's
//!   fields), so the guard judges what a listing shows.
//! - A release that finds none of those allocations left answers NotFound (perhaps our own write,
//!   its answer lost): proof of nothing, the engine's next read tells.
//! - A release another writer undoes (CAA's conflict retry writes the state of its first read,
//!   see the README) is shown again by the confirming read and released again, at most
//!   [`MAX_RELEASES`] times in one delete.

use std::collections::BTreeSet;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::ConfigMap;
use peerpods_provider_core::deletion::{DeleteAnswer, Lookup, Sighting};
use peerpods_provider_core::{
    Deleter, DeletionPorts, Error, InstanceKey, OwnerTag, Pace, ProviderName, Window,
};

use crate::failure::Failure;
use crate::machine_address::MachineAddress;
use crate::pool_configmap::PoolConfigMap;
use crate::pool_state::{PoolState, STATE_KEY};

/// Tries of one release when other writers keep changing the ConfigMap between read and write.
const RELEASE_ATTEMPTS: u32 = 5;
/// First wait after a conflicting write; it doubles each time.
const CONFLICT_BACKOFF: Duration = Duration::from_millis(20);
/// Releases of one allocation in one delete: a writer that keeps putting it back is reported
/// (`Unavailable`, so the caller comes back later), not outwritten.
pub const MAX_RELEASES: u32 = 3;
/// The engine's wait before the confirming read, and between reads of an allocation that keeps
/// coming back. A written release is visible to the next read at once; this only spaces out the
/// reads of a ConfigMap other writers keep changing.
const PACE: Duration = Duration::from_millis(50);

/// The not-found window is fixed at zero, with no setting: the pool state is one object read
/// from etcd with a consistent read (a GET without resourceVersion), and CAA writes an allocation
/// there before the instance id exists anywhere else (it is the machine's address, which CAA
/// learns from that write). A NotFound is therefore final the moment it is read; any other window
/// would only delay the answer for a machine that is free. The driver names a setting only for
/// a NotYetVisible verdict, which a zero window never gives.
const NO_WINDOW_SETTING: &str = "(none: byom's not-found window is always zero)";

/// The deletions of this backend, under `owner`'s guard.
pub fn deleter(owner: &OwnerTag) -> Deleter {
    Deleter::new(
        ProviderName::Byom,
        owner.guard(),
        Window(Duration::ZERO),
        NO_WINDOW_SETTING,
        Pace::every(PACE),
    )
}

/// What one delete has seen of the machine (nothing outlives the delete).
#[derive(Debug, Default)]
struct Seen {
    /// The allocation ids of the machine at this delete's first read: the instance deleted.
    ours: Option<BTreeSet<String>>,
    /// The ConfigMap the latest lookup read: the first try of the release that follows writes
    /// over it (its resourceVersion is the precondition), which saves a read.
    latest: Option<(ConfigMap, PoolState)>,
    /// Releases written so far.
    releases: u32,
}

/// The deletion engine's ports for the release of one machine.
pub struct Release<'a> {
    pool: &'a PoolConfigMap,
    address: MachineAddress,
    seen: Mutex<Seen>,
}

impl<'a> Release<'a> {
    pub fn new(pool: &'a PoolConfigMap, address: MachineAddress) -> Self {
        Release {
            pool,
            address,
            seen: Mutex::default(),
        }
    }

    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[async_trait]
impl DeletionPorts for Release<'_> {
    async fn look_up(&self, _instance: &InstanceKey) -> Result<Lookup, Error> {
        let (configmap, state) = self.pool.read_state().await?;
        let mut seen = self.seen();
        let on_machine = state.allocations_on(&self.address);
        let ours = seen
            .ours
            .get_or_insert_with(|| on_machine.keys().map(|id| (*id).to_owned()).collect());
        // The first by allocation id, as `list_instances` shows the machine.
        let lookup = on_machine
            .iter()
            .find(|(id, _)| ours.contains(**id))
            .map_or(Lookup::of(Sighting::NotFound), |(_, allocation)| {
                Lookup::created(
                    Sighting::Present(allocation.tags()),
                    allocation.allocated_at(),
                )
            });
        seen.latest = Some((configmap, state));
        Ok(lookup)
    }

    /// Removes our allocations of the machine and lists it available: read (or the lookup's
    /// read), release, write with the read's resourceVersion as precondition; on a conflicting
    /// write, again from a fresh read.
    async fn request_delete(&self, _instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        let pool = self.pool;
        let (ours, mut read) = {
            let mut seen = self.seen();
            let Some(ours) = seen.ours.clone() else {
                return Err(Error::internal(format!(
                    "byom machine {}: asked to release it before reading it",
                    self.address
                )));
            };
            if seen.releases >= MAX_RELEASES {
                return Err(Error::unavailable(format!(
                    "byom machine {} was returned to the pool {MAX_RELEASES} times and put back \
                     each time by another writer of ConfigMap {}: not returned again now",
                    self.address,
                    pool.path()
                )));
            }
            seen.releases += 1;
            (ours, seen.latest.take())
        };
        let mut backoff = CONFLICT_BACKOFF;
        for attempt in 1..=RELEASE_ATTEMPTS {
            let (mut configmap, mut state) = match read.take() {
                Some(read) => read,
                None => self.pool.read_state().await?,
            };
            let released = state.release(&self.address, &ours, jiff::Timestamp::now());
            if released.is_empty() {
                return Ok(DeleteAnswer::NotFound);
            }
            let text = state.to_text().map_err(|e| {
                Error::internal(format!("encoding the pool state: {e}")).with_source(e)
            })?;
            configmap
                .data
                .get_or_insert_default()
                .insert(STATE_KEY.to_owned(), text);
            match pool.replace(&configmap).await {
                Ok(()) => {
                    tracing::info!(
                        machine = %self.address,
                        allocations = ?released,
                        configmap = %pool.path(),
                        "byom machine returned to the pool"
                    );
                    return Ok(DeleteAnswer::Accepted);
                }
                Err(Failure::Conflict) => {
                    tracing::debug!(machine = %self.address, attempt, "pool ConfigMap changed meanwhile, reading it again");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(failure) => return Err(self.pool.error_of(failure)),
            }
        }
        Err(Error::unavailable(format!(
            "ConfigMap {} changed during each of {RELEASE_ATTEMPTS} attempts to update it",
            pool.path()
        )))
    }
}
