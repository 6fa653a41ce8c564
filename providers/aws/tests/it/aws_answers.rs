//! EC2's documented answers that are neither success nor a permanent refusal, produced with
//! EC2's own XML error body by the fault layer in front of moto (`test_support::moto::Faults`,
//! its `refuse` knob) and driven through the real AWS SDK: an instance in a state that does not
//! allow `TerminateInstances` yet (`IncorrectInstanceState`) is waited for, not an internal error,
//! and is terminated once its state allows it; `RequestLimitExceeded` is throttling.

use crate::aws_support::{SERIAL, config_for, moto, run_instances, state_of};
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider};
use test_support::moto::{Ec2Refusal, Faults};

/// The access key the provider signs with; faults are scoped to it.
const PROVIDER_KEY: &str = "AKIDPROVIDERANSWERS";

async fn provider() -> AwsProvider {
    AwsProvider::from_config(
        &config_for(
            &moto().endpoint,
            &[
                ("AWS_ACCESS_KEY_ID", PROVIDER_KEY),
                ("AWS_MAX_ATTEMPTS", "1"),
            ],
        ),
        CloudCalls::default(),
    )
    .await
    .expect("provider")
}

fn refusing(refusal: Ec2Refusal) -> Faults {
    Faults {
        access_key: Some(PROVIDER_KEY.to_owned()),
        refuse: Some(refusal),
        ..Faults::default()
    }
}

/// `IncorrectInstanceState` to `TerminateInstances` (three times here) is a refusal for the state
/// the instance is in now: the deletion waits, looks again and asks again, and ends once the
/// state allows it (the old code answered a retryable error instead).
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_in_a_transitional_state_is_waited_for_then_terminated() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    let provider = provider().await;
    moto().set_faults(&refusing(Ec2Refusal::incorrect_instance_state(
        "TerminateInstances",
        3,
    )));

    let answer = provider.delete_instance(&ids[0]).await;

    assert_eq!(answer.expect("deleted"), DeleteOutcome::Deleted);
    assert_eq!(moto().injected().refused, 3);
    assert_eq!(provider.api_calls("TerminateInstances"), 4);
    assert_eq!(state_of(&client, &ids[0]).await, "terminated");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_request_limit_on_terminate_is_throttling() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    let provider = provider().await;
    moto().set_faults(&refusing(Ec2Refusal::request_limit_exceeded(
        "TerminateInstances",
        10,
    )));

    let answer = provider.delete_instance(&ids[0]).await;

    assert!(
        matches!(&answer, Err(Error::Throttled { .. })),
        "{answer:?}"
    );
    assert_eq!(state_of(&client, &ids[0]).await, "running");
    moto().set_faults(&Faults::default());
    assert_eq!(
        provider.delete_instance(&ids[0]).await.expect("later"),
        DeleteOutcome::Deleted
    );
}
