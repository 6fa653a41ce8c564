//! When a cloud's "no such instance" may be believed (pure, apart from the clock the caller
//! reads), for every backend whose cloud may not show a new instance at once.
//!
//! Several clouds' APIs are eventually consistent after a create: EC2 ("Eventual consistency in
//! the Amazon EC2 API", up to about five minutes) and Alibaba Cloud ECS ("ECS OpenAPI eventual
//! consistency": right after `RunInstances`, `DescribeInstances` may return an empty list or
//! `InvalidInstance.NotFound`). Where a cloud does not document it, a window still costs nothing
//! but time on an id that never existed. So a NotFound is proof of "gone" only when
//!
//! - the cloud accepted this process's delete of the instance before (its own later lookup
//!   confirms that delete: the instance was there, was deleted, and is no more), or
//! - it has persisted for the window, counted from the first NotFound this process saw for the
//!   id (an answer showing the instance starts the count over).
//!
//! Until then the caller is told to come back ([`Error::Unavailable`], retryable), and no
//! finalizer is released on a guess.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::provider::DeleteOutcome;
use crate::{Error, ProviderConfig};

/// A first NotFound (or an accepted delete) older than the window by this much is forgotten, so
/// that ids asked about once never pile up; asked again later, such an id is judged afresh.
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// What a NotFound for an id means now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// The cloud accepted our delete of it before, NotFound has persisted for the whole window,
    /// or the window is zero: the instance is gone.
    Gone,
    /// NotFound for `unknown_for` only, less than `window`: possibly a new instance the cloud
    /// does not show everywhere yet.
    NotYetVisible {
        unknown_for: Duration,
        window: Duration,
    },
}

#[derive(Debug, Default)]
struct Sightings {
    /// The first NotFound of each id not yet believed.
    first_not_found: HashMap<String, Instant>,
    /// When the cloud accepted this process's delete of each id.
    delete_accepted: HashMap<String, Instant>,
}

/// The first NotFound seen per instance id, shared by every deletion of one backend.
#[derive(Debug)]
pub struct NotFoundWindow {
    window: Duration,
    /// The configuration key that sets the window, named in the retryable answer.
    setting: &'static str,
    /// The cloud's name for the reader, e.g. `Compute Engine`.
    cloud: &'static str,
    sightings: Mutex<Sightings>,
}

impl NotFoundWindow {
    pub fn new(cloud: &'static str, setting: &'static str, window: Duration) -> Self {
        NotFoundWindow {
            window,
            setting,
            cloud,
            sightings: Mutex::new(Sightings::default()),
        }
    }

    /// The window from `setting` (whole seconds; `0` trusts a NotFound at once), `default` when
    /// unset. A value that is not a number is a config error naming the key.
    pub fn from_config(
        config: &ProviderConfig,
        cloud: &'static str,
        setting: &'static str,
        default: Duration,
    ) -> Result<Self, Error> {
        let window = config.duration_secs(setting)?.unwrap_or(default);
        Ok(Self::new(cloud, setting, window))
    }

    pub fn window(&self) -> Duration {
        self.window
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sightings> {
        self.sightings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// The cloud answered NotFound for `instance_id` at `now`.
    pub fn not_found(&self, instance_id: &str, now: Instant) -> Verdict {
        if self.window.is_zero() {
            return Verdict::Gone;
        }
        let mut sightings = self.lock();
        let keep_for = self.window + FORGET_AFTER;
        sightings
            .first_not_found
            .retain(|_, seen| now.saturating_duration_since(*seen) < keep_for);
        sightings
            .delete_accepted
            .retain(|_, at| now.saturating_duration_since(*at) < keep_for);
        if sightings.delete_accepted.contains_key(instance_id) {
            return Verdict::Gone;
        }
        let seen = *sightings
            .first_not_found
            .entry(instance_id.to_owned())
            .or_insert(now);
        let unknown_for = now.saturating_duration_since(seen);
        if unknown_for >= self.window {
            Verdict::Gone
        } else {
            Verdict::NotYetVisible {
                unknown_for,
                window: self.window,
            }
        }
    }

    /// The cloud showed `instance_id`: whatever NotFound came before was its lag, not a verdict.
    pub fn found(&self, instance_id: &str) {
        self.lock().first_not_found.remove(instance_id);
    }

    /// The cloud accepted this process's delete of `instance_id` at `now`: a NotFound from now on
    /// confirms that delete.
    pub fn delete_accepted(&self, instance_id: &str, now: Instant) {
        let mut sightings = self.lock();
        sightings.first_not_found.remove(instance_id);
        sightings
            .delete_accepted
            .insert(instance_id.to_owned(), now);
    }

    /// The caller's answer for an id the cloud just called unknown: [`DeleteOutcome::AlreadyGone`]
    /// once believed, else a retryable [`Error::Unavailable`] naming the id and the setting.
    pub fn answer(&self, instance_id: &str, now: Instant) -> Result<DeleteOutcome, Error> {
        match self.not_found(instance_id, now) {
            Verdict::Gone => Ok(DeleteOutcome::AlreadyGone),
            Verdict::NotYetVisible {
                unknown_for,
                window,
            } => Err(Error::unavailable(format!(
                "instance {instance_id} is not known to {cloud} (for {}s): a new instance can be \
                     unknown for a while, so it counts as gone only once the cloud keeps saying so \
                     for {}s ({setting}); try again",
                unknown_for.as_secs(),
                window.as_secs(),
                cloud = self.cloud,
                setting = self.setting,
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(300);

    fn window() -> NotFoundWindow {
        NotFoundWindow::new("the cloud", "CLOUD_NOT_FOUND_WINDOW_SECS", WINDOW)
    }

    #[test]
    fn not_found_is_gone_only_once_it_persisted_for_the_window() {
        let window = window();
        let start = Instant::now();
        assert_eq!(
            window.not_found("vm-a", start),
            Verdict::NotYetVisible {
                unknown_for: Duration::ZERO,
                window: WINDOW
            }
        );
        assert_eq!(
            window.not_found("vm-a", start + Duration::from_secs(299)),
            Verdict::NotYetVisible {
                unknown_for: Duration::from_secs(299),
                window: WINDOW
            }
        );
        // Another id has a window of its own.
        assert!(matches!(
            window.not_found("vm-b", start + Duration::from_secs(299)),
            Verdict::NotYetVisible { .. }
        ));
        assert_eq!(window.not_found("vm-a", start + WINDOW), Verdict::Gone);
        assert_eq!(
            window.not_found("vm-a", start + WINDOW + Duration::from_secs(1)),
            Verdict::Gone
        );
    }

    #[test]
    fn an_instance_the_cloud_shows_starts_over() {
        let window = window();
        let start = Instant::now();
        let _ = window.not_found("vm-a", start);
        window.found("vm-a");
        assert!(matches!(
            window.not_found("vm-a", start + WINDOW),
            Verdict::NotYetVisible { unknown_for, .. } if unknown_for == Duration::ZERO
        ));
    }

    #[test]
    fn a_not_found_after_an_accepted_delete_confirms_it() {
        let window = window();
        let start = Instant::now();
        let _ = window.not_found("vm-a", start);
        window.delete_accepted("vm-a", start);
        assert_eq!(window.not_found("vm-a", start), Verdict::Gone);
        // Only for that id.
        assert!(matches!(
            window.not_found("vm-b", start),
            Verdict::NotYetVisible { .. }
        ));
    }

    #[test]
    fn a_zero_window_trusts_not_found_at_once() {
        let window = NotFoundWindow::new("c", "K", Duration::ZERO);
        assert_eq!(window.not_found("vm-a", Instant::now()), Verdict::Gone);
    }

    #[test]
    fn old_sightings_are_forgotten() {
        let window = window();
        let start = Instant::now();
        let _ = window.not_found("vm-a", start);
        window.delete_accepted("vm-c", start);
        let later = start + WINDOW + FORGET_AFTER;
        let _ = window.not_found("vm-b", later);
        let sightings = window.lock();
        assert!(!sightings.first_not_found.contains_key("vm-a"));
        assert!(!sightings.delete_accepted.contains_key("vm-c"));
        assert!(sightings.first_not_found.contains_key("vm-b"));
    }

    #[test]
    fn not_yet_visible_is_a_retryable_answer_naming_the_id_and_the_setting() {
        let answer = window().answer("vm-a", Instant::now());
        let Err(Error::Unavailable { message, .. }) = answer else {
            panic!("expected Unavailable, got {answer:?}");
        };
        assert!(message.contains("vm-a"), "{message}");
        assert!(message.contains("CLOUD_NOT_FOUND_WINDOW_SECS"), "{message}");
        let trusting = NotFoundWindow::new("c", "K", Duration::ZERO);
        assert!(matches!(
            trusting.answer("vm-a", Instant::now()),
            Ok(DeleteOutcome::AlreadyGone)
        ));
    }

    #[test]
    fn the_window_comes_from_its_setting() {
        let config = ProviderConfig::from_pairs([("K", "20")]);
        let w = NotFoundWindow::from_config(&config, "c", "K", WINDOW).expect("valid");
        assert_eq!(w.window(), Duration::from_secs(20));
        let config = ProviderConfig::from_pairs(Vec::<(String, String)>::new());
        let w = NotFoundWindow::from_config(&config, "c", "K", WINDOW).expect("valid");
        assert_eq!(w.window(), WINDOW);
        let config = ProviderConfig::from_pairs([("K", "5m")]);
        let e = NotFoundWindow::from_config(&config, "c", "K", WINDOW).expect_err("refused");
        assert!(e.to_string().contains('K'), "{e}");
    }
}
