//! When a cloud's "no such instance" may be believed.
//!
//! Several clouds' APIs are eventually consistent after a create: EC2 ("Eventual consistency in
//! the Amazon EC2 API", up to about five minutes) and Alibaba Cloud ECS (right after
//! `RunInstances`, `DescribeInstances` may return an empty list or `InvalidInstance.NotFound`).
//! Where a cloud does not document it, a window still costs nothing but time on an id that never
//! existed. So a NotFound proves an instance gone only when
//!
//! - the instance is known to be older than the window: the cloud's lag is about new instances
//!   (its age when first shown, as the cloud reports its creation time, plus the time since),
//!   or
//! - the NotFound has persisted for the window, counted from the first NotFound for the
//!   instance's key; any answer that shows the instance starts this count over.
//!
//! An accepted delete proves nothing by itself: right after a create, a lookup may not show an
//! instance whose delete the cloud has just accepted, and that instance (and what is attached to
//! it) still exists.
//!
//! Pure: the caller passes the time ([`Moment`]), so the same rules run under a model checker
//! with logical time.

use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::time::{Duration, Instant};

use crate::InstanceKey;

/// A point in time the protocol can measure from: [`Instant`] in the services, a logical clock
/// in the model.
pub trait Moment: Copy + Eq + Ord + Hash + Debug {
    /// How long after `earlier` this moment is (zero when it is not after it).
    fn since(self, earlier: Self) -> Duration;
}

impl Moment for Instant {
    fn since(self, earlier: Self) -> Duration {
        self.saturating_duration_since(earlier)
    }
}

/// What is remembered of one instance between deletions (the engine reads it when it starts
/// and hands it back after every step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Memo<M> {
    /// The first NotFound not yet believed; `None` once an answer showed the instance.
    pub first_not_found: Option<M>,
    /// When a delete of the instance was last seen accepted.
    pub deletion_seen: Option<M>,
    /// When the instance was first shown, with the age the cloud gave it then (zero when the
    /// cloud did not say).
    pub first_shown: Option<(M, Duration)>,
}

impl<M> Default for Memo<M> {
    fn default() -> Self {
        Memo {
            first_not_found: None,
            deletion_seen: None,
            first_shown: None,
        }
    }
}

impl<M: Moment> Memo<M> {
    /// The latest moment this memo records, if any.
    fn last(&self) -> Option<M> {
        self.first_not_found
            .max(self.deletion_seen)
            .max(self.first_shown.map(|(at, _)| at))
    }

    /// An answer at `now` showed the instance, `age` old if the cloud says: a NotFound before it
    /// was the cloud's lag.
    pub fn shown(&mut self, now: M, age: Option<Duration>) {
        self.first_not_found = None;
        let age = age.unwrap_or_default();
        if self.known_for(now).is_none_or(|known| known < age) {
            self.first_shown = Some((now, age));
        }
    }

    /// How long the instance is known to have existed at `now`, if it was ever shown.
    pub fn known_for(&self, now: M) -> Option<Duration> {
        self.first_shown
            .map(|(at, age)| now.since(at).saturating_add(age))
    }

    /// A delete of the instance was accepted (by this process, or the cloud shows it deleting).
    pub fn deletion_accepted(&mut self, now: M) {
        self.first_not_found = None;
        self.deletion_seen = Some(now);
    }
}

/// What a NotFound means now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum NotFound {
    /// Gone: the instance is older than the window, the NotFound persisted for the whole window,
    /// or the window is zero.
    Gone,
    /// Unknown for `unknown_for` only, less than `window`: possibly a new instance the cloud does
    /// not show everywhere yet.
    NotYetVisible {
        unknown_for: Duration,
        window: Duration,
    },
}

/// How long a NotFound must persist, for one cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window(pub Duration);

impl Window {
    /// Judges a NotFound at `now`, recording it in `memo`.
    pub fn judge<M: Moment>(self, memo: &mut Memo<M>, now: M) -> NotFound {
        if self.0.is_zero() || memo.known_for(now).is_some_and(|known| known >= self.0) {
            return NotFound::Gone;
        }
        let first = *memo.first_not_found.get_or_insert(now);
        let unknown_for = now.since(first);
        if unknown_for >= self.0 {
            NotFound::Gone
        } else {
            NotFound::NotYetVisible {
                unknown_for,
                window: self.0,
            }
        }
    }
}

/// A memo older than the window by this much is forgotten, so that ids asked about once never
/// pile up; asked again later, such an instance is judged afresh.
pub const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The memos of every instance one backend deleted or looked for, by [`InstanceKey`].
#[derive(Debug)]
pub struct Book<M> {
    window: Window,
    memos: HashMap<InstanceKey, Memo<M>>,
}

impl<M: Moment> Book<M> {
    pub fn new(window: Window) -> Self {
        Book {
            window,
            memos: HashMap::new(),
        }
    }

    pub fn window(&self) -> Window {
        self.window
    }

    /// The memo of `key` (empty when none is kept), forgetting every memo that outlived the
    /// window by [`FORGET_AFTER`].
    pub fn recall(&mut self, key: &InstanceKey, now: M) -> Memo<M> {
        let keep_for = self.window.0 + FORGET_AFTER;
        self.memos
            .retain(|_, memo| memo.last().is_some_and(|at| now.since(at) < keep_for));
        self.memos.get(key).copied().unwrap_or_default()
    }

    /// Keeps `memo` for `key` (an empty memo is not kept).
    pub fn keep(&mut self, key: &InstanceKey, memo: Memo<M>) {
        if memo.last().is_some() {
            self.memos.insert(key.clone(), memo);
        } else {
            self.memos.remove(key);
        }
    }

    /// How many memos are kept.
    pub fn len(&self) -> usize {
        self.memos.len()
    }

    pub fn is_empty(&self) -> bool {
        self.memos.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProviderName;

    const WINDOW: Window = Window(Duration::from_secs(300));

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn not_found_is_gone_only_once_it_persisted_for_the_window() {
        let start = Instant::now();
        let mut memo = Memo::default();
        assert_eq!(
            WINDOW.judge(&mut memo, start),
            NotFound::NotYetVisible {
                unknown_for: Duration::ZERO,
                window: WINDOW.0
            }
        );
        assert_eq!(
            WINDOW.judge(&mut memo, start + secs(299)),
            NotFound::NotYetVisible {
                unknown_for: secs(299),
                window: WINDOW.0
            }
        );
        assert_eq!(WINDOW.judge(&mut memo, start + secs(300)), NotFound::Gone);
        assert_eq!(memo.first_not_found, Some(start));
    }

    #[test]
    fn an_answer_showing_the_instance_starts_the_count_over() {
        let start = Instant::now();
        let mut memo = Memo::default();
        let _ = WINDOW.judge(&mut memo, start);
        memo.shown(start + secs(299), None);
        assert_eq!(
            WINDOW.judge(&mut memo, start + secs(300)),
            NotFound::NotYetVisible {
                unknown_for: Duration::ZERO,
                window: WINDOW.0
            }
        );
    }

    #[test]
    fn an_accepted_delete_proves_nothing_by_itself() {
        let start = Instant::now();
        let mut memo = Memo::default();
        let _ = WINDOW.judge(&mut memo, start);
        memo.shown(start, None);
        memo.deletion_accepted(start + secs(1));
        assert_eq!(memo.first_not_found, None);
        assert_eq!(memo.deletion_seen, Some(start + secs(1)));
        // Shown a moment ago: a NotFound may be the cloud's lag for a new instance.
        assert!(matches!(
            WINDOW.judge(&mut memo, start + secs(2)),
            NotFound::NotYetVisible { .. }
        ));
        // Known for the whole window: no new instance any more.
        memo.first_not_found = None;
        assert_eq!(WINDOW.judge(&mut memo, start + WINDOW.0), NotFound::Gone);
    }

    #[test]
    fn an_instance_older_than_the_window_is_believed_gone_at_once() {
        let start = Instant::now();
        let mut memo = Memo::default();
        memo.shown(start, Some(WINDOW.0));
        assert_eq!(memo.known_for(start), Some(WINDOW.0));
        assert_eq!(WINDOW.judge(&mut memo, start), NotFound::Gone);
        // Younger by a second: not yet.
        let mut memo = Memo::default();
        memo.shown(start, Some(WINDOW.0 - secs(1)));
        assert!(matches!(
            WINDOW.judge(&mut memo, start),
            NotFound::NotYetVisible { .. }
        ));
        assert_eq!(WINDOW.judge(&mut memo, start + secs(1)), NotFound::Gone);
    }

    #[test]
    fn the_oldest_known_age_is_kept() {
        let start = Instant::now();
        let mut memo = Memo::default();
        assert_eq!(memo.known_for(start), None);
        memo.shown(start, None);
        assert_eq!(memo.first_shown, Some((start, Duration::ZERO)));
        // A later answer without an age changes nothing.
        memo.shown(start + secs(5), None);
        assert_eq!(memo.known_for(start + secs(5)), Some(secs(5)));
        // An age older than known replaces it; a younger one does not.
        memo.shown(start + secs(5), Some(secs(60)));
        assert_eq!(memo.first_shown, Some((start + secs(5), secs(60))));
        memo.shown(start + secs(6), Some(secs(10)));
        assert_eq!(memo.known_for(start + secs(6)), Some(secs(61)));
        // Equal is no change either.
        memo.shown(start + secs(6), Some(secs(61)));
        assert_eq!(memo.first_shown, Some((start + secs(5), secs(60))));
    }

    #[test]
    fn a_zero_window_trusts_not_found_at_once() {
        let mut memo = Memo::default();
        assert_eq!(
            Window(Duration::ZERO).judge(&mut memo, Instant::now()),
            NotFound::Gone
        );
    }

    #[test]
    fn the_book_keeps_memos_by_key_and_forgets_old_ones() {
        let start = Instant::now();
        let mut book = Book::new(WINDOW);
        assert_eq!(book.window(), WINDOW);
        let a = InstanceKey::new(ProviderName::Azure, "/subscriptions/s/VM-A");
        let a_other_case = InstanceKey::new(ProviderName::Azure, "/SUBSCRIPTIONS/S/vm-a");
        let b = InstanceKey::new(ProviderName::Azure, "/subscriptions/s/vm-b");
        let mut memo = book.recall(&a, start);
        assert_eq!(memo, Memo::default());
        let _ = WINDOW.judge(&mut memo, start);
        book.keep(&a, memo);
        assert_eq!(book.recall(&a_other_case, start + secs(1)), memo);
        assert_eq!(book.recall(&b, start + secs(1)), Memo::default());
        assert_eq!(book.len(), 1);
        // Kept until the window and FORGET_AFTER have passed since its last moment.
        let keep_for = WINDOW.0 + FORGET_AFTER;
        assert_eq!(
            book.recall(&b, start + keep_for - secs(1)).first_not_found,
            None
        );
        assert_eq!(book.len(), 1);
        let _ = book.recall(&b, start + keep_for);
        assert!(book.is_empty());
        // An empty memo is not kept, and removes what was.
        book.keep(&a, memo);
        book.keep(&a, Memo::default());
        assert!(book.is_empty());
    }

    #[test]
    fn the_book_counts_the_memos_it_keeps() {
        let mut book: Book<Instant> = Book::new(WINDOW);
        assert_eq!(book.len(), 0);
        assert!(book.is_empty());
        let mut memo = Memo::default();
        memo.deletion_accepted(Instant::now());
        book.keep(&InstanceKey::new(ProviderName::Aws, "i-1"), memo);
        book.keep(&InstanceKey::new(ProviderName::Aws, "i-2"), memo);
        assert_eq!(book.len(), 2);
        assert!(!book.is_empty());
    }

    #[test]
    fn a_memo_lasts_from_its_latest_moment() {
        let start = Instant::now();
        let mut memo = Memo::default();
        memo.deletion_accepted(start + secs(10));
        memo.first_not_found = Some(start);
        assert_eq!(memo.last(), Some(start + secs(10)));
        // The first sighting counts too.
        let mut shown = memo;
        shown.first_shown = Some((start + secs(20), Duration::ZERO));
        assert_eq!(shown.last(), Some(start + secs(20)));
        let mut book = Book::new(WINDOW);
        let key = InstanceKey::new(ProviderName::Aws, "i-1");
        book.keep(&key, memo);
        let keep_for = WINDOW.0 + FORGET_AFTER;
        assert_eq!(book.recall(&key, start + keep_for), memo);
        assert_eq!(
            book.recall(&key, start + secs(10) + keep_for),
            Memo::default()
        );
    }
}
