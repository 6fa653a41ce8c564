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

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::LeaseManagerBuilder;
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

/// Pause before a standby retries after an API error.
const RETRY: Duration = Duration::from_secs(2);

/// Runs `work()` whenever this replica holds the Lease, until `shutdown` is cancelled; then releases the
/// Lease. `work` is called again on every new term (and again if it returns while still leading).
///
/// kube-lease-manager's standby sleeps until the holder's lock expires and has no way to be woken early, so
/// a released Lease would sit free for up to a lease duration. A watch on the Lease notices the release, and
/// a fresh manager (which reads the Lease anew) takes it at once: a clean shutdown hands over in about a
/// second, a crash after at most one lease duration.
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
    let set_ready = |detail: &str| {
        if let Some(r) = &readiness {
            r.set(READINESS_COMPONENT, true, detail);
        }
    };
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let failed = |e: kube_lease_manager::LeaseManagerError| Error::LeaderElection {
        message: format!("Lease {}/{}: {e}", config.namespace, config.lease_name),
    };
    let leading = 'standby: loop {
        set_ready("standby");
        let built = LeaseManagerBuilder::new(client.clone(), &config.lease_name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(duration)
            .with_grace(grace)
            .build()
            .await;
        let manager = match built {
            Ok(m) => m,
            Err(e) => {
                // The API server may be briefly unreachable; a standby just tries again.
                warn!(error = %failed(e), "cannot read the Lease; retrying");
                tokio::select! {
                    () = tokio::time::sleep(RETRY) => continue 'standby,
                    () = shutdown.cancelled() => return Ok(()),
                }
            }
        };
        let acquired = tokio::select! {
            changed = manager.changed() => match changed {
                Ok(acquired) => acquired,
                Err(e) => {
                    warn!(error = %failed(e), "cannot take the Lease; retrying");
                    tokio::time::sleep(RETRY).await;
                    continue 'standby;
                }
            },
            () = released(&leases, &config.lease_name) => continue 'standby,
            () = shutdown.cancelled() => return Ok(()),
        };
        if !acquired {
            continue 'standby;
        }
        info!(identity = %config.identity, lease = %config.lease_name, "acquired the Lease; starting work");
        set_ready("leader");
        loop {
            let term = work();
            tokio::select! {
                () = term => warn!("work ended while leading; starting it again"),
                // While leading, changed() renews the Lease and returns only when it is lost.
                changed = manager.changed() => {
                    match changed {
                        Ok(_) => warn!(identity = %config.identity, "lost the Lease; stopped work"),
                        Err(e) => warn!(error = %e, "cannot renew the Lease; stopped work"),
                    }
                    continue 'standby;
                }
                () = shutdown.cancelled() => break 'standby manager,
            }
        }
    };
    // Only reached on shutdown while leading: hand over now instead of after expiry.
    match leading.release().await {
        Ok(()) => info!(identity = %config.identity, "released the Lease"),
        Err(e) => warn!(error = %e, "releasing the Lease failed; it expires by itself"),
    }
    Ok(())
}

/// Resolves when the Lease changes to having no holder (released or deleted). The state found when the
/// watch starts is skipped: the manager has just read it, and a free Lease is taken by the manager itself.
/// Watch errors end the wait early: the caller then re-reads the Lease, which is always safe.
async fn released(leases: &Api<Lease>, name: &str) {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let mut events = std::pin::pin!(watcher(leases.clone(), config).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(watcher::Event::Apply(lease)) => {
                let holder = lease
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                if holder.is_empty() {
                    return;
                }
            }
            Ok(watcher::Event::Delete(_)) => return,
            Ok(_) => {}
            Err(e) => {
                warn!(error = %e, "watching the Lease failed");
                tokio::time::sleep(RETRY).await;
                return;
            }
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
