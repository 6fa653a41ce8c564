//! When EC2's "no such instance" may be believed (pure, apart from the clock the caller reads).
//!
//! The EC2 API is eventually consistent: right after `RunInstances`, other calls can answer
//! `InvalidInstanceID.NotFound` for the new id, and EC2's documentation warns that such an answer
//! to `TerminateInstances` does not mean the instance is or will be terminated: it may well be
//! running ("Eventual consistency in the Amazon EC2 API"; it advises backing off up to about five
//! minutes). So a NotFound is proof of "gone" only once it has persisted for a window, counted
//! from the first NotFound this process saw for the id; until then the caller is told to come
//! back (retryable), not that the instance is gone, and no finalizer is released on a guess.

use std::time::{Duration, Instant};

use peerpods_provider_core::{DeleteOutcome, NotFoundVerdict};

use super::failure::Failure;

/// How long a NotFound must persist before it counts as gone: EC2's documentation backs off "up
/// to about five minutes" for a new id to propagate.
pub const DEFAULT_NOT_FOUND_WINDOW: Duration = Duration::from_secs(300);

/// The setting that sets the window, named in the retryable answer.
const SETTING: &str = "AWS_NOT_FOUND_WINDOW_SECS";

/// The first NotFound seen per instance id, shared by every deletion of this provider: the
/// shared rule of every backend ([`peerpods_provider_core::NotFoundWindow`]) with EC2's answer
/// type. EC2 keeps a terminated instance visible (`terminated`) for about an hour, so a
/// successful `TerminateInstances` answers for itself and only [`Self::found`] is needed.
#[derive(Debug)]
pub struct NotFoundWindow(peerpods_provider_core::NotFoundWindow);

impl NotFoundWindow {
    pub fn new(window: Duration) -> Self {
        NotFoundWindow(peerpods_provider_core::NotFoundWindow::new(
            "EC2", SETTING, window,
        ))
    }

    /// EC2 answered for `instance_id`: whatever NotFound came before was its lag, not a verdict.
    pub fn found(&self, instance_id: &str) {
        self.0.found(instance_id);
    }

    /// The caller's answer for an id EC2 just called unknown.
    pub fn answer(&self, instance_id: &str, now: Instant) -> Result<DeleteOutcome, Failure> {
        match self.0.not_found(instance_id, now) {
            NotFoundVerdict::Gone => Ok(DeleteOutcome::AlreadyGone),
            NotFoundVerdict::NotYetVisible {
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
                    cause: None,
                })
            }
        }
    }
}

fn not_yet_visible(instance_id: &str, unknown_for: Duration, window: Duration) -> String {
    format!(
        "instance {instance_id} is not yet visible to EC2 (InvalidInstanceID.NotFound for {}s): \
         EC2 is eventually consistent and a new instance can be unknown for a while, so it counts \
         as gone only once NotFound persists for {}s ({SETTING}); try again",
        unknown_for.as_secs(),
        window.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const WINDOW: Duration = Duration::from_secs(300);

    #[test]
    fn not_yet_visible_is_a_retryable_answer_naming_the_id_and_the_setting() {
        let window = NotFoundWindow::new(WINDOW);
        let start = Instant::now();
        let answer = window.answer("i-0000000a", start);
        let Err(Failure::Unavailable { detail, .. }) = answer else {
            panic!("expected Unavailable, got {answer:?}");
        };
        assert!(detail.contains("i-0000000a"), "{detail}");
        assert!(detail.contains("AWS_NOT_FOUND_WINDOW_SECS"), "{detail}");
        assert!(detail.contains("not yet visible"), "{detail}");
        // Persisting for the window, it is gone (the rule itself: provider-core's tests).
        assert_eq!(
            window.answer("i-0000000a", start + WINDOW),
            Ok(DeleteOutcome::AlreadyGone)
        );
        let trusting = NotFoundWindow::new(Duration::ZERO);
        assert_eq!(
            trusting.answer("i-0000000a", Instant::now()),
            Ok(DeleteOutcome::AlreadyGone)
        );
    }

    #[test]
    fn an_instance_ec2_answers_for_starts_over() {
        let window = NotFoundWindow::new(WINDOW);
        let start = Instant::now();
        let _ = window.answer("i-0000000a", start);
        window.found("i-0000000a");
        assert!(matches!(
            window.answer("i-0000000a", start + WINDOW),
            Err(Failure::Unavailable { .. })
        ));
    }
}
