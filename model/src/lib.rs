//! The deletion protocol of peer pods as a small explicit-state model, checked exhaustively by
//! [stateright] in this crate's tests (`make test` runs them).
//!
//! One VM and its owned parts (NIC, disk, public IP: one flag, as the backends treat them
//! together) are named by up to two PeerPods: the one cloud-api-adaptor (CAA) creates, and a copy a
//! restore may make of it while it is live. The actors and what each action stands for in the code:
//!
//! | actor | action | code |
//! |---|---|---|
//! | CAA | [`Action::CaaCreateVm`], [`Action::CaaCreatePeerPod`], [`Action::CaaDeletePod`] | cloud-api-adaptor (outside this repository) |
//! | user | [`Action::RestoreCopy`], [`Action::DeleteCopy`] | a backup restore / `kubectl delete` |
//! | garbage collector | [`Action::GcMarksPeerPod`] | kube-controller-manager: the Pod is the PeerPod's controlling owner |
//! | peerpod-ctrl replica | [`Action::AcquireLease`], [`Action::NoticeLeaseLost`] | `runtime`'s Lease manager |
//! | peerpod-ctrl replica | [`Action::Reconcile`] | `peerpod-ctrl/src/decide.rs` (one plan: delete, wait, release, hold) carried out by `reconcile.rs` |
//! | provider-service | [`Action::TaskStep`] | the detached, de-duplicated delete task behind `DeleteInstance` and the backend's steps (`providers/*`) |
//! | provider-service | [`Action::Restart`] | a rollout or crash: every detached task and remembered answer dies |
//! | cloud | [`Action::CloudFinishesVmDelete`], [`Action::CloudFinishesPartsDelete`] | slow deletes (an Azure VM takes minutes) |
//! | cloud | [`Action::CloudShowsVm`], [`Action::TimePassesWindow`] | eventual consistency: a new instance is `NotFound` for its first seconds |
//! | cloud | [`Action::LoseAnswer`] | a hang, a 5xx, throttling or a cut connection: the call's answer never reaches the task |
//! | peerpod-ctrl | [`Action::LeaseExpires`] | a replica that stops renewing (GC pause, partition) but still thinks it leads |
//!
//! Faults (restarts, lost answers, Lease expiries) each have a budget of one, after which the
//! cloud "recovers": that keeps the state space finite and acyclic except for waits, and makes
//! "eventually" mean "once the faults stop". A step that would change nothing (a re-ask answered
//! "in progress", a look at a VM still deleting) is not a transition, so a stuck protocol shows
//! up as a terminal state, which is where stateright checks `eventually` properties.
//!
//! A [`Flaw`] turns on one deliberate mistake, so the tests can show each property catches it.

use stateright::{Model, Property};

/// A deliberate mistake in the protocol, for showing that the checker catches it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Flaw {
    /// The protocol as built.
    None,
    /// The backend reads `NotFound` as gone at once, inside the cloud's consistency window (EC2's
    /// single-id `InvalidInstanceID.NotFound` read as `AlreadyGone`).
    NotFoundIsGone,
    /// The backend answers `Deleted` as soon as the cloud accepted the delete call, without a
    /// later lookup that shows the VM (and then its parts) gone.
    AcceptedIsGone,
    /// peerpod-ctrl decides "delete" without looking for a live PeerPod naming the same VM.
    IgnoreLiveNamesake,
    /// The delete runs inside the caller's request and dies with it; provider-service answers
    /// "in progress" for the instance ever after (the de-duplication entry outlives the task).
    TaskLeaksOnCancel,
}

/// A PeerPod object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PeerPod {
    Absent,
    /// Not being deleted; carries `peer.pod/finalizer`.
    Live,
    /// `deletionTimestamp` set, finalizer still present.
    Terminating,
    /// Finalizer released: the API server removed the object.
    Released,
}

/// A cloud resource (the VM, or its owned parts together).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Resource {
    Absent,
    Present,
    /// The cloud accepted the delete and has not finished it.
    Deleting,
    Gone,
}

/// Where provider-service's detached delete task for the VM is (one per instance: a second
/// `DeleteInstance` joins it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Task {
    None,
    /// Looking the VM up; deletes it when present, waits while it is deleting, and counts it
    /// gone only on a `NotFound` past the consistency window.
    ConfirmVmGone,
    /// The VM is confirmed gone: delete the parts it owns and look until they are gone.
    ConfirmPartsGone,
    /// The caller's request died and took the task with it, but its de-duplication entry stayed
    /// (only with [`Flaw::TaskLeaksOnCancel`]).
    Orphaned,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The Pod CAA runs the sandbox for; its PeerPods' controlling owner.
    pub pod_alive: bool,
    /// `[CAA's PeerPod, a restored copy]`, both naming the one VM.
    pub peerpods: [PeerPod; 2],
    pub vm: Resource,
    pub parts: Resource,
    /// The cloud lists the VM (eventual consistency: false for a while after create).
    pub vm_visible: bool,
    /// The backend's consistency window has passed since the VM was created (EC2: 300 s).
    pub window_passed: bool,
    pub task: Task,
    /// provider-service remembers that the task ended with the VM and its parts confirmed gone.
    pub confirmed_gone: bool,
    /// The Lease's holder, if any.
    pub lease: Option<usize>,
    /// Whether each replica believes it leads (it may after its Lease expired).
    pub leads: [bool; 2],
    /// Each replica's last `DeleteInstance` answer for each PeerPod was "deleted".
    pub answered_deleted: [[bool; 2]; 2],
    pub restarts_left: u8,
    pub lost_answers_left: u8,
    pub lease_expiries_left: u8,
    /// Ghost: a finalizer was released while the VM or an owned part existed and no live
    /// PeerPod named the VM.
    pub released_early: bool,
    /// Ghost: the cloud was asked to delete the VM or a part while a live PeerPod named it.
    pub deleted_while_named: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    CaaCreateVm,
    CaaCreatePeerPod,
    CaaDeletePod,
    RestoreCopy,
    DeleteCopy,
    GcMarksPeerPod,
    AcquireLease(usize),
    LeaseExpires,
    NoticeLeaseLost(usize),
    /// Replica `.0` reconciles PeerPod `.1`.
    Reconcile(usize, usize),
    TaskStep,
    /// The answer of the task's next cloud call is lost (hang, 5xx, throttling, cut connection).
    LoseAnswer,
    Restart,
    CloudShowsVm,
    TimePassesWindow,
    CloudFinishesVmDelete,
    CloudFinishesPartsDelete,
}

/// The model, with an optional flaw.
#[derive(Clone, Debug)]
pub struct DeletionProtocol {
    pub flaw: Flaw,
    /// Check only this property. stateright 0.30's BFS keeps exploring while any property
    /// lacks a discovery and then records later terminal states for an `eventually` property
    /// already discovered, so its reported path is only the first (a true counterexample) when
    /// the property checked is the only one.
    pub only: Option<&'static str>,
}

impl DeletionProtocol {
    pub fn new(flaw: Flaw) -> Self {
        DeletionProtocol { flaw, only: None }
    }
}

/// The properties' names, for [`stateright::Checker::discovery`].
pub const RELEASED_ONLY_WHEN_GONE: &str =
    "a finalizer released implies the VM and its parts are gone";
pub const NOTHING_DELETED_WHILE_NAMED: &str = "nothing is deleted while a live PeerPod names it";
pub const EVERY_PEERPOD_RELEASED: &str =
    "every terminating PeerPod is eventually released, the VM and its parts gone";
pub const CLEANUP_HAPPENS: &str = "a cleanup through provider-service can complete";

fn named_by_live(state: &State) -> bool {
    state.peerpods.contains(&PeerPod::Live)
}

fn all_gone(state: &State) -> bool {
    matches!(state.vm, Resource::Gone) && matches!(state.parts, Resource::Gone)
}

/// Starts (or joins) the detached delete task for the VM, as `DeleteInstance` does; returns
/// whether the answer is "deleted".
fn delete_instance(state: &mut State) -> bool {
    if state.confirmed_gone {
        return true;
    }
    if state.task == Task::None {
        state.task = Task::ConfirmVmGone;
    }
    false
}

impl Model for DeletionProtocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![State {
            pod_alive: true,
            peerpods: [PeerPod::Absent; 2],
            vm: Resource::Absent,
            parts: Resource::Absent,
            vm_visible: false,
            window_passed: false,
            task: Task::None,
            confirmed_gone: false,
            lease: None,
            leads: [false; 2],
            answered_deleted: [[false; 2]; 2],
            restarts_left: 1,
            lost_answers_left: 1,
            lease_expiries_left: 1,
            released_early: false,
            deleted_while_named: false,
        }]
    }

    fn actions(&self, _state: &State, actions: &mut Vec<Action>) {
        // Every action is offered; next_state refuses those not enabled (None), so each rule
        // sits in one place with its guard.
        actions.extend([
            Action::CaaCreateVm,
            Action::CaaCreatePeerPod,
            Action::CaaDeletePod,
            Action::RestoreCopy,
            Action::DeleteCopy,
            Action::GcMarksPeerPod,
            Action::AcquireLease(0),
            Action::AcquireLease(1),
            Action::LeaseExpires,
            Action::NoticeLeaseLost(0),
            Action::NoticeLeaseLost(1),
            Action::Reconcile(0, 0),
            Action::Reconcile(0, 1),
            Action::Reconcile(1, 0),
            Action::Reconcile(1, 1),
            Action::TaskStep,
            Action::LoseAnswer,
            Action::Restart,
            Action::CloudShowsVm,
            Action::TimePassesWindow,
            Action::CloudFinishesVmDelete,
            Action::CloudFinishesPartsDelete,
        ]);
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            // CAA creates the VM with its parts (one create call), then records it in a PeerPod.
            Action::CaaCreateVm if s.vm == Resource::Absent => {
                s.vm = Resource::Present;
                s.parts = Resource::Present;
            }
            Action::CaaCreatePeerPod
                if s.vm != Resource::Absent && s.peerpods[0] == PeerPod::Absent =>
            {
                s.peerpods[0] = PeerPod::Live;
            }
            // The sandbox ends: CAA deletes the Pod (its own VM delete may fail; the finalizer
            // is then peerpod-ctrl's to release).
            Action::CaaDeletePod if s.pod_alive && s.peerpods[0] == PeerPod::Live => {
                s.pod_alive = false;
            }
            // A restore makes a second PeerPod naming the same live VM.
            Action::RestoreCopy
                if s.peerpods[0] == PeerPod::Live && s.peerpods[1] == PeerPod::Absent =>
            {
                s.peerpods[1] = PeerPod::Live;
            }
            Action::DeleteCopy if s.peerpods[1] == PeerPod::Live => {
                s.peerpods[1] = PeerPod::Terminating;
            }
            // The garbage collector deletes the PeerPod whose owner is gone; the finalizer holds it.
            Action::GcMarksPeerPod if !s.pod_alive && s.peerpods[0] == PeerPod::Live => {
                s.peerpods[0] = PeerPod::Terminating;
            }
            Action::AcquireLease(r) if s.lease.is_none() && !s.leads[r] => {
                s.lease = Some(r);
                s.leads[r] = true;
            }
            Action::LeaseExpires if s.lease.is_some() && s.lease_expiries_left > 0 => {
                s.lease = None;
                s.lease_expiries_left -= 1;
            }
            Action::NoticeLeaseLost(r) if s.leads[r] && s.lease != Some(r) => {
                s.leads[r] = false;
            }
            // decide() then reconcile(): one plan per PeerPod from what the replica sees now.
            Action::Reconcile(r, p) if s.leads[r] && s.peerpods[p] == PeerPod::Terminating => {
                let other = s.peerpods[1 - p];
                if other == PeerPod::Live && self.flaw != Flaw::IgnoreLiveNamesake {
                    // Plan "release": a live PeerPod still names the VM; it is not deleted.
                    s.peerpods[p] = PeerPod::Released;
                } else if s.answered_deleted[r][p] {
                    // Plan "release": provider-service answered "deleted" (confirmed gone).
                    if !all_gone(&s) && !named_by_live(&s) {
                        s.released_early = true;
                    }
                    s.peerpods[p] = PeerPod::Released;
                } else {
                    // Plan "delete": DeleteInstance; "in progress" is plan "wait" (re-ask with
                    // backoff), "deleted" is remembered for the release.
                    s.answered_deleted[r][p] = delete_instance(&mut s);
                }
            }
            Action::TaskStep => self.task_step(&mut s)?,
            // The task's next cloud call hangs or fails and its answer is lost. The fixed
            // protocol looks again (the task keeps its step); a task tied to its caller dies
            // with the caller's deadline instead.
            Action::LoseAnswer
                if s.lost_answers_left > 0
                    && matches!(s.task, Task::ConfirmVmGone | Task::ConfirmPartsGone) =>
            {
                s.lost_answers_left -= 1;
                if self.flaw == Flaw::TaskLeaksOnCancel {
                    s.task = Task::Orphaned;
                }
            }
            // provider-service restarts: the task and what it remembered are gone.
            Action::Restart
                if s.restarts_left > 0 && (s.task != Task::None || s.confirmed_gone) =>
            {
                s.restarts_left -= 1;
                s.task = Task::None;
                s.confirmed_gone = false;
            }
            Action::CloudShowsVm if !s.vm_visible && s.vm != Resource::Absent => {
                s.vm_visible = true;
            }
            // Time passes beyond the consistency window: by then every lookup sees the VM.
            Action::TimePassesWindow if !s.window_passed && s.vm != Resource::Absent => {
                s.window_passed = true;
                s.vm_visible = true;
            }
            Action::CloudFinishesVmDelete if s.vm == Resource::Deleting => {
                s.vm = Resource::Gone;
            }
            Action::CloudFinishesPartsDelete if s.parts == Resource::Deleting => {
                s.parts = Resource::Gone;
            }
            _ => return None,
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let all = vec![
            Property::always(RELEASED_ONLY_WHEN_GONE, |_, s: &State| !s.released_early),
            Property::always(NOTHING_DELETED_WHILE_NAMED, |_, s: &State| {
                !s.deleted_while_named
            }),
            Property::eventually(EVERY_PEERPOD_RELEASED, |_, s: &State| {
                s.peerpods[0] == PeerPod::Released
                    && s.peerpods[1] != PeerPod::Live
                    && s.peerpods[1] != PeerPod::Terminating
                    && all_gone(s)
            }),
            Property::sometimes(CLEANUP_HAPPENS, |_, s: &State| s.confirmed_gone),
        ];
        all.into_iter()
            .filter(|p| self.only.is_none_or(|only| only == p.name))
            .collect()
    }
}

impl DeletionProtocol {
    /// One step of the detached task: one cloud call and what the backend makes of its answer.
    /// `None` when the step would change nothing (waiting for the cloud).
    fn task_step(&self, s: &mut State) -> Option<()> {
        match s.task {
            Task::None | Task::Orphaned => return None,
            Task::ConfirmVmGone => {
                // A lookup by id: NotFound while the cloud does not show the VM yet, or once
                // it is gone.
                let not_found = !s.vm_visible || s.vm == Resource::Gone;
                if not_found {
                    // AWS: NotFound counts as gone only once it persists past the window
                    // (providers/aws/src/visibility.rs); Azure/GCP/IBM/Alibaba: a 404 after the
                    // instance was seen deleting, or past the window.
                    if s.window_passed || self.flaw == Flaw::NotFoundIsGone {
                        s.task = Task::ConfirmPartsGone;
                    } else {
                        return None;
                    }
                } else if s.vm == Resource::Present {
                    // The delete call; the next step looks again (Azure: provisioningState
                    // Deleting, AWS: shutting-down).
                    if named_by_live(s) {
                        s.deleted_while_named = true;
                    }
                    s.vm = Resource::Deleting;
                    if self.flaw == Flaw::AcceptedIsGone {
                        s.task = Task::ConfirmPartsGone;
                    }
                } else {
                    // Still deleting: wait (plan "wait" for every caller meanwhile).
                    return None;
                }
            }
            Task::ConfirmPartsGone => match s.parts {
                // Only what the VM owns (deleteOption Delete, or CAA's names/tags).
                Resource::Present => {
                    if named_by_live(s) {
                        s.deleted_while_named = true;
                    }
                    s.parts = Resource::Deleting;
                    if self.flaw == Flaw::AcceptedIsGone {
                        s.task = Task::None;
                        s.confirmed_gone = true;
                    }
                }
                Resource::Deleting => return None,
                Resource::Gone | Resource::Absent => {
                    s.task = Task::None;
                    s.confirmed_gone = true;
                }
            },
        }
        Some(())
    }
}

/// The shortest counterexample the checker finds for `property` (actions from the initial state
/// and the state they end in), or `None` when the property holds.
pub fn counterexample(flaw: Flaw, property: &'static str) -> Option<(String, State)> {
    use stateright::Checker;
    let model = DeletionProtocol {
        flaw,
        only: Some(property),
    };
    let checker = model.checker().spawn_bfs().join();
    checker
        .discovery(property)
        .map(|path| (path.to_string(), path.last_state().clone()))
}
