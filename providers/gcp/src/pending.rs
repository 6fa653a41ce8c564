//! The delete operations this process started and has not seen end: a later delete of the same instance
//! polls the operation instead of starting another.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// A pending operation older than this is forgotten (a deletion abandoned after a failure).
const FORGET_AFTER: Duration = Duration::from_secs(3600);

/// The delete operations this process started and has not seen end, by instance name.
#[derive(Debug, Default)]
pub struct Pending(Mutex<HashMap<String, (String, Instant)>>);

impl Pending {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, (String, Instant)>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn started(&self, instance: &str, operation: String) {
        let mut pending = self.lock();
        pending.retain(|_, (_, at)| at.elapsed() < FORGET_AFTER);
        pending.insert(instance.to_owned(), (operation, Instant::now()));
    }

    pub(crate) fn of(&self, instance: &str) -> Option<String> {
        self.lock().get(instance).map(|(op, _)| op.clone())
    }

    pub(crate) fn ended(&self, instance: &str) {
        self.lock().remove(instance);
    }
}
