//! One set of checks of an emulator's eventual consistency ([`crate::faults::Visibility`] and
//! [`crate::faults::Flapping`]), run by each emulator's tests through its API over plain HTTP:
//! each kind of call misses a new VM on its own while the others find it, flapping answers go
//! found, not found, found (the same with the same seed), every miss is counted, and with no knob
//! nothing is missed. Windows are an hour long and flapping is bounded by a count of answers, so
//! no verdict depends on timing.
#![allow(clippy::unwrap_used)] // test support: a failed check ends the test with its message

use std::time::Duration;

use crate::cloud::CloudEmulator;
use crate::faults::{CallKind, Faults, Flapping, Visibility};

/// How an emulator's tests ask its API about one VM (the id [`CloudEmulator::create_vm`]
/// returned), each answer read as "found" or not.
#[allow(async_fn_in_trait)] // used by tests only, never behind `dyn` nor across threads
pub trait Probe {
    /// The kinds of call the cloud has (Alibaba Cloud's ECS has no lookup but a list).
    fn kinds(&self) -> &'static [CallKind] {
        &CallKind::ALL
    }

    /// A lookup by id: `true` if it answered the VM, `false` if the cloud's not-found.
    async fn get(&self, id: &str) -> bool;

    /// A list (or filtered query) that would list the VM: whether it did.
    async fn list(&self, id: &str) -> bool;

    /// A deletion: `true` if accepted, `false` if the cloud's not-found.
    async fn delete(&self, id: &str) -> bool;

    /// Seconds since the creation time the cloud's API reports for the VM (checked in the
    /// cloud's own format).
    async fn age(&self, id: &str) -> f64;

    /// One call of `kind`.
    async fn found(&self, kind: CallKind, id: &str) -> bool {
        match kind {
            CallKind::Get => self.get(id).await,
            CallKind::List => self.list(id).await,
            CallKind::Delete => self.delete(id).await,
        }
    }
}

const HOUR: Duration = Duration::from_secs(3600);

/// Whether `answers` (found or not) go found, then not found, then found again.
pub fn found_missed_found(answers: &[bool]) -> bool {
    let found = answers.iter().position(|f| *f);
    let missed = found.and_then(|at| answers[at..].iter().position(|f| !*f).map(|n| at + n));
    missed.is_some_and(|at| answers[at..].contains(&true))
}

/// With no knob set, every kind of call finds a VM created just now, and nothing is counted.
pub async fn defaults_hide_nothing(emulator: &dyn CloudEmulator, probe: &impl Probe, name: &str) {
    emulator.set_faults(Faults::default());
    let id = emulator.create_vm(name, &[]);
    // Deletion last: it deletes.
    for kind in probe.kinds() {
        for _ in 0..5 {
            assert!(
                probe.found(*kind, &id).await,
                "{}: a {kind:?} missed {id} with no knob set",
                emulator.provider()
            );
            if *kind == CallKind::Delete {
                break;
            }
        }
    }
    assert_eq!(emulator.injected().not_found, 0, "{}", emulator.provider());
}

/// Calls of `hidden` miss a new VM for an hour (its [`Visibility`] window) while the other kinds
/// find it: a lookup misses what a list shows and the reverse, a deletion answers not found while
/// a lookup finds it. Each miss is counted. The emulator must hold no other VM of this age.
pub async fn a_kind_misses_a_new_vm_alone(
    emulator: &dyn CloudEmulator,
    probe: &impl Probe,
    name: &str,
    hidden: CallKind,
) {
    let provider = emulator.provider();
    emulator.set_faults(Faults {
        invisible: Visibility::only(&[hidden], HOUR),
        ..Faults::default()
    });
    let id = emulator.create_vm(name, &[]);
    for _ in 0..3 {
        assert!(
            !probe.found(hidden, &id).await,
            "{provider}: a {hidden:?} found {id} inside its window"
        );
    }
    assert_eq!(emulator.injected().not_found, 3, "{provider}");
    assert!(emulator.vm_or_parts_exist(&id), "{provider}");
    // The other kinds find it; a deletion last, as it deletes.
    let mut others: Vec<CallKind> = probe
        .kinds()
        .iter()
        .copied()
        .filter(|k| *k != hidden)
        .collect();
    others.sort_by_key(|k| *k == CallKind::Delete);
    for other in others {
        assert!(
            probe.found(other, &id).await,
            "{provider}: a {other:?} missed {id} while only {hidden:?} calls are hidden"
        );
    }
    assert_eq!(emulator.injected().not_found, 3, "{provider}");
    emulator.set_faults(Faults::default());
}

/// `kind`'s answers flap for the first 30 answers about a new VM: found, not found, found again,
/// each miss counted, then found; the knobs set again with the same seed (which restarts the
/// count of answers), the same answers again.
pub async fn answers_of_a_kind_flap(
    emulator: &dyn CloudEmulator,
    probe: &impl Probe,
    name: &str,
    kind: CallKind,
) {
    let provider = emulator.provider();
    let flapping = Faults {
        flapping: Flapping::for_answers(30, &[kind]),
        seed: 5,
        ..Faults::default()
    };
    emulator.set_faults(flapping.clone());
    let id = emulator.create_vm(name, &[]);
    let answers = || async {
        let mut found = Vec::new();
        for _ in 0..36 {
            found.push(probe.found(kind, &id).await);
        }
        let misses = found.iter().filter(|f| !**f).count() as u64;
        assert_eq!(
            emulator.injected().not_found,
            misses,
            "{provider}: {found:?}"
        );
        found
    };
    let first = answers().await;
    assert!(
        found_missed_found(&first),
        "{provider}: {kind:?} answers never went found, not found, found: {first:?}"
    );
    assert!(
        first[30..].iter().all(|found| *found),
        "{provider}: {kind:?} answers flapped past the 30th: {first:?}"
    );
    let misses = first.iter().filter(|f| !**f).count();
    assert!((5..=25).contains(&misses), "{provider}: {first:?}");
    // The other kinds do not flap (a deletion is not tried: it would delete).
    for other in probe
        .kinds()
        .iter()
        .filter(|k| ![kind, CallKind::Delete].contains(k))
    {
        for _ in 0..5 {
            assert!(probe.found(*other, &id).await, "{provider}: {other:?}");
        }
    }
    emulator.set_faults(flapping);
    assert_eq!(
        answers().await,
        first,
        "{provider}: not repeated with the seed"
    );
    emulator.set_faults(Faults::default());
}

/// The creation time the emulator reports agrees with how it lags
/// ([`Faults::age_at_creation`]): an hour ago with no lag knob (a VM cloud-api-adaptor created
/// earlier), now while a knob (`lag`, a kind hidden for an hour) makes new VMs lag (the lag
/// windows count from it), and `created_age` ago when the knobs say so, whatever else they say;
/// knobs set after a VM's creation leave its time alone. `resolution`: how much older a time the
/// cloud writes coarsely may read, in seconds (ECS writes minutes). Creates `podvm-old`,
/// `podvm-new` and `podvm-aged`; the knobs are off again at the end.
pub async fn creation_times_follow_the_lag(
    emulator: &dyn CloudEmulator,
    probe: &impl Probe,
    lag: CallKind,
    resolution: f64,
) {
    let provider = emulator.provider();
    let within = |age: f64, low: f64, high: f64| {
        assert!(
            (low..high + resolution).contains(&age),
            "{provider}: {age} s old, not within {low}..{high}"
        );
    };
    let old = emulator.create_vm("podvm-old", &[]);
    within(probe.age(&old).await, 3590.0, 3610.0);

    emulator.set_faults(Faults {
        invisible: Visibility::only(&[lag], HOUR),
        ..Faults::default()
    });
    let new = emulator.create_vm("podvm-new", &[]);
    within(probe.age(&new).await, -1.0, 10.0);

    emulator.set_faults(Faults {
        invisible: Visibility::only(&[lag], HOUR),
        created_age: Some(2 * HOUR),
        ..Faults::default()
    });
    let aged = emulator.create_vm("podvm-aged", &[]);
    within(probe.age(&aged).await, 7190.0, 7210.0);
    within(probe.age(&old).await, 3590.0, 3610.0);
    emulator.set_faults(Faults::default());
}
