//! provider-service unavailable during a cleanup: the API writes stay bounded (a circuit breaker holds the
//! calls, a failure is written once per change of class), and every PeerPod is cleaned once it is back.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::{Controller, ControllerOptions, ProviderService, Scenario, unused_addr};
use futures::StreamExt;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use kube::runtime::watcher;

/// How long provider-service stays away once the PeerPods are deleted: with the scenario's 2 s retry cap, every
/// PeerPod would be retried about five times.
const OUTAGE: Duration = Duration::from_secs(10);

/// API writes made for the PeerPods of the namespace so far: every version of a PeerPod being deleted but the
/// deletion itself (a status patch or the finalizer release each make one), and every Event occurrence (a
/// create, or a series update).
async fn writes(s: &Scenario, versions: &Mutex<BTreeSet<(String, String)>>, n: usize) -> usize {
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(s.client.clone(), &s.ns);
    let event_writes: usize = events
        .list(&ListParams::default())
        .await
        .expect("list Events")
        .items
        .iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("PeerPod"))
        .map(|e| {
            e.series.as_ref().map_or(1, |series| {
                usize::try_from(series.count).unwrap_or(1).max(1)
            })
        })
        .sum();
    let seen = versions.lock().expect("versions").len();
    // Each PeerPod's deletion is one version that is not ours; a PeerPod whose deletion version the watch
    // has not shown yet makes this undercount by one, never overcount.
    seen.saturating_sub(n) + event_writes
}

#[tokio::test(flavor = "multi_thread")]
async fn an_outage_during_a_cleanup_costs_bounded_writes_and_every_peerpod_is_cleaned_after() {
    const N: usize = 100;
    let s = Scenario::start("outage").await;
    let addr = unused_addr();
    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(addr)).await;
    let mut vms = Vec::with_capacity(N);
    for i in 0..N {
        let vm = s.define_domain(false);
        s.create_peerpod(&format!("outage-{i}"), None, "libvirt", &vm)
            .await;
        vms.push(vm);
    }
    let api = s.peerpods();
    testenv::wait_for("the PeerPods created", Duration::from_secs(60), || async {
        (api.list(&ListParams::default()).await.ok()?.items.len() == N).then_some(())
    })
    .await;

    // Every version of a PeerPod being deleted, as (name, resourceVersion).
    let versions = Arc::new(Mutex::new(BTreeSet::<(String, String)>::new()));
    let watching = tokio::spawn({
        let versions = versions.clone();
        let stream = watcher(api.clone(), watcher::Config::default());
        async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                if let Ok(
                    watcher::Event::Apply(p)
                    | watcher::Event::InitApply(p)
                    | watcher::Event::Delete(p),
                ) = event
                    && p.metadata.deletion_timestamp.is_some()
                {
                    versions
                        .lock()
                        .expect("versions")
                        .insert((p.name_any(), p.resource_version().unwrap_or_default()));
                }
            }
        }
    });

    api.delete_collection(&DeleteParams::default(), &ListParams::default())
        .await
        .expect("delete all");
    tokio::time::sleep(OUTAGE).await;
    let during = writes(&s, &versions, N).await;
    let held = ctrl.metric(
        "peerpod_ctrl_instance_deletes_total",
        &[("provider", "libvirt"), ("result", "CircuitOpen")],
    );
    let failed = ctrl.metric(
        "peerpod_ctrl_instance_deletes_total",
        &[("provider", "libvirt"), ("result", "ProviderUnavailable")],
    );
    eprintln!(
        "outage of {OUTAGE:?}: {during} writes, {failed} calls failed, {held} calls held by the breaker"
    );
    // The PeerPod whose call opened the breaker and each failed probe write a condition and an Event once;
    // nothing else is written, however often the held PeerPods come back.
    assert!(
        during <= 20,
        "{during} writes during the outage ({failed} failed calls, {held} held)"
    );
    assert!(
        held >= N as u64,
        "every PeerPod was held back at least once: {held}"
    );
    let provider = ProviderService::start(Some(addr)).await;
    testenv::wait_for(
        "every PeerPod released",
        Duration::from_secs(300),
        || async {
            api.list(&ListParams::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        },
    )
    .await;
    assert!(
        vms.iter().all(|vm| !s.domain_exists(vm)),
        "every VM is deleted"
    );
    assert_eq!(provider.delete_calls("libvirt"), N as u64);
    // The watch has seen every release by now (each PeerPod's last version).
    testenv::wait_for(
        "the watch to see every release",
        Duration::from_secs(60),
        || async {
            let names: BTreeSet<String> = versions
                .lock()
                .expect("versions")
                .iter()
                .map(|(name, _)| name.clone())
                .collect();
            (names.len() == N).then_some(())
        },
    )
    .await;
    let total = writes(&s, &versions, N).await;
    watching.abort();
    // The success path costs two writes per PeerPod: its Event and the finalizer release.
    let success_path = 2 * N;
    eprintln!(
        "{N} PeerPods cleaned through a {OUTAGE:?} outage: {total} writes, {:.2}x the success path's {success_path}",
        total as f64 / success_path as f64
    );
    assert!(
        total * 10 <= success_path * 12,
        "{total} writes, more than 1.2x the success path's {success_path}"
    );
    ctrl.stop().await;
    s.cleanup().await;
}

/// A TCP proxy on 127.0.0.1 that holds every chunk from the client for [`SLOW`] before passing it on, and says when
/// the first one arrived: provider-service answering a DeleteInstance seconds after it was sent.
struct SlowProxy {
    addr: std::net::SocketAddr,
    seen: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

const SLOW: Duration = Duration::from_millis(700);

impl SlowProxy {
    async fn start(target: std::net::SocketAddr) -> SlowProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(tokio::sync::Notify::new());
        let notify = seen.clone();
        let task = tokio::spawn(async move {
            let mut connections = tokio::task::JoinSet::new();
            while let Ok((inbound, _)) = listener.accept().await {
                let notify = notify.clone();
                connections.spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let Ok(outbound) = tokio::net::TcpStream::connect(target).await else {
                        return;
                    };
                    let (mut from_client, mut to_client) = inbound.into_split();
                    let (mut from_server, mut to_server) = outbound.into_split();
                    let upstream = async move {
                        let mut buf = vec![0u8; 64 * 1024];
                        while let Ok(n) = from_client.read(&mut buf).await {
                            if n == 0 {
                                break;
                            }
                            notify.notify_one();
                            tokio::time::sleep(SLOW).await;
                            if to_server.write_all(&buf[..n]).await.is_err() {
                                break;
                            }
                        }
                    };
                    let downstream = tokio::io::copy(&mut from_server, &mut to_client);
                    let _ = tokio::join!(upstream, downstream);
                });
            }
        });
        SlowProxy { addr, seen, task }
    }
}

impl Drop for SlowProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Stopped while a DeleteInstance is on its way, the controller drains: the reconcile in flight gets its answer,
/// and releases the finalizer of the PeerPod whose VM it deleted, before the controller returns. Dropped instead,
/// the VM would be gone and the PeerPod still held, until a next controller asked again.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_controller_finishes_the_cleanup_in_flight() {
    let s = Scenario::start("drain").await;
    let provider = ProviderService::start(None).await;
    let proxy = SlowProxy::start(provider.addr).await;
    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(proxy.addr)).await;
    let vm = s.define_domain(false);
    s.create_peerpod("draining", None, "libvirt", &vm).await;
    s.delete_peerpod("draining").await;
    // The call is on its way (held by the proxy): stop the controller now.
    proxy.seen.notified().await;
    ctrl.stop().await;
    assert_eq!(provider.delete_calls("libvirt"), 1, "the call got through");
    assert!(!s.domain_exists(&vm));
    // No controller runs any more: only the drained reconcile can have released it.
    s.wait_peerpod_gone("draining", Duration::from_secs(10))
        .await;
    s.cleanup().await;
}
