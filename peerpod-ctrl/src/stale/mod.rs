//! Stale PeerPods: a live PeerPod whose Pod has a newer one belongs to a sandbox that is gone. It is deleted
//! (UID precondition) and comes back through the cleanup, which deletes its VM.
//!
//! - [`rules`]: which PeerPods are stale (pure).
//! - `acts`: deletes them, with an Event and a metric.

mod acts;
pub mod rules;

pub(crate) use acts::reap_stale;
