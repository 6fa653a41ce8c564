//! TLS for the gRPC port with rustls. The certificate and key are read again when their files
//! change (cert-manager and Secret mounts rotate them in place); a bad new pair keeps the old.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use futures::StreamExt;
use peerpods_runtime::tls::HandshakeLimits;
pub use peerpods_runtime::tls::{TlsPolicy, TlsVersion};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;
use tokio_rustls::server::TlsStream;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::Error;

/// Certificate and key files, and the pair currently served.
#[derive(Debug)]
pub struct ReloadingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Loaded>,
    /// TLS versions and cipher suites served ([`ReloadingCert::with_policy`]).
    policy: TlsPolicy,
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
            policy: TlsPolicy::default(),
        }))
    }

    /// The same files served with `policy`'s TLS versions and cipher suites.
    pub fn with_policy(self: Arc<Self>, policy: TlsPolicy) -> Arc<Self> {
        let current = match Arc::try_unwrap(self) {
            Ok(cert) => cert,
            // Only `load` hands one out, so nobody else holds it yet; copy if that ever changes.
            Err(shared) => {
                let (files, key) = match shared.current.read() {
                    Ok(c) => (c.files.clone(), c.key.clone()),
                    Err(poisoned) => {
                        let c = poisoned.into_inner();
                        (c.files.clone(), c.key.clone())
                    }
                };
                ReloadingCert {
                    cert_path: shared.cert_path.clone(),
                    key_path: shared.key_path.clone(),
                    current: RwLock::new(Loaded { files, key }),
                    policy: shared.policy.clone(),
                }
            }
        };
        Arc::new(ReloadingCert { policy, ..current })
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

    /// A rustls server config serving the current pair, speaking HTTP/2 only (gRPC), with the
    /// TLS versions and cipher suites of its policy (by default TLS 1.2 and 1.3, every suite this
    /// build implements).
    pub fn server_config(self: &Arc<Self>) -> Result<Arc<rustls::ServerConfig>, Error> {
        self.server_config_with(&self.policy)
    }

    /// [`ReloadingCert::server_config`] with `policy`'s TLS versions and cipher suites
    /// (`TLS_MIN_VERSION`, `TLS_CIPHER_SUITES`).
    pub fn server_config_with(
        self: &Arc<Self>,
        policy: &TlsPolicy,
    ) -> Result<Arc<rustls::ServerConfig>, Error> {
        policy
            .server_config(self.clone(), &[b"h2"])
            .map_err(|e| Error::tls("", e))
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
        .map_err(|e| Error::tls("certificate file", e))?;
    if chain.is_empty() {
        return Err(Error::Tls {
            message: "certificate file holds no certificate".into(),
            source: None,
        });
    }
    // Never echo key material: only say what kind of problem it is.
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::tls("key file", e))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| Error::tls("key file", e))?;
    let certified = CertifiedKey::new(chain, signing);
    certified
        .keys_match()
        .map_err(|e| Error::tls("certificate and key do not match", e))?;
    Ok(Arc::new(certified))
}

/// Connections that completed the TLS handshake on `listener`, from the services' shared listener
/// ([`peerpods_runtime::tls::incoming`]): accepting never waits for a handshake, each runs in its own task with a
/// short deadline, idle connections cost only the handshake slots they hold, and every accepted socket gets
/// TCP_NODELAY (see `server`'s module doc).
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    shutdown: CancellationToken,
) -> impl futures::Stream<Item = Result<TlsStream<TcpStream>, std::io::Error>> + Send + 'static {
    let connections =
        peerpods_runtime::tls::incoming(listener, config, HandshakeLimits::default(), shutdown);
    ReceiverStream::new(connections).map(|(stream, _peer)| Ok(stream))
}
