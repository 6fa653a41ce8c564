//! The admin server over real HTTP on 127.0.0.1: liveness, readiness driven by the shared
//! state, and Prometheus metrics from the registry.

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

/// A watch without progress (the API server away) makes the service not ready, and leaves it live: a restart
/// would not bring the API server back. Only a local loop without progress (a deadlock) fails `/healthz`.
#[tokio::test(flavor = "multi_thread")]
async fn a_stalled_watch_fails_readyz_and_only_a_stalled_loop_fails_healthz() {
    use peerpods_runtime::health::Liveness;
    use std::time::{Duration, Instant};

    let clock = Arc::new(Manual(std::sync::Mutex::new(Instant::now())));
    let liveness = Liveness::with_clock(Duration::from_secs(60), clock.clone());
    let readiness = Readiness::default();
    let admin = AdminServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        readiness.clone(),
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
    let watch = liveness.track("watch/peerpods", Some(readiness.clone()));
    let reconcile = liveness.track_loop("loop/reconcile");
    watch.synced();
    assert_eq!(get(addr, "/readyz").await.0, 200);
    *clock.0.lock().unwrap() += Duration::from_secs(61);
    reconcile.tick();
    let (code, body) = get(addr, "/readyz").await;
    assert_eq!(code, 503, "{body}");
    assert!(
        body.contains("watch/peerpods: stalled: no progress for 61s (limit 60s)"),
        "{body}"
    );
    assert_eq!(
        get(addr, "/healthz").await,
        (200, "loop/reconcile: ok\n".to_owned()),
        "a stalled watch is no reason to restart"
    );
    watch.tick();
    assert_eq!(get(addr, "/readyz").await.0, 200);

    *clock.0.lock().unwrap() += Duration::from_secs(61);
    watch.tick();
    let (code, body) = get(addr, "/healthz").await;
    assert_eq!(code, 503);
    assert!(
        body.contains("loop/reconcile: stalled: no progress for 61s (limit 60s)"),
        "{body}"
    );
    reconcile.tick();
    assert_eq!(get(addr, "/healthz").await.0, 200);

    shutdown.cancel();
    task.await.unwrap().unwrap();
}

/// Asked to stop, a controller first turns not ready, then drains: while its work in flight finishes, `/readyz`
/// answers 503 naming the shutdown and `/healthz` still answers 200; the admin server stops only after the
/// controller returned.
#[cfg(feature = "controller")]
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_controller_is_not_ready_while_it_drains() {
    use peerpods_runtime::binary::{SHUTDOWN, Started, serve_until};
    use peerpods_runtime::health::Health;

    let health = Health::default();
    let admin = AdminServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        health.readiness.clone(),
        Arc::new(prometheus_client::registry::Registry::default()),
    )
    .await
    .unwrap()
    .with_liveness(health.liveness.clone());
    let addr = admin.local_addr().unwrap();
    let (draining_tx, draining_rx) = tokio::sync::oneshot::channel::<()>();
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = CancellationToken::new();
    let run = serve_until(
        admin,
        health,
        move |Started { shutdown, health }| async move {
            health.readiness.set("work", true, "");
            shutdown.cancelled().await;
            // The work in flight: held until the test has looked.
            let _ = draining_tx.send(());
            let _ = drained_rx.await;
            Ok(())
        },
        stop.clone().cancelled_owned(),
    );
    let look = async {
        testenv::wait_for("ready", std::time::Duration::from_secs(60), || async {
            (get(addr, "/readyz").await.0 == 200).then_some(())
        })
        .await;
        stop.cancel();
        draining_rx.await.unwrap();
        let (code, body) = get(addr, "/readyz").await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains(&format!("{SHUTDOWN}: not ready")), "{body}");
        assert_eq!(get(addr, "/healthz").await.0, 200, "draining is alive");
        drained_tx.send(()).unwrap();
    };
    let (result, ()) = tokio::join!(run, look);
    result.unwrap();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the admin server stops with the controller"
    );
}
