//! A delete waiting for one of its cloud's delete slots is not running yet: its bound starts once it
//! holds a slot, and the time it queues for a slot again after a pause (the cloud still deleting)
//! is not counted either. On the Azure emulator, whose VM deletions take several looks (the backend
//! looks every 200 ms here) and whose every request takes 200 ms, deletes that share few slots
//! take longer together than the bound, are answered "in progress" meanwhile, and each ends
//! deleted.
//!
//! The deletes go through the service's own layering (`backends::guarded_with`: the call budget
//! and the cache over the real Azure backend) and its detached deletes (`Deletes`), with a
//! budget and a bound smaller than the defaults: the server itself always runs with those.

use std::sync::Arc;
use std::time::{Duration, Instant};

use peerpods_emulator_azure::AzureEmulator;
use peerpods_provider_core::{CallBudget, CloudCalls, DeleteOutcome, Provider, ProviderConfig};
use provider_service::backends::guarded_with;
use provider_service::deletes::{Answer, DeleteSettings, Deletes, Job};
use test_support::cloud::CloudEmulator;
use test_support::faults::Faults;

/// The Azure backend on `emulator`, as the service guards it, with `budget` and `bound`.
fn azure(emulator: &AzureEmulator, budget: CallBudget, bound: Duration) -> Arc<dyn Provider> {
    let config = ProviderConfig::from_pairs(emulator.config().into_iter().chain([
        ("DELETE_UNTAGGED".to_owned(), "allow".to_owned()),
        // The backend's pace: every look at a VM being deleted comes 200 ms after the last, so a
        // deletion of N looks takes N x 200 ms or more, however fast the machine.
        ("AZURE_POLL_INTERVAL_MS".to_owned(), PACE_MS.to_string()),
    ]));
    let backend =
        peerpods_provider_azure::AzureProvider::from_config(&config, CloudCalls::default())
            .unwrap();
    guarded_with(Arc::new(backend), budget, bound)
}

/// The Azure backend's wait between two looks at a VM being deleted, and the time ARM takes to
/// answer each request: a delete holds its slot for its requests, not for its waits.
const PACE_MS: u64 = 200;

/// The bound of each delete here: over twice one deletion's own time (10 requests or more and 8
/// waits: 3.6 s or more), under the time the deletes of each test hold their slots together.
const BOUND: Duration = Duration::from_secs(10);

/// The Azure emulator, every request answered `PACE_MS` late, each VM deletion taking 8 looks.
fn slow_azure() -> AzureEmulator {
    let emulator = AzureEmulator::start();
    emulator.set_faults(Faults {
        latency: Duration::from_millis(PACE_MS),
        ..Faults::default()
    });
    emulator.set_operation_polls(8, 0);
    emulator
}

fn vm_deletes(emulator: &AzureEmulator, name: &str) -> usize {
    emulator.arm_requests_matching("DELETE", &format!("/virtualMachines/{name}"))
}

/// Starts a delete of each VM, in order.
fn start_all(deletes: &Deletes, provider: &Arc<dyn Provider>, ids: &[String]) -> Vec<Job> {
    ids.iter()
        .map(|id| {
            deletes
                .delete(provider.clone(), id, tracing::Span::none())
                .unwrap()
        })
        .collect()
}

/// The end of each delete (each waited for at most `within`), in order.
async fn ends(jobs: Vec<Job>, within: Duration) -> Vec<Answer> {
    futures::future::join_all(jobs.into_iter().map(|job| job.answer(within))).await
}

/// Every job ends `Deleted` within `patience`, the last longer after it was queued at `started`
/// than its `bound` (counted from its queueing, it would have failed); each VM was deleted once
/// and is gone, and nothing is left in flight.
async fn all_end_deleted_once_past_the_bound(
    jobs: Vec<Job>,
    patience: Duration,
    started: Instant,
    bound: Duration,
    emulator: &AzureEmulator,
    names: &[String],
    deletes: &Deletes,
) {
    let answers = ends(jobs, patience).await;
    let waited = started.elapsed();
    assert_all_deleted(&answers, names);
    assert!(waited > bound, "{waited:?}");
    for name in names {
        assert!(!emulator.vm_or_parts_exist(name), "{name} is gone");
        assert_eq!(vm_deletes(emulator, name), 1, "{name} was deleted once");
    }
    assert_eq!(deletes.in_flight(), 0);
}

fn assert_all_deleted(answers: &[Answer], names: &[String]) {
    for (answer, name) in answers.iter().zip(names) {
        assert!(
            matches!(answer, Answer::Finished(Ok(DeleteOutcome::Deleted))),
            "{name}: {answer:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn deletes_sharing_one_slot_for_longer_than_the_bound_end_deleted() {
    // One delete slot; each deletion takes 8 looks and 10 requests or more (2 s of requests, 1.6 s of
    // waits, under half the bound): six deletes hold the one slot 12 s or more together, longer
    // than the bound, and each ends deleted.
    let emulator = slow_azure();
    let bound = BOUND;
    let provider = azure(
        &emulator,
        CallBudget {
            deletes: 1,
            reads: 1,
        },
        bound,
    );
    let deletes = Deletes::new(DeleteSettings::default());
    let names: Vec<String> = (0..6).map(|i| format!("podvm-queued-{i}")).collect();
    let ids: Vec<String> = names.iter().map(|n| emulator.create_vm(n, &[])).collect();

    let started = Instant::now();
    let jobs = start_all(&deletes, &provider, &ids);
    let running = crate::common::eventually("one delete to reach ARM", || async {
        names.iter().position(|n| vm_deletes(&emulator, n) > 0)
    })
    .await;
    // Asked again, a delete that runs (or queues for the slot) is joined, and its caller hears
    // "in progress".
    let asked_again = deletes
        .delete(provider.clone(), &ids[running], tracing::Span::none())
        .unwrap();
    assert!(asked_again.joined);
    assert!(matches!(
        asked_again.answer(Duration::from_millis(200)).await,
        Answer::InProgress { .. }
    ));
    assert_eq!(deletes.in_flight(), 6);

    all_end_deleted_once_past_the_bound(
        jobs,
        Duration::from_secs(300),
        started,
        bound,
        &emulator,
        &names,
        &deletes,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_slow_azure_deletes_end_with_none_timing_out_in_the_queue() {
    // The default budget (32 delete slots) and deletions of 10 requests or more (2 s of slot time
    // each): 200 of them hold the slots 12.5 s or more together, past the bound (10 s).
    let emulator = slow_azure();
    let bound = BOUND;
    let provider = azure(&emulator, CallBudget::default(), bound);
    let deletes = Deletes::new(DeleteSettings::default());
    let names: Vec<String> = (0..200).map(|i| format!("podvm-storm-{i:03}")).collect();
    let ids: Vec<String> = names.iter().map(|n| emulator.create_vm(n, &[])).collect();

    let started = Instant::now();
    let jobs = start_all(&deletes, &provider, &ids);
    assert_eq!(deletes.in_flight(), 200);
    all_end_deleted_once_past_the_bound(
        jobs,
        Duration::from_secs(600),
        started,
        bound,
        &emulator,
        &names,
        &deletes,
    )
    .await;
}
