//! Leader election on a `coordination.k8s.io/v1` Lease (kube-lease-manager; kube has none built in).
//!
//! [`run_while_leader`] runs the caller's work only while this process holds the Lease: the work future is
//! started on every acquisition and dropped the moment the Lease is lost, so in-flight reconciles stop at
//! their next await point. On shutdown the running term drains (bounded by [`LeaderConfig::drain_grace`]),
//! then the Lease is released so the other replica takes over at once instead of waiting for it to expire.
//!
//! Fencing: a replica cut off from the API server cannot learn that it lost the Lease, so it does not wait to
//! be told. Every Lease call goes through a client of its own ([`lease_client`]) that gives up after
//! [`LeaderConfig::call_timeout`] and notes each Lease it reads or writes. The work is dropped locally at the
//! Lease's last confirmed `renewTime` + its duration - [`LeaderConfig::fence_margin`], unless a later renewal
//! moved that point: the other replicas take the Lease only once their clock passes `renewTime` + duration
//! (that is how kube-lease-manager, like client-go, judges expiry), so the old leader has stopped `margin`
//! before any other can start. The margin covers clock skew between the replicas' nodes and the time the
//! work takes to drop; the renewal (attempted `renew_before` ahead of expiry) has `renew_before - margin` to
//! succeed. What stays possible is a request already on the wire when the work is dropped; work run under
//! this must be idempotent for that (the controllers' cloud calls are, and their writes are guarded patches).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::client::Body;
use kube::runtime::{WatchStreamExt, watcher};
use kube_lease_manager::LeaseManagerBuilder;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::Error;
use crate::admin::Readiness;

/// Default [`LeaderConfig::drain_grace`]: below Kubernetes' default 30 s between SIGTERM and SIGKILL.
pub const DRAIN_GRACE: Duration = Duration::from_secs(20);

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
    /// How long before the Lease expires, as the other replicas judge it, this replica stops working when no
    /// renewal has been confirmed (see the module documentation). Shorter than `renew_before`.
    /// [default: half of `renew_before`]
    pub fence_margin: Option<Duration>,
    /// Longest wait for one Lease API call (read, renew, release). A renewal that takes longer than the fence
    /// margin lands too late anyway. [default: half of `renew_before`]
    pub call_timeout: Option<Duration>,
    /// On shutdown while leading, how long the running term may finish its work (the work sees the shutdown
    /// itself and stops starting new things) before the Lease is released. The Lease is held and renewed, and the
    /// fence still applies, while it drains. Keep it below the Pod's termination grace period.
    pub drain_grace: Duration,
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
            fence_margin: None,
            call_timeout: None,
            drain_grace: DRAIN_GRACE,
        }
    }

    /// See [`LeaderConfig::fence_margin`].
    pub fn fence_margin(&self) -> Duration {
        self.fence_margin.unwrap_or(self.renew_before / 2)
    }

    /// See [`LeaderConfig::call_timeout`].
    pub fn call_timeout(&self) -> Duration {
        self.call_timeout.unwrap_or(self.renew_before / 2)
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
                source: None,
            });
        }
        let (margin, timeout) = (self.fence_margin(), self.call_timeout());
        if margin.is_zero() || margin >= Duration::from_secs(grace) {
            return Err(Error::LeaderElection {
                message: format!(
                    "the fence margin ({margin:?}) must be above zero and shorter than the renewal margin ({grace}s), \
                     or the leader would stop before it renews"
                ),
                source: None,
            });
        }
        if timeout.is_zero() {
            return Err(Error::LeaderElection {
                message: "the Lease call timeout must be above zero".into(),
                source: None,
            });
        }
        Ok((duration, grace))
    }
}

/// Readiness component name set by [`run_while_leader`]: a standby replica is ready (it serves health and
/// metrics and is able to take over); the detail says whether it leads.
pub const READINESS_COMPONENT: &str = "leader-election";

/// The readiness detail of [`READINESS_COMPONENT`] while this replica holds the Lease and works
/// (`peerpods_leader` reads it).
pub const LEADING: &str = "leader";

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
    // The watch for a released Lease streams, so it keeps the plain client; every other Lease call goes
    // through the client with the timeout that also feeds the fence.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
    let (fence_tx, mut fence) = watch::channel(None);
    let lease_calls = lease_client(client.clone(), config.call_timeout(), {
        let (identity, lease_duration, margin) = (
            config.identity.clone(),
            config.lease_duration,
            config.fence_margin(),
        );
        move |lease: &Lease| {
            let now = (jiff::Timestamp::now(), Instant::now());
            fence_tx.send_replace(valid_until(lease, &identity, lease_duration, margin, now));
        }
    });
    let failed = |e: kube_lease_manager::LeaseManagerError| Error::LeaderElection {
        message: format!("Lease {}/{}", config.namespace, config.lease_name),
        source: Some(Box::new(e)),
    };
    let leading = 'standby: loop {
        set_ready("standby");
        let build = LeaseManagerBuilder::new(lease_calls.clone(), &config.lease_name)
            .with_namespace(&config.namespace)
            .with_identity(&config.identity)
            .with_duration(duration)
            .with_grace(grace)
            .build();
        let built = tokio::select! {
            built = build => built,
            () = shutdown.cancelled() => return Ok(()),
        };
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
        set_ready(LEADING);
        loop {
            // Past the fence (the Lease still names us, but no renewal is confirmed), work waits for one while
            // changed() keeps renewing; the Lease may also turn out lost.
            if !within(&fence) {
                tokio::select! {
                    () = renewed(&mut fence) => info!(identity = %config.identity, "Lease renewal confirmed; resuming work"),
                    changed = manager.changed() => {
                        match changed {
                            Ok(_) => warn!(identity = %config.identity, "lost the Lease"),
                            Err(e) => warn!(error = %e, "cannot renew the Lease"),
                        }
                        continue 'standby;
                    }
                    () = shutdown.cancelled() => break 'standby manager,
                }
            }
            let term = work();
            tokio::pin!(term);
            tokio::select! {
                // The fence is checked first: past it, nothing else may run.
                biased;
                () = fenced(&mut fence) => {
                    warn!(
                        identity = %config.identity,
                        lease = %config.lease_name,
                        "no Lease renewal confirmed in time; stopped work before the Lease can expire"
                    );
                }
                () = &mut term => warn!("work ended while leading; starting it again"),
                // While leading, changed() renews the Lease and returns only when it is lost.
                changed = manager.changed() => {
                    match changed {
                        Ok(_) => warn!(identity = %config.identity, "lost the Lease; stopped work"),
                        Err(e) => warn!(error = %e, "cannot renew the Lease; stopped work"),
                    }
                    continue 'standby;
                }
                () = shutdown.cancelled() => {
                    // Drain: the work has seen the shutdown too and stops starting new things; what it runs now
                    // (a VM deleted whose finalizer is not yet released) finishes under the same Lease, renewed
                    // and fenced as before, then the Lease is released for a quick handover.
                    tokio::select! {
                        biased;
                        () = fenced(&mut fence) => {
                            warn!(identity = %config.identity, "no Lease renewal confirmed while draining; stopped work");
                        }
                        () = &mut term => info!(identity = %config.identity, "work drained"),
                        changed = manager.changed() => {
                            match changed {
                                Ok(_) => warn!(identity = %config.identity, "lost the Lease while draining; stopped work"),
                                Err(e) => warn!(error = %e, "cannot renew the Lease while draining; stopped work"),
                            }
                            // Not ours any more: nothing to release.
                            return Ok(());
                        }
                        () = tokio::time::sleep(config.drain_grace) => {
                            warn!(grace = ?config.drain_grace, "work still running after the drain grace; dropped");
                        }
                    }
                    break 'standby manager;
                }
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

/// Until when `identity` may work, judged from `lease` as read or written at `now` (wall clock and monotonic
/// clock taken together): the Lease's `renewTime` + duration (the shorter of its own and ours) - `margin`,
/// when it names `identity`. `None` (stop now) when it names someone else, nobody, or lacks the times.
pub fn valid_until(
    lease: &Lease,
    identity: &str,
    lease_duration: Duration,
    margin: Duration,
    now: (jiff::Timestamp, Instant),
) -> Option<Instant> {
    let spec = lease.spec.as_ref()?;
    if spec.holder_identity.as_deref() != Some(identity) {
        return None;
    }
    let renewed = spec.renew_time.as_ref()?.0;
    let written = Duration::from_secs(u64::try_from(spec.lease_duration_seconds?).ok()?);
    let valid_for = written.min(lease_duration).checked_sub(margin)?;
    let until = renewed
        .checked_add(jiff::SignedDuration::try_from(valid_for).ok()?)
        .ok()?;
    let (wall, monotonic) = now;
    // Converted once, right away: the monotonic clock cannot jump, a wall clock step later does not move it.
    let remaining = Duration::try_from(until.duration_since(wall)).unwrap_or(Duration::ZERO);
    Some(monotonic + remaining)
}

/// Whether the latest Lease seen lets this replica work now.
fn within(fence: &watch::Receiver<Option<Instant>>) -> bool {
    fence.borrow().is_some_and(|until| until > Instant::now())
}

/// Resolves once a Lease seen lets this replica work again.
async fn renewed(fence: &mut watch::Receiver<Option<Instant>>) {
    loop {
        if fence
            .borrow_and_update()
            .is_some_and(|until| until > Instant::now())
        {
            return;
        }
        if fence.changed().await.is_err() {
            return std::future::pending().await;
        }
    }
}

/// Resolves once the fence has passed: the latest Lease seen no longer lets this replica work.
async fn fenced(fence: &mut watch::Receiver<Option<Instant>>) {
    loop {
        let Some(until) = *fence.borrow_and_update() else {
            return;
        };
        if until <= Instant::now() {
            return;
        }
        tokio::select! {
            () = tokio::time::sleep_until(until.into()) => {}
            changed = fence.changed() => if changed.is_err() {
                return;
            },
        }
    }
}

/// A client for Lease calls: each request (and its response body) gives up after `timeout`, so a black-holed
/// API server answers with an error instead of kube's default of minutes; every Lease in a successful answer
/// is handed to `observe`. Bodies are read whole, so this client is not for watches.
pub fn lease_client(
    client: kube::Client,
    timeout: Duration,
    observe: impl Fn(&Lease) + Send + Sync + 'static,
) -> kube::Client {
    let namespace = client.default_namespace().to_string();
    let observe = Arc::new(observe);
    let service = tower::service_fn(move |request: http::Request<Body>| {
        let (client, observe) = (client.clone(), observe.clone());
        async move {
            let call = async {
                let response = client.send(request).await?;
                let (parts, body) = response.into_parts();
                let bytes = body.collect_bytes().await?;
                if parts.status.is_success()
                    && let Ok(lease) = k8s_openapi::serde_json::from_slice::<Lease>(&bytes)
                {
                    observe(&lease);
                }
                Ok::<_, kube::Error>(http::Response::from_parts(parts, Body::from(bytes)))
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(answer) => answer.map_err(tower::BoxError::from),
                Err(_) => Err(tower::BoxError::from(Error::LeaderElection {
                    message: format!("Lease call got no answer within {timeout:?}"),
                    source: None,
                })),
            }
        }
    });
    kube::Client::new(service, namespace)
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

    #[test]
    fn the_fence_margin_must_leave_time_to_renew() {
        let mut c = LeaderConfig::new("l", "ns", "me");
        assert_eq!(c.fence_margin(), Duration::from_millis(2500));
        assert_eq!(c.call_timeout(), Duration::from_millis(2500));
        c.fence_margin = Some(Duration::from_secs(5));
        assert!(
            c.seconds().is_err(),
            "a margin of renew_before fences before renewing"
        );
        c.fence_margin = Some(Duration::ZERO);
        assert!(c.seconds().is_err());
        c.fence_margin = Some(Duration::from_secs(1));
        c.call_timeout = Some(Duration::ZERO);
        assert!(c.seconds().is_err());
        c.call_timeout = Some(Duration::from_secs(1));
        assert!(c.seconds().is_ok());
    }

    fn lease(holder: Option<&str>, renewed: jiff::Timestamp, seconds: i32) -> Lease {
        use k8s_openapi::api::coordination::v1::LeaseSpec;
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
        Lease {
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                renew_time: Some(MicroTime(renewed)),
                lease_duration_seconds: Some(seconds),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        }
    }

    #[test]
    fn the_fence_is_the_last_renewal_plus_the_duration_minus_the_margin() {
        let renewed = jiff::Timestamp::from_second(1_700_000_000).expect("valid");
        let start = Instant::now();
        // Observed one second after the renewal.
        let now = (renewed + jiff::SignedDuration::from_secs(1), start);
        let (fifteen, two) = (Duration::from_secs(15), Duration::from_secs(2));
        assert_eq!(
            valid_until(&lease(Some("me"), renewed, 15), "me", fifteen, two, now),
            Some(start + Duration::from_secs(12))
        );
        // The shorter of the written and the configured duration counts.
        assert_eq!(
            valid_until(&lease(Some("me"), renewed, 10), "me", fifteen, two, now),
            Some(start + Duration::from_secs(7))
        );
        // Already past: stop at once.
        let late = (renewed + jiff::SignedDuration::from_secs(60), start);
        assert_eq!(
            valid_until(&lease(Some("me"), renewed, 15), "me", fifteen, two, late),
            Some(start)
        );
        // Somebody else's Lease, or nobody's: no time to work at all.
        assert_eq!(
            valid_until(&lease(Some("other"), renewed, 15), "me", fifteen, two, now),
            None
        );
        assert_eq!(
            valid_until(&lease(None, renewed, 15), "me", fifteen, two, now),
            None
        );
        assert_eq!(
            valid_until(&Lease::default(), "me", fifteen, two, now),
            None
        );
    }
}
