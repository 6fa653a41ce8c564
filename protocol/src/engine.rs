//! The deletion engine: what "deleted" means, written once for every cloud, apart from I/O (the
//! sans-I/O shape of quinn-proto and rustls).
//!
//! A [`Deletion`] is a state machine. Its driver (provider-service's detached delete, a unit
//! test, the model checker) asks it what to do ([`Deletion::step`] returns a [`Command`]), does
//! that against the cloud through a backend's ports, and hands back what the cloud answered as
//! an [`Observation`]. A backend only translates the cloud's answers; it never decides "gone".
//!
//! The rules, in the order a deletion meets them:
//! 1. Look the instance up. Act only on an instance the cloud shows, and only if it passes the
//!    [`Guard`] (no do-not-delete mark; this cluster's tag where one is required). An instance
//!    the cloud does not show is judged by the consistency [`Window`]: not yet visible ends the
//!    run with [`Verdict::NotYetVisible`] (come back later), never "let the delete call decide".
//! 2. Before requesting the delete, list the VM's parts (an address or an interface may be
//!    unreachable once the VM is gone), then request the delete.
//! 3. Confirm by a later lookup. A delete refused because of the instance's state, and a
//!    delete answered NotFound, lead to another lookup after a wait, never to an answer. A
//!    lookup's NotFound after an accepted delete is believed only by the window's rule (an
//!    instance older than the window, or a NotFound that persisted for it): until then the
//!    machine waits and looks again.
//! 4. Once the VM is confirmed gone, list its parts again and delete only those that are the
//!    VM's ([`Tie`]), each under the same guard; confirm each part gone by a later lookup.
//!
//! Every cycle of the machine passes through a [`Command::Wait`]: a cloud that keeps
//! contradicting itself is asked again at the driver's pace, never in a hot loop.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::guard::{Guard, Refusal, Tags};
use crate::window::{Memo, Moment, NotFound, Window};

/// What a part of a VM is. The order is the order of deletion: an interface before the
/// address bound to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PartKind {
    NetworkInterface,
    PublicAddress,
    Disk,
    Volume,
}

impl PartKind {
    /// Stable label for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            PartKind::NetworkInterface => "network_interface",
            PartKind::PublicAddress => "public_address",
            PartKind::Disk => "disk",
            PartKind::Volume => "volume",
        }
    }
}

/// A part of a VM: its kind and the cloud's id for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PartId {
    pub kind: PartKind,
    pub id: String,
}

impl PartId {
    pub fn new(kind: PartKind, id: impl Into<String>) -> Self {
        PartId {
            kind,
            id: id.into(),
        }
    }
}

/// How a part is tied to the VM, as the cloud shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Tie {
    /// The cloud marks it to be deleted with the VM (e.g. Azure's `deleteOption: Delete`).
    GoesWithVm,
    /// Created for this VM by cloud-api-adaptor (it names or tags it for the VM).
    CreatedForVm,
    /// Anything else attached to the VM (an operator's address, a shared disk): never deleted.
    NotTheVms,
}

/// A part as a listing shows it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Part {
    pub id: PartId,
    pub tags: Tags,
    pub tie: Tie,
}

/// What a lookup of the instance (or of a part) showed.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Sighting {
    /// Shown, not being deleted, with these tags.
    Present(Tags),
    /// Shown being deleted (a delete was accepted, ours or another's), with these tags.
    Deleting(Tags),
    /// The cloud says it is gone for good (e.g. EC2's `terminated`).
    Gone,
    /// The cloud does not know it.
    NotFound,
}

/// What the cloud answered a delete request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeleteAnswer {
    /// Accepted: the delete runs or is done.
    Accepted,
    /// NotFound: proves nothing by itself (the cloud may not show everything everywhere yet).
    NotFound,
    /// Refused for the state it is in now (starting, attached, busy): ask again later.
    WrongState,
}

/// What the driver saw, handed to [`Deletion::step`].
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Observation {
    /// Nothing yet: the first step.
    Start,
    /// The answer to [`Command::LookUp`], with the instance's age when the cloud tells its
    /// creation time (an instance older than the consistency window is no new instance the
    /// cloud may not show yet).
    Instance(Sighting, Option<Duration>),
    /// The answer to [`Command::RequestDelete`].
    DeleteAnswered(DeleteAnswer),
    /// The answer to [`Command::ListParts`]: every part attached to or named for the VM.
    Parts(Vec<Part>),
    /// The answer to [`Command::DeletePart`].
    PartDeleteAnswered(DeleteAnswer),
    /// The answer to [`Command::LookUpPart`].
    Part(Sighting),
    /// A [`Command::Wait`] is over.
    Waited,
}

/// What the machine waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Waiting {
    /// The cloud is deleting the instance.
    CloudDeleting,
    /// The cloud refused the delete for the instance's state (e.g. still starting).
    CloudBusy,
    /// The cloud answered NotFound to a delete: a later lookup tells.
    Confirming,
    /// The cloud is deleting a part, refused it for its state, or answered NotFound to it.
    Part(PartKind),
}

impl Waiting {
    /// Stable label for logs and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Waiting::CloudDeleting => "cloud_deleting",
            Waiting::CloudBusy => "cloud_busy",
            Waiting::Confirming => "confirming",
            Waiting::Part(_) => "part",
        }
    }
}

/// How a deletion ended.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Verdict {
    /// The instance was shown in this run and is confirmed gone, with its parts.
    Deleted,
    /// The instance was not shown in this run and is confirmed gone, with its parts.
    AlreadyGone,
    /// The cloud does not show the instance, for less than the window: come back later.
    NotYetVisible {
        unknown_for: Duration,
        window: Duration,
    },
    /// The instance may not be deleted.
    Refused(Refusal),
}

/// What the driver does next.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Command {
    LookUp,
    RequestDelete,
    ListParts,
    DeletePart(PartId),
    LookUpPart(PartId),
    /// Wait at the driver's pace for this, then hand back [`Observation::Waited`].
    Wait(Waiting),
    /// The end: no more steps are needed (a further step repeats it).
    Finish(Verdict),
}

/// What comes after a listing of the parts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum AfterListing {
    RequestDelete,
    WaitWhileDeleting,
    DeleteParts,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Phase {
    Start,
    LookingUp,
    Requesting,
    Listing(AfterListing),
    /// Waiting; then look up the part, or the instance when `None`.
    Waiting(Option<PartId>),
    DeletingPart(PartId),
    LookingUpPart(PartId),
    Done(Verdict),
}

/// Where the deletion of one owned part stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct PartProgress {
    /// Look it up before anything else (it was not in the latest listing, or the cloud
    /// answered its delete).
    look_first: bool,
    /// The cloud accepted its delete since it was last shown present.
    requested: bool,
}

/// The deletion of one instance: see the module's documentation.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Deletion<M> {
    guard: Guard,
    window: Window,
    memo: Memo<M>,
    phase: Phase,
    /// The instance was shown (present or deleting) in this run.
    shown: bool,
    /// The parts were listed while the instance was shown.
    listed_while_shown: bool,
    /// The VM's own parts still to delete and confirm, in deletion order.
    parts: BTreeMap<PartId, PartProgress>,
    /// Parts left alone, and why.
    kept: BTreeMap<PartId, Refusal>,
}

impl<M: Moment> Deletion<M> {
    /// A deletion under `guard`, with what is remembered of the instance (`memo`).
    pub fn new(guard: Guard, window: Window, memo: Memo<M>) -> Self {
        Deletion {
            guard,
            window,
            memo,
            phase: Phase::Start,
            shown: false,
            listed_while_shown: false,
            parts: BTreeMap::new(),
            kept: BTreeMap::new(),
        }
    }

    /// What is to be remembered of the instance now (the driver keeps it after every step).
    pub fn memo(&self) -> Memo<M> {
        self.memo
    }

    /// Parts that were left alone, and why.
    pub fn kept(&self) -> &BTreeMap<PartId, Refusal> {
        &self.kept
    }

    /// The verdict, once finished.
    pub fn verdict(&self) -> Option<&Verdict> {
        match &self.phase {
            Phase::Done(verdict) => Some(verdict),
            _ => None,
        }
    }

    /// Takes what the cloud answered at `now` and says what to do next. An observation that
    /// does not answer the last command is ignored and the last command repeated.
    pub fn step(&mut self, observation: Observation, now: M) -> Command {
        let phase = std::mem::replace(&mut self.phase, Phase::Start);
        match (phase, observation) {
            (Phase::Start, _) => self.look_up(),
            (Phase::LookingUp, Observation::Instance(sighting, age)) => {
                self.on_instance(sighting, age, now)
            }
            (Phase::Requesting, Observation::DeleteAnswered(answer)) => {
                self.on_delete_answer(answer, now)
            }
            (Phase::Listing(then), Observation::Parts(parts)) => self.on_parts(parts, then),
            (Phase::Waiting(None), Observation::Waited) => self.look_up(),
            (Phase::Waiting(Some(part)), Observation::Waited) => self.look_up_part(part),
            (Phase::DeletingPart(part), Observation::PartDeleteAnswered(answer)) => {
                self.on_part_delete_answer(part, answer)
            }
            (Phase::LookingUpPart(part), Observation::Part(sighting)) => {
                self.on_part(part, sighting)
            }
            (phase, _) => {
                self.phase = phase;
                self.repeat()
            }
        }
    }

    /// The command of the phase the machine is in.
    fn repeat(&self) -> Command {
        match &self.phase {
            Phase::Start | Phase::LookingUp => Command::LookUp,
            Phase::Requesting => Command::RequestDelete,
            Phase::Listing(_) => Command::ListParts,
            Phase::Waiting(None) => Command::Wait(Waiting::CloudDeleting),
            Phase::Waiting(Some(part)) => Command::Wait(Waiting::Part(part.kind)),
            Phase::DeletingPart(part) => Command::DeletePart(part.clone()),
            Phase::LookingUpPart(part) => Command::LookUpPart(part.clone()),
            Phase::Done(verdict) => Command::Finish(verdict.clone()),
        }
    }

    fn look_up(&mut self) -> Command {
        self.phase = Phase::LookingUp;
        Command::LookUp
    }

    fn finish(&mut self, verdict: Verdict) -> Command {
        self.phase = Phase::Done(verdict.clone());
        Command::Finish(verdict)
    }

    fn wait(&mut self, waiting: Waiting, then_part: Option<PartId>) -> Command {
        self.phase = Phase::Waiting(then_part);
        Command::Wait(waiting)
    }

    fn list(&mut self, then: AfterListing) -> Command {
        self.phase = Phase::Listing(then);
        Command::ListParts
    }

    fn on_instance(&mut self, sighting: Sighting, age: Option<Duration>, now: M) -> Command {
        match sighting {
            Sighting::Present(tags) => {
                self.memo.shown(now, age);
                self.shown = true;
                if let Err(refusal) = self.guard.check(&tags) {
                    return self.finish(Verdict::Refused(refusal));
                }
                if !self.listed_while_shown {
                    self.listed_while_shown = true;
                    return self.list(AfterListing::RequestDelete);
                }
                self.phase = Phase::Requesting;
                Command::RequestDelete
            }
            Sighting::Deleting(tags) => {
                self.memo.shown(now, age);
                self.memo.deletion_accepted(now);
                self.shown = true;
                if let Err(refusal) = self.guard.check(&tags) {
                    return self.finish(Verdict::Refused(refusal));
                }
                if !self.listed_while_shown {
                    self.listed_while_shown = true;
                    return self.list(AfterListing::WaitWhileDeleting);
                }
                self.wait(Waiting::CloudDeleting, None)
            }
            Sighting::Gone => self.list(AfterListing::DeleteParts),
            Sighting::NotFound => match self.window.judge(&mut self.memo, now) {
                NotFound::Gone => self.list(AfterListing::DeleteParts),
                // A delete was accepted, but the instance is young: the lookup may lag behind it.
                // The delete goes on; look again.
                NotFound::NotYetVisible { .. } if self.memo.deletion_seen.is_some() => {
                    self.wait(Waiting::Confirming, None)
                }
                NotFound::NotYetVisible {
                    unknown_for,
                    window,
                } => self.finish(Verdict::NotYetVisible {
                    unknown_for,
                    window,
                }),
            },
        }
    }

    fn on_delete_answer(&mut self, answer: DeleteAnswer, now: M) -> Command {
        match answer {
            DeleteAnswer::Accepted => {
                self.memo.deletion_accepted(now);
                self.wait(Waiting::CloudDeleting, None)
            }
            DeleteAnswer::NotFound => self.wait(Waiting::Confirming, None),
            DeleteAnswer::WrongState => self.wait(Waiting::CloudBusy, None),
        }
    }

    fn on_parts(&mut self, parts: Vec<Part>, then: AfterListing) -> Command {
        if then == AfterListing::DeleteParts {
            // A part listed before that this listing lacks is looked up, not deleted again.
            for progress in self.parts.values_mut() {
                progress.look_first = true;
            }
        }
        for part in parts {
            let allowed = match part.tie {
                Tie::NotTheVms => Err(Refusal::NotTheVms),
                Tie::GoesWithVm | Tie::CreatedForVm => self.guard.check(&part.tags),
            };
            match allowed {
                Ok(()) => {
                    let progress = self.parts.entry(part.id).or_insert(PartProgress {
                        look_first: false,
                        requested: false,
                    });
                    progress.look_first = false;
                }
                Err(refusal) => {
                    self.parts.remove(&part.id);
                    self.kept.insert(part.id, refusal);
                }
            }
        }
        match then {
            AfterListing::RequestDelete => {
                self.phase = Phase::Requesting;
                Command::RequestDelete
            }
            AfterListing::WaitWhileDeleting => self.wait(Waiting::CloudDeleting, None),
            AfterListing::DeleteParts => self.next_part(),
        }
    }

    /// The next owned part to delete or confirm, or the end once none is left.
    fn next_part(&mut self) -> Command {
        let Some((part, progress)) = self.parts.iter().next() else {
            let verdict = if self.shown {
                Verdict::Deleted
            } else {
                Verdict::AlreadyGone
            };
            return self.finish(verdict);
        };
        if progress.look_first {
            self.look_up_part(part.clone())
        } else {
            let part = part.clone();
            self.phase = Phase::DeletingPart(part.clone());
            Command::DeletePart(part)
        }
    }

    fn look_up_part(&mut self, part: PartId) -> Command {
        self.phase = Phase::LookingUpPart(part.clone());
        Command::LookUpPart(part)
    }

    fn on_part_delete_answer(&mut self, part: PartId, answer: DeleteAnswer) -> Command {
        let kind = part.kind;
        if let Some(progress) = self.parts.get_mut(&part) {
            progress.look_first = true;
            progress.requested = answer == DeleteAnswer::Accepted;
        }
        match answer {
            DeleteAnswer::Accepted => self.look_up_part(part),
            DeleteAnswer::NotFound | DeleteAnswer::WrongState => {
                self.wait(Waiting::Part(kind), Some(part))
            }
        }
    }

    fn on_part(&mut self, part: PartId, sighting: Sighting) -> Command {
        let kind = part.kind;
        match sighting {
            Sighting::NotFound | Sighting::Gone => {
                self.parts.remove(&part);
                self.next_part()
            }
            Sighting::Deleting(_) => self.wait(Waiting::Part(kind), Some(part)),
            Sighting::Present(tags) => {
                if let Err(refusal) = self.guard.check(&tags) {
                    self.parts.remove(&part);
                    self.kept.insert(part, refusal);
                    return self.next_part();
                }
                let Some(progress) = self.parts.get_mut(&part) else {
                    return self.next_part();
                };
                if progress.requested {
                    // Accepted, and still shown: the cloud's lag; look again after a wait, and
                    // ask again if it still shows it then.
                    progress.requested = false;
                    return self.wait(Waiting::Part(kind), Some(part));
                }
                progress.look_first = false;
                self.phase = Phase::DeletingPart(part.clone());
                Command::DeletePart(part)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::guard::{DO_NOT_DELETE, DO_NOT_DELETE_PORTABLE};

    const WINDOW: Window = Window(Duration::from_secs(300));

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn ours() -> Tags {
        tags(&[("cluster", "prod")])
    }

    fn guard() -> Guard {
        Guard::new(Some(("cluster".into(), "prod".into())))
    }

    fn deletion() -> Deletion<Instant> {
        Deletion::new(guard(), WINDOW, Memo::default())
    }

    fn part(kind: PartKind, id: &str, tie: Tie, tags: Tags) -> Part {
        Part {
            id: PartId::new(kind, id),
            tags,
            tie,
        }
    }

    fn nic() -> PartId {
        PartId::new(PartKind::NetworkInterface, "nic-1")
    }

    /// Steps through `script` at `now`: each observation must be answered by its command.
    fn expect(d: &mut Deletion<Instant>, now: Instant, script: Vec<(Observation, Command)>) {
        for (i, (observation, command)) in script.into_iter().enumerate() {
            let seen = format!("{observation:?}");
            assert_eq!(d.step(observation, now), command, "step {i}: {seen}");
        }
    }

    use Command as C;
    use Observation as O;

    #[test]
    fn a_shown_instance_is_guarded_deleted_confirmed_and_only_its_own_parts_go() {
        let now = Instant::now();
        let mut d = deletion();
        let dnd_disk = PartId::new(PartKind::Disk, "disk-kept");
        let operator_ip = PartId::new(PartKind::PublicAddress, "eip-operator");
        let untagged = PartId::new(PartKind::Volume, "vol-untagged");
        let caa_ip = PartId::new(PartKind::PublicAddress, "eip-caa");
        expect(
            &mut d,
            now,
            vec![
                (O::Start, C::LookUp),
                (
                    O::Instance(Sighting::Present(ours()), Some(WINDOW.0)),
                    C::ListParts,
                ),
                (
                    O::Parts(vec![
                        part(
                            PartKind::PublicAddress,
                            "eip-caa",
                            Tie::CreatedForVm,
                            ours(),
                        ),
                        part(PartKind::NetworkInterface, "nic-1", Tie::GoesWithVm, ours()),
                        part(
                            PartKind::PublicAddress,
                            "eip-operator",
                            Tie::NotTheVms,
                            ours(),
                        ),
                        part(
                            PartKind::Disk,
                            "disk-kept",
                            Tie::GoesWithVm,
                            tags(&[("cluster", "prod"), (DO_NOT_DELETE_PORTABLE, "")]),
                        ),
                        part(
                            PartKind::Volume,
                            "vol-untagged",
                            Tie::CreatedForVm,
                            tags(&[]),
                        ),
                    ]),
                    C::RequestDelete,
                ),
                (
                    O::DeleteAnswered(DeleteAnswer::Accepted),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Waited, C::LookUp),
                (
                    O::Instance(Sighting::Deleting(ours()), None),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Waited, C::LookUp),
                // Shown a window old: its NotFound after the accepted delete confirms it.
                (O::Instance(Sighting::NotFound, None), C::ListParts),
                // The interface goes first; the CAA address was not listed again: looked up.
                (
                    O::Parts(vec![part(
                        PartKind::NetworkInterface,
                        "nic-1",
                        Tie::GoesWithVm,
                        ours(),
                    )]),
                    C::DeletePart(nic()),
                ),
                (
                    O::PartDeleteAnswered(DeleteAnswer::Accepted),
                    C::LookUpPart(nic()),
                ),
                (O::Part(Sighting::NotFound), C::LookUpPart(caa_ip.clone())),
                (O::Part(Sighting::Gone), C::Finish(Verdict::Deleted)),
                (O::Waited, C::Finish(Verdict::Deleted)),
            ],
        );
        assert_eq!(d.verdict(), Some(&Verdict::Deleted));
        assert_eq!(
            d.kept().clone(),
            BTreeMap::from([
                (
                    dnd_disk,
                    Refusal::DoNotDelete {
                        tag: DO_NOT_DELETE_PORTABLE,
                        value: String::new()
                    }
                ),
                (operator_ip, Refusal::NotTheVms),
                (
                    untagged,
                    Refusal::NotOwnedByCluster {
                        key: "cluster".into(),
                        value: "prod".into()
                    }
                ),
            ])
        );
        assert_eq!(d.memo().deletion_seen, Some(now));
    }

    #[test]
    fn an_instance_never_shown_is_gone_only_past_the_window() {
        let start = Instant::now();
        let mut d = deletion();
        assert_eq!(d.verdict(), None);
        expect(
            &mut d,
            start,
            vec![
                (O::Start, C::LookUp),
                (
                    O::Instance(Sighting::NotFound, None),
                    C::Finish(Verdict::NotYetVisible {
                        unknown_for: Duration::ZERO,
                        window: WINDOW.0,
                    }),
                ),
            ],
        );
        let memo = d.memo();
        assert_eq!(memo.first_not_found, Some(start));
        // A later run, still inside the window.
        let mut d = Deletion::new(guard(), WINDOW, memo);
        let later = start + Duration::from_secs(299);
        expect(
            &mut d,
            later,
            vec![
                (O::Start, C::LookUp),
                (
                    O::Instance(Sighting::NotFound, None),
                    C::Finish(Verdict::NotYetVisible {
                        unknown_for: Duration::from_secs(299),
                        window: WINDOW.0,
                    }),
                ),
            ],
        );
        let mut d = Deletion::new(guard(), WINDOW, d.memo());
        expect(
            &mut d,
            start + WINDOW.0,
            vec![
                (O::Start, C::LookUp),
                (O::Instance(Sighting::NotFound, None), C::ListParts),
                (O::Parts(vec![]), C::Finish(Verdict::AlreadyGone)),
            ],
        );
    }

    #[test]
    fn a_gone_answer_needs_no_window() {
        let mut d = deletion();
        expect(
            &mut d,
            Instant::now(),
            vec![
                (O::Start, C::LookUp),
                (O::Instance(Sighting::Gone, None), C::ListParts),
                (O::Parts(vec![]), C::Finish(Verdict::AlreadyGone)),
            ],
        );
    }

    #[test]
    fn an_accepted_delete_of_a_young_instance_waits_for_its_not_found_to_be_believed() {
        let start = Instant::now();
        let mut d = deletion();
        expect(
            &mut d,
            start,
            vec![
                (O::Start, C::LookUp),
                // The cloud gives no age: the instance is known from now on.
                (O::Instance(Sighting::Present(ours()), None), C::ListParts),
                (O::Parts(vec![]), C::RequestDelete),
                (
                    O::DeleteAnswered(DeleteAnswer::Accepted),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Waited, C::LookUp),
                // It may be the lookup's lag behind a new instance: look again.
                (
                    O::Instance(Sighting::NotFound, None),
                    C::Wait(Waiting::Confirming),
                ),
                (O::Waited, C::LookUp),
            ],
        );
        assert_eq!(d.verdict(), None);
        // Known for the window: believed.
        expect(
            &mut d,
            start + WINDOW.0,
            vec![
                (O::Instance(Sighting::NotFound, None), C::ListParts),
                (O::Parts(vec![]), C::Finish(Verdict::Deleted)),
            ],
        );
        // A later run remembers the accepted delete and waits too, until the window has passed.
        let mut memo = Memo::default();
        memo.deletion_accepted(start);
        let mut d = Deletion::new(guard(), WINDOW, memo);
        expect(
            &mut d,
            start,
            vec![
                (O::Start, C::LookUp),
                (
                    O::Instance(Sighting::NotFound, None),
                    C::Wait(Waiting::Confirming),
                ),
                (O::Waited, C::LookUp),
            ],
        );
        expect(
            &mut d,
            start + WINDOW.0,
            vec![
                (O::Instance(Sighting::NotFound, None), C::ListParts),
                (O::Parts(vec![]), C::Finish(Verdict::AlreadyGone)),
            ],
        );
    }

    #[test]
    fn guards_refuse_before_anything_is_deleted() {
        let marked = tags(&[("cluster", "prod"), (DO_NOT_DELETE, "yes")]);
        let refused_marked = Verdict::Refused(Refusal::DoNotDelete {
            tag: DO_NOT_DELETE,
            value: "yes".into(),
        });
        let refused_other = Verdict::Refused(Refusal::NotOwnedByCluster {
            key: "cluster".into(),
            value: "prod".into(),
        });
        for (sighting, verdict) in [
            (Sighting::Present(marked.clone()), refused_marked.clone()),
            (Sighting::Deleting(marked), refused_marked),
            (
                Sighting::Present(tags(&[("cluster", "test")])),
                refused_other.clone(),
            ),
            (Sighting::Deleting(tags(&[])), refused_other),
        ] {
            let mut d = deletion();
            expect(
                &mut d,
                Instant::now(),
                vec![
                    (O::Start, C::LookUp),
                    (O::Instance(sighting, None), C::Finish(verdict.clone())),
                    (
                        O::DeleteAnswered(DeleteAnswer::Accepted),
                        C::Finish(verdict),
                    ),
                ],
            );
        }
        // Without a cluster tag only the mark refuses.
        let mut d = Deletion::new(Guard::default(), WINDOW, Memo::default());
        expect(
            &mut d,
            Instant::now(),
            vec![
                (O::Start, C::LookUp),
                (
                    O::Instance(Sighting::Present(tags(&[])), None),
                    C::ListParts,
                ),
            ],
        );
    }

    #[test]
    fn a_delete_answered_not_found_or_refused_for_its_state_leads_to_another_lookup() {
        let start = Instant::now();
        let mut d = deletion();
        expect(
            &mut d,
            start,
            vec![
                (O::Start, C::LookUp),
                (O::Instance(Sighting::Present(ours()), None), C::ListParts),
                (O::Parts(vec![]), C::RequestDelete),
                (
                    O::DeleteAnswered(DeleteAnswer::WrongState),
                    C::Wait(Waiting::CloudBusy),
                ),
                (O::Waited, C::LookUp),
                // Listed once while shown: the next sighting requests the delete at once.
                (
                    O::Instance(Sighting::Present(ours()), None),
                    C::RequestDelete,
                ),
                (
                    O::DeleteAnswered(DeleteAnswer::NotFound),
                    C::Wait(Waiting::Confirming),
                ),
                (O::Waited, C::LookUp),
                // Shown a moment ago and no delete accepted: NotFound is not yet proof.
                (
                    O::Instance(Sighting::NotFound, None),
                    C::Finish(Verdict::NotYetVisible {
                        unknown_for: Duration::ZERO,
                        window: WINDOW.0,
                    }),
                ),
            ],
        );
        assert_eq!(d.memo().deletion_seen, None);
    }

    #[test]
    fn an_instance_deleting_is_waited_for_and_its_parts_listed_first() {
        let now = Instant::now();
        let mut d = deletion();
        expect(
            &mut d,
            now,
            vec![
                (O::Start, C::LookUp),
                (
                    O::Instance(Sighting::Deleting(ours()), Some(WINDOW.0)),
                    C::ListParts,
                ),
                (O::Parts(vec![]), C::Wait(Waiting::CloudDeleting)),
                (O::Waited, C::LookUp),
                (
                    O::Instance(Sighting::Deleting(ours()), None),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Waited, C::LookUp),
                (O::Instance(Sighting::NotFound, None), C::ListParts),
                (O::Parts(vec![]), C::Finish(Verdict::Deleted)),
            ],
        );
        assert_eq!(d.memo().deletion_seen, Some(now));
    }

    #[test]
    fn a_present_instance_after_an_accepted_delete_is_asked_again() {
        let mut d = deletion();
        expect(
            &mut d,
            Instant::now(),
            vec![
                (O::Start, C::LookUp),
                (O::Instance(Sighting::Present(ours()), None), C::ListParts),
                (O::Parts(vec![]), C::RequestDelete),
                (
                    O::DeleteAnswered(DeleteAnswer::Accepted),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Waited, C::LookUp),
                (
                    O::Instance(Sighting::Present(ours()), None),
                    C::RequestDelete,
                ),
                // Tags read again: a mark set meanwhile stops it.
                (
                    O::DeleteAnswered(DeleteAnswer::Accepted),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Waited, C::LookUp),
                (
                    O::Instance(
                        Sighting::Present(tags(&[("cluster", "prod"), (DO_NOT_DELETE, "true")])),
                        None,
                    ),
                    C::Finish(Verdict::Refused(Refusal::DoNotDelete {
                        tag: DO_NOT_DELETE,
                        value: "true".into(),
                    })),
                ),
            ],
        );
    }

    #[test]
    fn parts_that_lag_refuse_or_flap_are_waited_for_and_asked_again() {
        let mut d = deletion();
        let disk = PartId::new(PartKind::Disk, "disk-1");
        let owned_disk = part(PartKind::Disk, "disk-1", Tie::GoesWithVm, ours());
        expect(
            &mut d,
            Instant::now(),
            vec![
                (O::Start, C::LookUp),
                (O::Instance(Sighting::Gone, None), C::ListParts),
                (O::Parts(vec![owned_disk]), C::DeletePart(disk.clone())),
                (
                    O::PartDeleteAnswered(DeleteAnswer::WrongState),
                    C::Wait(Waiting::Part(PartKind::Disk)),
                ),
                (O::Waited, C::LookUpPart(disk.clone())),
                (
                    O::Part(Sighting::Present(ours())),
                    C::DeletePart(disk.clone()),
                ),
                (
                    O::PartDeleteAnswered(DeleteAnswer::NotFound),
                    C::Wait(Waiting::Part(PartKind::Disk)),
                ),
                (O::Waited, C::LookUpPart(disk.clone())),
                (
                    O::Part(Sighting::Present(ours())),
                    C::DeletePart(disk.clone()),
                ),
                (
                    O::PartDeleteAnswered(DeleteAnswer::Accepted),
                    C::LookUpPart(disk.clone()),
                ),
                // Accepted and still shown: wait, then look again.
                (
                    O::Part(Sighting::Present(ours())),
                    C::Wait(Waiting::Part(PartKind::Disk)),
                ),
                (O::Waited, C::LookUpPart(disk.clone())),
                (
                    O::Part(Sighting::Deleting(ours())),
                    C::Wait(Waiting::Part(PartKind::Disk)),
                ),
                (O::Waited, C::LookUpPart(disk.clone())),
                // Still shown after the wait: ask again.
                (
                    O::Part(Sighting::Present(ours())),
                    C::DeletePart(disk.clone()),
                ),
                (
                    O::PartDeleteAnswered(DeleteAnswer::Accepted),
                    C::LookUpPart(disk.clone()),
                ),
                (O::Part(Sighting::NotFound), C::Finish(Verdict::AlreadyGone)),
            ],
        );
        assert!(d.kept().is_empty());
    }

    #[test]
    fn a_part_marked_meanwhile_is_kept() {
        let mut d = deletion();
        let disk = PartId::new(PartKind::Disk, "disk-1");
        expect(
            &mut d,
            Instant::now(),
            vec![
                (O::Start, C::LookUp),
                (O::Instance(Sighting::Gone, None), C::ListParts),
                (
                    O::Parts(vec![part(
                        PartKind::Disk,
                        "disk-1",
                        Tie::CreatedForVm,
                        ours(),
                    )]),
                    C::DeletePart(disk.clone()),
                ),
                (
                    O::PartDeleteAnswered(DeleteAnswer::WrongState),
                    C::Wait(Waiting::Part(PartKind::Disk)),
                ),
                (O::Waited, C::LookUpPart(disk.clone())),
                (
                    O::Part(Sighting::Present(tags(&[
                        ("cluster", "prod"),
                        (DO_NOT_DELETE, ""),
                    ]))),
                    C::Finish(Verdict::AlreadyGone),
                ),
            ],
        );
        assert_eq!(
            d.kept().get(&disk),
            Some(&Refusal::DoNotDelete {
                tag: DO_NOT_DELETE,
                value: String::new()
            })
        );
    }

    #[test]
    fn a_part_listed_owned_then_refused_is_kept_not_deleted() {
        let mut d = deletion();
        let disk = part(PartKind::Disk, "disk-1", Tie::GoesWithVm, ours());
        let mut marked = disk.clone();
        marked.tags.insert(DO_NOT_DELETE.into(), "true".into());
        expect(
            &mut d,
            Instant::now(),
            vec![
                (O::Start, C::LookUp),
                (
                    O::Instance(Sighting::Present(ours()), Some(WINDOW.0)),
                    C::ListParts,
                ),
                (O::Parts(vec![disk]), C::RequestDelete),
                (
                    O::DeleteAnswered(DeleteAnswer::Accepted),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Waited, C::LookUp),
                (O::Instance(Sighting::NotFound, None), C::ListParts),
                (O::Parts(vec![marked]), C::Finish(Verdict::Deleted)),
            ],
        );
        assert_eq!(d.kept().len(), 1);
    }

    #[test]
    fn an_answer_to_another_question_repeats_the_question() {
        let now = Instant::now();
        let mut d = deletion();
        let disk = PartId::new(PartKind::Disk, "d");
        expect(
            &mut d,
            now,
            vec![
                (O::Start, C::LookUp),
                (O::Waited, C::LookUp),
                (
                    O::Instance(Sighting::Present(ours()), Some(WINDOW.0)),
                    C::ListParts,
                ),
                (O::Waited, C::ListParts),
                (O::Parts(vec![]), C::RequestDelete),
                (O::Parts(vec![]), C::RequestDelete),
                (
                    O::DeleteAnswered(DeleteAnswer::Accepted),
                    C::Wait(Waiting::CloudDeleting),
                ),
                (O::Start, C::Wait(Waiting::CloudDeleting)),
                (O::Waited, C::LookUp),
                (O::Instance(Sighting::NotFound, None), C::ListParts),
                (
                    O::Parts(vec![part(PartKind::Disk, "d", Tie::GoesWithVm, ours())]),
                    C::DeletePart(disk.clone()),
                ),
                (O::Part(Sighting::NotFound), C::DeletePart(disk.clone())),
                (
                    O::PartDeleteAnswered(DeleteAnswer::NotFound),
                    C::Wait(Waiting::Part(PartKind::Disk)),
                ),
                (
                    O::Part(Sighting::NotFound),
                    C::Wait(Waiting::Part(PartKind::Disk)),
                ),
                (O::Waited, C::LookUpPart(disk.clone())),
                (O::Waited, C::LookUpPart(disk)),
                (O::Part(Sighting::NotFound), C::Finish(Verdict::Deleted)),
            ],
        );
    }

    #[test]
    fn labels_are_stable() {
        assert_eq!(
            [
                PartKind::NetworkInterface,
                PartKind::PublicAddress,
                PartKind::Disk,
                PartKind::Volume
            ]
            .map(PartKind::as_str),
            ["network_interface", "public_address", "disk", "volume"]
        );
        assert_eq!(
            [
                Waiting::CloudDeleting,
                Waiting::CloudBusy,
                Waiting::Confirming,
                Waiting::Part(PartKind::Disk)
            ]
            .map(Waiting::as_str),
            ["cloud_deleting", "cloud_busy", "confirming", "part"]
        );
    }
}
