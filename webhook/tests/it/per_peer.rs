//! What one client can hold is bounded per peer address, so a flood from one address leaves room for the API
//! server: a peer at 127.0.0.2 (Linux loopback accepts any 127/8 source) holds slow admissions until it is shed,
//! connections until one is closed at once, or a body it never finishes until the read timeout refuses it, and an
//! admission from 127.0.0.1 is still decided. And `/metrics` behind TLS, TokenReview and SubjectAccessReview
//! (`--metrics-secure`), against the real API server.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use crate::support::{Pair, Webhook, connect_tls_from, get, post_tls};
use peerpods_runtime::secure_metrics::SecureMetrics;
use peerpods_runtime::shutdown::CancellationToken;
use peerpods_runtime::tls::{CapLabels, ConnectionLimits};
use peerpods_webhook::listen::ListenAddr;
use peerpods_webhook::metrics::OutcomeLabels;
use peerpods_webhook::mutation::Target;
use peerpods_webhook::server::{self, ADMISSION_MIN_SHARE, AdmissionLimits, Options, WEBHOOK_PATH};
use peerpods_webhook::tls::TlsVersion;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

/// The flooding client's address; the webhook listens on 127.0.0.1.
const FLOODER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));
/// Only keeps a broken server from hanging a test; no verdict depends on it.
const PATIENCE: Duration = Duration::from_secs(60);

fn review(uid: &str) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "userInfo": {},
            "object": {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": "p"},
                "spec": {"runtimeClassName": "other", "containers": [{"name": "c", "image": "i"}]}
            }
        }
    }))
    .unwrap()
}

/// The status code of one response read from a kept-alive connection (its head, then `Content-Length` bytes),
/// or `None` when the connection ends first.
async fn answer<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<u16> {
    response(stream).await.map(|(status, _)| status)
}

/// [`answer`] with the response's body.
async fn response<S: tokio::io::AsyncRead + Unpin>(stream: &mut S) -> Option<(u16, Vec<u8>)> {
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = raw.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    };
    let head = String::from_utf8_lossy(&raw[..head_end]).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while raw.len() < head_end + length {
        match stream.read(&mut buf).await {
            Ok(0) | Err(_) => return None,
            Ok(n) => raw.extend_from_slice(&buf[..n]),
        }
    }
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, raw[head_end..head_end + length].to_vec()))
}

/// An admission from 127.0.0.1, not the flooder's address, is decided: answered with its uid, and allowed (the
/// webhook's target matches no pod).
async fn another_is_decided(webhook: &Webhook, pair: &Pair) {
    let served = post_tls(
        webhook.webhook_addr,
        &pair.ca,
        WEBHOOK_PATH,
        &review("other"),
    )
    .await
    .unwrap();
    assert_eq!(
        served.status,
        200,
        "another address is decided: {}",
        served.text()
    );
    assert_eq!(served.json()["response"]["uid"], "other");
    assert_eq!(served.json()["response"]["allowed"], true);
}

async fn wait_served(webhook: &Webhook, pair: &Pair) {
    crate::support::eventually("the webhook serves its certificate", || async {
        post_tls(
            webhook.webhook_addr,
            &pair.ca,
            WEBHOOK_PATH,
            &review("warm-up"),
        )
        .await
        .ok()
        .filter(|r| r.status == 200)
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn slow_admissions_from_one_address_leave_the_budget_to_another() {
    let pair = Pair::issue();
    // A budget of 16 admissions of the least share, a quarter of it (4) per peer, a short wait for a share, and
    // bodies that may take long: a connection that sent only its headers keeps its share while the test holds it.
    let budget = 16 * ADMISSION_MIN_SHARE;
    let webhook = Webhook::start_with(
        Target::new("", ""),
        Some(&pair),
        AdmissionLimits {
            budget_bytes: budget,
            peer_share_bytes: budget / 4,
            wait: Duration::from_millis(300),
            body_read_timeout: Duration::from_secs(600),
            ..AdmissionLimits::default()
        },
    )
    .await;
    wait_served(&webhook, &pair).await;

    // More slow admissions than the whole budget holds, each on its own connection from the flooder: headers
    // sent, the body never. With one budget for all, the first 16 hold all of it. A shed one is answered only
    // once its body is read (or the read times out), so the refusal is seen in the metrics.
    let metrics = webhook.running.as_ref().unwrap().metrics.clone();
    let mut flood = Vec::new();
    for _ in 0..20 {
        let (addr, ca) = (webhook.webhook_addr, pair.ca.clone());
        flood.push(tokio::spawn(async move {
            let mut tls = connect_tls_from(Some(FLOODER), addr, &ca, "127.0.0.1")
                .await
                .unwrap();
            tls.write_all(
                format!(
                    "POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n"
                )
                .as_bytes(),
            )
            .await
            .unwrap();
            // Held open until the test ends.
            let _ = answer(&mut tls).await;
        }));
    }
    // Wait until the flooder is refused: then it holds all it may.
    crate::support::eventually("the flooder shed", || async {
        let shed = metrics
            .reviews
            .get_or_create(&OutcomeLabels { outcome: "shed" })
            .get();
        (shed >= 1).then_some(())
    })
    .await;
    let per_peer = metrics
        .shed
        .get_or_create(&CapLabels { cap: "per_peer" })
        .get();
    assert!(per_peer >= 1, "shed by its peer's share");

    another_is_decided(&webhook, &pair).await;
    for task in flood {
        task.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_body_not_sent_within_the_read_timeout_is_refused_and_another_is_served() {
    let pair = Pair::issue();
    let webhook = Webhook::start_with(
        Target::new("", ""),
        Some(&pair),
        AdmissionLimits {
            body_read_timeout: Duration::from_secs(1),
            ..AdmissionLimits::default()
        },
    )
    .await;
    wait_served(&webhook, &pair).await;

    // Headers and a tenth of the body promised, then nothing: the webhook answers once its read timeout is
    // over, with an AdmissionReview refusing the request (the API server shows its message), not a dropped
    // connection.
    let mut tls = connect_tls_from(Some(FLOODER), webhook.webhook_addr, &pair.ca, "127.0.0.1")
        .await
        .unwrap();
    tls.write_all(
        format!(
            "POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{}",
            " ".repeat(100)
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let (status, body) = tokio::time::timeout(PATIENCE, response(&mut tls))
        .await
        .expect("answered before the test's patience ran out")
        .expect("answered, not dropped");
    assert_eq!(status, 200);
    let answered: serde_json::Value = serde_json::from_slice(&body).unwrap();
    let refusal = &answered["response"];
    assert_eq!(refusal["allowed"], false, "{answered}");
    assert_eq!(refusal["status"]["code"], 408, "{answered}");
    assert_eq!(
        refusal["status"]["message"],
        "malformed admission request: the request body: not read within 1 s",
        "{answered}"
    );
    let metrics = webhook.running.as_ref().unwrap().metrics.clone();
    assert_eq!(
        metrics
            .reviews
            .get_or_create(&OutcomeLabels { outcome: "invalid" })
            .get(),
        1,
        "counted as invalid"
    );

    another_is_decided(&webhook, &pair).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn connections_from_one_address_are_capped_and_another_is_served() {
    let pair = Pair::issue();
    let per_peer = 4;
    let webhook = Webhook::start_with(
        Target::new("", ""),
        Some(&pair),
        AdmissionLimits {
            connections: ConnectionLimits {
                per_peer,
                total: 64,
            },
            ..AdmissionLimits::default()
        },
    )
    .await;
    wait_served(&webhook, &pair).await;

    // Kept-alive connections from the flooder, each answered once, until one is closed without an answer.
    let body = review("flood");
    let mut held = Vec::new();
    let mut refused_at = None;
    for n in 0..4 * per_peer {
        let connected = tokio::time::timeout(PATIENCE, async {
            let mut tls =
                connect_tls_from(Some(FLOODER), webhook.webhook_addr, &pair.ca, "127.0.0.1")
                    .await
                    .ok()?;
            let request = format!(
                "POST {WEBHOOK_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
                body.len()
            );
            tls.write_all(request.as_bytes()).await.ok()?;
            tls.write_all(&body).await.ok()?;
            let status = answer(&mut tls).await?;
            Some((status, tls))
        })
        .await
        .expect("a connection neither answered nor closed");
        match connected {
            Some((status, tls)) => {
                assert_eq!(status, 200);
                held.push(tls);
            }
            None => {
                refused_at = Some(n);
                break;
            }
        }
    }
    assert_eq!(
        refused_at,
        Some(per_peer),
        "the flooder holds {per_peer} connections, the next is closed"
    );

    another_is_decided(&webhook, &pair).await;

    let metrics = get(webhook.health_addr, "/metrics").await.text();
    assert!(
        metrics.contains("peerpods_webhook_connections_refused_total{cap=\"per_peer\"} 1"),
        "{metrics}"
    );
    drop(held);
}

/// One GET of `/metrics` over TLS trusting `ca`; the status code and body.
async fn scrape(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    token: Option<&str>,
) -> (u16, String) {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap();
    let authorization = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    tls.write_all(
        format!(
            "GET /metrics HTTP/1.1\r\nHost: localhost\r\n{authorization}Connection: close\r\n\r\n"
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    // A peer closing without close_notify is fine here: the answer is complete.
    let _ = tls.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let code = raw.split_whitespace().nth(1).unwrap().parse().unwrap();
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap();
    (code, body)
}

#[tokio::test(flavor = "multi_thread")]
async fn secure_metrics_need_a_token_the_api_server_allows_to_get_metrics() {
    let cp = testenv::shared_for(module_path!());
    let client = cp.client().await;
    let ns = testenv::namespace(&client, "webhook-metrics").await;
    let prometheus = testenv::service_account_token(&client, &ns, "prometheus", &[]).await;
    testenv::grant_metrics_reader(&client, &ns, "prometheus").await;

    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let metrics_dir = tempfile::tempdir().unwrap();
    std::fs::write(metrics_dir.path().join("tls.crt"), made.cert.pem()).unwrap();
    std::fs::write(
        metrics_dir.path().join("tls.key"),
        made.signing_key.serialize_pem(),
    )
    .unwrap();
    let ca = made.cert.der().clone();
    let secure = SecureMetrics::bind(
        "127.0.0.1:0".parse().unwrap(),
        Some(metrics_dir.path()),
        client.clone(),
    )
    .await
    .unwrap();

    let pair = Pair::issue();
    let cert_dir = tempfile::tempdir().unwrap();
    pair.write_to(cert_dir.path());
    let stop = CancellationToken::new();
    let running = server::start(
        Options {
            webhook: ListenAddr::Socket("127.0.0.1:0".parse().unwrap()),
            health: ListenAddr::Socket("127.0.0.1:0".parse().unwrap()),
            secure_metrics: Some(secure),
            cert_dir: cert_dir.path().to_owned(),
            cert_poll_interval: Duration::from_millis(100),
            tls_min_version: TlsVersion::Tls12,
            tls_cipher_suites: Vec::new(),
            target: Target::new("", ""),
            admission: AdmissionLimits::default(),
        },
        stop.clone(),
    )
    .await
    .unwrap();
    let metrics_addr = running.metrics_addr.expect("a secure metrics port");
    let health_addr = running.health_addr.unwrap();
    let answered = post_tls(
        running.webhook_addr,
        &pair.ca,
        WEBHOOK_PATH,
        &review("counted"),
    )
    .await
    .unwrap();
    assert_eq!(answered.status, 200);

    let (code, body) = scrape(metrics_addr, &ca, None).await;
    assert_eq!(code, 401, "no token: {body}");
    let (code, body) = scrape(metrics_addr, &ca, Some("not-a-token")).await;
    assert_eq!(code, 401, "a token the API server does not know: {body}");
    let (code, body) = scrape(metrics_addr, &ca, Some(&prometheus)).await;
    assert_eq!(code, 200, "{body}");
    assert!(
        body.contains("peerpods_webhook_admission_reviews_total{outcome=\"unchanged\"} 1"),
        "{body}"
    );
    // The plain health port keeps the probes only.
    assert_eq!(get(health_addr, "/metrics").await.status, 404);
    assert_eq!(get(health_addr, "/healthz").await.status, 200);

    stop.cancel();
    running.wait().await.unwrap();
}
