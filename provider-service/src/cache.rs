//! Capacity and health answers of a backend, cached for a few seconds with one cloud call in
//! flight (single flight): CAA on every node may poll GetCapacity, and a thousand polls a second
//! must cost the cloud one call per few seconds, not a thousand. Deletes and listings pass
//! through untouched.
//!
//! A failed answer is kept for a shorter time than a good one, so an outage is not hammered by
//! every poller either, and is seen to end soon after it does. While one caller refreshes a stale
//! answer, the others get the last good one (up to 30 s old) instead of queueing behind the cloud
//! call, so a slow cloud does not pile polls up in the service.

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
    /// A good capacity answer or a health check result.
    pub fresh_for: Duration,
    /// A failed capacity answer.
    pub failure_for: Duration,
    /// While one caller refreshes a stale capacity answer, the others get the last good one if it
    /// is younger than this, instead of queueing behind the cloud call.
    pub stale_for: Duration,
}

impl Default for CacheTimes {
    fn default() -> Self {
        CacheTimes {
            fresh_for: Duration::from_secs(5),
            failure_for: Duration::from_secs(1),
            stale_for: Duration::from_secs(30),
        }
    }
}

/// How long a listing waits for a backend's first health check before it says "not checked yet".
pub const FIRST_CHECK_WAIT: Duration = Duration::from_secs(5);

/// One cached answer and when it was fetched.
#[derive(Clone)]
struct Entry<T> {
    at: Instant,
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

    /// The last good capacity answer, if younger than [`CacheTimes::stale_for`].
    fn recent_good(&self) -> Option<Capacity> {
        let last = self.last_good.lock().ok()?;
        let entry = last.as_ref()?;
        (entry.at.elapsed() < self.times.stale_for).then_some(entry.value)
    }

    fn capacity_fresh(&self, entry: &Entry<Result<Capacity, Error>>) -> bool {
        let keep = match entry.value {
            Ok(_) => self.times.fresh_for,
            Err(_) => self.times.failure_for,
        };
        entry.at.elapsed() < keep
    }
}

/// The same error again, for each caller that shares one cached failure.
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
        Error::Config { key, message } => Error::Config {
            key: key.clone(),
            message: message.clone(),
        },
        Error::Throttled {
            retry_after,
            message,
        } => Error::Throttled {
            retry_after: *retry_after,
            message: message.clone(),
        },
        Error::Unavailable { message } => Error::Unavailable {
            message: message.clone(),
        },
        Error::CloudPermissionDenied { message } => Error::CloudPermissionDenied {
            message: message.clone(),
        },
        Error::CloudUnauthenticated { message } => Error::CloudUnauthenticated {
            message: message.clone(),
        },
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
        Error::Tls { message } => Error::Tls {
            message: message.clone(),
        },
        Error::Io { context, source } => Error::Io {
            context: context.clone(),
            source: std::io::Error::new(source.kind(), source.to_string()),
        },
        Error::Internal { message } => Error::Internal {
            message: message.clone(),
        },
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
    let health = inner.health().await;
    *slot = Some(Entry {
        at: Instant::now(),
        value: health.clone(),
    });
    last.send_replace(Some(Entry {
        at: Instant::now(),
        value: health.clone(),
    }));
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
        let value = self.inner.capacity().await;
        let answer = copy_result(&value);
        if let (Ok(capacity), Ok(mut last)) = (&value, self.last_good.lock()) {
            *last = Some(Entry {
                at: Instant::now(),
                value: *capacity,
            });
        }
        *slot = Some(Entry {
            at: Instant::now(),
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
}
