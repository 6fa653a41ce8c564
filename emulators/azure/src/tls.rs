//! HTTPS for the emulator: azure_core's bearer-token policy refuses to send tokens over plain
//! HTTP, so the emulator serves TLS with a certificate of its own throwaway CA, which the backend
//! trusts through its CA-bundle key.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio_rustls::server::TlsStream;

/// A CA and a serving certificate it signed for 127.0.0.1 and localhost.
pub struct Certificates {
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

pub fn certificates() -> Result<Certificates, String> {
    let fail = |e: rcgen::Error| e.to_string();
    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "azure emulator CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca = ca_params.self_signed(&ca_key).map_err(fail)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let server_key = KeyPair::generate().map_err(fail)?;
    let server = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(fail)?
        .signed_by(&server_key, &issuer)
        .map_err(fail)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let server_config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(
            vec![server.der().clone()],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
        )
        .map_err(|e| e.to_string())?;
    Ok(Certificates {
        ca_pem: ca.pem(),
        server_config: Arc::new(server_config),
    })
}

/// A TCP listener whose connections are TLS sessions (handshakes that fail are dropped).
pub struct TlsListener {
    pub tcp: TcpListener,
    pub acceptor: TlsAcceptor,
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Ok((stream, addr)) = self.tcp.accept().await else {
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            };
            let handshake = self.acceptor.accept(stream);
            if let Ok(Ok(tls)) = tokio::time::timeout(Duration::from_secs(5), handshake).await {
                return (tls, addr);
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.tcp.local_addr()
    }
}
