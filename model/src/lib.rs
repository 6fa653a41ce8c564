//! The deletion protocol of peer pods as an explicit-state model that runs the code that runs:
//! provider-service's delete tasks step the real deletion engine
//! ([`peerpods_protocol::engine::Deletion`]) against an adversarial model cloud, and peerpod-ctrl's
//! reconciles take the real decision kernel's plan ([`peerpods_protocol::decide::plan`]) over
//! PeerPod facts built from the model's state. The tests check every reachable state
//! ([`check::explore`]); `make test` runs them, and `make mutants` mutates the engine and the
//! kernel and expects these tests to fail.
//!
//! One VM (an Azure id, so that two spellings of it name one instance) with four parts: an
//! interface the cloud deletes with the VM ([`Tie::GoesWithVm`]; refused while the VM holds it), an
//! address created for the VM ([`Tie::CreatedForVm`]), an operator's address attached to it
//! ([`Tie::NotTheVms`]) and a disk of the VM marked do-not-delete. Up to two PeerPods name the VM:
//! the one cloud-api-adaptor (CAA) creates, and a restored copy.
//!
//! | actor | actions | code |
//! |---|---|---|
//! | CAA | [`Action::CaaCreateVm`], [`Action::CaaCreatePeerPod`], [`Action::PodEnds`], [`Action::CaaDeleteInstance`], [`Action::CaaReleases`] | cloud-api-adaptor: it calls provider-service's DeleteInstance when the sandbox ends, and releases its PeerPod on a gone answer |
//! | user | [`Action::RestoreCopy`], [`Action::DeleteCopy`] | a backup restore, `kubectl delete` |
//! | garbage collector | [`Action::GcMarksPeerPod`] | the Pod is the PeerPod's controlling owner |
//! | peerpod-ctrl replica | [`Action::AcquireLease`], [`Action::NoticeLeaseLost`], [`Action::CacheSync`] | the Lease manager; the watch behind the replica's cache |
//! | peerpod-ctrl replica | [`Action::Reconcile`] | `decide::plan` over the cached facts, then DeleteInstance, or the release |
//! | provider-service replica | [`Action::TaskStep`] | one step of the detached delete: the engine's command, the cloud's answer, the engine's next step |
//! | cloud | [`Action::CloudShowsVm`], [`Action::TimePasses`], [`Action::CloudFinishesVmDelete`], [`Action::CloudFinishesPartDelete`] | eventual consistency, slow deletes |
//! | faults | [`Action::TaskStep`] with an adversarial answer, [`Action::Restart`], [`Action::LeaseExpires`] | lost answers, stale reads, refusals; a rollout; a replica that stops renewing |
//!
//! The model cloud answers every command as the engine's observation, adversarially: while the
//! VM is new (before the window has passed since its creation) a lookup may or may not find it
//! (found, then not found) and a delete may answer 404; beyond that, within a fault budget
//! ([`State::faults_left`]), any answer may be lost (with or without its effect), a delete
//! refused for the state it is in or answered 404 after a lookup found it, a listing may lack a
//! part, and a lookup may show a deleting thing present (or a gone VM deleting). Time is logical
//! ([`Tick`]).
//!
//! What the model assumes of the world is written down in [`Assumptions`]; each assumption has a
//! test showing the counterexample without it.
//!
//! [`Tie::GoesWithVm`]: peerpods_protocol::engine::Tie::GoesWithVm
//! [`Tie::CreatedForVm`]: peerpods_protocol::engine::Tie::CreatedForVm
//! [`Tie::NotTheVms`]: peerpods_protocol::engine::Tie::NotTheVms

pub mod check;

mod assumptions; // what the model takes for granted, and which faults and actors it lets in
mod cloud; // the adversarial model cloud and its answers
mod properties; // the properties checked, and the fairness liveness is checked under
mod protocol; // the actors' transitions over the real engine and kernel
mod state; // logical time, the state, the actions

pub use assumptions::{Assumptions, DeletionProtocol};
pub use cloud::{Answer, INSTANCE_ID, INSTANCE_ID_COPY, answers};
pub use properties::{
    CLEANUP_HAPPENS, EVERY_PEERPOD_RELEASED, NOTHING_DELETED_WHILE_NAMED,
    NOTHING_FORBIDDEN_DELETED, RELEASED_ONLY_WHEN_GONE, fair_group, is_fault, nothing_terminating,
};
pub use state::{Action, Caller, PeerPod, Replica, Res, State, Task, Tick, WINDOW};
