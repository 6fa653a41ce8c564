//! The adversarial model cloud: one VM and its four parts, and every answer it may give to the
//! engine's commands.

use peerpods_protocol::engine::{
    Command, DeleteAnswer, Observation, Part, PartId, PartKind, Sighting, Tie,
};
use peerpods_protocol::window::Moment;
use peerpods_protocol::{DO_NOT_DELETE, Guard, InstanceKey, ProviderName, Tags};

use crate::assumptions::DeletionProtocol;
use crate::state::{Res, State, Tick, WINDOW};

/// The model's instance, as CAA's PeerPod names it.
pub const INSTANCE_ID: &str =
    "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/pod-vm";
/// The same instance as the restored copy spells it.
pub const INSTANCE_ID_COPY: &str =
    "/SUBSCRIPTIONS/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/POD-VM ";
const PROVIDER: ProviderName = ProviderName::Azure;
const CLUSTER_TAG: (&str, &str) = ("peerpods.io/cluster", "c1");

pub(crate) fn key() -> InstanceKey {
    InstanceKey::new(PROVIDER, INSTANCE_ID)
}

pub(crate) fn guard() -> Guard {
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
pub(crate) enum Effect {
    None,
    VmDeleting,
    PartDeleting(usize),
    Forbidden,
}

/// One way the cloud may answer a command: the observation (`None`: the answer is lost and the
/// call fails), what it does, and whether it spends the fault budget.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    pub(crate) obs: Option<Observation>,
    pub(crate) effect: Effect,
    pub(crate) fault: bool,
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
