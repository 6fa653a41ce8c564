//! Every HTTP attempt the SDK makes is counted and classified (`cloud_api_attempts`), the SDK's
//! own retries included: throttling that the SDK absorbed inside one call still shows. The fault
//! layer in front of moto answers EC2's throttling (HTTP 503 `RequestLimitExceeded`) and server
//! errors; moto counts every request it received per access key, which the attempts must match.

use std::sync::Arc;

use crate::aws_support::{SERIAL, config_for, moto, run_instances};
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::{ATTEMPT_RESULTS, CloudCalls, DeleteOutcome, Provider};
use test_support::moto::Faults;

/// The access key the provider signs with; faults and counts are scoped to it.
const PROVIDER_KEY: &str = "AKIDPROVIDERATTEMPTS";
/// Every operation the backend calls, and `other` for any the counter does not know.
const OPERATIONS: [&str; 7] = [
    "DescribeAccountAttributes",
    "DescribeAddresses",
    "DescribeInstances",
    "DisassociateAddress",
    "ReleaseAddress",
    "TerminateInstances",
    "other",
];

async fn provider(calls: &CloudCalls, extra: &[(&str, &str)]) -> Arc<AwsProvider> {
    let mut pairs = vec![("AWS_ACCESS_KEY_ID", PROVIDER_KEY)];
    pairs.extend_from_slice(extra);
    Arc::new(
        AwsProvider::from_config(&config_for(&moto().endpoint, &pairs), calls.clone())
            .await
            .expect("provider"),
    )
}

fn attempts(calls: &CloudCalls, operation: &'static str, result: &'static str) -> u64 {
    calls.attempts("aws", operation, result)
}

fn all_attempts(calls: &CloudCalls) -> u64 {
    OPERATIONS
        .iter()
        .flat_map(|op| ATTEMPT_RESULTS.iter().map(move |r| (*op, *r)))
        .map(|(op, r)| attempts(calls, op, r))
        .sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_the_sdk_retried_is_counted_per_attempt() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    moto().set_faults(&Faults {
        throttle_rate: 1.0,
        access_key: Some(PROVIDER_KEY.to_owned()),
        ..Faults::default()
    });
    let calls = CloudCalls::default();
    let provider = provider(&calls, &[("AWS_MAX_ATTEMPTS", "3")]).await;

    let error = provider.capacity().await.expect_err("throttled");
    assert_eq!(error.reason(), "Throttled", "{error}");
    // One call, counted once; its three attempts, each a throttling answer.
    assert_eq!(
        calls.count("aws", "DescribeAccountAttributes", "throttled"),
        1
    );
    assert_eq!(
        attempts(&calls, "DescribeAccountAttributes", "throttled"),
        3
    );
    assert_eq!(moto().injected().throttled, 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn every_request_moto_received_is_an_attempt_counted() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let ids = run_instances(&moto().client(), 5, &[]).await;
    moto().set_faults(&Faults {
        throttle_rate: 0.3,
        server_error_rate: 0.2,
        access_key: Some(PROVIDER_KEY.to_owned()),
        seed: 23,
        ..Faults::default()
    });
    let calls = CloudCalls::default();
    let provider = provider(
        &calls,
        &[
            ("AWS_MAX_ATTEMPTS", "10"),
            ("AWS_DELETE_BATCH_MAX_IDS", "1"),
        ],
    )
    .await;

    for _ in 0..3 {
        let _ = provider.capacity().await;
    }
    for id in &ids {
        // Retried until it goes through: every attempt on the way is counted.
        let mut deleted = false;
        for _ in 0..20 {
            if let Ok(outcome) = provider.delete_instance(id).await {
                // A delete whose confirmation failed is confirmed by the next ask.
                assert!(
                    matches!(outcome, DeleteOutcome::Deleted | DeleteOutcome::AlreadyGone),
                    "{outcome:?}"
                );
                deleted = true;
                break;
            }
        }
        assert!(deleted, "{id} not deleted");
    }

    let received: u64 = moto().requests_signed_by(PROVIDER_KEY).values().sum();
    let injected = moto().injected();
    let counted: Vec<String> = OPERATIONS
        .iter()
        .flat_map(|op| ATTEMPT_RESULTS.iter().map(move |r| (*op, *r)))
        .filter_map(|(op, r)| {
            let n = attempts(&calls, op, r);
            (n > 0).then(|| format!("{op}/{r}={n}"))
        })
        .collect();
    assert_eq!(
        all_attempts(&calls),
        received,
        "every request is an attempt: {counted:?} against {:?}",
        moto().requests_signed_by(PROVIDER_KEY)
    );
    let throttled: u64 = OPERATIONS
        .iter()
        .map(|op| attempts(&calls, op, "throttled"))
        .sum();
    let server_errors: u64 = OPERATIONS
        .iter()
        .map(|op| attempts(&calls, op, "server_error"))
        .sum();
    assert_eq!(throttled, injected.throttled);
    assert_eq!(server_errors, injected.server_errors);
    assert!(throttled > 0 && server_errors > 0, "both faults occurred");
}
