//! Every libvirt attempt is counted in `cloud_api_attempts`, as the HTTP backends count theirs:
//! `ok` when libvirt answered, `client_error` when it refused the call, `transport_error` when
//! there was no connection or no answer in time. The real libvirt client library, against its
//! in-memory test driver and real sockets.

use std::time::Duration;

use peerpods_provider_core::{CloudCalls, DeleteOutcome, Provider, ProviderConfig};
use peerpods_provider_libvirt::LibvirtProvider;
use test_support::silent_host::SilentHost;

fn attempts(calls: &CloudCalls, operation: &'static str, result: &'static str) -> u64 {
    calls.attempts("libvirt", operation, result)
}

#[tokio::test(flavor = "multi_thread")]
async fn answers_and_refusals_of_libvirt_are_counted() {
    let calls = CloudCalls::default();
    let config =
        ProviderConfig::from_pairs([("LIBVIRT_URI", "test:///default")]).for_development(true);
    let provider = LibvirtProvider::from_config(&config, calls.clone()).unwrap();

    provider.capacity().await.unwrap();
    // The test driver's own domain, `test`: deleted, then already gone.
    let test_domain = "6695eb01-f6a4-8304-79aa-97f2502e193f";
    let deleted = provider.delete_instance(test_domain).await.unwrap();
    assert_eq!(deleted, DeleteOutcome::Deleted);
    let gone = provider.delete_instance(test_domain).await.unwrap();
    assert_eq!(gone, DeleteOutcome::AlreadyGone);
    // Not a UUID: libvirt refuses the lookup (the API layer would have refused it first).
    provider.delete_instance("not-a-uuid").await.unwrap_err();

    assert_eq!(attempts(&calls, "capacity", "ok"), 1);
    // Looked up, destroyed and undefined, looked up again (gone); looked up (gone).
    assert_eq!(attempts(&calls, "look_up_domain", "ok"), 3);
    assert_eq!(attempts(&calls, "delete_domain", "ok"), 1);
    assert_eq!(attempts(&calls, "look_up_domain", "client_error"), 1);
    assert_eq!(attempts(&calls, "look_up_domain", "transport_error"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_host_that_refuses_the_connection_is_a_transport_error() {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let calls = CloudCalls::default();
    let uri = format!("qemu+tcp://127.0.0.1:{port}/system");
    let config = ProviderConfig::from_pairs([
        ("LIBVIRT_URI", uri.as_str()),
        ("LIBVIRT_CALL_TIMEOUT_SECS", "30"),
    ]);
    let provider = LibvirtProvider::from_config(&config, calls.clone()).unwrap();

    let error = provider.capacity().await.unwrap_err();

    assert_eq!(error.reason(), "CloudUnavailable", "{error}");
    assert_eq!(attempts(&calls, "capacity", "transport_error"), 1);
    assert_eq!(attempts(&calls, "capacity", "ok"), 0);
}

/// A host that accepts the connection and never answers: each call that reached libvirt (got one
/// of the `LIBVIRT_MAX_BLOCKING_CALLS` threads) is one `transport_error` attempt, counted when the
/// caller stops waiting, although its thread is still stuck in libvirt; the callers that gave up
/// waiting for a thread made no attempt.
#[tokio::test(flavor = "multi_thread")]
async fn an_attempt_the_host_never_answers_is_a_transport_error() {
    let host = SilentHost::start().await;
    let calls = CloudCalls::default();
    let uri = host.libvirt_uri();
    let config = ProviderConfig::from_pairs([
        ("LIBVIRT_URI", uri.as_str()),
        ("LIBVIRT_CALL_TIMEOUT_SECS", "1"),
        ("LIBVIRT_MAX_BLOCKING_CALLS", "2"),
    ]);
    let provider =
        std::sync::Arc::new(LibvirtProvider::from_config(&config, calls.clone()).unwrap());

    let tasks: Vec<_> = (0..5)
        .map(|_| {
            let provider = provider.clone();
            tokio::spawn(async move { provider.capacity().await })
        })
        .collect();
    for task in tasks {
        // Generous: only keeps a call that never ends from hanging the test.
        let answer = tokio::time::timeout(Duration::from_secs(60), task)
            .await
            .expect("the call is answered");
        answer
            .unwrap()
            .expect_err("a silent host gives no capacity");
    }

    assert_eq!(attempts(&calls, "capacity", "transport_error"), 2);
    assert_eq!(attempts(&calls, "capacity", "ok"), 0);
    assert_eq!(calls.count("libvirt", "capacity", "error"), 5);
}
