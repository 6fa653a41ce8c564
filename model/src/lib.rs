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

pub mod check;

use std::time::Duration;

use peerpods_protocol::decide::{self, PeerPodFacts, Plan, Progress};
use peerpods_protocol::engine::{
    Command, DeleteAnswer, Deletion, Observation, Part, PartId, PartKind, Sighting, Tie, Verdict,
};
use peerpods_protocol::window::{Book, FORGET_AFTER, Memo, Moment, Window};
use peerpods_protocol::{DO_NOT_DELETE, Guard, InstanceKey, ProviderName, Tags};
use stateright::{Model, Property};

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
/// [`Book`], for the model's one instance).
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
    fn bit(self) -> u8 {
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
    TaskStep(usize, usize, bool),
    Restart(usize),
    CloudShowsVm,
    TimePasses,
    CloudFinishesVmDelete,
    CloudFinishesPartDelete(usize),
}

/// What the model takes for granted about the world. Each is needed: its test shows the
/// counterexample without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Assumptions {
    /// A lookup lags (answers NotFound for a VM that exists, deleting or not) only while the VM
    /// is younger than the consistency window: the window's own premise. Without it no window
    /// is long enough, and a NotFound of an old VM still deleting would be believed.
    pub lag_only_while_young: bool,
    /// Once the VM is gone, a listing shows every part left: a lagging listing only happens
    /// while the VM exists (after it, nothing would name the part again).
    pub lists_catch_up_by_gone: bool,
    /// An age the cloud tells (from its creation time) is never older than the VM is: the
    /// driver takes a clock-skew allowance off every age for this. Without it a new VM told old
    /// has its lagging NotFound believed.
    pub told_ages_are_true: bool,
}

impl Assumptions {
    pub const ALL: Assumptions = Assumptions {
        lag_only_while_young: true,
        lists_catch_up_by_gone: true,
        told_ages_are_true: true,
    };
}

/// The model.
#[derive(Clone, Debug)]
pub struct DeletionProtocol {
    pub assume: Assumptions,
    /// Adversarial cloud answers (lost answers included) along one run.
    pub faults: u8,
    pub restarts: u8,
    pub lease_expiries: u8,
    /// A user may restore a copy of CAA's PeerPod (and delete it).
    pub restore: bool,
    /// CAA calls DeleteInstance itself when the Pod ends (on the other provider-service
    /// replica), racing peerpod-ctrl's.
    pub caa_deletes: bool,
    /// A lookup that shows the VM tells its age, as clouds that report a creation time do;
    /// otherwise the engine knows the age only from its first sighting (libvirt).
    pub cloud_tells_age: bool,
}

impl Default for DeletionProtocol {
    fn default() -> Self {
        DeletionProtocol {
            assume: Assumptions::ALL,
            faults: 1,
            restarts: 1,
            lease_expiries: 1,
            restore: true,
            caa_deletes: true,
            cloud_tells_age: false,
        }
    }
}

/// The properties' names.
pub const RELEASED_ONLY_WHEN_GONE: &str = "a released finalizer implies the VM and its owned parts are gone (or another PeerPod holding its finalizer names it)";
pub const NOTHING_DELETED_WHILE_NAMED: &str = "nothing is deleted while a live PeerPod names it";
pub const NOTHING_FORBIDDEN_DELETED: &str =
    "nothing not owned and nothing marked do-not-delete is ever deleted";
pub const EVERY_PEERPOD_RELEASED: &str =
    "every terminating PeerPod is released once the faults stop";
pub const CLEANUP_HAPPENS: &str = "a PeerPod is released with its VM deleted";

/// The model's instance, as CAA's PeerPod names it.
pub const INSTANCE_ID: &str =
    "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/pod-vm";
/// The same instance as the restored copy spells it.
pub const INSTANCE_ID_COPY: &str =
    "/SUBSCRIPTIONS/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/POD-VM ";
/// The provider-service replica peerpod-ctrl's calls reach, and the one CAA's reach: two
/// replicas, each with its own task and memo, deleting the one VM side by side.
const CTRL_CALLS: usize = 1;
const CAA_CALLS: usize = 0;
const PROVIDER: ProviderName = ProviderName::Azure;
const CLUSTER_TAG: (&str, &str) = ("peerpods.io/cluster", "c1");

fn key() -> InstanceKey {
    InstanceKey::new(PROVIDER, INSTANCE_ID)
}

fn guard() -> Guard {
    Guard::new(Some((CLUSTER_TAG.0.into(), CLUSTER_TAG.1.into())))
}

fn ours() -> Tags {
    Tags::from([(CLUSTER_TAG.0.into(), CLUSTER_TAG.1.into())])
}

/// The VM's parts, as a listing shows them: the two owned ones first.
fn part(i: usize) -> Part {
    let (kind, id, tie) = [
        (PartKind::NetworkInterface, "nic", Tie::GoesWithVm),
        (PartKind::PublicAddress, "ip", Tie::CreatedForVm),
        (PartKind::PublicAddress, "operator-ip", Tie::NotTheVms),
        (PartKind::Disk, "kept-disk", Tie::GoesWithVm),
    ][i];
    let mut tags = ours();
    if i == 3 {
        tags.insert(DO_NOT_DELETE.into(), "true".into());
    }
    Part {
        id: PartId::new(kind, id),
        tags,
        tie,
    }
}

fn part_index(id: &PartId) -> Option<usize> {
    (0..4).find(|&i| part(i).id == *id)
}

/// What the cloud does besides answering.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Effect {
    None,
    VmDeleting,
    PartDeleting(usize),
    Forbidden,
}

/// One way the cloud may answer a command: the observation (`None`: the answer is lost and the
/// call fails), what it does, and whether it spends the fault budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    obs: Option<Observation>,
    effect: Effect,
    fault: bool,
}

fn ok(obs: Observation, effect: Effect) -> Answer {
    Answer {
        obs: Some(obs),
        effect,
        fault: false,
    }
}

fn fault(obs: Option<Observation>, effect: Effect) -> Answer {
    Answer {
        obs,
        effect,
        fault: true,
    }
}

/// Every answer the model cloud may give to `command` in state `s`, the faithful ones first.
pub fn answers(model: &DeletionProtocol, s: &State, command: &Command) -> Vec<Answer> {
    use Observation as O;
    let assume = &model.assume;
    let new = s.now < Tick(1) && !s.vm_visible;
    let mut all = match command {
        Command::Wait(_) | Command::Finish(_) => return Vec::new(),
        Command::LookUp => {
            // The VM is made at tick 0: its age is the time since. A cloud that may tell an age
            // that is not true tells a new VM a window old.
            let age = model.cloud_tells_age.then(|| {
                if s.now == Tick::ZERO && !assume.told_ages_are_true {
                    WINDOW.0
                } else {
                    s.now.since(Tick::ZERO)
                }
            });
            let seen = |sighting| {
                let age = match sighting {
                    Sighting::NotFound | Sighting::Gone => None,
                    _ => age,
                };
                O::Instance(sighting, age)
            };
            match s.vm {
                Res::Absent => vec![ok(seen(Sighting::NotFound), Effect::None)],
                Res::Present if new => vec![
                    ok(seen(Sighting::NotFound), Effect::None),
                    ok(seen(Sighting::Present(ours())), Effect::None),
                ],
                Res::Present => vec![ok(seen(Sighting::Present(ours())), Effect::None)],
                Res::Deleting => {
                    let mut a = vec![
                        ok(seen(Sighting::Deleting(ours())), Effect::None),
                        fault(Some(seen(Sighting::Present(ours()))), Effect::None),
                    ];
                    if s.now < Tick(1) || !assume.lag_only_while_young {
                        a.push(ok(seen(Sighting::NotFound), Effect::None));
                    }
                    a
                }
                Res::Gone => vec![
                    ok(seen(Sighting::Gone), Effect::None),
                    ok(seen(Sighting::NotFound), Effect::None),
                    fault(Some(seen(Sighting::Deleting(ours()))), Effect::None),
                ],
            }
        }
        Command::RequestDelete => {
            let answered = |a| Some(O::DeleteAnswered(a));
            match s.vm {
                Res::Present => {
                    let mut a = vec![ok(
                        O::DeleteAnswered(DeleteAnswer::Accepted),
                        Effect::VmDeleting,
                    )];
                    if new {
                        a.push(ok(O::DeleteAnswered(DeleteAnswer::NotFound), Effect::None));
                    } else {
                        a.push(fault(answered(DeleteAnswer::NotFound), Effect::None));
                    }
                    a.push(fault(answered(DeleteAnswer::WrongState), Effect::None));
                    a.push(fault(None, Effect::VmDeleting));
                    a
                }
                Res::Deleting => vec![
                    ok(O::DeleteAnswered(DeleteAnswer::Accepted), Effect::None),
                    fault(answered(DeleteAnswer::WrongState), Effect::None),
                ],
                Res::Absent | Res::Gone => {
                    vec![ok(O::DeleteAnswered(DeleteAnswer::NotFound), Effect::None)]
                }
            }
        }
        Command::ListParts => {
            let listed: Vec<usize> = match s.vm {
                Res::Absent => Vec::new(),
                _ => (0..4)
                    .filter(|&i| i >= 2 || !matches!(s.parts[i], Res::Gone | Res::Absent))
                    .collect(),
            };
            let list = |skip: Option<usize>| {
                O::Parts(
                    listed
                        .iter()
                        .filter(|&&i| Some(i) != skip)
                        .map(|&i| part(i))
                        .collect(),
                )
            };
            let mut a = vec![ok(list(None), Effect::None)];
            if s.vm != Res::Gone || !assume.lists_catch_up_by_gone {
                for &i in listed.iter().filter(|&&i| i < 2) {
                    a.push(fault(Some(list(Some(i))), Effect::None));
                }
            }
            a
        }
        Command::DeletePart(id) => {
            let answered = |a| Some(O::PartDeleteAnswered(a));
            match part_index(id) {
                None => Vec::new(),
                Some(i) if i >= 2 => vec![ok(
                    O::PartDeleteAnswered(DeleteAnswer::Accepted),
                    Effect::Forbidden,
                )],
                Some(i) => match s.parts[i] {
                    // The interface is refused while the VM holds it.
                    Res::Present if i == 0 && s.vm != Res::Gone => vec![ok(
                        O::PartDeleteAnswered(DeleteAnswer::WrongState),
                        Effect::None,
                    )],
                    Res::Present => vec![
                        ok(
                            O::PartDeleteAnswered(DeleteAnswer::Accepted),
                            Effect::PartDeleting(i),
                        ),
                        fault(answered(DeleteAnswer::NotFound), Effect::None),
                        fault(answered(DeleteAnswer::WrongState), Effect::None),
                        fault(None, Effect::PartDeleting(i)),
                    ],
                    Res::Deleting => vec![
                        ok(O::PartDeleteAnswered(DeleteAnswer::Accepted), Effect::None),
                        fault(answered(DeleteAnswer::WrongState), Effect::None),
                    ],
                    Res::Absent | Res::Gone => vec![ok(
                        O::PartDeleteAnswered(DeleteAnswer::NotFound),
                        Effect::None,
                    )],
                },
            }
        }
        Command::LookUpPart(id) => match part_index(id) {
            None => Vec::new(),
            Some(i) if i >= 2 => vec![ok(O::Part(Sighting::Present(part(i).tags)), Effect::None)],
            Some(i) => match s.parts[i] {
                Res::Present => vec![ok(O::Part(Sighting::Present(ours())), Effect::None)],
                Res::Deleting => vec![
                    ok(O::Part(Sighting::Deleting(ours())), Effect::None),
                    fault(Some(O::Part(Sighting::Present(ours()))), Effect::None),
                ],
                Res::Absent | Res::Gone => vec![
                    ok(O::Part(Sighting::NotFound), Effect::None),
                    ok(O::Part(Sighting::Gone), Effect::None),
                ],
            },
        },
    };
    // Any call may fail without an answer (a hang, a 5xx, a cut connection).
    all.push(fault(None, Effect::None));
    all.retain(|a| !a.fault || s.faults_left > 0);
    all
}

/// The VM is in use: its Pod runs and a live PeerPod names it. (Once the Pod ended, CAA tears
/// the VM down whatever PeerPod still names it.)
fn named_in_use(s: &State) -> bool {
    s.pod_alive && s.peerpods.contains(&PeerPod::Live)
}

fn all_gone(s: &State) -> bool {
    matches!(s.vm, Res::Gone | Res::Absent) && s.parts.iter().all(|p| *p == Res::Gone)
}

/// The facts peerpod-ctrl's kernel reads of PeerPod `p` as cache `view` shows it.
fn facts(p: usize, view: PeerPod) -> PeerPodFacts {
    PeerPodFacts {
        uid: Some(format!("uid-{p}")),
        name: format!("default/peerpod-{p}"),
        deleting: matches!(view, PeerPod::Terminating | PeerPod::Released),
        finalizer: view != PeerPod::Released,
        do_not_delete: false,
        cloud_provider: "azure".into(),
        instance_id: if p == 0 {
            INSTANCE_ID
        } else {
            INSTANCE_ID_COPY
        }
        .into(),
    }
}

/// The memo a replica recalls for the VM at `now` (its window book, with the model's one key).
fn recall(memo: Memo<Tick>, now: Tick) -> Memo<Tick> {
    let mut book = Book::new(WINDOW);
    book.keep(&key(), memo);
    book.recall(&key(), now)
}

impl DeletionProtocol {
    fn release(s: &mut State, p: usize) {
        if s.peerpods[p] != PeerPod::Terminating && !(p == 0 && s.peerpods[p] == PeerPod::Live) {
            return;
        }
        // Another PeerPod that still holds its finalizer keeps the VM in someone's charge.
        let other_holds = matches!(s.peerpods[1 - p], PeerPod::Live | PeerPod::Terminating);
        if !all_gone(s) && !other_holds {
            s.released_early = true;
        }
        s.peerpods[p] = PeerPod::Released;
    }

    /// DeleteInstance on provider-service replica `ps`: joins its task, or starts one.
    fn call(s: &mut State, ps: usize, caller: Caller) {
        let now = s.now;
        let replica = &mut s.replicas[ps];
        if let Some(task) = &mut replica.task {
            task.waiters |= caller.bit();
            return;
        }
        let mut deletion = Deletion::new(guard(), WINDOW, recall(replica.memo, now));
        let next = deletion.step(Observation::Start, now);
        replica.memo = deletion.memo();
        replica.task = Some(Task {
            deletion,
            next,
            waiters: caller.bit(),
        });
    }

    /// The task of replica `ps` ended (`gone`: with a Deleted or AlreadyGone verdict): its
    /// callers hear it.
    fn end_task(s: &mut State, ps: usize, gone: bool) {
        let waiters = s.replicas[ps].task.take().map_or(0, |t| t.waiters);
        for r in 0..2 {
            for p in 0..2 {
                if waiters & Caller::Ctrl(r, p).bit() != 0 && s.waiting[r][p] == Some(ps) {
                    s.waiting[r][p] = None;
                    s.heard_gone[r][p] |= gone;
                }
            }
        }
        if waiters & Caller::Caa.bit() != 0 && s.caa_waiting == Some(ps) {
            s.caa_waiting = None;
            s.caa_heard_gone |= gone;
        }
    }

    fn task_step(&self, s: &mut State, ps: usize, choice: usize) -> Option<()> {
        let now = s.now;
        let task = s.replicas[ps].task.as_mut()?;
        if let Command::Wait(_) = task.next {
            task.next = task.deletion.step(Observation::Waited, now);
        }
        let task = s.replicas[ps].task.as_ref()?;
        let answer = answers(self, s, &task.next).into_iter().nth(choice)?;
        if answer.fault {
            s.faults_left -= 1;
        }
        match answer.effect {
            Effect::None => {}
            Effect::VmDeleting => {
                if s.vm == Res::Present {
                    if named_in_use(s) {
                        s.deleted_while_named = true;
                    }
                    s.vm = Res::Deleting;
                }
            }
            Effect::PartDeleting(i) => {
                if s.parts[i] == Res::Present {
                    if named_in_use(s) {
                        s.deleted_while_named = true;
                    }
                    s.parts[i] = Res::Deleting;
                }
            }
            Effect::Forbidden => s.forbidden_deleted = true,
        }
        let Some(observation) = answer.obs else {
            // The call failed: the delete ends with an error, what it learnt stays in the memo.
            Self::end_task(s, ps, false);
            return Some(());
        };
        let replica = &mut s.replicas[ps];
        let task = replica.task.as_mut()?;
        let command = task.deletion.step(observation, now);
        replica.memo = task.deletion.memo();
        match command {
            Command::Finish(verdict) => {
                let gone = matches!(verdict, Verdict::Deleted | Verdict::AlreadyGone);
                Self::end_task(s, ps, gone);
            }
            command => task.next = command,
        }
        Some(())
    }

    fn reconcile(&self, s: &mut State, r: usize, p: usize, ps: usize) -> Option<()> {
        if !s.leads[r] {
            return None;
        }
        let me = facts(p, s.cache[r][p]);
        let other = facts(1 - p, s.cache[r][1 - p]);
        let namesake = (s.cache[r][1 - p] != PeerPod::Absent
            && decide::is_live_namesake(&me, &other))
        .then_some(&other);
        let progress = s.waiting[r][p].map(|_| Progress {
            provider: other.cloud_provider.clone(),
            instance_id: other.instance_id.clone(),
            ask_again_at: s.now,
        });
        match decide::plan(&me, namesake, progress.as_ref(), s.now) {
            Plan::Release { .. } => Self::release(s, p),
            Plan::Delete { .. } if s.heard_gone[r][p] => {
                s.heard_gone[r][p] = false;
                Self::release(s, p);
            }
            Plan::Delete { .. } if s.waiting[r][p].is_none() => {
                s.waiting[r][p] = Some(ps);
                Self::call(s, ps, Caller::Ctrl(r, p));
            }
            _ => return None,
        }
        Some(())
    }
}

impl Model for DeletionProtocol {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let replica = Replica {
            task: None,
            memo: Memo::default(),
        };
        vec![State {
            now: Tick::ZERO,
            vm: Res::Absent,
            vm_visible: false,
            parts: [Res::Absent; 2],
            replicas: [replica.clone(), replica],
            pod_alive: true,
            peerpods: [PeerPod::Absent; 2],
            lease: Some(0),
            leads: [true, false],
            cache: [[PeerPod::Absent; 2]; 2],
            waiting: [[None; 2]; 2],
            heard_gone: [[false; 2]; 2],
            caa_waiting: None,
            caa_heard_gone: false,
            caa_calls_left: u8::from(self.caa_deletes),
            faults_left: self.faults,
            restarts_left: self.restarts,
            lease_expiries_left: self.lease_expiries,
            released_early: false,
            deleted_while_named: false,
            forbidden_deleted: false,
        }]
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        // Every action is offered; next_state refuses those not enabled (None), so each rule sits
        // in one place with its guard.
        actions.extend([
            Action::CaaCreateVm,
            Action::CaaCreatePeerPod,
            Action::PodEnds,
            Action::CaaDeleteInstance(CAA_CALLS),
            Action::CaaReleases,
            Action::RestoreCopy,
            Action::DeleteCopy,
            Action::GcMarksPeerPod,
            Action::AcquireLease(0),
            Action::AcquireLease(1),
            Action::LeaseExpires,
            Action::NoticeLeaseLost(0),
            Action::NoticeLeaseLost(1),
            Action::Restart(0),
            Action::Restart(1),
            Action::CloudShowsVm,
            Action::TimePasses,
            Action::CloudFinishesVmDelete,
            Action::CloudFinishesPartDelete(0),
            Action::CloudFinishesPartDelete(1),
        ]);
        for r in 0..2 {
            actions.push(Action::CacheSync(r));
            for p in 0..2 {
                actions.push(Action::Reconcile(r, p, CTRL_CALLS));
            }
        }
        for ps in 0..2 {
            if let Some(task) = &s.replicas[ps].task {
                let command = match task.next {
                    Command::Wait(_) => task.deletion.clone().step(Observation::Waited, s.now),
                    ref command => command.clone(),
                };
                let all = answers(self, s, &command);
                actions.extend(
                    all.iter()
                        .enumerate()
                        .map(|(i, a)| Action::TaskStep(ps, i, a.fault)),
                );
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        match action {
            Action::CaaCreateVm if s.vm == Res::Absent && s.now == Tick::ZERO => {
                s.vm = Res::Present;
                s.parts = [Res::Present; 2];
            }
            Action::CaaCreatePeerPod
                if s.vm != Res::Absent && s.peerpods[0] == PeerPod::Absent && s.pod_alive =>
            {
                s.peerpods[0] = PeerPod::Live;
            }
            Action::PodEnds if s.pod_alive && s.peerpods[0] == PeerPod::Live => {
                s.pod_alive = false;
            }
            Action::CaaDeleteInstance(ps)
                if !s.pod_alive && s.caa_calls_left > 0 && s.caa_waiting.is_none() =>
            {
                s.caa_calls_left -= 1;
                s.caa_waiting = Some(ps);
                Self::call(&mut s, ps, Caller::Caa);
            }
            Action::CaaReleases if s.caa_heard_gone => {
                s.caa_heard_gone = false;
                Self::release(&mut s, 0);
            }
            Action::RestoreCopy
                if self.restore
                    && s.peerpods[0] != PeerPod::Absent
                    && s.peerpods[1] == PeerPod::Absent =>
            {
                s.peerpods[1] = PeerPod::Live;
            }
            Action::DeleteCopy if s.peerpods[1] == PeerPod::Live => {
                s.peerpods[1] = PeerPod::Terminating;
            }
            Action::GcMarksPeerPod if !s.pod_alive && s.peerpods[0] == PeerPod::Live => {
                s.peerpods[0] = PeerPod::Terminating;
            }
            Action::AcquireLease(r) if s.lease.is_none() && !s.leads[r] && r == 1 => {
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
            // A replica that does not lead reconciles nothing; its watch is as far behind as it
            // may be when it takes over.
            Action::CacheSync(r) if s.leads[r] => s.cache[r] = s.peerpods,
            Action::Reconcile(r, p, ps) => self.reconcile(&mut s, r, p, ps)?,
            Action::TaskStep(ps, i, _) => self.task_step(&mut s, ps, i)?,
            Action::Restart(ps)
                if s.restarts_left > 0
                    && (s.replicas[ps].task.is_some()
                        || s.replicas[ps].memo != Memo::default()) =>
            {
                s.restarts_left -= 1;
                Self::end_task(&mut s, ps, false);
                s.replicas[ps].memo = Memo::default();
            }
            Action::CloudShowsVm if !s.vm_visible && s.vm != Res::Absent => {
                s.vm_visible = true;
            }
            Action::TimePasses if s.now < Tick::HORIZON => {
                s.now = Tick(s.now.0 + 1);
                // The window has passed since the VM's creation (tick 0): every read shows it.
                s.vm_visible = s.vm != Res::Absent;
            }
            Action::CloudFinishesVmDelete if s.vm == Res::Deleting => s.vm = Res::Gone,
            Action::CloudFinishesPartDelete(i) if s.parts[i] == Res::Deleting => {
                s.parts[i] = Res::Gone;
            }
            _ => return None,
        }
        (s != *last).then_some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(RELEASED_ONLY_WHEN_GONE, |_, s: &State| !s.released_early),
            Property::always(NOTHING_DELETED_WHILE_NAMED, |_, s: &State| {
                !s.deleted_while_named
            }),
            Property::always(NOTHING_FORBIDDEN_DELETED, |_, s: &State| {
                !s.forbidden_deleted
            }),
            Property::sometimes(CLEANUP_HAPPENS, |_, s: &State| {
                s.peerpods[0] == PeerPod::Released && all_gone(s) && s.vm == Res::Gone
            }),
        ]
    }
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
