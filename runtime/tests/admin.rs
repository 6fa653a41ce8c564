//! The admin server over real HTTP on 127.0.0.1: liveness, readiness driven by the shared
//! state, and Prometheus metrics from the registry.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

use std::sync::Arc;

use peerpods_runtime::admin::{AdminServer, Readiness};
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

async fn get(addr: std::net::SocketAddr, path: &str) -> (u16, String) {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.unwrap();
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn health_readiness_and_metrics() {
    let mut registry = prometheus_client::registry::Registry::default();
    let counter = Counter::<u64>::default();
    registry.register("deletes", "Instance deletes", counter.clone());
    counter.inc();
    let readiness = Readiness::default();
    let admin = AdminServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        readiness.clone(),
        Arc::new(registry),
    )
    .await
    .unwrap();
    let addr = admin.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(admin.serve(async move { stop.cancelled().await }));

    assert_eq!(get(addr, "/healthz").await.0, 200);

    // Nothing registered yet: not ready.
    assert_eq!(get(addr, "/readyz").await.0, 503);
    readiness.set("grpc", true, "listening");
    readiness.set("leader", false, "waiting for the Lease");
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503);
    assert!(
        body.contains("leader: not ready: waiting for the Lease"),
        "{body}"
    );
    readiness.set("leader", true, "");
    assert_eq!(get(addr, "/readyz").await.0, 200);

    let (code, body) = get(addr, "/metrics").await;
    assert_eq!(code, 200);
    assert!(body.contains("deletes_total 1"), "{body}");

    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// A clock the test moves by hand.
#[derive(Debug)]
struct Manual(std::sync::Mutex<std::time::Instant>);

impl peerpods_runtime::health::Clock for Manual {
    fn now(&self) -> std::time::Instant {
        *self.0.lock().unwrap()
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_fails_while_a_watch_is_stalled() {
    use peerpods_runtime::health::Liveness;
    use std::time::{Duration, Instant};

    let clock = Arc::new(Manual(std::sync::Mutex::new(Instant::now())));
    let liveness = Liveness::with_clock(Duration::from_secs(60), clock.clone());
    let admin = AdminServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Readiness::default(),
        Arc::new(prometheus_client::registry::Registry::default()),
    )
    .await
    .unwrap()
    .with_liveness(liveness.clone());
    let addr = admin.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(admin.serve(async move { stop.cancelled().await }));

    assert_eq!(get(addr, "/healthz").await, (200, "ok\n".to_owned()));
    let progress = liveness.track("watch/peerpods", None);
    assert_eq!(get(addr, "/healthz").await.0, 200);
    *clock.0.lock().unwrap() += Duration::from_secs(61);
    let (code, body) = get(addr, "/healthz").await;
    assert_eq!(code, 503);
    assert!(
        body.contains("watch/peerpods: stalled: no progress for 61s (limit 60s)"),
        "{body}"
    );
    progress.tick();
    assert_eq!(
        get(addr, "/healthz").await,
        (200, "watch/peerpods: ok\n".to_owned())
    );

    shutdown.cancel();
    task.await.unwrap().unwrap();
}
