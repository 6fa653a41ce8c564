//! What the webhook's tests share: a serving certificate for 127.0.0.1 signed by a CA of its own, a webhook
//! started on 127.0.0.1 with it, and minimal HTTP/1.1 clients (HTTPS trusting only that CA, and plain HTTP for
//! the health port).

pub mod caa;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use peerpods_runtime::shutdown::CancellationToken;
use peerpods_webhook::listen::ListenAddr;
use peerpods_webhook::mutation::Target;
use peerpods_webhook::server::{self, Options, Running};
use peerpods_webhook::tls::{CERT_FILE, KEY_FILE, TlsVersion};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};

/// A CA (PEM) and a leaf for 127.0.0.1 it signed (PEM certificate and key).
pub struct Pair {
    pub ca: String,
    pub cert: String,
    pub key: String,
}

impl Pair {
    pub fn issue() -> Pair {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let issuer = Issuer::new(ca_params, ca_key);
        let key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned()])
            .unwrap()
            .signed_by(&key, &issuer)
            .unwrap();
        Pair {
            ca: ca.pem(),
            cert: leaf.pem(),
            key: key.serialize_pem(),
        }
    }

    /// Writes `tls.crt` and `tls.key` as a Secret mount has them.
    pub fn write_to(&self, dir: &Path) {
        std::fs::write(dir.join(CERT_FILE), &self.cert).unwrap();
        std::fs::write(dir.join(KEY_FILE), &self.key).unwrap();
    }
}

/// A webhook serving on 127.0.0.1, stopped on drop.
pub struct Webhook {
    pub running: Option<Running>,
    pub webhook_addr: SocketAddr,
    pub health_addr: SocketAddr,
    pub cert_dir: tempfile::TempDir,
    stop: CancellationToken,
}

impl Webhook {
    /// Starts the webhook for `target`, with `pair` in its certificate directory (or none yet).
    pub async fn start(target: Target, pair: Option<&Pair>) -> Webhook {
        Webhook::start_with(
            target,
            pair,
            peerpods_webhook::server::AdmissionLimits::default(),
        )
        .await
    }

    /// [`Webhook::start`] with `admission` limits of the test's choosing.
    pub async fn start_with(
        target: Target,
        pair: Option<&Pair>,
        admission: peerpods_webhook::server::AdmissionLimits,
    ) -> Webhook {
        let cert_dir = tempfile::tempdir().unwrap();
        if let Some(pair) = pair {
            pair.write_to(cert_dir.path());
        }
        let stop = CancellationToken::new();
        let options = Options {
            webhook: ListenAddr::Socket("127.0.0.1:0".parse().unwrap()),
            health: ListenAddr::Socket("127.0.0.1:0".parse().unwrap()),
            secure_metrics: None,
            cert_dir: cert_dir.path().to_owned(),
            cert_poll_interval: Duration::from_millis(100),
            tls_min_version: TlsVersion::Tls12,
            tls_cipher_suites: Vec::new(),
            target,
            admission,
        };
        let running = server::start(options, stop.clone()).await.unwrap();
        Webhook {
            webhook_addr: running.webhook_addr,
            health_addr: running.health_addr.unwrap(),
            running: Some(running),
            cert_dir,
            stop,
        }
    }

    /// The webhook's URL as the API server is given it.
    pub fn url(&self) -> String {
        format!("https://{}{}", self.webhook_addr, server::WEBHOOK_PATH)
    }

    /// Stops it and waits until it has.
    pub async fn stop(mut self) {
        self.stop.cancel();
        if let Some(running) = self.running.take() {
            running.wait().await.unwrap();
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// An HTTP response: status code and body.
pub struct Response {
    pub status: u16,
    pub body: Vec<u8>,
}

impl Response {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

fn request(method: &str, path: &str, body: &[u8]) -> Vec<u8> {
    let mut bytes = format!(
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes
}

fn response(raw: &[u8]) -> Response {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP header in {}", String::from_utf8_lossy(raw)));
    let head = String::from_utf8_lossy(&raw[..split]);
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head}"));
    let body = &raw[split + 4..];
    let chunked = head
        .lines()
        .any(|l| l.eq_ignore_ascii_case("transfer-encoding: chunked"));
    Response {
        status,
        body: if chunked {
            dechunk(body)
        } else {
            body.to_vec()
        },
    }
}

/// A chunked body's content (Go's HTTP server chunks answers of a few KiB and more).
pub fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("chunk size line");
        let size = std::str::from_utf8(&body[..line_end]).unwrap();
        let size = usize::from_str_radix(size.split(';').next().unwrap().trim(), 16).unwrap();
        if size == 0 {
            return out;
        }
        let start = line_end + 2;
        out.extend_from_slice(&body[start..start + size]);
        body = &body[start + size + 2..];
    }
}

/// Plain HTTP GET (the health port).
pub async fn get(addr: SocketAddr, path: &str) -> Response {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&request("GET", path, b"")).await.unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    response(&raw)
}

/// Plain HTTP POST (the CAA reference).
pub async fn post(addr: SocketAddr, path: &str, body: &[u8]) -> Response {
    let mut tcp = TcpStream::connect(addr).await.unwrap();
    tcp.write_all(&request("POST", path, body)).await.unwrap();
    let mut raw = Vec::new();
    tcp.read_to_end(&mut raw).await.unwrap();
    response(&raw)
}

/// HTTPS POST trusting only `ca` (PEM); `Err` when the TLS handshake fails.
pub async fn post_tls(
    addr: SocketAddr,
    ca: &str,
    path: &str,
    body: &[u8],
) -> Result<Response, String> {
    post_tls_as(addr, ca, "127.0.0.1", path, body).await
}

/// HTTPS POST to `addr` verifying the server as `server_name` (as the API server verifies a webhook Service as
/// `<service>.<namespace>.svc`), trusting only `ca` (PEM).
pub async fn post_tls_as(
    addr: SocketAddr,
    ca: &str,
    server_name: &str,
    path: &str,
    body: &[u8],
) -> Result<Response, String> {
    let mut tls = connect_tls(addr, ca, server_name).await?;
    tls.write_all(&request("POST", path, body))
        .await
        .map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    // The server closes after answering (Connection: close); rustls reports a close without close_notify as an
    // error, after the bytes.
    let _ = tls.read_to_end(&mut raw).await;
    Ok(response(&raw))
}

/// A TLS connection to `addr` verifying the server as `server_name`, trusting only `ca` (PEM); `Err` when the
/// handshake fails.
pub async fn connect_tls(
    addr: SocketAddr,
    ca: &str,
    server_name: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    connect_tls_from(None, addr, ca, server_name).await
}

/// [`connect_tls`] from the local address `source` (Linux loopback takes any 127/8 address), as another client
/// would connect.
pub async fn connect_tls_from(
    source: Option<std::net::IpAddr>,
    addr: SocketAddr,
    ca: &str,
    server_name: &str,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
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
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let tcp = match source {
        None => TcpStream::connect(addr).await.unwrap(),
        Some(source) => {
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(SocketAddr::new(source, 0)).unwrap();
            socket.connect(addr).await.unwrap()
        }
    };
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())
}

/// Polls `check` until it returns `Some`, for up to 20 s.
pub async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    testenv::wait_for(what, Duration::from_secs(20), check).await
}
