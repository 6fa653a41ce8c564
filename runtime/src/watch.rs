//! Backoff for a failing watch that only real progress resets.
//!
//! kube's `WatchStreamExt::default_backoff` resets its backoff on any `Ok` item. A watcher with the usual
//! list-then-watch start yields `Ok(Event::Init)` *before* each list it makes, so when that list keeps failing (the
//! CRD not installed yet, a forbidden list, the API server answering errors) every retry starts with an `Ok` and
//! the backoff never grows: the watcher re-lists about every second, forever. [`backoff`] counts an `Init` as no
//! progress: only objects arriving, a list completing, or a watch event reset it.

use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::runtime::watcher::{self, DefaultBackoff};

/// Delays the polling of `events` after each error by kube's default backoff (0.8 s doubling, with jitter, up to
/// 30 s), reset only by progress (see the module doc).
pub fn backoff<K, S>(
    events: S,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
{
    with_backoff(events, DefaultBackoff::default())
}

fn with_backoff<K, S, B>(
    events: S,
    backoff: B,
) -> impl Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send
where
    K: Send + 'static,
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>> + Send + 'static,
    B: kube::runtime::utils::Backoff + 'static,
{
    let state = (events.boxed(), backoff, None::<Duration>);
    futures::stream::unfold(state, |(mut events, mut backoff, wait)| async move {
        if let Some(wait) = wait {
            tokio::time::sleep(wait).await;
        }
        let item = events.next().await?;
        let wait = match &item {
            Err(_) => backoff.next(),
            // A list about to be made: no sign that it will work.
            Ok(watcher::Event::Init) => None,
            Ok(_) => {
                backoff.reset();
                None
            }
        };
        Some((item, (events, backoff, wait)))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 1 s, 2 s, 3 s, ...; reset to 1 s.
    struct Linear(u64);

    impl Iterator for Linear {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            self.0 += 1;
            Some(Duration::from_secs(self.0))
        }
    }

    impl kube::runtime::utils::Backoff for Linear {
        fn reset(&mut self) {
            self.0 = 0;
        }
    }

    fn failed() -> Result<watcher::Event<()>, watcher::Error> {
        Err(watcher::Error::NoResourceVersion)
    }

    #[tokio::test]
    async fn an_init_before_each_failing_list_does_not_reset_the_backoff() {
        // What kube's watcher yields while its list keeps failing, then a list that works.
        let events = futures::stream::iter(vec![
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            failed(),
            Ok(watcher::Event::Init),
            Ok(watcher::Event::InitDone),
            failed(),
        ]);
        let waits = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let recorder = Recording(Linear(0), waits.clone());
        let out: Vec<_> = with_backoff(events, recorder).collect().await;
        assert_eq!(out.len(), 9);
        assert_eq!(
            *waits.lock().unwrap(),
            [1, 2, 3, 0, 1],
            "growing while failing, reset (0) only by the completed list"
        );
    }

    /// Records each wait it hands out (and a reset as 0).
    struct Recording(Linear, std::sync::Arc<std::sync::Mutex<Vec<u64>>>);

    impl Iterator for Recording {
        type Item = Duration;
        fn next(&mut self) -> Option<Duration> {
            let d = self.0.next()?;
            self.1.lock().unwrap().push(d.as_secs());
            // The test does not wait for real.
            Some(Duration::ZERO)
        }
    }

    impl kube::runtime::utils::Backoff for Recording {
        fn reset(&mut self) {
            self.0.reset();
            self.1.lock().unwrap().push(0);
        }
    }
}
