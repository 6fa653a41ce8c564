//! Leader fencing against the real API server (the local control plane): the leader's API traffic goes
//! through a TCP proxy that is then black-holed, as a partitioned node would see it. The leader stops its work
//! by itself, before the standby (with a working connection) starts its own, and the standby takes over.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use peerpods_runtime::leader::{LeaderConfig, lease_client, run_while_leader};
use testenv::proxy::Proxy;
use tokio_util::sync::CancellationToken;

const MINUTE: Duration = Duration::from_secs(60);

/// When one term of work started, and when it stopped if it did.
type Term = (Instant, Option<Instant>);

/// When each term of one replica's work started and stopped, as the work itself records it.
#[derive(Clone, Default)]
struct Terms(Arc<Mutex<Vec<Term>>>);

impl Terms {
    /// The work of one term: records its start when first polled and its stop when dropped.
    fn work(&self) -> impl Future<Output = ()> + use<> {
        let terms = self.clone();
        async move {
            let index = {
                let mut all = terms.0.lock().expect("terms");
                all.push((Instant::now(), None));
                all.len() - 1
            };
            let _stop = Stop { terms, index };
            std::future::pending::<()>().await
        }
    }

    fn snapshot(&self) -> Vec<Term> {
        self.0.lock().expect("terms").clone()
    }
}

struct Stop {
    terms: Terms,
    index: usize,
}

impl Drop for Stop {
    fn drop(&mut self) {
        self.terms.0.lock().expect("terms")[self.index].1 = Some(Instant::now());
    }
}

fn api_server() -> SocketAddr {
    testenv::shared()
        .server_url()
        .trim_start_matches("https://")
        .parse()
        .expect("the API server listens on an address")
}

/// An admin client whose every connection goes through `proxy`.
async fn client_through(proxy: &Proxy) -> kube::Client {
    let mut config = testenv::shared().config().await.expect("kubeconfig");
    config.cluster_url = format!("https://{}", proxy.addr())
        .parse()
        .expect("proxy URL");
    kube::Client::try_from(config).expect("client through the proxy")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_black_holed_leader_stops_working_before_the_standby_starts() {
    let direct = testenv::shared().client().await;
    let ns = testenv::namespace(&direct, "fence").await;
    let proxy = Proxy::start(api_server()).await.expect("proxy");
    let lease = |identity: &str| LeaderConfig {
        // A few seconds, so the test is quick; the margin is what orders the two replicas.
        lease_duration: Duration::from_secs(4),
        renew_before: Duration::from_secs(2),
        fence_margin: Some(Duration::from_secs(1)),
        ..LeaderConfig::new("fenced", ns.clone(), identity)
    };
    let stop = CancellationToken::new();

    let a_terms = Terms::default();
    let a = tokio::spawn(run_while_leader(
        client_through(&proxy).await,
        LeaderConfig {
            // Longer than the test: a hung renewal never returns an error here, so only the fence can stop A.
            call_timeout: Some(Duration::from_secs(600)),
            ..lease("replica-a")
        },
        stop.clone(),
        None,
        {
            let terms = a_terms.clone();
            move || terms.work()
        },
    ));
    testenv::wait_for("replica-a to lead", MINUTE, || async {
        (!a_terms.snapshot().is_empty()).then_some(())
    })
    .await;

    let b_terms = Terms::default();
    let b = tokio::spawn(run_while_leader(
        direct.clone(),
        lease("replica-b"),
        stop.clone(),
        None,
        {
            let terms = b_terms.clone();
            move || terms.work()
        },
    ));
    // A renews through the proxy while it works.
    let leases: Api<Lease> = Api::namespaced(direct.clone(), &ns);
    testenv::wait_for("replica-a to renew its Lease", MINUTE, || async {
        let spec = leases.get_opt("fenced").await.ok()??.spec?;
        (spec.holder_identity.as_deref() == Some("replica-a")
            && spec.renew_time != spec.acquire_time)
            .then_some(())
    })
    .await;

    proxy.black_hole();
    let cut_off = Instant::now();
    let b_started = testenv::wait_for("replica-b to take over", MINUTE, || async {
        b_terms.snapshot().first().map(|(start, _)| *start)
    })
    .await;
    let a_stopped = a_terms
        .snapshot()
        .iter()
        .map(|(start, stop)| {
            stop.unwrap_or_else(|| panic!("replica-a still works (term from {start:?})"))
        })
        .max()
        .expect("replica-a worked");
    assert!(
        a_stopped < b_started,
        "replica-a stopped {:?} after replica-b started",
        a_stopped.duration_since(b_started)
    );
    // Fencing is the order above: replica-b can only start once the Lease has expired, so replica-a stopping first
    // means it stopped within its lease. How long it took is printed, not asserted (a loaded machine delays timers).
    let stopped_after = a_stopped.duration_since(cut_off);
    eprintln!(
        "fencing: replica-a stopped {:.2}s after it was cut off and {:.2}s before replica-b started",
        stopped_after.as_secs_f64(),
        b_started.duration_since(a_stopped).as_secs_f64()
    );

    stop.cancel();
    b.await.expect("replica-b").expect("replica-b ends cleanly");
    a.abort();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lease_call_to_a_black_holed_api_server_gives_up_instead_of_hanging() {
    let direct = testenv::shared().client().await;
    let ns = testenv::namespace(&direct, "lease-timeout").await;
    let proxy = Proxy::start(api_server()).await.expect("proxy");
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let client = lease_client(client_through(&proxy).await, Duration::from_secs(1), {
        let seen = seen.clone();
        move |lease: &Lease| {
            seen.lock()
                .unwrap()
                .push(lease.metadata.name.clone().unwrap_or_default());
        }
    });
    let leases: Api<Lease> = Api::namespaced(client, &ns);
    let created = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("timed".into()),
            ..Default::default()
        },
        ..Lease::default()
    };
    leases
        .create(&Default::default(), &created)
        .await
        .expect("create through the proxy");
    leases.get("timed").await.expect("read through the proxy");
    assert_eq!(
        *seen.lock().expect("terms"),
        ["timed", "timed"],
        "every answer is seen"
    );

    proxy.black_hole();
    let started = Instant::now();
    let answer = tokio::time::timeout(MINUTE, leases.get("timed"))
        .await
        .expect("the call gives up by itself instead of hanging");
    let error = answer.expect_err("no answer through a black hole");
    assert!(error.to_string().contains("no answer within"), "{error}");
    eprintln!(
        "a Lease call gave up {:.2}s after the API server was cut off",
        started.elapsed().as_secs_f64()
    );
}

/// A leader told to stop lets its running work finish, still holding the Lease, and releases the Lease only then:
/// a reconcile that deleted a VM releases its finalizer instead of being dropped half-way. Work that does not
/// finish is dropped after the drain grace.
#[tokio::test(flavor = "multi_thread")]
async fn a_stopping_leader_drains_its_work_under_the_lease_then_releases_it() {
    let client = testenv::shared().client().await;
    let ns = testenv::namespace(&client, "drain").await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = |lease: Option<Lease>| lease.and_then(|l| l.spec?.holder_identity);
    let config = LeaderConfig {
        lease_duration: Duration::from_secs(4),
        renew_before: Duration::from_secs(2),
        drain_grace: MINUTE,
        ..LeaderConfig::new("drained", ns.clone(), "replica-a")
    };

    // The work, like a controller's, sees the shutdown itself, finishes what it runs, and notes who held the
    // Lease when it finished.
    let stop = CancellationToken::new();
    let finished = Arc::new(Mutex::new(None::<Option<String>>));
    let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let leader = tokio::spawn(run_while_leader(
        client.clone(),
        config,
        stop.clone(),
        None,
        {
            let (stop, leases, finished, started) = (
                stop.clone(),
                leases.clone(),
                finished.clone(),
                started.clone(),
            );
            move || {
                let (stop, leases, finished, started) = (
                    stop.clone(),
                    leases.clone(),
                    finished.clone(),
                    started.clone(),
                );
                async move {
                    started.store(true, std::sync::atomic::Ordering::SeqCst);
                    stop.cancelled().await;
                    // The last step of a running reconcile: one more API round trip.
                    let lease = leases.get_opt("drained").await.expect("read the Lease");
                    *finished.lock().expect("finished") = Some(holder(lease));
                }
            }
        },
    ));
    testenv::wait_for("replica-a to lead", MINUTE, || async {
        started
            .load(std::sync::atomic::Ordering::SeqCst)
            .then_some(())
    })
    .await;

    stop.cancel();
    tokio::time::timeout(MINUTE, leader)
        .await
        .expect("the leader stops once drained")
        .expect("leader task")
        .expect("leader ends cleanly");
    assert_eq!(
        *finished.lock().expect("finished"),
        Some(Some("replica-a".to_string())),
        "the running work finished, and did so while replica-a still held the Lease"
    );
    let after = holder(leases.get_opt("drained").await.expect("read the Lease"));
    assert_ne!(
        after.as_deref(),
        Some("replica-a"),
        "the Lease is released after the drain"
    );

    // Work that never finishes is dropped after the grace, and the Lease released all the same.
    let stop = CancellationToken::new();
    let config = LeaderConfig {
        lease_duration: Duration::from_secs(4),
        renew_before: Duration::from_secs(2),
        drain_grace: Duration::from_secs(1),
        ..LeaderConfig::new("stuck", ns.clone(), "replica-a")
    };
    let terms = Terms::default();
    let leader = tokio::spawn(run_while_leader(
        client.clone(),
        config,
        stop.clone(),
        None,
        {
            let terms = terms.clone();
            move || terms.work()
        },
    ));
    testenv::wait_for("replica-a to lead the second Lease", MINUTE, || async {
        (!terms.snapshot().is_empty()).then_some(())
    })
    .await;
    stop.cancel();
    tokio::time::timeout(MINUTE, leader)
        .await
        .expect("a stuck drain is bounded by its grace")
        .expect("leader task")
        .expect("leader ends cleanly");
    assert!(
        terms
            .snapshot()
            .iter()
            .all(|(_, stopped)| stopped.is_some()),
        "the stuck work was dropped"
    );
    let after = holder(leases.get_opt("stuck").await.expect("read the Lease"));
    assert_ne!(
        after.as_deref(),
        Some("replica-a"),
        "released after the grace"
    );
}
