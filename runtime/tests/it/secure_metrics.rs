//! `/metrics` behind TLS, TokenReview and SubjectAccessReview, against the real API server (the local control
//! plane): a scrape without a token, with a token the API server does not know, or with the token of a
//! ServiceAccount no role lets `get` `/metrics` is refused (401, 401, 403); a ServiceAccount bound to a
//! ClusterRole granting it (what the chart gives Prometheus) gets the metrics. The plain admin port keeps
//! `/healthz` and `/readyz` for the kubelet and no longer serves `/metrics`; plain HTTP on the metrics port
//! gets nothing.

use std::net::SocketAddr;
use std::sync::Arc;

use peerpods_runtime::admin::{AdminServer, Readiness};
use peerpods_runtime::secure_metrics::SecureMetrics;
use prometheus_client::metrics::counter::Counter;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_util::sync::CancellationToken;

/// One request over TLS trusting `ca`; the status code and body, or `None` when no TLS answer came.
async fn get_tls(
    addr: SocketAddr,
    ca: &CertificateDer<'static>,
    token: Option<&str>,
) -> Option<(u16, String)> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(ca.clone()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .ok()?;
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
    .ok()?;
    let mut raw = Vec::new();
    // A peer closing without close_notify is fine here: the answer is complete.
    let _ = tls.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    let code = raw.split_whitespace().nth(1)?.parse().ok()?;
    let body = raw.split_once("\r\n\r\n").map(|(_, b)| b.to_owned())?;
    Some((code, body))
}

/// One plain HTTP request; the status code, or `None` when no HTTP answer came.
async fn get_plain(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut tcp = tokio::net::TcpStream::connect(addr).await.ok()?;
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .ok()?;
    let mut raw = Vec::new();
    let _ = tcp.read_to_end(&mut raw).await;
    let raw = String::from_utf8_lossy(&raw).into_owned();
    raw.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_need_a_token_the_api_server_authenticates_and_allows_to_get_metrics() {
    let cp = testenv::shared_for(module_path!());
    let client = cp.client().await;
    let ns = testenv::namespace(&client, "metrics").await;
    let prometheus = testenv::service_account_token(&client, &ns, "prometheus", &[]).await;
    let stranger = testenv::service_account_token(&client, &ns, "stranger", &[]).await;
    // What the chart grants Prometheus: `get` on the non-resource URL /metrics.
    testenv::grant_metrics_reader(&client, &ns, "prometheus").await;

    // The serving certificate, as a kubernetes.io/tls Secret mounted in --metrics-cert-dir.
    let made = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert_dir = std::env::temp_dir().join(format!("secure-metrics-{ns}"));
    std::fs::create_dir_all(&cert_dir).unwrap();
    std::fs::write(cert_dir.join("tls.crt"), made.cert.pem()).unwrap();
    std::fs::write(cert_dir.join("tls.key"), made.signing_key.serialize_pem()).unwrap();
    let ca = made.cert.der().clone();

    let mut registry = prometheus_client::registry::Registry::default();
    let counter = Counter::<u64>::default();
    registry.register("deletes", "Instance deletes", counter.clone());
    counter.inc();
    let secure = SecureMetrics::bind(
        "127.0.0.1:0".parse().unwrap(),
        Some(&cert_dir),
        client.clone(),
    )
    .await
    .unwrap();
    let admin = AdminServer::bind(
        "127.0.0.1:0".parse().unwrap(),
        Readiness::default(),
        Arc::new(registry),
    )
    .await
    .unwrap()
    .with_secure_metrics(Some(secure));
    let admin_addr = admin.local_addr().unwrap();
    let metrics_addr = admin.metrics_addr().unwrap().unwrap();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    let task = tokio::spawn(admin.serve(async move { stop.cancelled().await }));

    let (code, body) = get_tls(metrics_addr, &ca, None).await.unwrap();
    assert_eq!(code, 401, "no token: {body}");
    let (code, body) = get_tls(metrics_addr, &ca, Some("not-a-token"))
        .await
        .unwrap();
    assert_eq!(code, 401, "an unknown token: {body}");
    let (code, body) = get_tls(metrics_addr, &ca, Some(&stranger)).await.unwrap();
    assert_eq!(code, 403, "a ServiceAccount without the role: {body}");
    assert!(
        body.contains(&format!("system:serviceaccount:{ns}:stranger")),
        "{body}"
    );
    assert!(!body.contains("deletes_total"), "{body}");
    let (code, body) = get_tls(metrics_addr, &ca, Some(&prometheus)).await.unwrap();
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("deletes_total 1"), "{body}");

    // Plain HTTP on the metrics port gets no HTTP answer; the admin port keeps the probes only.
    assert_eq!(get_plain(metrics_addr, "/metrics").await, None);
    assert_eq!(get_plain(admin_addr, "/metrics").await, Some(404));
    assert_eq!(get_plain(admin_addr, "/healthz").await, Some(200));
    assert_eq!(get_plain(admin_addr, "/readyz").await, Some(503));

    shutdown.cancel();
    task.await.unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&cert_dir);
}
