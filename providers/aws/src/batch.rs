//! Coalescing of concurrent calls about single instances into batched EC2 calls (a lookup into
//! one `DescribeInstances`, a delete into one `TerminateInstances`, a listing of addresses into
//! one `DescribeAddresses`).
//!
//! Pure bookkeeping: no I/O and no clock of its own (callers pass `now`), so every rule below is
//! unit-tested with plain values. The I/O driver (`batcher.rs`) owns one [`BatchQueue`] per kind
//! of call.
//!
//! Rules (group commit, as databases batch their log writes):
//! - while no batch is in flight, a batch is flushed `idle` after its oldest id arrived: a lone
//!   call waits only that long for company;
//! - while a batch is in flight, the ids arriving meanwhile wait for it to land (its flight is
//!   their wait for company), then go together; at most `max_wait` after the oldest arrived, so a
//!   slow call does not hold the next batch;
//! - a batch holding `max_ids` ids goes at once;
//! - an id that is already queued or in flight is not queued again: its caller joins the callers
//!   already waiting for that id (singleflight), so all of them get the answer of one cloud call.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

/// When a batch of calls is sent to the cloud.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BatchPolicy {
    /// While no batch is in flight: flush this long after the oldest queued id arrived.
    pub idle: Duration,
    /// Flush when the oldest queued id has waited this long, even while a batch is in flight.
    pub max_wait: Duration,
    /// Most ids in one `TerminateInstances` call (a `DescribeInstances` or `DescribeAddresses`
    /// call carries at most 200, EC2's limit of values per filter).
    pub max_ids: usize,
}

impl Default for BatchPolicy {
    fn default() -> Self {
        Self {
            // Calls made together (the deletes of one storm) arrive within microseconds of each
            // other; later ones wait for the batch in flight.
            idle: Duration::from_millis(20),
            max_wait: Duration::from_secs(1),
            // EC2 accepts up to 1000 ids per TerminateInstances; 500 keeps one failed call cheap.
            max_ids: 500,
        }
    }
}

/// What happened to a request handed to [`BatchQueue::enqueue`].
#[derive(Debug, PartialEq, Eq)]
pub enum Enqueued {
    /// The id was new: it waits for the next batch.
    Queued,
    /// The id was already queued or in flight: the caller shares that call's answer.
    Joined,
}

/// Ids waiting for a batch and the callers waiting for each id (`W` is a caller's reply handle).
#[derive(Debug)]
pub struct BatchQueue<W> {
    policy: BatchPolicy,
    /// Every id that is queued or in flight, with the callers waiting for its answer.
    waiters: HashMap<String, Vec<W>>,
    /// Queued ids in arrival order, with their arrival time.
    pending: VecDeque<(String, Instant)>,
    /// Batches taken and not yet landed ([`BatchQueue::landed`]).
    flights: usize,
}

impl<W> BatchQueue<W> {
    pub fn new(policy: BatchPolicy) -> Self {
        Self {
            policy: BatchPolicy {
                // A zero-sized batch would never flush anything.
                max_ids: policy.max_ids.max(1),
                ..policy
            },
            waiters: HashMap::new(),
            pending: VecDeque::new(),
            flights: 0,
        }
    }

    /// Registers a caller that wants an answer about `instance_id`.
    pub fn enqueue(&mut self, instance_id: &str, waiter: W, now: Instant) -> Enqueued {
        if let Some(waiting) = self.waiters.get_mut(instance_id) {
            waiting.push(waiter);
            return Enqueued::Joined;
        }
        self.waiters.insert(instance_id.to_owned(), vec![waiter]);
        self.pending.push_back((instance_id.to_owned(), now));
        Enqueued::Queued
    }

    /// The moment the queued ids must be flushed, if any are queued. While a batch is in flight
    /// the queued ids may go earlier, once it lands.
    pub fn deadline(&self) -> Option<Instant> {
        let (_, oldest) = self.pending.front()?;
        let wait = match self.flights {
            0 => self.policy.idle.min(self.policy.max_wait),
            _ => self.policy.max_wait,
        };
        Some(*oldest + wait)
    }

    /// Takes the next batch if one is due at `now`: up to `max_ids` ids, oldest first. Taken ids
    /// stay registered (in flight) until [`BatchQueue::complete`], so late callers still join.
    pub fn take_batch(&mut self, now: Instant) -> Option<Vec<String>> {
        let full = self.pending.len() >= self.policy.max_ids;
        let due = self.deadline().is_some_and(|deadline| now >= deadline);
        if !(full || due) {
            return None;
        }
        let count = self.pending.len().min(self.policy.max_ids);
        let batch: Vec<String> = self.pending.drain(..count).map(|(id, _)| id).collect();
        self.flights += 1;
        Some(batch)
    }

    /// One batch taken by [`BatchQueue::take_batch`] has its answers (or failed as a whole).
    pub fn landed(&mut self) {
        self.flights = self.flights.saturating_sub(1);
    }

    /// Ends the flight of `instance_id` and returns every caller waiting for its answer.
    pub fn complete(&mut self, instance_id: &str) -> Vec<W> {
        self.waiters.remove(instance_id).unwrap_or_default()
    }

    /// Number of ids queued for the next batch (not counting ids in flight).
    pub fn queued(&self) -> usize {
        self.pending.len()
    }

    /// Number of ids queued or in flight.
    pub fn outstanding(&self) -> usize {
        self.waiters.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> BatchPolicy {
        BatchPolicy {
            idle: Duration::from_millis(100),
            max_wait: Duration::from_secs(1),
            max_ids: 3,
        }
    }

    fn ms(base: Instant, millis: u64) -> Instant {
        base + Duration::from_millis(millis)
    }

    #[test]
    fn empty_queue_has_no_deadline_and_no_batch() {
        let mut queue: BatchQueue<u32> = BatchQueue::new(policy());
        let now = Instant::now();
        assert_eq!(queue.deadline(), None);
        assert_eq!(queue.take_batch(ms(now, 10_000)), None);
    }

    #[test]
    fn with_nothing_in_flight_a_batch_goes_idle_after_its_oldest_id() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(BatchPolicy {
            max_ids: 100,
            ..policy()
        });
        queue.enqueue("i-1", 1, t0);
        queue.enqueue("i-2", 2, ms(t0, 50));
        // Ids that keep arriving do not hold the batch back.
        queue.enqueue("i-3", 3, ms(t0, 99));
        assert_eq!(queue.deadline(), Some(ms(t0, 100)));
        assert_eq!(queue.take_batch(ms(t0, 99)), None);
        assert_eq!(
            queue.take_batch(ms(t0, 100)),
            Some(vec!["i-1".to_owned(), "i-2".to_owned(), "i-3".to_owned()])
        );
        assert_eq!(queue.queued(), 0);
        assert_eq!(queue.deadline(), None);
    }

    #[test]
    fn ids_arriving_during_a_flight_go_together_once_it_lands_or_at_max_wait() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(BatchPolicy {
            max_ids: 100,
            ..policy()
        });
        queue.enqueue("i-first", 0, t0);
        assert_eq!(queue.take_batch(ms(t0, 100)), Some(vec!["i-first".into()]));
        // One id every 90 ms while that batch is in flight: they wait for it, past `idle`.
        for n in 1..12u64 {
            queue.enqueue(&format!("i-{n}"), n, ms(t0, 100 + n * 90));
        }
        assert_eq!(queue.deadline(), Some(ms(t0, 1190)));
        assert_eq!(queue.take_batch(ms(t0, 400)), None);
        // Once it lands, what waited longer than `idle` goes at once.
        queue.landed();
        assert_eq!(queue.deadline(), Some(ms(t0, 290)));
        let batch = queue.take_batch(ms(t0, 400)).expect("due once landed");
        assert_eq!(batch.len(), 11);

        // A flight that does not land holds the next batch at most `max_wait`.
        queue.enqueue("i-late", 12, ms(t0, 500));
        assert_eq!(queue.take_batch(ms(t0, 1499)), None);
        assert_eq!(queue.take_batch(ms(t0, 1500)), Some(vec!["i-late".into()]));
        // Two flights: one landing leaves the other in flight.
        queue.enqueue("i-next", 13, ms(t0, 1600));
        queue.landed();
        assert_eq!(queue.deadline(), Some(ms(t0, 2600)));
        queue.landed();
        assert_eq!(queue.deadline(), Some(ms(t0, 1700)));
        // Landing more often than batches were taken counts nothing below zero.
        queue.landed();
        assert_eq!(queue.deadline(), Some(ms(t0, 1700)));
    }

    #[test]
    fn full_batch_is_ready_at_once_and_rest_keeps_its_age() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy());
        for n in 0..5u64 {
            queue.enqueue(&format!("i-{n}"), n, ms(t0, n));
        }
        let first = queue.take_batch(ms(t0, 5)).expect("full batch");
        assert_eq!(first, vec!["i-0", "i-1", "i-2"]);
        // Two left: not full, and a batch is in flight: they wait for it, at most max_wait after
        // the older of them (t0+3ms).
        assert_eq!(queue.take_batch(ms(t0, 5)), None);
        assert_eq!(queue.deadline(), Some(ms(t0, 1003)));
        assert_eq!(
            queue.take_batch(ms(t0, 1003)),
            Some(vec!["i-3".into(), "i-4".into()])
        );
    }

    #[test]
    fn same_id_joins_queued_and_in_flight_calls() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(policy());
        assert_eq!(queue.enqueue("i-a", 1, t0), Enqueued::Queued);
        assert_eq!(queue.enqueue("i-a", 2, t0), Enqueued::Joined);
        let batch = queue.take_batch(ms(t0, 100)).expect("due");
        assert_eq!(batch, vec!["i-a"]);
        // In flight now: a third caller still joins instead of starting a new call.
        assert_eq!(queue.enqueue("i-a", 3, ms(t0, 101)), Enqueued::Joined);
        assert_eq!(queue.queued(), 0);
        assert_eq!(queue.complete("i-a"), vec![1, 2, 3]);
        assert_eq!(queue.outstanding(), 0);
        // After completion the id starts a fresh call.
        assert_eq!(queue.enqueue("i-a", 4, ms(t0, 200)), Enqueued::Queued);
    }

    #[test]
    fn completing_unknown_id_returns_no_waiters() {
        let mut queue: BatchQueue<u8> = BatchQueue::new(policy());
        assert!(queue.complete("i-nope").is_empty());
    }

    #[test]
    fn zero_max_ids_still_flushes_one_at_a_time() {
        let t0 = Instant::now();
        let mut queue = BatchQueue::new(BatchPolicy {
            max_ids: 0,
            ..policy()
        });
        queue.enqueue("i-1", (), t0);
        queue.enqueue("i-2", (), t0);
        assert_eq!(queue.take_batch(t0), Some(vec!["i-1".to_owned()]));
    }
}
