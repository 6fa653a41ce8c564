//! Malformed admission requests, made by a fuzz-ish generator from one valid review (cut off, fields missing,
//! fields of the wrong type, other operations and kinds, no uid, quantities no API server would send, huge and
//! deeply nested bodies): ours answers every one over HTTPS with an AdmissionReview (refused with 400 or 413 and
//! the reason when it cannot be read), never drops a connection and keeps serving. The same inputs then go to
//! cloud-api-adaptor's webhook (the Go reference), and what it does with them is printed: the ones it answers
//! with a recovered panic or not at all are listed in `docs/webhook.md`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::caa::{CaaReference, patched};
use crate::support::{Pair, Webhook, get, post_tls};
use peerpods_webhook::mutation::{Target, VCPUS_ANNOTATION};
use peerpods_webhook::server::WEBHOOK_PATH;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// A generous bound on one answer from ours: far above the API server's 10 s webhook timeout, so only a hang
/// trips it.
const OURS_DEADLINE: Duration = Duration::from_secs(30);
/// How long the upstream reference is given per input before it counts as not answering.
const UPSTREAM_PATIENCE: Duration = Duration::from_secs(5);
/// The largest AdmissionReview either webhook reads (controller-runtime's limit, which ours keeps).
const LIMIT: usize = 7 * 1024 * 1024;

fn peer_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "apps",
        "annotations": {"team": "payments"}},
        "spec": {"runtimeClassName": "kata-remote",
            "initContainers": [{"name": "init", "image": "busybox", "resources": {"limits": {"cpu": "250m"}}}],
            "containers": [
                {"name": "web", "image": "nginx", "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}},
                {"name": "sidecar", "image": "envoy", "resources": {"requests": {"cpu": "500m"}}}]}})
}

fn valid() -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "apps",
            "operation": "CREATE",
            "userInfo": {"username": "alice"},
            "object": peer_pod(),
            "oldObject": null,
            "dryRun": false
        }
    })
}

/// `valid()` with `change` applied at the JSON pointer `at`: `None` removes the member.
fn with(at: &str, change: Option<Value>) -> Value {
    let mut review = valid();
    let (parent, key) = at.rsplit_once('/').unwrap();
    let parent = review.pointer_mut(parent).unwrap();
    match (parent, change) {
        (Value::Object(map), None) => {
            map.remove(key);
        }
        (Value::Object(map), Some(value)) => {
            map.insert(key.to_owned(), value);
        }
        (Value::Array(list), None) => {
            list.remove(key.parse().unwrap());
        }
        (Value::Array(list), Some(value)) => list[key.parse::<usize>().unwrap()] = value,
        (other, _) => panic!("{at} is below {other}"),
    }
    review
}

fn bytes(value: &Value) -> Vec<u8> {
    serde_json::to_vec(value).unwrap()
}

/// A deterministic stream of bytes (xorshift64*).
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed | 1;
    (0..len)
        .map(|_| {
            state ^= state >> 12;
            state ^= state << 25;
            state ^= state >> 27;
            state.wrapping_mul(0x2545_f491_4f6c_dd1d).to_le_bytes()[7]
        })
        .collect()
}

/// The generated inputs, by category: (category, label, body).
fn inputs() -> Vec<(&'static str, String, Vec<u8>)> {
    let mut out: Vec<(&'static str, String, Vec<u8>)> = Vec::new();
    let whole = bytes(&valid());

    for text in [
        "",
        "null",
        "[]",
        "{}",
        "\"review\"",
        "7",
        "true",
        "{\"request\":null}",
        "{\"kind\": 7",
    ] {
        out.push((
            "not a review",
            format!("{text:?}"),
            text.as_bytes().to_vec(),
        ));
    }
    for seed in 1..=8 {
        out.push((
            "not a review",
            format!("noise {seed}"),
            noise(seed, 64 << seed),
        ));
    }
    for part in 1..16 {
        let cut = whole.len() * part / 16;
        out.push((
            "cut off",
            format!("first {cut} bytes"),
            whole[..cut].to_vec(),
        ));
    }

    let fields = [
        "/apiVersion",
        "/kind",
        "/request",
        "/request/uid",
        "/request/kind",
        "/request/kind/kind",
        "/request/resource",
        "/request/operation",
        "/request/userInfo",
        "/request/dryRun",
        "/request/object",
        "/request/object/apiVersion",
        "/request/object/kind",
        "/request/object/metadata",
        "/request/object/metadata/annotations",
        "/request/object/spec",
        "/request/object/spec/runtimeClassName",
        "/request/object/spec/containers",
        "/request/object/spec/containers/0",
        "/request/object/spec/containers/0/name",
        "/request/object/spec/containers/0/resources",
        "/request/object/spec/containers/0/resources/requests",
        "/request/object/spec/containers/0/resources/requests/cpu",
        "/request/object/spec/initContainers",
    ];
    for at in fields {
        out.push(("missing", at.to_owned(), bytes(&with(at, None))));
        for wrong in [
            json!(null),
            json!(7),
            json!(-1.5),
            json!("x"),
            json!(true),
            json!([]),
            json!({}),
        ] {
            out.push((
                "wrong type",
                format!("{at} = {wrong}"),
                bytes(&with(at, Some(wrong))),
            ));
        }
    }

    for uid in [json!(""), json!(7), json!("u".repeat(1 << 20))] {
        let label = format!("uid {}", &uid.to_string()[..uid.to_string().len().min(12)]);
        out.push(("uid", label, bytes(&with("/request/uid", Some(uid)))));
    }
    out.push(("uid", "no uid".into(), bytes(&with("/request/uid", None))));

    for operation in ["UPDATE", "CONNECT", "create", "", "PATCH"] {
        let mut review = with("/request/operation", Some(operation.into()));
        review["request"]["oldObject"] = peer_pod();
        out.push(("operation", format!("{operation:?}"), bytes(&review)));
    }
    let mut delete = with("/request/operation", Some("DELETE".into()));
    delete["request"]["object"] = Value::Null;
    delete["request"]["oldObject"] = peer_pod();
    out.push(("operation", "DELETE".into(), bytes(&delete)));

    let other_kind = |group: &str, kind: &str, resource: &str, object: Value| {
        let mut review = valid();
        review["request"]["kind"] = json!({"group": group, "version": "v1", "kind": kind});
        review["request"]["resource"] =
            json!({"group": group, "version": "v1", "resource": resource});
        review["request"]["object"] = object;
        review
    };
    out.push((
        "kind",
        "ConfigMap".into(),
        bytes(&other_kind(
            "",
            "ConfigMap",
            "configmaps",
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}),
        )),
    ));
    out.push((
        "kind",
        "Deployment".into(),
        bytes(&other_kind(
            "apps",
            "Deployment",
            "deployments",
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                   "spec": {"template": {"spec": peer_pod()["spec"]}}}),
        )),
    ));
    out.push((
        "kind",
        "a Deployment sent as a Pod".into(),
        bytes(&with(
            "/request/object",
            Some(
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"},
                        "spec": {"replicas": 3}}),
            ),
        )),
    ));
    let mut binding = valid();
    binding["request"]["subResource"] = "binding".into();
    binding["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "Binding"});
    binding["request"]["object"] = json!({"apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "web"}, "target": {"kind": "Node", "name": "n1"}});
    out.push(("kind", "pods/binding".into(), bytes(&binding)));

    let cpu = "/request/object/spec/containers/0/resources/limits/cpu";
    let huge_digits = "9".repeat(100_000);
    for quantity in [
        "-1",
        "1.2.3",
        "",
        "1Qi",
        "0x10",
        " 1",
        "NaN",
        "1e",
        "+",
        ".",
        "1e2147483648",
        "123456789012345678901234567890Ei",
        huge_digits.as_str(),
    ] {
        let label = format!("cpu {:?}", &quantity[..quantity.len().min(16)]);
        out.push(("quantity", label, bytes(&with(cpu, Some(quantity.into())))));
    }

    let mut many = valid();
    many["request"]["object"]["spec"]["containers"] = Value::Array(
        (0..5000)
            .map(|i| json!({"name": format!("c{i}"), "image": "app", "resources": {"requests": {"cpu": "10m"}}}))
            .collect(),
    );
    out.push(("size", "5000 containers".into(), bytes(&many)));
    for (label, len) in [
        ("a 6 MiB annotation", 6 << 20),
        ("an 8 MiB annotation", 8 << 20),
    ] {
        let mut big = valid();
        big["request"]["object"]["metadata"]["annotations"]["big"] = "x".repeat(len).into();
        out.push(("size", label.into(), bytes(&big)));
    }
    for (label, open, close) in [("arrays", "[", "]"), ("objects", "{\"a\":", "}")] {
        let depth = 100_000;
        let nested = format!("{}1{}", open.repeat(depth), close.repeat(depth));
        let text = String::from_utf8(whole.clone()).unwrap().replacen(
            "\"spec\":{",
            &format!("\"spec\":{{\"futureField\":{nested},"),
            1,
        );
        out.push(("size", format!("{depth} nested {label}"), text.into_bytes()));
    }

    // Quantities whose exponent asks for a number of a billion digits: sent last, as they may keep upstream
    // busy for the rest of the run.
    for quantity in ["1e999999999", "1e-999999999"] {
        out.push((
            "quantity",
            format!("cpu {quantity:?}"),
            bytes(&with(cpu, Some(quantity.into()))),
        ));
    }
    out
}

/// What one webhook did with an input.
fn ours_outcome(label: &str, status: u16, body: &[u8]) -> String {
    assert_eq!(status, 200, "{label}: {}", String::from_utf8_lossy(body));
    let review: Value = serde_json::from_slice(body)
        .unwrap_or_else(|e| panic!("{label}: not JSON ({e}): {}", String::from_utf8_lossy(body)));
    assert_eq!(
        review["apiVersion"], "admission.k8s.io/v1",
        "{label}: {review}"
    );
    assert_eq!(review["kind"], "AdmissionReview", "{label}: {review}");
    let response = &review["response"];
    match response["allowed"].as_bool() {
        Some(true) => "allowed".into(),
        Some(false) => {
            let code = response["status"]["code"].as_i64().unwrap_or_default();
            let message = response["status"]["message"].as_str().unwrap_or_default();
            assert!(
                [400, 413].contains(&code) && !message.is_empty(),
                "{label}: {response}"
            );
            format!("refused {code}")
        }
        None => panic!("{label}: no allowed in {response}"),
    }
}

/// Posts `body` to ours. A body over the webhook's limit is sent as its first `LIMIT + 1` bytes: the webhook
/// stops reading once past the limit and answers, and a client still writing more would see the connection
/// reset (the kernel's answer to unread data on close) instead of the answer, whatever the server said.
async fn send(ours: &Webhook, ca: &str, body: &[u8]) -> Result<crate::support::Response, String> {
    if body.len() <= LIMIT {
        return post_tls(ours.webhook_addr, ca, WEBHOOK_PATH, body).await;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = TcpStream::connect(ours.webhook_addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
        .await
        .map_err(|e| e.to_string())?;
    let sent = &body[..=LIMIT];
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        sent.len()
    );
    tls.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    tls.write_all(sent).await.map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    let _ = tls.read_to_end(&mut raw).await;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no answer")?;
    let status = String::from_utf8_lossy(&raw[..split])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    Ok(crate::support::Response {
        status,
        body: raw[split + 4..].to_vec(),
    })
}

/// A plain HTTP POST that reports what went wrong instead of panicking (upstream may close or stall).
async fn try_post(addr: SocketAddr, body: &[u8]) -> Result<(u16, Vec<u8>), String> {
    // As to ours: past the limit, only the bytes the server reads before answering.
    let body = &body[..body.len().min(LIMIT + 1)];
    let mut tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let head = format!(
        "POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    tcp.write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    // A server may answer before reading all of a large body and close; what it answered still counts.
    let _ = tcp.write_all(body).await;
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.map_err(|e| e.to_string())?;
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("connection closed without an answer")?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or("no status")?;
    let mut body = raw[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = crate::support::dechunk(&body);
    }
    Ok((status, body))
}

fn upstream_outcome(
    answer: Result<Result<(u16, Vec<u8>), String>, tokio::time::error::Elapsed>,
) -> String {
    let (status, body) = match answer {
        Err(_) => return format!("no answer within {} s", UPSTREAM_PATIENCE.as_secs()),
        Ok(Err(error)) => return format!("connection failed: {error}"),
        Ok(Ok(answer)) => answer,
    };
    let Ok(review) = serde_json::from_slice::<Value>(&body) else {
        return format!("HTTP {status}, not an AdmissionReview");
    };
    let response = &review["response"];
    match response["allowed"].as_bool() {
        Some(true) => "allowed".into(),
        _ => {
            let code = response["status"]["code"].as_i64().unwrap_or_default();
            let message = response["status"]["message"].as_str().unwrap_or_default();
            if message.starts_with("panic:") {
                format!("panicked ({code})")
            } else {
                format!("refused {code}")
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_malformed_review_gets_an_answer_and_the_webhook_keeps_serving() {
    let inputs = inputs();
    assert!(inputs.len() > 250, "{} inputs", inputs.len());
    let pair = Pair::issue();
    // The body read timeout is what `per_peer` tests; here it is set to the answer's deadline, so a near-limit
    // body read slowly by a debug build on a busy machine is not refused with 408 for the time it took.
    let limits = peerpods_webhook::server::AdmissionLimits {
        body_read_timeout: OURS_DEADLINE,
        ..Default::default()
    };
    let ours = Webhook::start_with(Target::default(), Some(&pair), limits).await;

    let mut ours_by_category: BTreeMap<(&str, String), usize> = BTreeMap::new();
    let mut ours_by_label: BTreeMap<&str, String> = BTreeMap::new();
    let mut slowest = (Duration::ZERO, String::new());
    for (category, label, body) in &inputs {
        let started = Instant::now();
        let answer = tokio::time::timeout(OURS_DEADLINE, send(&ours, &pair.ca, body))
            .await
            .unwrap_or_else(|_| panic!("{label}: no answer within {OURS_DEADLINE:?}"))
            .unwrap_or_else(|e| panic!("{label}: {e}"));
        let outcome = ours_outcome(label, answer.status, &answer.body);
        if started.elapsed() > slowest.0 {
            slowest = (started.elapsed(), label.clone());
        }
        *ours_by_category
            .entry((category, outcome.clone()))
            .or_default() += 1;
        ours_by_label.insert(label, outcome);
    }
    // Specific answers the docs promise.
    let answer_to = |label: &str| {
        let body = &inputs.iter().find(|(_, l, _)| l == label).unwrap().2;
        send(&ours, &pair.ca, body)
    };
    for (label, expected) in [
        ("an 8 MiB annotation", "refused 413"),
        ("no uid", "refused 400"),
        ("DELETE", "allowed"),
        ("\"UPDATE\"", "allowed"),
        ("cpu \"1e999999999\"", "allowed"),
    ] {
        let answer = answer_to(label).await.unwrap();
        assert_eq!(
            ours_outcome(label, answer.status, &answer.body),
            expected,
            "{label}"
        );
    }

    // Still alive and still mutating; every request reached the handler and was counted (none dropped).
    assert_eq!(get(ours.health_addr, "/healthz").await.status, 200);
    let review = valid();
    let answer = post_tls(ours.webhook_addr, &pair.ca, WEBHOOK_PATH, &bytes(&review))
        .await
        .unwrap()
        .json();
    let pod = patched(&review["request"]["object"], &answer["response"]);
    assert_eq!(pod["metadata"]["annotations"][VCPUS_ANNOTATION], "3");
    let metrics = get(ours.health_addr, "/metrics").await.text();
    let counted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("peerpods_webhook_admission_reviews_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(counted, inputs.len() as u64 + 5 + 1, "{metrics}");
    ours.stop().await;

    println!(
        "ours: {} inputs answered, slowest {:?} ({})",
        inputs.len(),
        slowest.0,
        slowest.1
    );
    for ((category, outcome), count) in &ours_by_category {
        println!("  {category}: {outcome} x{count}");
    }

    // Upstream on the same inputs: printed, not judged (a hang is only seen as a time-out).
    let caa = CaaReference::start(&[]);
    let mut upstream: BTreeMap<(&str, String), Vec<&str>> = BTreeMap::new();
    let mut differ = Vec::new();
    for (category, label, body) in &inputs {
        let answer = tokio::time::timeout(UPSTREAM_PATIENCE, try_post(caa.addr, body)).await;
        let outcome = upstream_outcome(answer);
        if ours_by_label[label.as_str()] != outcome {
            differ.push(format!(
                "{label}: upstream {outcome}, ours {}",
                ours_by_label[label.as_str()]
            ));
        }
        upstream.entry((category, outcome)).or_default().push(label);
    }
    println!("upstream (cloud-api-adaptor v0.22 reference):");
    for ((category, outcome), labels) in &upstream {
        let shown: Vec<&str> = labels.iter().take(4).copied().collect();
        println!("  {category}: {outcome} x{} e.g. {shown:?}", labels.len());
    }
    println!(
        "answered differently ({}):\n  {}",
        differ.len(),
        differ.join("\n  ")
    );
}
