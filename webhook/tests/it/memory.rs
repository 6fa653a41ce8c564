//! The webhook's memory under large admission requests, measured on the real binary (`VmHWM`, the peak resident
//! set the kernel reports): a request's memory follows its size (the Pod is read into the view the mutation
//! needs, not a JSON tree plus a full Pod), and many large requests at once stay within the admission budget
//! (`ADMISSION_BUDGET_BYTES`): each waits for its share before its body is read, or is shed with HTTP 429, and
//! every request gets an answer.

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};

use crate::support::{Pair, caa::patched, post_tls};
use peerpods_webhook::server::{ADMISSION_BUDGET_BYTES, MAX_REVIEW_BYTES, WEBHOOK_PATH};
use serde_json::{Value, json};

/// The most memory a decision may take, as a multiple of its request body: the body, the view of the Pod, the
/// patch (one operation per container) and the answer, which carries the patch as a JSON array of numbers.
const PER_BODY_FACTOR: usize = 20;
/// What each open connection may hold besides its share (TLS and HTTP buffers).
const PER_CONNECTION: usize = 512 * 1024;
/// Large requests sent at once: without the budget they would be decided together.
const CONCURRENT: usize = 12;
const MIB: f64 = 1024.0 * 1024.0;

/// The real webhook binary on 127.0.0.1, stopped on drop.
struct Process {
    child: Child,
    addr: SocketAddr,
    _cert_dir: tempfile::TempDir,
}

impl Process {
    fn start(pair: &Pair) -> Process {
        let cert_dir = tempfile::tempdir().unwrap();
        pair.write_to(cert_dir.path());
        let addr = free_addr();
        let child = Command::new(env!("CARGO_BIN_EXE_peerpods-webhook"))
            .env("WEBHOOK_BIND_ADDRESS", addr.to_string())
            .env("HEALTH_PROBE_BIND_ADDRESS", "0")
            .env("CERT_DIR", cert_dir.path())
            .env("RUST_LOG", "error")
            // What is measured is memory: a body read slowly on a busy machine must not be refused as too slow.
            .env("BODY_READ_TIMEOUT", "5m")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        Process {
            child,
            addr,
            _cert_dir: cert_dir,
        }
    }

    /// `VmHWM` of the process, in bytes.
    fn peak_rss(&self) -> usize {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap();
        let kib: usize = status
            .lines()
            .find_map(|l| l.strip_prefix("VmHWM:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        kib * 1024
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn free_addr() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

/// A peer pod's creation with `containers` one-line containers, each asking for a little CPU: each gets a patch
/// operation clearing its resources, the largest answer a request of this size can get.
fn review(uid: &str, containers: usize) -> Value {
    let containers: Vec<Value> = (0..containers)
        .map(|i| json!({"name": format!("c{i}"), "image": "i", "resources": {"requests": {"cpu": "1m"}}}))
        .collect();
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "apps",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"generateName": "big-", "namespace": "apps"},
                "spec": {"runtimeClassName": "kata-remote", "containers": containers}
            }
        }
    })
}

/// Containers that make a review just under the webhook's body limit.
fn containers_for_limit() -> usize {
    let per = serde_json::to_vec(&review("u", 1000)).unwrap().len() as f64 / 1000.0;
    ((MAX_REVIEW_BYTES as f64 * 0.9) / per) as usize
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn large_admissions_at_once_stay_within_the_budget_and_each_is_answered() {
    let pair = Pair::issue();
    let webhook = Process::start(&pair);
    let small = serde_json::to_vec(&review("warm-up", 1)).unwrap();
    crate::support::eventually("the webhook listens", || async {
        tokio::net::TcpStream::connect(webhook.addr).await.ok()
    })
    .await;
    crate::support::eventually("the webhook serves", || async {
        post_tls(webhook.addr, &pair.ca, WEBHOOK_PATH, &small)
            .await
            .ok()
            .filter(|r| r.status == 200)
    })
    .await;
    let base = webhook.peak_rss();

    // One largest request alone: what one decision takes.
    let containers = containers_for_limit();
    let one = review("alone", containers);
    let body = serde_json::to_vec(&one).unwrap();
    assert!(body.len() < MAX_REVIEW_BYTES, "{} bytes", body.len());
    let answer = post_tls(webhook.addr, &pair.ca, WEBHOOK_PATH, &body)
        .await
        .unwrap();
    assert_eq!(answer.status, 200);
    let response = answer.json()["response"].clone();
    assert_eq!(response["uid"], "alone", "{}", response["status"]);
    assert_eq!(response["allowed"], true, "{}", response["status"]);
    assert!(
        response.get("patch").is_some(),
        "no patch: {}",
        response["status"]
    );
    let pod = patched(&one["request"]["object"], &response);
    assert_eq!(
        pod["spec"]["containers"][containers - 1]["resources"],
        json!({})
    );
    let alone = webhook.peak_rss() - base;
    println!(
        "{containers} containers, {:.1} MiB body: peak RSS {:.1} MiB at rest, +{:.1} MiB for one decision ({:.1}x its body)",
        body.len() as f64 / MIB,
        base as f64 / MIB,
        alone as f64 / MIB,
        alone as f64 / body.len() as f64
    );
    assert!(
        alone <= PER_BODY_FACTOR * body.len(),
        "one decision took {:.1} MiB, more than {PER_BODY_FACTOR}x its {:.1} MiB body",
        alone as f64 / MIB,
        body.len() as f64 / MIB
    );
    drop(one);

    // Many at once, each over its own connection (all spawned before any is awaited).
    let sends: Vec<_> = (0..CONCURRENT)
        .map(|_| {
            let body = body.clone();
            let ca = pair.ca.clone();
            let addr = webhook.addr;
            tokio::spawn(async move { post_tls(addr, &ca, WEBHOOK_PATH, &body).await })
        })
        .collect();
    let (mut mutated, mut shed) = (0, 0);
    for send in sends {
        let answer = send.await.unwrap().unwrap();
        match answer.status {
            200 => {
                assert_eq!(answer.json()["response"]["allowed"], true);
                mutated += 1;
            }
            429 => {
                assert_eq!(answer.json()["code"], 429, "{}", answer.text());
                shed += 1;
            }
            other => panic!("HTTP {other}: {}", answer.text()),
        }
    }
    let peak = webhook.peak_rss();
    let bound = base + PER_BODY_FACTOR * ADMISSION_BUDGET_BYTES + CONCURRENT * PER_CONNECTION;
    println!(
        "{CONCURRENT} at once: {mutated} mutated, {shed} shed; peak RSS {:.1} MiB (bound {:.1} MiB)",
        peak as f64 / MIB,
        bound as f64 / MIB
    );
    assert!(mutated >= 1, "none decided");
    assert!(
        peak <= bound,
        "peak RSS {:.1} MiB over the bound {:.1} MiB",
        peak as f64 / MIB,
        bound as f64 / MIB
    );
    // Still serving once the burst is over.
    let after = post_tls(webhook.addr, &pair.ca, WEBHOOK_PATH, &small)
        .await
        .unwrap();
    assert_eq!(after.status, 200);
}
