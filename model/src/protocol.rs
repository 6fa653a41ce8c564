//! The protocol's actors as transitions: peerpod-ctrl's reconciles over the real decision
//! kernel, provider-service's tasks stepping the real deletion engine against the model cloud,
//! CAA, the user, the garbage collector, the Lease and the cloud's own progress.

use peerpods_protocol::decide::{self, PeerPodFacts, Plan, Progress};
use peerpods_protocol::engine::{Command, Deletion, Observation, Verdict};
use peerpods_protocol::window::{Book, Memo};
use stateright::{Model, Property};

use crate::assumptions::DeletionProtocol;
use crate::cloud::{Effect, INSTANCE_ID, INSTANCE_ID_COPY, answers, guard, key};
use crate::properties::{
    CLEANUP_HAPPENS, NOTHING_DELETED_WHILE_NAMED, NOTHING_FORBIDDEN_DELETED,
    RELEASED_ONLY_WHEN_GONE, all_gone, named_in_use,
};
use crate::state::{Action, Caller, PeerPod, Replica, Res, State, Task, Tick, WINDOW};

/// The provider-service replica peerpod-ctrl's calls reach, and the one CAA's reach: two
/// replicas, each with its own task and memo, deleting the one VM side by side.
const CTRL_CALLS: usize = 1;
const CAA_CALLS: usize = 0;

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
