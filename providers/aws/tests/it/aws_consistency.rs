//! What EC2 does and moto does not: eventual consistency (an instance unknown for a while after
//! `RunInstances`, or not listed by a filtered `DescribeInstances`), throttling and server errors,
//! produced by the fault layer in front of moto (`test_support::moto::Faults`) with EC2's own
//! error bodies, through the real AWS SDK.
//!
//! The provider signs with an access key of its own, and only its calls get faults: the test's
//! arranging and checking (signed with the harness' key) see moto as it is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::aws_support::{SERIAL, config_for, moto, run_instances, state_of, unknown_id};
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider};
use test_support::moto::{CallKind, Faults, Visibility};

/// The access key the provider signs with; faults are scoped to it.
const PROVIDER_KEY: &str = "AKIDPROVIDERFAULTED";
/// How long a test keeps asking, as peerpod-ctrl would, before giving up: generous.
const PATIENCE: Duration = Duration::from_secs(90);
const PAUSE: Duration = Duration::from_millis(200);

async fn provider(extra: &[(&str, &str)]) -> Arc<AwsProvider> {
    let mut pairs = vec![("AWS_ACCESS_KEY_ID", PROVIDER_KEY)];
    pairs.extend_from_slice(extra);
    Arc::new(
        AwsProvider::from_config(&config_for(&moto().endpoint, &pairs), CloudCalls::default())
            .await
            .expect("provider"),
    )
}

fn faults() -> Faults {
    Faults {
        access_key: Some(PROVIDER_KEY.to_owned()),
        ..Faults::default()
    }
}

/// Whether an answer is the "not yet visible, come back later" wait.
fn not_yet_visible(answer: &Result<DeleteOutcome, Error>) -> bool {
    matches!(answer, Ok(DeleteOutcome::NotYetVisible { .. }))
}

/// Asks to delete `instance_id` until the answer is not "not yet visible" (as a caller coming
/// back after the wait would); returns that answer and how many "not yet visible" came before.
async fn delete_until_answered(
    provider: &AwsProvider,
    instance_id: &str,
) -> (Result<DeleteOutcome, Error>, usize) {
    let deadline = Instant::now() + PATIENCE;
    let mut retried = 0;
    loop {
        let answer = provider.delete_instance(instance_id).await;
        if !(not_yet_visible(&answer) && Instant::now() < deadline) {
            return (answer, retried);
        }
        retried += 1;
        tokio::time::sleep(PAUSE).await;
    }
}

/// EC2 does not list an id it does not know yet, as one it has forgotten. Inside the
/// consistency window (5 minutes by default) the provider does not call it gone: it answers
/// "not yet visible" (a wait, not an error) naming the window and its setting, so no finalizer is
/// released on it.
#[tokio::test(flavor = "multi_thread")]
async fn a_not_found_inside_the_consistency_window_is_not_gone() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let provider = provider(&[]).await;
    let unknown = unknown_id(20);

    for attempt in 0..3 {
        let answer = provider.delete_instance(&unknown).await;
        let Ok(DeleteOutcome::NotYetVisible {
            unknown_for,
            window,
            setting,
        }) = answer
        else {
            panic!("attempt {attempt}: not gone inside the window, got {answer:?}");
        };
        assert_eq!(window, Duration::from_secs(300));
        assert!(unknown_for < window);
        assert_eq!(setting, "AWS_NOT_FOUND_WINDOW_SECS");
    }
    assert_eq!(provider.api_calls("TerminateInstances"), 0);
}

/// An instance that a filtered `DescribeInstances` does not list yet (EC2's eventual consistency:
/// here for 600 s after its launch, while a call naming it would reach it) is not yet visible,
/// and is not terminated: the old code left such an instance "to TerminateInstances", unchecked
/// for the cluster tag and do-not-delete, and terminated it.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_the_filtered_describe_does_not_list_is_not_terminated() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(
        &client,
        1,
        &[(peerpods_provider_core::DO_NOT_DELETE_TAG, "true")],
    )
    .await;
    moto().set_faults(&Faults {
        invisible: Visibility::only(&[CallKind::List], Duration::from_secs(600)),
        ..faults()
    });
    let provider = provider(&[]).await;

    let answer = provider.delete_instance(&ids[0]).await;

    assert!(not_yet_visible(&answer), "{answer:?}");
    assert!(moto().injected().not_found >= 1, "the list left it out");
    assert_eq!(state_of(&client, &ids[0]).await, "running");
    assert_eq!(provider.api_calls("TerminateInstances"), 0);
}

/// Once NotFound has persisted past the window (2 s here), counted from the first NotFound this
/// provider saw, the instance is gone; every answer before that is "not yet visible".
#[tokio::test(flavor = "multi_thread")]
async fn a_not_found_that_persists_past_the_window_is_gone() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let window = Duration::from_secs(2);
    let provider = provider(&[("AWS_NOT_FOUND_WINDOW_SECS", "2")]).await;
    let unknown = unknown_id(21);

    let first_asked = Instant::now();
    let (answer, retried) = delete_until_answered(&provider, &unknown).await;

    assert_eq!(answer.expect("gone"), DeleteOutcome::AlreadyGone);
    assert!(retried >= 1, "the first NotFound is never believed");
    assert!(
        first_asked.elapsed() >= window,
        "gone after {:?}, inside the {window:?} window",
        first_asked.elapsed()
    );
    // Asked again later, it stays gone.
    assert_eq!(
        provider.delete_instance(&unknown).await.expect("again"),
        DeleteOutcome::AlreadyGone
    );
}

/// A real instance EC2 does not show for its first seconds after RunInstances (here: 10 s, the
/// fault layer's eventual consistency) is never reported gone: the caller is told to come back,
/// and once EC2 knows it, it is terminated.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_invisible_for_its_first_seconds_is_terminated_not_reported_gone() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    moto().set_faults(&Faults {
        invisible_after_launch: Duration::from_secs(10),
        ..faults()
    });
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    let provider = provider(&[]).await;

    let (answer, retried) = delete_until_answered(&provider, &ids[0]).await;

    assert_eq!(answer.expect("deleted"), DeleteOutcome::Deleted);
    assert!(retried >= 1, "EC2 did not know the instance at first");
    assert!(moto().injected().not_found >= 1);
    assert_eq!(state_of(&client, &ids[0]).await, "terminated");
}

/// In one batched `TerminateInstances`, EC2 names the ids it does not know though it lists them:
/// those wait (a NotFound to a delete proves nothing; the instance is looked up again, and
/// asked again while it is still shown), the others of the batch are terminated as usual.
#[tokio::test(flavor = "multi_thread")]
async fn in_a_batch_only_the_ids_ec2_does_not_know_wait() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 3, &[]).await;
    moto().set_faults(&Faults {
        hidden_ids: vec![ids[0].clone()],
        ..faults()
    });
    let provider = provider(&[]).await;

    let hidden = tokio::spawn({
        let provider = Arc::clone(&provider);
        let id = ids[0].clone();
        async move { provider.delete_instance(&id).await }
    });
    let (second, third) = tokio::join!(
        provider.delete_instance(&ids[1]),
        provider.delete_instance(&ids[2])
    );

    assert_eq!(second.expect("second"), DeleteOutcome::Deleted);
    assert_eq!(third.expect("third"), DeleteOutcome::Deleted);
    assert_eq!(state_of(&client, &ids[2]).await, "terminated");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !hidden.is_finished(),
        "no answer while EC2 contradicts itself"
    );
    assert_eq!(state_of(&client, &ids[0]).await, "running");

    // Once EC2 knows it everywhere, the waiting delete terminates it.
    moto().set_faults(&faults());
    assert_eq!(
        hidden.await.expect("task").expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert_eq!(state_of(&client, &ids[0]).await, "terminated");
}

/// EC2's throttling answer (HTTP 503 `RequestLimitExceeded`), from the fault layer in front of
/// moto: after the SDK's own attempts, the caller is told to wait, and nothing was terminated.
#[tokio::test(flavor = "multi_thread")]
async fn throttling_by_ec2_asks_the_caller_to_wait() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    moto().set_faults(&Faults {
        throttle_rate: 1.0,
        ..faults()
    });
    let provider = provider(&[("AWS_MAX_ATTEMPTS", "2")]).await;

    let error = provider
        .delete_instance(&ids[0])
        .await
        .expect_err("throttled");

    assert!(
        matches!(error, Error::Throttled { retry_after, .. } if retry_after >= Duration::from_secs(1)),
        "{error:?}"
    );
    assert!(moto().injected().throttled >= 2, "the SDK tried again");
    assert_eq!(state_of(&client, &ids[0]).await, "running");
}

/// A storm of server errors (30%) and throttling (20%) on every call: retried by the SDK or by the
/// caller, every instance ends terminated and none is reported gone before.
#[tokio::test(flavor = "multi_thread")]
async fn under_server_errors_and_throttling_every_instance_ends_terminated() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 20, &[]).await;
    moto().set_faults(&Faults {
        server_error_rate: 0.3,
        throttle_rate: 0.2,
        seed: 20,
        ..faults()
    });
    // One instance per batch: some 60 calls, so both faults certainly occur.
    let provider = provider(&[("AWS_DELETE_BATCH_MAX_IDS", "1")]).await;

    let deadline = Instant::now() + PATIENCE;
    let mut pending = ids.clone();
    let mut caller_retries = 0;
    while !pending.is_empty() {
        assert!(Instant::now() < deadline, "still not deleted: {pending:?}");
        let answers =
            futures::future::join_all(pending.iter().map(|id| provider.delete_instance(id))).await;
        let mut next = Vec::new();
        for (id, answer) in pending.iter().zip(answers) {
            match answer {
                // A delete whose confirmation failed is confirmed by the caller's next ask.
                Ok(DeleteOutcome::Deleted | DeleteOutcome::AlreadyGone) => {}
                Err(Error::Throttled { .. } | Error::Unavailable { .. }) => {
                    caller_retries += 1;
                    next.push(id.clone());
                }
                other => panic!("{id}: {other:?}"),
            }
        }
        pending = next;
        if !pending.is_empty() {
            tokio::time::sleep(PAUSE).await;
        }
    }

    let injected = moto().injected();
    println!(
        "20 deletes under faults: {injected:?}, {caller_retries} answers asked the caller to retry"
    );
    assert!(
        injected.server_errors > 0 && injected.throttled > 0,
        "{injected:?}"
    );
    // Every fault answered an attempt the provider made: the SDK's retries are counted too.
    let calls = moto().requests_signed_by(PROVIDER_KEY);
    println!("the provider's EC2 calls: {calls:?}");
    assert!(
        calls.values().sum::<u64>() > injected.server_errors + injected.throttled,
        "{calls:?}"
    );
    for id in &ids {
        assert_eq!(state_of(&client, id).await, "terminated", "{id}");
    }
}
