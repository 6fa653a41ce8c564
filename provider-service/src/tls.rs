//! TLS for the gRPC port with rustls. The certificate and key are read again when their files
//! change (cert-manager and Secret mounts rotate them in place); a bad new pair keeps the old.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// A handshake that takes longer than this is dropped, so slow clients cannot hold slots.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress at most. Past this, accepting waits (the kernel's backlog queues new
/// connections), so a flood of idle connections cannot grow tasks and memory without bound.
const MAX_HANDSHAKES: usize = 256;

/// Certificate and key files, and the pair currently served.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Loaded>,
}

#[derive(Debug)]
struct Loaded {
    files: (Vec<u8>, Vec<u8>),
    key: Arc<CertifiedKey>,
}

impl ReloadingCert {
    /// Loads the pair; fails when either file is missing or unusable.
    pub fn load(cert_path: &Path, key_path: &Path) -> Result<Arc<Self>, Error> {
        let files = read_pair(cert_path, key_path)?;
        let key = certified_key(&files)?;
        Ok(Arc::new(ReloadingCert {
            cert_path: cert_path.to_owned(),
            key_path: key_path.to_owned(),
            current: RwLock::new(Loaded { files, key }),
        }))
    }

    /// Reads the files again. `Ok(true)` when a new pair is now served, `Ok(false)` when
    /// unchanged, `Err` (old pair kept) when the new files are unusable.
    pub fn reload(&self) -> Result<bool, Error> {
        let files = read_pair(&self.cert_path, &self.key_path)?;
        if self
            .current
            .read()
            .map(|c| c.files == files)
            .unwrap_or(false)
        {
            return Ok(false);
        }
        let key = certified_key(&files)?;
        if let Ok(mut current) = self.current.write() {
            *current = Loaded { files, key };
        }
        Ok(true)
    }

    /// A rustls server config serving the current pair, speaking HTTP/2 only (gRPC).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, Error> {
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls {
            message: e.to_string(),
        })?
        .with_no_client_auth()
        .with_cert_resolver(self.clone());
        config.alpn_protocols = vec![b"h2".to_vec()];
        Ok(Arc::new(config))
    }
}

impl ResolvesServerCert for ReloadingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current.read().ok().map(|c| c.key.clone())
    }
}

fn read_pair(cert: &Path, key: &Path) -> Result<(Vec<u8>, Vec<u8>), Error> {
    let c = std::fs::read(cert).map_err(|e| Error::io(format!("reading {}", cert.display()), e))?;
    let k = std::fs::read(key).map_err(|e| Error::io(format!("reading {}", key.display()), e))?;
    Ok((c, k))
}

fn certified_key((cert, key): &(Vec<u8>, Vec<u8>)) -> Result<Arc<CertifiedKey>, Error> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::Tls {
            message: format!("certificate file: {e}"),
        })?;
    if chain.is_empty() {
        return Err(Error::Tls {
            message: "certificate file holds no certificate".into(),
        });
    }
    // Never echo key material: only say what kind of problem it is.
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::Tls {
        message: format!("key file: {e}"),
    })?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key).map_err(|e| Error::Tls {
        message: format!("key file: {e}"),
    })?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| Error::Tls {
        message: format!("certificate and key do not match: {e}"),
    })?;
    Ok(Arc::new(certified))
}

/// Accepts TCP connections and hands out those that completed the TLS handshake. Handshakes run
/// in their own tasks (at most [`MAX_HANDSHAKES`] at once), so a slow or garbage-sending client
/// delays nobody. Each connection gets TCP_NODELAY (see `server`'s module doc).
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> ReceiverStream<Result<TlsStream<TcpStream>, std::io::Error>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    let acceptor = TlsAcceptor::from(config);
    let handshakes = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                () = shutdown.cancelled() => break,
                a = accept_with_slot(&listener, &handshakes) => a,
            };
            let (tcp, peer, slot) = match accepted {
                Ok(a) => a,
                Err(e) => {
                    // E.g. EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
            }
            let acceptor = acceptor.clone();
            let tx = tx.clone();
            tokio::spawn(async move {
                let handshake = tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await;
                drop(slot);
                match handshake {
                    Ok(Ok(stream)) => {
                        let _ = tx.send(Ok(stream)).await;
                    }
                    Ok(Err(e)) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                    Err(_) => tracing::debug!(%peer, "TLS handshake timed out"),
                }
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The next connection, once a handshake slot is free.
async fn accept_with_slot(
    listener: &TcpListener,
    handshakes: &Arc<tokio::sync::Semaphore>,
) -> Result<
    (
        TcpStream,
        std::net::SocketAddr,
        tokio::sync::OwnedSemaphorePermit,
    ),
    std::io::Error,
> {
    let slot = handshakes
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| std::io::Error::other("handshake limiter closed"))?;
    let (tcp, peer) = listener.accept().await?;
    Ok((tcp, peer, slot))
}
