//! The TLS gRPC port under idle connections and with upstream's TLS settings: a client that
//! finishes its handshake is served while 500 idle TCP connections are held open against the port
//! (before, accepting waited while 256 idle handshakes ran out their 10 s), and
//! `TLS_CIPHER_SUITES` refuses the TLS 1.2 suites it does not list.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use peerpods_proto::v1 as pb;
use peerpods_provider_client::{ProviderClientConfig, connect};
use test_support::idle_connections::{closed_by_server, hold_idle};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

/// A self-signed certificate for `localhost` as cert.pem/key.pem in `dir`; returns its PEM and DER.
fn issue(dir: &std::path::Path) -> (String, Vec<u8>) {
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    (cert.pem(), cert.der().to_vec())
}

fn config_dir(extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let mut pairs = vec![
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", "test:///default"),
    ];
    pairs.extend_from_slice(extra);
    crate::common::write_config(dir.path(), &pairs);
    dir
}

async fn start_tls(
    certs: &std::path::Path,
    extra: &[(&str, &str)],
) -> (crate::common::TestServer, tempfile::TempDir) {
    let dir = config_dir(extra);
    let server = crate::common::start(
        dir.path(),
        crate::common::Options {
            tls: Some((certs.join("cert.pem"), certs.join("key.pem"))),
            ..crate::common::Options::development()
        },
    )
    .await;
    (server, dir)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_new_client_is_served_while_idle_connections_are_held() {
    let certs = tempfile::tempdir().unwrap();
    let (ca, _) = issue(certs.path());
    let ca_file = certs.path().join("ca.pem");
    std::fs::write(&ca_file, &ca).unwrap();
    let (server, _dir) = start_tls(certs.path(), &[]).await;

    let mut idle = hold_idle(server.addr).await;
    let mut client = connect(&ProviderClientConfig {
        endpoint: format!("https://{}", server.addr),
        ca_file: Some(ca_file),
        tls_server_name: Some("localhost".into()),
        ..Default::default()
    })
    .unwrap();
    // Generous: it only keeps a broken listener from hanging the test; the verdict is below.
    let listed = tokio::time::timeout(
        Duration::from_secs(60),
        client.list_providers(pb::ListProvidersRequest {}),
    )
    .await
    .expect("the new client is answered")
    .expect("ListProviders over TLS")
    .into_inner();
    assert_eq!(listed.providers.len(), 1);
    // A listener that waits for idle handshakes to give up before accepting again serves the new
    // client only after it has closed idle ones; served beside them, every one is still open.
    assert_eq!(
        closed_by_server(&mut idle),
        0,
        "the new client was served only after idle connections were dropped"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_cipher_suites_refuses_the_others() {
    use rustls::crypto::ring::cipher_suite;
    let certs = tempfile::tempdir().unwrap();
    let (_, der) = issue(certs.path());
    // rcgen's keys are ECDSA P-256.
    let (server, _dir) = start_tls(
        certs.path(),
        &[
            ("TLS_MIN_VERSION", "VersionTLS12"),
            (
                "TLS_CIPHER_SUITES",
                "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
            ),
        ],
    )
    .await;
    let handshake = |suite: rustls::SupportedCipherSuite| {
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = vec![suite];
        let mut roots = rustls::RootCertStore::empty();
        roots.add(CertificateDer::from(der.clone())).unwrap();
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(&[&rustls::version::TLS12])
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = vec![b"h2".to_vec()];
        let addr = server.addr;
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tokio_rustls::TlsConnector::from(Arc::new(config))
                .connect(ServerName::try_from("localhost").unwrap(), tcp)
                .await
                .map(|_| ())
        }
    };
    handshake(cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)
        .await
        .expect("the listed suite is served");
    for other in [
        cipher_suite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
        cipher_suite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ] {
        assert!(
            handshake(other).await.is_err(),
            "{:?} was accepted",
            other.suite()
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_settings_upstream_refuses_are_refused() {
    let certs = tempfile::tempdir().unwrap();
    issue(certs.path());
    for (key, value) in [
        ("TLS_MIN_VERSION", "VersionTLS11"),
        ("TLS_CIPHER_SUITES", "NOT_A_SUITE"),
    ] {
        let dir = config_dir(&[(key, value)]);
        let started = provider_service::service::start(
            provider_service::service::Options {
                grpc: provider_service::service::Listen::Addr(SocketAddr::from((
                    Ipv4Addr::LOCALHOST,
                    0,
                ))),
                admin: None,
                secure_metrics: None,
                config_dirs: vec![dir.path().to_owned()],
                development: true,
                reload_interval: Duration::from_secs(1),
                tls: Some((certs.path().join("cert.pem"), certs.path().join("key.pem"))),
                auth: crate::common::CallerAuth::None,
            },
            tokio_util::sync::CancellationToken::new(),
        )
        .await;
        let error = started.err().expect("refused");
        assert!(error.to_string().contains(key), "{error}");
    }
}
