//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager; kube has none built in).
//!
//! [`run_while_leader`] runs the caller's work only while this process holds the Lease: the work future is
//! started on every acquisition and dropped the moment the Lease is lost, so in-flight reconciles stop at
//! their next await point. On shutdown the Lease is released so the other replica takes over at once
//! instead of waiting for it to expire.
//!
//! There is no fencing: a replica cut off from the API server learns that it lost the Lease only when its
//! renewal fails. Work run under this must therefore be safe to duplicate for up to one lease duration
//! (the controllers' cloud calls are idempotent and their writes are guarded patches).

use std::future::Future;
use std::time::Duration;

use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Error;
use crate::admin::Readiness;

/// Which Lease to compete for, and as whom.
#[derive(Debug, Clone)]
pub struct LeaderConfig {
    /// Name of the Lease object; one per controller.
    pub lease_name: String,
    /// Namespace of the Lease (the controller's own namespace).
    pub namespace: String,
    /// Unique name of this replica, usually the Pod name.
    pub identity: String,
    /// How long the Lease stays valid after the last renewal; a crashed leader is replaced after this.
    pub lease_duration: Duration,
    /// How long before expiry the holder renews.
    pub renew_before: Duration,
}

impl LeaderConfig {
    /// Defaults used by Kubernetes' own controllers: 15 s Lease, renewed 5 s before expiry.
    pub fn new(
        lease_name: impl Into<String>,
        namespace: impl Into<String>,
        identity: impl Into<String>,
    ) -> Self {
        LeaderConfig {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_before: Duration::from_secs(5),
        }
    }

    /// Whole seconds, as the Lease API counts; kube-lease-manager panics unless 0 < renew < duration, so
    /// that is checked here and reported as an error instead.
    fn seconds(&self) -> Result<(u64, u64), Error> {
        let duration = self.lease_duration.as_secs();
        let grace = self.renew_before.as_secs();
        if grace == 0 || grace >= duration {
            return Err(Error::LeaderElection {
                message: format!(
                    "lease duration ({duration}s) must be longer than the renewal margin ({grace}s), both at least 1s"
                ),
            });
        }
        Ok((duration, grace))
    }
}

/// Readiness component name set by [`run_while_leader`]: a standby replica is ready (it serves health and
/// metrics and is able to take over); the detail says whether it leads.
pub const READINESS_COMPONENT: &str = "leader-election";

/// Runs `work()` whenever this replica holds the Lease, until `shutdown` is cancelled; then releases the
/// Lease. `work` is called again on every new term (and again if it returns while still leading).
pub async fn run_while_leader<W, F>(
    client: kube::Client,
    config: LeaderConfig,
    shutdown: CancellationToken,
    readiness: Option<Readiness>,
    mut work: W,
) -> Result<(), Error>
where
    W: FnMut() -> F,
    F: Future<Output = ()>,
{
    let (duration, grace) = config.seconds()?;
    let manager = LeaseManagerBuilder::new(client, &config.lease_name)
        .with_namespace(&config.namespace)
        .with_identity(&config.identity)
        .with_duration(duration)
        .with_grace(grace)
        .build()
        .await
        .map_err(|e| Error::LeaderElection {
            message: format!("Lease {}/{}: {e}", config.namespace, config.lease_name),
        })?;
    let (mut leading, task) = manager.watch().await;
    let set_ready = |detail: &str| {
        if let Some(r) = &readiness {
            r.set(READINESS_COMPONENT, true, detail);
        }
    };
    set_ready("standby");
    let result = loop {
        if !*leading.borrow_and_update() {
            tokio::select! {
                () = shutdown.cancelled() => break Ok(()),
                changed = leading.changed() => match changed {
                    Ok(()) => continue,
                    Err(_) => break Err(Error::LeaderElection {
                        message: "the lease manager stopped".into(),
                    }),
                },
            }
        }
        info!(identity = %config.identity, lease = %config.lease_name, "acquired the Lease; starting work");
        set_ready("leader");
        let term = work();
        tokio::select! {
            () = term => {
                warn!("work ended while leading; starting it again");
                continue;
            }
            lost = until_lost(&mut leading) => {
                set_ready("standby");
                if lost {
                    warn!(identity = %config.identity, "lost the Lease; stopped work");
                    continue;
                }
                break Err(Error::LeaderElection { message: "the lease manager stopped".into() });
            }
            () = shutdown.cancelled() => break Ok(()),
        }
    };
    // Dropping the receiver closes the channel; the manager's task then releases the Lease and ends.
    drop(leading);
    match task.await {
        Ok(Ok(_)) => info!(identity = %config.identity, "released the Lease"),
        Ok(Err(e)) => warn!(error = %e, "releasing the Lease failed; it expires by itself"),
        Err(e) => warn!(error = %e, "lease manager task failed"),
    }
    result
}

/// Resolves with `true` when leadership is lost, `false` when the manager stopped.
async fn until_lost(leading: &mut watch::Receiver<bool>) -> bool {
    loop {
        if leading.changed().await.is_err() {
            return false;
        }
        if !*leading.borrow_and_update() {
            return true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renewal_margin_must_be_shorter_than_the_lease() {
        let mut c = LeaderConfig::new("l", "ns", "me");
        assert_eq!(c.seconds().expect("defaults are valid"), (15, 5));
        c.renew_before = Duration::from_secs(15);
        assert!(c.seconds().is_err());
        c.renew_before = Duration::from_millis(500);
        assert!(c.seconds().is_err());
    }
}
