//! The exhaustive checks of the deletion protocol, running the real engine and decision kernel:
//! every reachable state of each configuration (which faults, which actors), every property;
//! and each of the model's assumptions shown needed by the counterexample without it.
//!
//! With `MODEL_QUICK` set (the mutation run, `make mutants`), only the small configurations
//! run: each mutant is built and tested in seconds.

use std::time::Instant;

use deletion_model::check::{Counterexample, Report, explore};
use deletion_model::{
    Assumptions, CLEANUP_HAPPENS, DeletionProtocol, EVERY_PEERPOD_RELEASED, RELEASED_ONLY_WHEN_GONE,
};

fn model(
    faults: u8,
    restarts: u8,
    lease_expiries: u8,
    restore: bool,
    caa: bool,
) -> DeletionProtocol {
    DeletionProtocol {
        assume: Assumptions::ALL,
        faults,
        restarts,
        lease_expiries,
        restore,
        caa_deletes: caa,
        cloud_tells_age: false,
    }
}

/// `model(..)` on a cloud whose lookups tell the VM's age.
fn telling_age(model: DeletionProtocol) -> DeletionProtocol {
    DeletionProtocol {
        cloud_tells_age: true,
        ..model
    }
}

fn run(model: &DeletionProtocol) -> Report {
    let start = Instant::now();
    let report = explore(model);
    eprintln!(
        "{model:?}: {} states, {} transitions in {:.1?}",
        report.states,
        report.transitions,
        start.elapsed()
    );
    report
}

fn assert_holds(model: DeletionProtocol) {
    let report = run(&model);
    assert!(
        report.broken.is_empty(),
        "{model:?}: counterexamples:\n{}",
        report.describe()
    );
    // Not vacuous: a cleanup that deletes the VM is reachable.
    assert!(report.reached.contains(&CLEANUP_HAPPENS), "{model:?}");
}

fn deep() -> bool {
    if std::env::var_os("MODEL_QUICK").is_some() {
        eprintln!("MODEL_QUICK: the deep configuration is left out");
        return false;
    }
    true
}

// The small configurations: each actor and fault on its own, in well under a second each.

#[test]
fn peerpod_ctrl_alone_on_a_faithful_cloud() {
    assert_holds(model(0, 0, 0, false, false));
}

#[test]
fn cloud_faults_restarts_and_a_lease_expiry() {
    assert_holds(model(1, 1, 1, false, false));
}

#[test]
fn a_restored_copy() {
    assert_holds(model(0, 0, 0, true, false));
}

#[test]
fn caa_deleting_beside_peerpod_ctrl() {
    assert_holds(model(0, 0, 0, false, true));
}

#[test]
fn a_cloud_telling_ages_with_faults_restarts_and_a_lease_expiry() {
    assert_holds(telling_age(model(1, 1, 1, false, false)));
}

// The deep configurations: every actor with faults.

#[test]
fn two_cloud_faults_restarts_and_a_lease_expiry() {
    if deep() {
        assert_holds(model(2, 1, 1, false, false));
    }
}

#[test]
fn caa_racing_peerpod_ctrl_through_two_cloud_faults_and_a_restart() {
    if deep() {
        assert_holds(model(2, 1, 0, false, true));
    }
}

#[test]
fn a_restored_copy_with_a_cloud_fault_and_a_lease_expiry() {
    if deep() {
        assert_holds(model(1, 0, 1, true, false));
    }
}

#[test]
fn a_restored_copy_and_caa_racing_peerpod_ctrl() {
    if deep() {
        assert_holds(model(0, 0, 0, true, true));
    }
}

// Each assumption is needed.

fn broken(model: DeletionProtocol, property: &str) -> Counterexample {
    let report = run(&model);
    let c = report
        .broken(property)
        .unwrap_or_else(|| panic!("{model:?} keeps {property:?}"))
        .clone();
    eprintln!("{c}");
    c
}

#[test]
fn without_lag_only_while_young_a_not_found_of_an_old_vm_still_deleting_releases_early() {
    let c = broken(
        DeletionProtocol {
            assume: Assumptions {
                lag_only_while_young: false,
                ..Assumptions::ALL
            },
            ..model(2, 0, 0, false, false)
        },
        RELEASED_ONLY_WHEN_GONE,
    );
    assert!(c.len() <= 16, "{c}");
}

#[test]
fn without_true_ages_a_new_vm_told_old_is_released_on_a_lagging_not_found() {
    let c = broken(
        DeletionProtocol {
            assume: Assumptions {
                told_ages_are_true: false,
                ..Assumptions::ALL
            },
            ..telling_age(model(2, 0, 0, false, false))
        },
        RELEASED_ONLY_WHEN_GONE,
    );
    assert!(c.len() <= 16, "{c}");
}

#[test]
fn without_listings_catching_up_a_part_nobody_lists_again_is_left() {
    if !deep() {
        return;
    }
    let c = broken(
        DeletionProtocol {
            assume: Assumptions {
                lists_catch_up_by_gone: false,
                ..Assumptions::ALL
            },
            ..model(1, 0, 0, false, true)
        },
        RELEASED_ONLY_WHEN_GONE,
    );
    assert!(c.len() <= 20, "{c}");
}

#[test]
#[ignore = "a measuring aid: F, R, L, C, D set the configuration"]
fn measure() {
    let var = |k: &str, d: u8| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let model = model(
        var("F", 1),
        var("R", 1),
        var("L", 1),
        var("C", 1) == 1,
        var("D", 1) == 1,
    );
    let report = run(&model);
    eprintln!("{}", report.describe());
    let _ = EVERY_PEERPOD_RELEASED;
}
