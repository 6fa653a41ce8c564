//! Capacity and health answers of a backend, cached for a few seconds with one cloud call in
//! flight (single flight): CAA on every node may poll GetCapacity, and a thousand polls a second
//! must cost the cloud one call per few seconds, not a thousand. Deletes and listings pass
//! through untouched.
//!
//! A good answer stays fresh for a few seconds, or for ten times as long as the cloud took to give
//! it, up to a minute: a capacity query that walks thousands of instances then takes at most a
//! tenth of the cloud's (and of our deletes' share of its) time, however many poll. A failed
//! answer is kept for a shorter time than a good one, so an outage is not hammered by every poller
//! either, and is seen to end soon after it does. While one caller refreshes a stale answer, the
//! others get the last good one (up to 30 s past its freshness) instead of queueing behind the
//! cloud call, so a slow cloud does not pile polls up in the service.

use std::sync::Arc;
use std::time::{Duration, Instant};

use peerpods_provider_core::{
    Capacity, DeleteOutcome, Error, Health, Instance, Provider, ProviderName, TagSelector,
};
use tokio::sync::watch;
use tonic::async_trait;

/// How long answers are reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheTimes {
    /// A good capacity answer (at least) or a health check result.
    pub fresh_for: Duration,
    /// A good capacity answer stays fresh for this many times as long as the cloud took to give
    /// it, if that is longer than `fresh_for`: the cloud spends at most about 1/N of its time on
    /// capacity queries.
    pub cost_factor: u32,
    /// The longest a good capacity answer stays fresh, however slow the cloud.
    pub fresh_at_most: Duration,
    /// A failed capacity answer.
    pub failure_for: Duration,
    /// While one caller refreshes a stale capacity answer, the others get the last good one if it
    /// went stale less than this long ago, instead of queueing behind the cloud call.
    pub stale_for: Duration,
}

impl Default for CacheTimes {
    fn default() -> Self {
        CacheTimes {
            fresh_for: Duration::from_secs(5),
            cost_factor: 10,
            fresh_at_most: Duration::from_secs(60),
            failure_for: Duration::from_secs(1),
            stale_for: Duration::from_secs(30),
        }
    }
}

/// How long a listing waits for a backend's first health check before it says "not checked yet".
pub const FIRST_CHECK_WAIT: Duration = Duration::from_secs(5);

impl CacheTimes {
    /// How long a good capacity answer that took the cloud `took` stays fresh.
    pub fn capacity_fresh_for(&self, took: Duration) -> Duration {
        let cost = took.saturating_mul(self.cost_factor);
        cost.min(self.fresh_at_most).max(self.fresh_for)
    }
}

/// One cached answer, when it was fetched, and how long the cloud took for it.
#[derive(Clone)]
struct Entry<T> {
    at: Instant,
    took: Duration,
    value: T,
}

/// A backend with cached capacity and health answers.
pub struct Cached {
    inner: Arc<dyn Provider>,
    times: CacheTimes,
    /// Held across the cloud call: callers that find the answer stale queue here and then find
    /// the one answer the first of them fetched.
    capacity: tokio::sync::Mutex<Option<Entry<Result<Capacity, Error>>>>,
    /// The last good capacity answer, served while a refresh runs (see [`CacheTimes::stale_for`]).
    last_good: std::sync::Mutex<Option<Entry<Capacity>>>,
    health: Arc<tokio::sync::Mutex<Option<Entry<Health>>>>,
    /// The last health result, readable without waiting (ListProviders), and awaited while none
    /// is there yet.
    last_health: Arc<watch::Sender<Option<Entry<Health>>>>,
}

impl Cached {
    pub fn new(inner: Arc<dyn Provider>, times: CacheTimes) -> Self {
        Cached {
            inner,
            times,
            capacity: tokio::sync::Mutex::new(None),
            last_good: std::sync::Mutex::new(None),
            health: Arc::new(tokio::sync::Mutex::new(None)),
            last_health: Arc::new(watch::Sender::new(None)),
        }
    }

    /// The last good capacity answer, if it went stale less than [`CacheTimes::stale_for`] ago.
    fn recent_good(&self) -> Option<Capacity> {
        let last = self.last_good.lock().ok()?;
        let entry = last.as_ref()?;
        let usable = self.times.capacity_fresh_for(entry.took) + self.times.stale_for;
        (entry.at.elapsed() < usable).then_some(entry.value)
    }

    fn capacity_fresh(&self, entry: &Entry<Result<Capacity, Error>>) -> bool {
        let keep = match entry.value {
            Ok(_) => self.times.capacity_fresh_for(entry.took),
            Err(_) => self.times.failure_for,
        };
        entry.at.elapsed() < keep
    }
}

/// The same error again, for each caller that shares one cached failure. The copy carries the
/// message only: a source is not `Clone` (the cached original keeps it).
fn copy_error(e: &Error) -> Error {
    match e {
        Error::InvalidArgument { field, message } => Error::InvalidArgument {
            field,
            message: message.clone(),
        },
        Error::UnknownProvider { name } => Error::UnknownProvider { name: name.clone() },
        Error::ProviderNotConfigured { name } => {
            Error::ProviderNotConfigured { name: name.clone() }
        }
        Error::Config { key, message, .. } => Error::config(key.clone(), message.clone()),
        Error::Throttled {
            retry_after,
            message,
            ..
        } => Error::throttled(*retry_after, message.clone()),
        Error::Unavailable { message, .. } => Error::unavailable(message.clone()),
        Error::CloudPermissionDenied { message, .. } => {
            Error::cloud_permission_denied(message.clone())
        }
        Error::CloudUnauthenticated { message, .. } => {
            Error::cloud_unauthenticated(message.clone())
        }
        Error::NotOwnedByCluster { message } => Error::NotOwnedByCluster {
            message: message.clone(),
        },
        Error::DoNotDelete {
            instance_id,
            tag,
            value,
        } => Error::DoNotDelete {
            instance_id: instance_id.clone(),
            tag,
            value: value.clone(),
        },
        Error::Tls { message, .. } => Error::tls(message.clone()),
        Error::Io { context, source } => Error::Io {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Internal { message, .. } => Error::internal(message.clone()),
    }
}

fn copy_result(r: &Result<Capacity, Error>) -> Result<Capacity, Error> {
    match r {
        Ok(c) => Ok(*c),
        Err(e) => Err(copy_error(e)),
    }
}

/// Checks health once (single flight) unless a fresh result is there; returns the result.
async fn checked_health(
    inner: &Arc<dyn Provider>,
    cache: &tokio::sync::Mutex<Option<Entry<Health>>>,
    last: &watch::Sender<Option<Entry<Health>>>,
    fresh_for: Duration,
) -> Health {
    let mut slot = cache.lock().await;
    if let Some(entry) = slot.as_ref()
        && entry.at.elapsed() < fresh_for
    {
        return entry.value.clone();
    }
    let asked = Instant::now();
    let health = inner.health().await;
    let entry = Entry {
        at: Instant::now(),
        took: asked.elapsed(),
        value: health.clone(),
    };
    *slot = Some(entry.clone());
    last.send_replace(Some(entry));
    health
}

#[async_trait]
impl Provider for Cached {
    fn name(&self) -> ProviderName {
        self.inner.name()
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        self.inner.validate_instance_id(instance_id)
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        self.inner.delete_instance(instance_id).await
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        let mut slot = match self.capacity.try_lock() {
            Ok(slot) => slot,
            // A refresh runs: a recent good answer now beats a queue behind the cloud call.
            Err(_) => match self.recent_good() {
                Some(capacity) => return Ok(capacity),
                None => self.capacity.lock().await,
            },
        };
        if let Some(entry) = slot.as_ref()
            && self.capacity_fresh(entry)
        {
            return copy_result(&entry.value);
        }
        let asked = Instant::now();
        let value = self.inner.capacity().await;
        let took = asked.elapsed();
        let answer = copy_result(&value);
        if let (Ok(capacity), Ok(mut last)) = (&value, self.last_good.lock()) {
            *last = Some(Entry {
                at: Instant::now(),
                took,
                value: *capacity,
            });
        }
        *slot = Some(Entry {
            at: Instant::now(),
            took,
            value,
        });
        answer
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        self.inner.list_instances(selector).await
    }

    async fn health(&self) -> Health {
        checked_health(
            &self.inner,
            &self.health,
            &self.last_health,
            self.times.fresh_for,
        )
        .await
    }

    /// The last result, at once; a stale or missing one starts a check in the background (one at
    /// a time), so the next reader finds a fresh one. While no check ever ended, waits for the
    /// first one for up to [`FIRST_CHECK_WAIT`].
    async fn last_health(&self) -> Option<Health> {
        let last = self.last_health.borrow().clone();
        if let Some(entry) = last {
            if entry.at.elapsed() >= self.times.fresh_for {
                self.check_in_background();
            }
            return Some(entry.value);
        }
        self.check_in_background();
        let mut first = self.last_health.subscribe();
        let checked = tokio::time::timeout(FIRST_CHECK_WAIT, first.wait_for(Option::is_some)).await;
        match checked {
            Ok(Ok(entry)) => entry.as_ref().map(|e| e.value.clone()),
            _ => None,
        }
    }
}

impl Cached {
    /// Starts a health check unless one runs already (it holds the lock; this one would only
    /// wait for it).
    fn check_in_background(&self) {
        if self.health.try_lock().is_err() {
            return;
        }
        let (inner, cache, last, fresh_for) = (
            self.inner.clone(),
            self.health.clone(),
            self.last_health.clone(),
            self.times.fresh_for,
        );
        tokio::spawn(async move {
            checked_health(&inner, &cache, &last, fresh_for).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use tokio::sync::Notify;

    /// A backend whose capacity answers count up and, from the second call on, wait until
    /// released: pure cache logic, no cloud.
    struct Slow {
        calls: AtomicU64,
        release: Notify,
    }

    #[async_trait]
    impl Provider for Slow {
        fn name(&self) -> ProviderName {
            ProviderName::Libvirt
        }
        fn validate_instance_id(&self, _: &str) -> Result<(), Error> {
            Ok(())
        }
        async fn delete_instance(&self, _: &str) -> Result<DeleteOutcome, Error> {
            Ok(DeleteOutcome::Deleted)
        }
        async fn capacity(&self) -> Result<Capacity, Error> {
            let n = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
            if n > 1 {
                self.release.notified().await;
            }
            let mut capacity = Capacity::default();
            capacity.instances.in_use = Some(n);
            Ok(capacity)
        }
        async fn list_instances(&self, _: &TagSelector) -> Result<Vec<Instance>, Error> {
            Ok(Vec::new())
        }
        async fn health(&self) -> Health {
            Health {
                healthy: true,
                message: String::new(),
            }
        }
    }

    #[tokio::test(flavor = "multi_thread")]
    async fn a_refresh_in_flight_serves_the_last_good_answer() {
        let slow = Arc::new(Slow {
            calls: AtomicU64::new(0),
            release: Notify::new(),
        });
        let cached = Arc::new(Cached::new(
            slow.clone(),
            CacheTimes {
                // Every answer is stale at once: each call wants a refresh.
                fresh_for: Duration::ZERO,
                cost_factor: 0,
                fresh_at_most: Duration::ZERO,
                failure_for: Duration::ZERO,
                stale_for: Duration::from_secs(3600),
            },
        ));
        let first = cached.capacity().await.unwrap();
        assert_eq!(first.instances.in_use, Some(1));

        let refreshing = tokio::spawn({
            let cached = cached.clone();
            async move { cached.capacity().await }
        });
        while slow.calls.load(Ordering::SeqCst) < 2 {
            tokio::task::yield_now().await;
        }
        // Generous: without the stale answer this call waits for the refresh, which never ends
        // until released below.
        let meanwhile = tokio::time::timeout(Duration::from_secs(10), cached.capacity())
            .await
            .expect("answered while the refresh runs")
            .unwrap();
        assert_eq!(meanwhile.instances.in_use, Some(1), "the last good answer");
        assert_eq!(slow.calls.load(Ordering::SeqCst), 2, "no second refresh");

        slow.release.notify_one();
        let refreshed = refreshing.await.unwrap().unwrap();
        assert_eq!(refreshed.instances.in_use, Some(2));
    }

    #[test]
    fn a_slow_answer_stays_fresh_ten_times_as_long_up_to_a_minute() {
        let times = CacheTimes::default();
        assert_eq!(
            times.capacity_fresh_for(Duration::from_millis(20)),
            times.fresh_for
        );
        assert_eq!(
            times.capacity_fresh_for(Duration::from_millis(5300)),
            Duration::from_secs(53)
        );
        assert_eq!(
            times.capacity_fresh_for(Duration::from_secs(600)),
            times.fresh_at_most
        );
        assert_eq!(times.capacity_fresh_for(Duration::MAX), times.fresh_at_most);
    }

    /// A cached answer of `age` that took the cloud `took`.
    async fn cached_answer(age: Duration, took: Duration) -> (Arc<Slow>, Cached) {
        let slow = Arc::new(Slow {
            calls: AtomicU64::new(0),
            release: Notify::new(),
        });
        let cached = Cached::new(slow.clone(), CacheTimes::default());
        let at = Instant::now()
            .checked_sub(age)
            .expect("an instant in the past");
        let mut capacity = Capacity::default();
        capacity.instances.in_use = Some(7);
        *cached.capacity.lock().await = Some(Entry {
            at,
            took,
            value: Ok(capacity),
        });
        (slow, cached)
    }

    #[tokio::test]
    async fn the_cloud_is_asked_again_after_an_interval_that_grows_with_its_answers_cost() {
        // 30 s old: stale for an answer the cloud gave in 20 ms (fresh for 5 s) ...
        let (slow, cached) =
            cached_answer(Duration::from_secs(30), Duration::from_millis(20)).await;
        assert_eq!(cached.capacity().await.unwrap().instances.in_use, Some(1));
        assert_eq!(slow.calls.load(Ordering::SeqCst), 1, "asked the cloud");
        // ... still fresh for one that took 5 s (fresh for 50 s).
        let (slow, cached) = cached_answer(Duration::from_secs(30), Duration::from_secs(5)).await;
        assert_eq!(cached.capacity().await.unwrap().instances.in_use, Some(7));
        assert_eq!(
            slow.calls.load(Ordering::SeqCst),
            0,
            "answered from the cache"
        );
        // Never older than a minute.
        let (slow, cached) = cached_answer(Duration::from_secs(61), Duration::from_secs(60)).await;
        assert_eq!(cached.capacity().await.unwrap().instances.in_use, Some(1));
        assert_eq!(slow.calls.load(Ordering::SeqCst), 1);
    }
}
