//! The AWS backend against the fault layer in front of moto (`test_support::moto::Faults`): the
//! knobs the emulators' layer shares with it (latency, hangs, server errors), through the real AWS
//! SDK. Throttling and eventual consistency are in `aws_consistency.rs`.

use std::time::Duration;

use crate::aws_support::{SERIAL, config_for, moto, run_instances, state_of};
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider};
use test_support::moto::Faults;

/// The access key the provider signs with; faults are scoped to it.
const PROVIDER_KEY: &str = "AKIDPROVIDERHANGS";
const PATIENCE: Duration = Duration::from_secs(120);

async fn provider(extra: &[(&str, &str)]) -> AwsProvider {
    let mut pairs = vec![("AWS_ACCESS_KEY_ID", PROVIDER_KEY)];
    pairs.extend_from_slice(extra);
    AwsProvider::from_config(&config_for(&moto().endpoint, &pairs), CloudCalls::default())
        .await
        .expect("provider")
}

fn faults() -> Faults {
    Faults {
        access_key: Some(PROVIDER_KEY.to_owned()),
        ..Faults::default()
    }
}

async fn delete(provider: &AwsProvider, id: &str) -> Result<DeleteOutcome, Error> {
    tokio::time::timeout(PATIENCE, provider.delete_instance(id))
        .await
        .expect("the backend answers within its own deadline")
}

/// Every EC2 call hangs (held 600 s): the SDK's operation timeout ends the call as Unavailable
/// (retryable) long before, and the instance is untouched; without the hang it is terminated.
#[tokio::test(flavor = "multi_thread")]
async fn a_hang_ends_at_the_operation_timeout_as_unavailable() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    moto().set_faults(&Faults {
        hang_rate: 1.0,
        hang_for: Duration::from_secs(600),
        ..faults()
    });
    let provider = provider(&[("AWS_OPERATION_TIMEOUT_MS", "1000")]).await;

    let answer = delete(&provider, &ids[0]).await;

    assert!(
        matches!(answer, Err(Error::Unavailable { .. })),
        "{answer:?}"
    );
    assert!(moto().injected().hangs >= 1);
    assert_eq!(state_of(&client, &ids[0]).await, "running");
    moto().set_faults(&faults());
    assert_eq!(
        delete(&provider, &ids[0]).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert_eq!(state_of(&client, &ids[0]).await, "terminated");
}

/// Every EC2 call fails with 500 `InternalError`: the SDK retries, and the caller is told the
/// cloud is unavailable (retryable), not that anything is gone.
#[tokio::test(flavor = "multi_thread")]
async fn server_errors_are_retried_then_unavailable() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    moto().set_faults(&Faults {
        server_error_rate: 1.0,
        ..faults()
    });
    let provider = provider(&[("AWS_MAX_ATTEMPTS", "3")]).await;

    let answer = delete(&provider, &ids[0]).await;

    assert!(
        matches!(answer, Err(Error::Unavailable { .. })),
        "{answer:?}"
    );
    assert!(moto().injected().server_errors >= 2, "the SDK tried again");
    assert_eq!(state_of(&client, &ids[0]).await, "running");
}

/// Slow answers (latency on every call) still end with the instance terminated.
#[tokio::test(flavor = "multi_thread")]
async fn slow_answers_complete() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    moto().set_faults(&Faults {
        latency: Duration::from_millis(100),
        ..faults()
    });
    let provider = provider(&[]).await;

    assert_eq!(
        delete(&provider, &ids[0]).await.expect("deleted"),
        DeleteOutcome::Deleted
    );
    assert_eq!(state_of(&client, &ids[0]).await, "terminated");
    assert_eq!(moto().injected().hangs, 0);
}
