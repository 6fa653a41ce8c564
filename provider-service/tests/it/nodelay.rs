//! Every connection provider-service accepts has TCP_NODELAY set, plaintext and TLS alike.
//! Without it a unary answer's last small frame waits for the caller's delayed ACK: 20–40 ms per
//! successful call for clients that do not ACK at once (grpc-go among them). `make bench`
//! reports the round-trip latency; this test checks the socket option itself.

use std::sync::Arc;

use futures::StreamExt;
use provider_service::server::plaintext_incoming;
use provider_service::tls::{ReloadingCert, incoming};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_util::sync::CancellationToken;

#[tokio::test]
async fn plaintext_connections_have_nodelay() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut accepted = plaintext_incoming(listener);
    let _client = TcpStream::connect(addr).await.unwrap();
    let server_side = accepted.next().await.unwrap().unwrap();
    assert!(server_side.nodelay().unwrap());
}

#[tokio::test]
async fn tls_connections_have_nodelay() {
    let dir = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(dir.path().join("tls.crt"), cert.pem()).unwrap();
    std::fs::write(dir.path().join("tls.key"), key.serialize_pem()).unwrap();
    let tls =
        ReloadingCert::load(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).unwrap();

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let mut accepted = incoming(listener, tls.server_config().unwrap(), shutdown.clone());

    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(cert.der().to_vec()))
        .unwrap();
    let mut client_config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    client_config.alpn_protocols = vec![b"h2".to_vec()];
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_config));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let client = tokio::spawn(async move {
        connector
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .unwrap()
    });
    let server_side = accepted.next().await.unwrap().unwrap();
    assert!(server_side.get_ref().0.nodelay().unwrap());
    client.await.unwrap();
    shutdown.cancel();
}
