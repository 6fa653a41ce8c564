//! When EC2's "no such instance" may be believed (pure, apart from the clock the caller reads).
//!
//! The EC2 API is eventually consistent: right after `RunInstances`, other calls can answer
//! `InvalidInstanceID.NotFound` for the new id, and EC2's documentation warns that such an answer
//! to `TerminateInstances` does not mean the instance is or will be terminated: it may well be
//! running ("Eventual consistency in the Amazon EC2 API"; it advises backing off up to about five
//! minutes). So a NotFound is proof of "gone" only once it has persisted for a window, counted
//! from the first NotFound this process saw for the id; until then the caller is told to come
//! back (retryable), not that the instance is gone, and no finalizer is released on a guess.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use peerpods_provider_core::DeleteOutcome;

use super::failure::Failure;

/// How long a NotFound must persist before it counts as gone: EC2's documentation backs off "up
/// to about five minutes" for a new id to propagate.
pub const DEFAULT_NOT_FOUND_WINDOW: Duration = Duration::from_secs(300);

/// A first NotFound older than the window by this much is forgotten, so that ids asked about
/// once never pile up; asked again later, such an id is judged afresh (a NotFound persisting
/// that long is still gone once the window has passed again).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// What a NotFound for an id means now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// NotFound has persisted for the whole window (or the window is zero): the instance is gone.
    Gone,
    /// NotFound for `unknown_for` only, less than `window`: possibly a new instance EC2 does not
    /// show everywhere yet.
    NotYetVisible {
        unknown_for: Duration,
        window: Duration,
    },
}

/// The first NotFound seen per instance id, shared by every deletion of this provider.
#[derive(Debug)]
pub struct NotFoundWindow {
    window: Duration,
    first_not_found: Mutex<HashMap<String, Instant>>,
}

impl NotFoundWindow {
    pub fn new(window: Duration) -> Self {
        NotFoundWindow {
            window,
            first_not_found: Mutex::new(HashMap::new()),
        }
    }

    /// EC2 answered NotFound for `instance_id` at `now`.
    pub fn not_found(&self, instance_id: &str, now: Instant) -> Verdict {
        if self.window.is_zero() {
            return Verdict::Gone;
        }
        let mut first = self
            .first_not_found
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let keep_for = self.window + FORGET_AFTER;
        first.retain(|_, seen| now.saturating_duration_since(*seen) < keep_for);
        let seen = *first.entry(instance_id.to_owned()).or_insert(now);
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

    /// EC2 answered for `instance_id`: whatever NotFound came before was its lag, not a verdict.
    pub fn found(&self, instance_id: &str) {
        self.first_not_found
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(instance_id);
    }

    /// The caller's answer for an id EC2 just called unknown.
    pub fn answer(&self, instance_id: &str, now: Instant) -> Result<DeleteOutcome, Failure> {
        match self.not_found(instance_id, now) {
            Verdict::Gone => Ok(DeleteOutcome::AlreadyGone),
            Verdict::NotYetVisible {
                unknown_for,
                window,
            } => {
                tracing::info!(
                    instance_id,
                    unknown_for_secs = unknown_for.as_secs(),
                    window_secs = window.as_secs(),
                    "EC2 does not know the instance yet; not treating it as gone"
                );
                Err(Failure::Unavailable {
                    detail: not_yet_visible(instance_id, unknown_for, window),
                })
            }
        }
    }
}

fn not_yet_visible(instance_id: &str, unknown_for: Duration, window: Duration) -> String {
    format!(
        "instance {instance_id} is not yet visible to EC2 (InvalidInstanceID.NotFound for {}s): \
         EC2 is eventually consistent and a new instance can be unknown for a while, so it counts \
         as gone only once NotFound persists for {}s (AWS_NOT_FOUND_WINDOW_SECS); try again",
        unknown_for.as_secs(),
        window.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(300);

    #[test]
    fn not_found_is_gone_only_once_it_persisted_for_the_window() {
        let window = NotFoundWindow::new(WINDOW);
        let start = Instant::now();
        assert_eq!(
            window.not_found("i-0000000a", start),
            Verdict::NotYetVisible {
                unknown_for: Duration::ZERO,
                window: WINDOW
            }
        );
        assert_eq!(
            window.not_found("i-0000000a", start + Duration::from_secs(299)),
            Verdict::NotYetVisible {
                unknown_for: Duration::from_secs(299),
                window: WINDOW
            }
        );
        // Another id has a window of its own.
        assert!(matches!(
            window.not_found("i-0000000b", start + Duration::from_secs(299)),
            Verdict::NotYetVisible { .. }
        ));
        assert_eq!(
            window.not_found("i-0000000a", start + WINDOW),
            Verdict::Gone
        );
        // Once gone, asking again stays gone.
        assert_eq!(
            window.not_found("i-0000000a", start + WINDOW + Duration::from_secs(1)),
            Verdict::Gone
        );
    }

    #[test]
    fn an_instance_ec2_answers_for_starts_over() {
        let window = NotFoundWindow::new(WINDOW);
        let start = Instant::now();
        let _ = window.not_found("i-0000000a", start);
        window.found("i-0000000a");
        assert!(matches!(
            window.not_found("i-0000000a", start + WINDOW),
            Verdict::NotYetVisible { unknown_for, .. } if unknown_for == Duration::ZERO
        ));
    }

    #[test]
    fn a_zero_window_trusts_not_found_at_once() {
        let window = NotFoundWindow::new(Duration::ZERO);
        assert_eq!(
            window.not_found("i-0000000a", Instant::now()),
            Verdict::Gone
        );
    }

    #[test]
    fn old_first_sightings_are_forgotten() {
        let window = NotFoundWindow::new(WINDOW);
        let start = Instant::now();
        let _ = window.not_found("i-0000000a", start);
        let later = start + WINDOW + FORGET_AFTER;
        let _ = window.not_found("i-0000000b", later);
        let first = window.first_not_found.lock().expect("lock");
        assert!(!first.contains_key("i-0000000a"));
        assert!(first.contains_key("i-0000000b"));
    }

    #[test]
    fn not_yet_visible_is_a_retryable_answer_naming_the_id_and_the_setting() {
        let window = NotFoundWindow::new(WINDOW);
        let answer = window.answer("i-0000000a", Instant::now());
        let Err(Failure::Unavailable { detail }) = answer else {
            panic!("expected Unavailable, got {answer:?}");
        };
        assert!(detail.contains("i-0000000a"), "{detail}");
        assert!(detail.contains("AWS_NOT_FOUND_WINDOW_SECS"), "{detail}");
        let trusting = NotFoundWindow::new(Duration::ZERO);
        assert_eq!(
            trusting.answer("i-0000000a", Instant::now()),
            Ok(DeleteOutcome::AlreadyGone)
        );
    }
}
