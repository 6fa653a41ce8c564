//! A libvirt host that accepts the connection and never answers (a hung `qemu+` host): calls are
//! answered `Unavailable` after `LIBVIRT_CALL_TIMEOUT_SECS` instead of hanging, and the calls stuck
//! in libvirt hold at most `LIBVIRT_MAX_BLOCKING_CALLS` threads (and so connections), however many
//! callers keep asking. The real libvirt client library talks to a real socket.

use std::sync::Arc;

use peerpods_provider_core::{CloudCalls, Provider, ProviderConfig};
use peerpods_provider_libvirt::LibvirtProvider;
use test_support::silent_host::SilentHost;

#[tokio::test(flavor = "multi_thread")]
async fn a_silent_host_costs_bounded_threads_and_answers_unavailable() {
    let host = SilentHost::start().await;
    let uri = host.libvirt_uri();
    let config = ProviderConfig::from_pairs([
        ("LIBVIRT_URI", uri.as_str()),
        ("LIBVIRT_CALL_TIMEOUT_SECS", "1"),
        ("LIBVIRT_MAX_BLOCKING_CALLS", "2"),
    ]);
    let provider = Arc::new(LibvirtProvider::from_config(&config, CloudCalls::default()).unwrap());

    let calls: Vec<_> = (0..10)
        .map(|_| {
            let provider = provider.clone();
            tokio::spawn(async move { provider.capacity().await })
        })
        .collect();
    for call in calls {
        // Generous: only keeps a call that never ends from hanging the test.
        let answer = tokio::time::timeout(std::time::Duration::from_secs(60), call)
            .await
            .expect("the call is answered");
        let error = answer
            .unwrap()
            .expect_err("a silent host gives no capacity");
        assert_eq!(error.reason(), "CloudUnavailable", "{error}");
        assert!(
            error.to_string().contains("LIBVIRT_CALL_TIMEOUT_SECS"),
            "{error}"
        );
    }
    // Later callers waited for a thread slot and gave up there: no third thread, no third socket.
    let opened = host.connections();
    assert!(
        (1..=2).contains(&opened),
        "{opened} connections opened to the silent host"
    );
}

#[test]
fn timeouts_must_be_whole_seconds() {
    for (key, value) in [
        ("LIBVIRT_CALL_TIMEOUT_SECS", "0"),
        ("LIBVIRT_MAX_BLOCKING_CALLS", "many"),
    ] {
        let config = ProviderConfig::from_pairs([
            ("LIBVIRT_URI", "qemu+tcp://127.0.0.1:1/system"),
            (key, value),
        ]);
        let error = LibvirtProvider::from_config(&config, CloudCalls::default())
            .err()
            .expect("refused");
        assert!(error.to_string().contains(key), "{error}");
    }
}
