//! The exhaustive check of the deletion protocol (every reachable state), and the same check
//! catching each deliberate flaw with a counterexample.

use deletion_model::{
    CLEANUP_HAPPENS, DeletionProtocol, EVERY_PEERPOD_RELEASED, Flaw, NOTHING_DELETED_WHILE_NAMED,
    PeerPod, RELEASED_ONLY_WHEN_GONE, Resource, State, Task, counterexample,
};
use stateright::{Checker, Model};

#[test]
fn the_protocol_as_built_keeps_every_property_in_every_reachable_state() {
    let checker = DeletionProtocol::new(Flaw::None)
        .checker()
        .spawn_bfs()
        .join();
    assert!(checker.is_done(), "the state space is finite");
    for property in [
        RELEASED_ONLY_WHEN_GONE,
        NOTHING_DELETED_WHILE_NAMED,
        EVERY_PEERPOD_RELEASED,
    ] {
        if let Some(path) = checker.discovery(property) {
            panic!("{property}: counterexample\n{path}");
        }
    }
    // Not vacuous: a cleanup through provider-service is reachable at all.
    assert!(checker.discovery(CLEANUP_HAPPENS).is_some());
    eprintln!(
        "checked {} distinct states ({} visits)",
        checker.unique_state_count(),
        checker.state_count()
    );
}

/// The flawed model breaks `property`; returns the state the counterexample ends in.
fn assert_caught(flaw: Flaw, property: &'static str) -> State {
    let (path, last) = counterexample(flaw, property)
        .unwrap_or_else(|| panic!("{flaw:?} is not caught by {property:?}"));
    eprintln!("{flaw:?} breaks {property:?}:\n{path}");
    last
}

#[test]
fn a_notfound_inside_the_consistency_window_read_as_gone_releases_early() {
    let last = assert_caught(Flaw::NotFoundIsGone, RELEASED_ONLY_WHEN_GONE);
    assert_eq!(last.vm, Resource::Present, "released while the VM runs");
}

#[test]
fn a_release_after_the_delete_call_without_a_later_lookup_releases_early() {
    let last = assert_caught(Flaw::AcceptedIsGone, RELEASED_ONLY_WHEN_GONE);
    assert_eq!(
        last.vm,
        Resource::Deleting,
        "released while the cloud still deletes"
    );
}

#[test]
fn deciding_without_the_live_namesake_deletes_a_vm_still_in_use() {
    assert_caught(Flaw::IgnoreLiveNamesake, NOTHING_DELETED_WHILE_NAMED);
}

#[test]
fn a_delete_that_dies_with_its_caller_leaves_a_peerpod_terminating_forever() {
    let last = assert_caught(Flaw::TaskLeaksOnCancel, EVERY_PEERPOD_RELEASED);
    assert_eq!(last.task, Task::Orphaned);
    assert!(last.peerpods.contains(&PeerPod::Terminating), "{last:?}");
}
