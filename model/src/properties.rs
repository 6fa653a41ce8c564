//! What the check proves: the properties' names, the ghosts' predicates, and the fairness the
//! liveness property is checked under.

use crate::state::{Action, PeerPod, Res, State};

/// The properties' names.
pub const RELEASED_ONLY_WHEN_GONE: &str = "a released finalizer implies the VM and its owned parts are gone (or another PeerPod holding its finalizer names it)";
pub const NOTHING_DELETED_WHILE_NAMED: &str = "nothing is deleted while a live PeerPod names it";
pub const NOTHING_FORBIDDEN_DELETED: &str =
    "nothing not owned and nothing marked do-not-delete is ever deleted";
pub const EVERY_PEERPOD_RELEASED: &str =
    "every terminating PeerPod is released once the faults stop";
pub const CLEANUP_HAPPENS: &str = "a PeerPod is released with its VM deleted";

/// The VM is in use: its Pod runs and a live PeerPod names it. (Once the Pod ended, CAA tears
/// the VM down whatever PeerPod still names it.)
pub(crate) fn named_in_use(s: &State) -> bool {
    s.pod_alive && s.peerpods.contains(&PeerPod::Live)
}

pub(crate) fn all_gone(s: &State) -> bool {
    matches!(s.vm, Res::Gone | Res::Absent) && s.parts.iter().all(|p| *p == Res::Gone)
}

/// Whether `action` is a fault (it stops once the faults stop).
pub fn is_fault(action: Action) -> bool {
    matches!(
        action,
        Action::Restart(_) | Action::LeaseExpires | Action::TaskStep(_, _, true)
    )
}

/// The weakly fair group an action belongs to (an actor that keeps being able to act does), or
/// `None` for what the world may never do (create, restore, delete a copy, CAA's call).
pub fn fair_group(action: Action) -> Option<u32> {
    Some(match action {
        Action::TaskStep(ps, _, _) => ps as u32,
        Action::Reconcile(r, p, _) => 2 + (r * 2 + p) as u32,
        Action::CacheSync(r) => 6 + r as u32,
        Action::AcquireLease(r) => 10 + r as u32,
        Action::NoticeLeaseLost(r) => 12 + r as u32,
        Action::GcMarksPeerPod => 14,
        Action::CloudShowsVm => 15,
        Action::TimePasses => 16,
        Action::CloudFinishesVmDelete => 17,
        Action::CloudFinishesPartDelete(i) => 18 + i as u32,
        Action::CaaReleases => 20,
        _ => return None,
    })
}

/// The liveness goal: no PeerPod waits for its finalizer.
pub fn nothing_terminating(s: &State) -> bool {
    !s.peerpods.contains(&PeerPod::Terminating)
}
