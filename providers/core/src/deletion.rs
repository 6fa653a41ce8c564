//! Drives the protocol's deletion engine ([`peerpods_protocol::engine`]) against one cloud. The
//! engine owns every rule of "deleted"; a backend only implements [`DeletionPorts`], the calls
//! that look, list and delete, translating the cloud's answers into the engine's observations.
//! No backend can answer [`DeleteOutcome::Deleted`] or [`DeleteOutcome::AlreadyGone`] by itself:
//! only [`Deleter::delete`] turns the engine's verdict into an outcome.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use peerpods_protocol::engine::{Command, Deletion, Observation, Verdict};
use peerpods_protocol::window::{Book, Memo};
use peerpods_protocol::{Guard, InstanceKey, Refusal, Window};

pub use peerpods_protocol::engine::{DeleteAnswer, Part, PartId, PartKind, Sighting, Tie, Waiting};

use crate::budget::without_delete_slot;
use crate::{DeleteOutcome, Error, ProviderConfig, ProviderName};

/// The calls a backend makes for the engine. Each translates the cloud's answer and nothing
/// more: a NotFound is [`Sighting::NotFound`] (the engine judges it), a refusal for the
/// instance's state is [`DeleteAnswer::WrongState`], a failure of the call is an [`Error`].
#[async_trait]
pub trait DeletionPorts: Send + Sync {
    /// Looks the instance up (by id, so that a cloud that lists it shows it), with its creation
    /// time when the answer carries one.
    async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error>;

    /// Asks the cloud to delete the instance.
    async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error>;

    /// Every part attached to the instance or named for it, each with how it is tied to the
    /// VM. A cloud whose VMs have no parts of their own to delete lists none.
    async fn parts(&self, _instance: &InstanceKey) -> Result<Vec<Part>, Error> {
        Ok(Vec::new())
    }

    /// Asks the cloud to delete one part the engine chose from [`DeletionPorts::parts`].
    async fn delete_part(
        &self,
        instance: &InstanceKey,
        part: &PartId,
    ) -> Result<DeleteAnswer, Error> {
        Err(no_parts(instance, part))
    }

    /// Looks one part up.
    async fn look_up_part(&self, instance: &InstanceKey, part: &PartId) -> Result<Sighting, Error> {
        Err(no_parts(instance, part))
    }

    /// What the cloud last answered that the deletion waits out (a status, a refusal), for the
    /// error of a delete that ends at its bound while the cloud refuses it.
    fn last_word(&self) -> Option<String> {
        None
    }
}

fn no_parts(instance: &InstanceKey, part: &PartId) -> Error {
    Error::internal(format!(
        "{instance}: the backend lists no parts, yet was asked about {} {}",
        part.kind.as_str(),
        part.id
    ))
}

/// What a lookup of the instance showed: the sighting, and when the cloud says the instance was
/// created, if its answer says. An instance older than the consistency window is no new instance
/// the cloud may not show yet: its NotFound is believed at once, where one of unknown age waits
/// the window out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lookup {
    pub sighting: Sighting,
    /// The latest moment the instance may have been created (a cloud that writes its creation
    /// time in whole minutes gives the end of that minute).
    pub created: Option<jiff::Timestamp>,
}

impl Lookup {
    /// A sighting of an instance whose creation time the answer does not give.
    pub fn of(sighting: Sighting) -> Self {
        Lookup {
            sighting,
            created: None,
        }
    }

    /// A sighting of an instance created at `created`, when the answer says.
    pub fn created(sighting: Sighting, created: Option<jiff::Timestamp>) -> Self {
        Lookup { sighting, created }
    }

    /// The instance's age at `now` by this machine's clock, less [`CLOCK_SKEW`]; `None` when the
    /// cloud gave no creation time or the instance is younger than the allowance.
    pub fn age(&self, now: jiff::Timestamp) -> Option<Duration> {
        let age: Duration = now.duration_since(self.created?).try_into().ok()?;
        age.checked_sub(CLOCK_SKEW)
    }
}

/// How far this machine's clock may be ahead of the cloud's: taken off every age the cloud's
/// creation times give, so that a fast clock never makes a young instance look old.
pub const CLOCK_SKEW: Duration = Duration::from_secs(60);

/// How long the driver waits before looking again, per thing it waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// While the cloud deletes the instance.
    pub deleting: Duration,
    /// The first of those waits in a delete call: a VM the cloud deletes at once (one already
    /// stopped, a cloud that answers when it is done) is then confirmed without a whole
    /// `deleting`; one still being deleted is looked at again at `deleting`. Never longer than
    /// `deleting`.
    pub first_look: Duration,
    /// After the cloud refused the delete for the instance's state, or answered NotFound.
    pub busy: Duration,
    /// While a part is deleted, refused or unconfirmed.
    pub part: Duration,
}

impl Pace {
    /// The same wait for everything.
    pub const fn every(wait: Duration) -> Self {
        Pace {
            deleting: wait,
            first_look: wait,
            busy: wait,
            part: wait,
        }
    }

    /// The first wait while the cloud deletes the instance is `first_look` (at most the pace).
    pub const fn looking_first_after(self, first_look: Duration) -> Self {
        Pace { first_look, ..self }
    }
}

/// The waits of one delete call, in order: the first wait for the cloud's deleting is the pace's
/// `first_look`, every later one its `deleting`.
#[derive(Debug, Clone, Copy)]
struct Waits {
    pace: Pace,
    waited_for_deleting: bool,
}

impl Waits {
    fn new(pace: Pace) -> Self {
        Waits {
            pace,
            waited_for_deleting: false,
        }
    }

    /// How long to wait for `waiting` now.
    fn next(&mut self, waiting: Waiting) -> Duration {
        let pace = &self.pace;
        match waiting {
            Waiting::CloudDeleting if !self.waited_for_deleting => {
                self.waited_for_deleting = true;
                pace.first_look.min(pace.deleting)
            }
            Waiting::CloudDeleting => pace.deleting,
            Waiting::CloudBusy | Waiting::Confirming => pace.busy,
            Waiting::Part(_) => pace.part,
        }
    }
}

/// Reads a consistency window from `setting` (whole seconds; `0` trusts a NotFound at once),
/// `default` when unset; a value that is not a number is a config error naming the key.
pub fn window_from_config(
    config: &ProviderConfig,
    setting: &'static str,
    default: Duration,
) -> Result<Window, Error> {
    Ok(Window(config.duration_secs(setting)?.unwrap_or(default)))
}

/// How long one delete call may go on before it answers, and what sets that bound (named in the
/// answer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    pub within: Duration,
    /// The configuration key that sets it, or how it is set.
    pub setting: &'static str,
}

/// The deletions of one backend: its guard, its pace, its bound, and what it remembers of each
/// instance between deletions (the consistency window's memos, keyed by [`InstanceKey`]).
#[derive(Debug)]
pub struct Deleter {
    provider: ProviderName,
    guard: Guard,
    pace: Pace,
    /// The configuration key of the window, named when an instance is not yet visible.
    window_setting: &'static str,
    /// Checked before each wait; `None`: only the caller's bound (provider-service's).
    bound: Option<Bound>,
    book: Mutex<Book<Instant>>,
}

impl Deleter {
    pub fn new(
        provider: ProviderName,
        guard: Guard,
        window: Window,
        window_setting: &'static str,
        pace: Pace,
    ) -> Self {
        Deleter {
            provider,
            guard,
            pace,
            window_setting,
            bound: None,
            book: Mutex::new(Book::new(window)),
        }
    }

    /// Ends each delete call at its first wait past `bound`: a delete the cloud accepted (or
    /// shows deleting) and has not finished is then [`DeleteOutcome::InProgress`], a wait; one the
    /// cloud still refuses, or whose parts are still being deleted, a retryable
    /// [`Error::Unavailable`] naming what it waits for. The next call resumes from the memo. Each
    /// cloud call is bounded by the backend's own request deadline; this bounds the waits.
    pub fn with_bound(mut self, bound: Bound) -> Self {
        self.bound = Some(bound);
        self
    }

    pub fn window(&self) -> Window {
        self.book().window()
    }

    pub fn guard(&self) -> &Guard {
        &self.guard
    }

    fn book(&self) -> MutexGuard<'_, Book<Instant>> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Deletes `instance_id` (already validated) through `ports`, by the engine's rules, until
    /// the engine finishes or a call fails. A failure leaves what was learnt in the memo, so the
    /// next delete resumes from it.
    pub async fn delete(
        &self,
        ports: &(impl DeletionPorts + ?Sized),
        instance_id: &str,
    ) -> Result<DeleteOutcome, Error> {
        let key = InstanceKey::new(self.provider, instance_id);
        let (window, memo) = {
            let mut book = self.book();
            (book.window(), book.recall(&key, Instant::now()))
        };
        let mut deletion = Deletion::new(self.guard.clone(), window, memo);
        let mut observation = Observation::Start;
        let started = Instant::now();
        let mut waits = Waits::new(self.pace);
        loop {
            let command = deletion.step(observation, Instant::now());
            self.book().keep(&key, deletion.memo());
            tracing::debug!(instance = %key, ?command, "deletion step");
            observation = match command {
                Command::LookUp => {
                    let lookup = ports.look_up(&key).await?;
                    let age = lookup.age(jiff::Timestamp::now());
                    Observation::Instance(lookup.sighting, age)
                }
                Command::RequestDelete => {
                    Observation::DeleteAnswered(ports.request_delete(&key).await?)
                }
                Command::ListParts => Observation::Parts(ports.parts(&key).await?),
                Command::DeletePart(part) => {
                    Observation::PartDeleteAnswered(ports.delete_part(&key, &part).await?)
                }
                Command::LookUpPart(part) => {
                    Observation::Part(ports.look_up_part(&key, &part).await?)
                }
                Command::Wait(waiting) => {
                    if let Some(bound) = self.bound.filter(|b| started.elapsed() >= b.within) {
                        return self.out_of_time(&key, deletion.memo(), waiting, bound, ports);
                    }
                    // Paused, the delete leaves its delete slot to other deletes' calls.
                    without_delete_slot(tokio::time::sleep(waits.next(waiting))).await?;
                    Observation::Waited
                }
                Command::Finish(verdict) => {
                    for (part, refusal) in deletion.kept() {
                        tracing::info!(instance = %key, part = %part.id, kind = part.kind.as_str(), %refusal, "part of the VM left alone");
                    }
                    return self.outcome(instance_id, verdict);
                }
            };
        }
    }

    /// The answer of a delete whose bound passed as it was about to wait for `waiting`.
    fn out_of_time(
        &self,
        key: &InstanceKey,
        memo: Memo<Instant>,
        waiting: Waiting,
        bound: Bound,
        ports: &(impl DeletionPorts + ?Sized),
    ) -> Result<DeleteOutcome, Error> {
        let what = match waiting {
            // The cloud accepted the delete and is at it: a wait, not a failure.
            Waiting::CloudDeleting | Waiting::Confirming if memo.deletion_seen.is_some() => {
                tracing::info!(instance = %key, within_ms = bound.within.as_millis() as u64, setting = bound.setting, "the cloud is still deleting the instance; the next call resumes");
                return Ok(DeleteOutcome::InProgress);
            }
            Waiting::CloudDeleting | Waiting::Confirming => "is not confirmed deleted".to_owned(),
            Waiting::CloudBusy => "still refuses its delete for its state".to_owned(),
            Waiting::Part(kind) => format!("still has a {} being deleted", kind.as_str()),
        };
        let said = ports
            .last_word()
            .map(|word| format!(" ({word})"))
            .unwrap_or_default();
        Err(Error::unavailable(format!(
            "{} instance {} {what} after {} s{said} ({}); the next call resumes",
            self.provider.as_str(),
            key.id(),
            bound.within.as_secs_f64(),
            bound.setting,
        )))
    }

    fn outcome(&self, instance_id: &str, verdict: Verdict) -> Result<DeleteOutcome, Error> {
        match verdict {
            Verdict::Deleted => Ok(DeleteOutcome::Deleted),
            Verdict::AlreadyGone => Ok(DeleteOutcome::AlreadyGone),
            Verdict::NotYetVisible {
                unknown_for,
                window,
            } => Ok(DeleteOutcome::NotYetVisible {
                unknown_for,
                window,
                setting: self.window_setting,
            }),
            Verdict::Refused(Refusal::DoNotDelete { tag, value }) => Err(Error::DoNotDelete {
                instance_id: instance_id.to_owned(),
                tag,
                value,
            }),
            Verdict::Refused(refusal) => Err(Error::NotOwnedByCluster {
                message: format!("instance {instance_id}: {refusal}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::testing::{DeleteOnly, Deletes};
    use crate::{Budgeted, CallBudget, Provider};
    use async_trait::async_trait;
    use std::collections::BTreeSet;
    use std::sync::Arc;

    #[test]
    fn only_the_first_wait_for_the_clouds_deleting_is_the_first_look() {
        let ms = Duration::from_millis;
        let pace = Pace {
            deleting: ms(2000),
            first_look: ms(250),
            busy: ms(3000),
            part: ms(4000),
        };
        let mut waits = Waits::new(pace);
        let order = [
            Waiting::CloudBusy,
            Waiting::CloudDeleting,
            Waiting::Confirming,
            Waiting::CloudDeleting,
            Waiting::Part(PartKind::Disk),
            Waiting::CloudDeleting,
        ];
        assert_eq!(
            order.map(|w| waits.next(w)),
            [ms(3000), ms(250), ms(3000), ms(2000), ms(4000), ms(2000)]
        );
        // A first look longer than the pace waits the pace; without one set, every wait is the pace.
        let mut slow = Waits::new(Pace::every(ms(100)).looking_first_after(ms(500)));
        assert_eq!(slow.next(Waiting::CloudDeleting), ms(100));
        let mut even = Waits::new(Pace::every(ms(100)));
        assert_eq!(
            [Waiting::CloudDeleting, Waiting::CloudDeleting].map(|w| even.next(w)),
            [ms(100), ms(100)]
        );
    }

    /// Two instances in memory: one asked to be deleted shows `Deleting` until both were asked,
    /// then `Gone`. Pure logic of the driver, no cloud.
    #[derive(Default)]
    struct DeletedTogether {
        requested: Mutex<BTreeSet<String>>,
    }

    #[async_trait]
    impl DeletionPorts for DeletedTogether {
        async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error> {
            let requested = self.requested.lock().unwrap();
            Ok(Lookup::of(if !requested.contains(instance.id()) {
                Sighting::Present(Default::default())
            } else if requested.len() == 2 {
                Sighting::Gone
            } else {
                Sighting::Deleting(Default::default())
            }))
        }

        async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
            self.requested
                .lock()
                .unwrap()
                .insert(instance.id().to_owned());
            Ok(DeleteAnswer::Accepted)
        }
    }

    struct Backend {
        deleter: Deleter,
        cloud: DeletedTogether,
    }

    #[async_trait]
    impl Deletes for Backend {
        async fn delete(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
            self.deleter.delete(&self.cloud, instance_id).await
        }
    }

    #[tokio::test]
    async fn deletes_waiting_for_the_cloud_wait_side_by_side_on_one_delete_slot() {
        let backend = Backend {
            deleter: Deleter::new(
                ProviderName::Libvirt,
                Guard::new(None),
                Window(Duration::ZERO),
                "NOT_FOUND_WINDOW",
                Pace::every(Duration::from_millis(1)),
            ),
            cloud: DeletedTogether::default(),
        };
        let budgeted = Arc::new(Budgeted::new(
            Arc::new(DeleteOnly(backend)),
            CallBudget {
                deletes: 1,
                reads: 1,
            },
        ));
        // Holding its slot through its waits, the first delete would wait for a cloud that waits
        // for the second delete, which waits for the slot.
        let deletes: Vec<_> = [
            "6f1a3c55-0d7e-4a4e-9d59-3c0f2b8c9a01",
            "6f1a3c55-0d7e-4a4e-9d59-3c0f2b8c9a02",
        ]
        .into_iter()
        .map(|id| {
            let b = budgeted.clone();
            tokio::spawn(async move { b.delete_instance(id).await })
        })
        .collect();
        for delete in deletes {
            let outcome = tokio::time::timeout(Duration::from_secs(10), delete)
                .await
                .expect("both deletes reach the cloud while the other waits")
                .unwrap();
            assert_eq!(outcome.unwrap(), DeleteOutcome::Deleted);
        }
        assert_eq!(budgeted.free_delete_slots(), 1);
    }

    #[test]
    fn an_age_is_the_time_since_creation_less_the_clock_skew() {
        let now: jiff::Timestamp = "2026-11-27T12:00:00Z".parse().unwrap();
        let created = |text: &str| Lookup::created(Sighting::NotFound, Some(text.parse().unwrap()));
        assert_eq!(
            created("2026-11-27T11:00:00Z").age(now),
            Some(Duration::from_secs(3600) - CLOCK_SKEW)
        );
        // Younger than the allowance, or created "after" now by a slow clock: no age.
        assert_eq!(created("2026-11-27T11:59:30Z").age(now), None);
        assert_eq!(created("2026-11-27T12:05:00Z").age(now), None);
        assert_eq!(Lookup::of(Sighting::NotFound).age(now), None);
    }
}
