//! The webhook port under idle connections and with upstream's TLS settings: a client that finishes its
//! handshake is served while hundreds of idle TCP connections are held open against the port (the API server
//! calls the webhook with a 10 s timeout and `failurePolicy: Fail`, so a stalled port stalls pod creation), and
//! `TLS_CIPHER_SUITES` refuses the TLS 1.2 suites it does not list.

use std::sync::Arc;
use std::time::Duration;

use crate::support::{Pair, Webhook, post_tls};
use peerpods_runtime::shutdown::CancellationToken;
use peerpods_webhook::listen::ListenAddr;
use peerpods_webhook::mutation::Target;
use peerpods_webhook::server::{self, Options};
use peerpods_webhook::tls::TlsVersion;
use test_support::idle_connections::{closed_by_server, hold_idle};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

fn review() -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "idle-1",
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

#[tokio::test(flavor = "multi_thread")]
async fn a_new_client_is_served_while_idle_connections_are_held() {
    let pair = Pair::issue();
    let webhook = Webhook::start(Target::new("", ""), Some(&pair)).await;
    crate::support::eventually("the webhook serves its certificate", || async {
        post_tls(
            webhook.webhook_addr,
            &pair.ca,
            server::WEBHOOK_PATH,
            &review(),
        )
        .await
        .ok()
    })
    .await;

    let mut idle = hold_idle(webhook.webhook_addr).await;
    // Generous: it only keeps a broken listener from hanging the test; the verdict is below.
    let answer = tokio::time::timeout(
        Duration::from_secs(60),
        post_tls(
            webhook.webhook_addr,
            &pair.ca,
            server::WEBHOOK_PATH,
            &review(),
        ),
    )
    .await
    .expect("the new client is answered")
    .expect("TLS handshake");
    assert_eq!(answer.status, 200, "{}", answer.text());
    // A listener that waits for idle handshakes to give up before accepting again serves the new client only
    // after it has closed idle ones; served beside them, every idle connection is still open.
    assert_eq!(
        closed_by_server(&mut idle),
        0,
        "the new client was served only after idle connections were dropped"
    );
}

fn client_config(ca: &str, suite: rustls::SupportedCipherSuite) -> Arc<ClientConfig> {
    let mut provider = rustls::crypto::ring::default_provider();
    provider.cipher_suites = vec![suite];
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca.as_bytes()) {
        roots.add(cert.unwrap()).unwrap();
    }
    Arc::new(
        ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_cipher_suites_refuses_the_others() {
    use rustls::crypto::ring::cipher_suite;
    let pair = Pair::issue();
    let dir = tempfile::tempdir().unwrap();
    pair.write_to(dir.path());
    let stop = CancellationToken::new();
    let running = server::start(
        Options {
            webhook: ListenAddr::Socket("127.0.0.1:0".parse().unwrap()),
            health: ListenAddr::Off,
            secure_metrics: None,
            cert_dir: dir.path().to_owned(),
            cert_poll_interval: Duration::from_millis(100),
            tls_min_version: TlsVersion::Tls12,
            // rcgen's keys are ECDSA P-256.
            tls_cipher_suites: vec!["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256".to_owned()],
            target: Target::new("", ""),
            admission: peerpods_webhook::server::AdmissionLimits::default(),
        },
        stop.clone(),
    )
    .await
    .unwrap();
    let handshake = |suite| {
        let config = client_config(&pair.ca, suite);
        let addr = running.webhook_addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tokio_rustls::TlsConnector::from(config)
                .connect(ServerName::try_from("127.0.0.1").unwrap(), tcp)
                .await
                .map(|_| ())
        }
    };
    crate::support::eventually("the listed suite is served", || async {
        handshake(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
            .await
            .ok()
    })
    .await;
    for other in [
        cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ] {
        let refused = handshake(other).await;
        assert!(refused.is_err(), "{:?} was accepted", other.suite());
    }
    stop.cancel();
    running.wait().await.unwrap();
}
