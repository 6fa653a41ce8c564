//! ECS's documented "try again later" answers (throttling, a busy instance, a conflicting
//! request), each produced by the emulator with its real status, `Code`, `Message` and headers
//! (`AlibabaCloudEmulator::refuse_next_of`), driven through the backend's real signed HTTP
//! client, and classified by the code, not the status: throttling is `Throttled` with the
//! cloud's wait, a busy instance is waited for within the bound and then `Unavailable`
//! (retryable), never a refusal the caller cannot retry.

use std::time::Duration;

use peerpods_emulator_alibabacloud::{AlibabaCloudEmulator, EcsRefusal};
use peerpods_provider_alibabacloud::AlibabaCloudProvider;
use peerpods_provider_core::{
    CloudCalls, DEFAULT_RETRY_AFTER, DeleteOutcome, Error, Provider, ProviderConfig,
};
use test_support::cloud::CloudEmulator;

fn provider(emulator: &AlibabaCloudEmulator) -> AlibabaCloudProvider {
    let mut pairs: Vec<(String, String)> = emulator.config();
    // A short wait bound, so that a lasting busy answer ends the call soon.
    pairs.push(("ALIBABACLOUD_WAIT_TIMEOUT_MS".into(), "1000".into()));
    pairs.push(("ALIBABACLOUD_POLL_INTERVAL_MS".into(), "100".into()));
    AlibabaCloudProvider::from_config(&ProviderConfig::from_pairs(pairs), CloudCalls::default())
        .expect("provider")
}

/// `DeleteInstance` is refused `count` times with `refusal`; returns the first answer, after
/// checking the instance is still there and that a later delete ends with it gone.
async fn refused_delete(refusal: EcsRefusal, count: u32) -> Result<DeleteOutcome, Error> {
    let emulator = AlibabaCloudEmulator::start();
    let id = emulator.create_vm("podvm-refused", &[]);
    let provider = provider(&emulator);
    emulator.refuse_next_of("DeleteInstance", count, refusal);

    let answer = provider.delete_instance(&id).await;

    if answer.is_err() {
        assert!(
            emulator.instance_exists(&id),
            "{refusal:?}: the instance must stay"
        );
        emulator.refuse_next_of("DeleteInstance", 0, refusal);
        assert_eq!(
            provider.delete_instance(&id).await.expect("later"),
            DeleteOutcome::Deleted
        );
    }
    assert!(!emulator.instance_exists(&id));
    answer
}

#[tokio::test]
async fn throttling_is_throttled_whatever_its_status() {
    let answer = refused_delete(EcsRefusal::Throttling, 1).await;
    assert!(
        matches!(&answer, Err(Error::Throttled { retry_after, message, .. }) if *retry_after == DEFAULT_RETRY_AFTER && message.contains("HTTP 400")),
        "{answer:?}"
    );
    let answer = refused_delete(
        EcsRefusal::ThrottlingUser {
            retry_after_secs: 9,
        },
        1,
    )
    .await;
    assert!(
        matches!(&answer, Err(Error::Throttled { retry_after, .. }) if *retry_after == Duration::from_secs(9)),
        "{answer:?}"
    );
}

#[tokio::test]
async fn a_busy_instance_is_waited_for_then_deleted() {
    for refusal in [
        EcsRefusal::IncorrectInstanceStatus,
        EcsRefusal::OperationConflict,
        EcsRefusal::LastTokenProcessing,
    ] {
        let answer = refused_delete(refusal, 2).await;
        assert_eq!(
            answer.expect("settled"),
            DeleteOutcome::Deleted,
            "{refusal:?}"
        );
    }
}

#[tokio::test]
async fn a_lasting_busy_answer_is_retryable_at_the_bound_not_a_refusal() {
    for (refusal, code) in [
        (
            EcsRefusal::IncorrectInstanceStatus,
            "IncorrectInstanceStatus",
        ),
        (EcsRefusal::OperationConflict, "OperationConflict"),
        (EcsRefusal::LastTokenProcessing, "LastTokenProcessing"),
    ] {
        let answer = refused_delete(refusal, 1000).await;
        assert!(
            matches!(&answer, Err(Error::Unavailable { message, .. }) if message.contains(code)),
            "{refusal:?}: {answer:?}"
        );
    }
}
