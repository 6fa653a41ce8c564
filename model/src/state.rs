//! The model's state: logical time, what the cloud, Kubernetes, peerpod-ctrl and
//! provider-service hold, the ghosts the properties read, and the actions that change it.

use std::time::Duration;

use peerpods_protocol::engine::{Command, Deletion};
use peerpods_protocol::window::{FORGET_AFTER, Memo, Moment, Window};

/// Logical time: ticks of one consistency window each, up to the horizon.
///
/// [`Tick::HORIZON`] stands for "as late as needed": a finite state space cannot hold unbounded
/// time, so every two moments at the horizon are taken to be far apart (further than the window
/// and the memos' lifetime). That is sound here because every VM is created at tick 0 and the
/// cloud shows it everywhere once the window has passed: at the horizon a NotFound is the truth.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(pub u8);

impl Tick {
    pub const ZERO: Tick = Tick(0);
    pub const HORIZON: Tick = Tick(2);
}

/// The consistency window of the model's cloud: one tick.
pub const WINDOW: Window = Window(Duration::from_secs(60));

/// How far apart two moments at the horizon are.
const FAR: Duration = Duration::from_secs(60 + FORGET_AFTER.as_secs());

impl Moment for Tick {
    fn since(self, earlier: Self) -> Duration {
        if self == Tick::HORIZON {
            return FAR;
        }
        WINDOW.0 * u32::from(self.0.saturating_sub(earlier.0))
    }
}

/// How the model cloud keeps a thing (the VM or a part).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Res {
    Absent,
    Present,
    /// A delete was accepted and the cloud has not finished it.
    Deleting,
    Gone,
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

/// One provider-service replica's detached delete of the VM (one per replica: a second
/// DeleteInstance joins it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Task {
    pub deletion: Deletion<Tick>,
    /// The engine's last command, to be answered.
    pub next: Command,
    /// The callers waiting for its end, one bit each (`Caller::bit`).
    pub waiters: u8,
}

/// One provider-service replica: its delete task, and its memo of the VM (the window's
/// [`Book`](peerpods_protocol::window::Book), for the model's one instance).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    pub task: Option<Task>,
    pub memo: Memo<Tick>,
}

/// Who called DeleteInstance.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Caller {
    /// peerpod-ctrl replica `.0` for PeerPod `.1`.
    Ctrl(usize, usize),
    Caa,
}

impl Caller {
    pub(crate) fn bit(self) -> u8 {
        match self {
            Caller::Ctrl(r, p) => 1 << (r * 2 + p),
            Caller::Caa => 1 << 4,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: Tick,
    // The cloud.
    pub vm: Res,
    /// Every read shows the VM (eventual consistency: not before the cloud caught up, at the
    /// latest once the window has passed since its creation).
    pub vm_visible: bool,
    /// The VM's own parts: [interface, address].
    pub parts: [Res; 2],
    // provider-service.
    pub replicas: [Replica; 2],
    // Kubernetes and peerpod-ctrl.
    pub pod_alive: bool,
    /// `[CAA's PeerPod, a restored copy]`, both naming the VM.
    pub peerpods: [PeerPod; 2],
    pub lease: Option<usize>,
    /// Whether each replica believes it leads (it may after its Lease expired).
    pub leads: [bool; 2],
    /// What each replica's cache shows of the PeerPods (the state at its last sync).
    pub cache: [[PeerPod; 2]; 2],
    /// The provider-service replica each (replica, PeerPod) call waits on.
    pub waiting: [[Option<usize>; 2]; 2],
    /// The call's answer was gone (Deleted or AlreadyGone).
    pub heard_gone: [[bool; 2]; 2],
    pub caa_waiting: Option<usize>,
    pub caa_heard_gone: bool,
    pub caa_calls_left: u8,
    // Budgets.
    pub faults_left: u8,
    pub restarts_left: u8,
    pub lease_expiries_left: u8,
    // Ghosts.
    /// A finalizer was released while the VM or an owned part existed and no other PeerPod
    /// holding its finalizer named the VM (nothing would delete it any more).
    pub released_early: bool,
    /// The cloud accepted a delete of the VM or an owned part while a live PeerPod named it and
    /// its Pod ran.
    pub deleted_while_named: bool,
    /// A delete of a part that is not the VM's own, or is marked do-not-delete, was requested.
    pub forbidden_deleted: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    CaaCreateVm,
    CaaCreatePeerPod,
    PodEnds,
    /// CAA's DeleteInstance on provider-service replica `.0`.
    CaaDeleteInstance(usize),
    CaaReleases,
    RestoreCopy,
    DeleteCopy,
    GcMarksPeerPod,
    AcquireLease(usize),
    LeaseExpires,
    NoticeLeaseLost(usize),
    /// Replica `.0`'s cache catches up with the API server (an informer's cache is the state
    /// of some earlier moment, for every PeerPod at once).
    CacheSync(usize),
    /// peerpod-ctrl replica `.0` reconciles PeerPod `.1`, calling provider-service replica `.2`.
    Reconcile(usize, usize, usize),
    /// provider-service replica `.0`'s task: the cloud answers its command with answer `.1` of
    /// [`answers`] (`.2`: an adversarial one), and the engine steps. A wait ends first: the
    /// task sleeps in [`Command::Wait`] while the world goes on, and asks again when it wakes.
    ///
    /// [`answers`]: crate::answers
    TaskStep(usize, usize, bool),
    Restart(usize),
    CloudShowsVm,
    TimePasses,
    CloudFinishesVmDelete,
    CloudFinishesPartDelete(usize),
}
