//! HTTPS for the webhook port: the serving certificate from `tls.crt` and `tls.key` in the certificate
//! directory (the mounted Secret), read again when the files change, and a listener that hands out connections
//! that finished their TLS handshake.
//!
//! Until a usable pair has been read the port refuses handshakes and `/readyz` says why; a bad new pair keeps the
//! old one. Secret mounts are swapped atomically, but the two files are read one after the other, so a pair that
//! does not match is simply tried again on the next poll.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::rustls::server::{ClientHello, ResolvesServerCert};
use tokio_rustls::rustls::sign::CertifiedKey;

use crate::Error;

/// File names inside the certificate directory, as controller-runtime and the Secret use them.
pub const CERT_FILE: &str = "tls.crt";
pub const KEY_FILE: &str = "tls.key";

/// Lowest TLS version the port accepts (upstream's `TLS_MIN_VERSION` values), and the version and cipher policy
/// built from it and `TLS_CIPHER_SUITES`: the same for every port of the services.
pub use peerpods_runtime::tls::{TlsListener, TlsPolicy, TlsVersion};

/// The certificate and key files and the pair currently served.
#[derive(Debug)]
pub struct ServingCert {
    cert_path: PathBuf,
    key_path: PathBuf,
    current: RwLock<Option<Loaded>>,
}

#[derive(Debug)]
struct Loaded {
    files: (Vec<u8>, Vec<u8>),
    key: Arc<CertifiedKey>,
}

impl ServingCert {
    /// The pair in `dir`, not read yet (see [`ServingCert::reload`]).
    pub fn in_dir(dir: &Path) -> Arc<Self> {
        Arc::new(ServingCert {
            cert_path: dir.join(CERT_FILE),
            key_path: dir.join(KEY_FILE),
            current: RwLock::new(None),
        })
    }

    /// Reads the files. `Ok(true)`: a new pair is served from now on; `Ok(false)`: unchanged; `Err`: the files
    /// are missing or unusable, and the pair served before (if any) stays.
    pub fn reload(&self) -> Result<bool, Error> {
        let read = |path: &Path| {
            std::fs::read(path)
                .map_err(|e| Error::certificate_from(format!("reading {}", path.display()), e))
        };
        let files = (read(&self.cert_path)?, read(&self.key_path)?);
        let unchanged = self
            .current
            .read()
            .map(|c| c.as_ref().is_some_and(|c| c.files == files))
            .unwrap_or(false);
        if unchanged {
            return Ok(false);
        }
        let key = certified_key(&files)?;
        if let Ok(mut current) = self.current.write() {
            *current = Some(Loaded { files, key });
        }
        Ok(true)
    }

    /// Whether a pair is being served.
    pub fn is_loaded(&self) -> bool {
        self.current.read().map(|c| c.is_some()).unwrap_or(false)
    }

    /// Where the pair is read from.
    pub fn describe(&self) -> String {
        format!(
            "{} and {}",
            self.cert_path.display(),
            self.key_path.display()
        )
    }

    /// A rustls server config serving the current pair with `policy`'s TLS versions and cipher suites. HTTP/1.1
    /// only, as controller-runtime's webhook server does by default: the API server needs nothing else, and it
    /// keeps HTTP/2's rapid-reset attacks away.
    pub fn server_config(
        self: &Arc<Self>,
        policy: &TlsPolicy,
    ) -> Result<Arc<rustls::ServerConfig>, Error> {
        policy
            .server_config(self.clone(), &[b"http/1.1"])
            .map_err(|e| Error::certificate_from("", e))
    }
}

impl ResolvesServerCert for ServingCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.current
            .read()
            .ok()
            .and_then(|c| c.as_ref().map(|c| c.key.clone()))
    }
}

fn certified_key((cert, key): &(Vec<u8>, Vec<u8>)) -> Result<Arc<CertifiedKey>, Error> {
    let chain = CertificateDer::pem_slice_iter(cert)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| Error::certificate_from(CERT_FILE, e))?;
    if chain.is_empty() {
        return Err(Error::certificate(format!(
            "{CERT_FILE} holds no certificate"
        )));
    }
    // Never echo key material: only say what kind of problem it is. The PEM and rustls errors kept as the
    // source quote no key bytes either (a section's BEGIN/END marker line, a base64 decoder's position, "no
    // supported key type"), so they may stay in the chain.
    let key =
        PrivateKeyDer::from_pem_slice(key).map_err(|e| Error::certificate_from(KEY_FILE, e))?;
    let signing = rustls::crypto::ring::sign::any_supported_type(&key)
        .map_err(|e| Error::certificate_from(KEY_FILE, e))?;
    let certified = CertifiedKey::new(chain, signing);
    certified.keys_match().map_err(|e| {
        Error::certificate_from(format!("{CERT_FILE} and {KEY_FILE} do not match"), e)
    })?;
    Ok(Arc::new(certified))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    fn pair(name: &str) -> (String, String) {
        let key = rcgen::KeyPair::generate().unwrap();
        let cert = rcgen::CertificateParams::new(vec![name.to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn write(dir: &Path, (cert, key): &(String, String)) {
        std::fs::write(dir.join(CERT_FILE), cert).unwrap();
        std::fs::write(dir.join(KEY_FILE), key).unwrap();
    }

    #[test]
    fn loads_reloads_and_keeps_the_last_good_pair() {
        let dir = tempfile::tempdir().unwrap();
        let serving = ServingCert::in_dir(dir.path());
        let missing = serving.reload().unwrap_err();
        assert_eq!(missing.reason(), "Certificate");
        assert!(missing.to_string().contains(CERT_FILE), "{missing}");
        // The read's own error is the source, and the text is the one `/readyz` and the log always showed.
        let read = missing
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the failed read is the source");
        assert_eq!(read.kind(), std::io::ErrorKind::NotFound);
        assert_eq!(
            missing.to_string(),
            format!(
                "serving certificate: reading {}: {read}",
                dir.path().join(CERT_FILE).display()
            )
        );
        assert!(!serving.is_loaded());

        let first = pair("one.example");
        write(dir.path(), &first);
        assert!(serving.reload().unwrap());
        assert!(serving.is_loaded());
        assert!(!serving.reload().unwrap(), "same files, nothing new");

        // A key that belongs to another certificate is refused; the first pair stays.
        let second = pair("two.example");
        std::fs::write(dir.path().join(KEY_FILE), &second.1).unwrap();
        let mismatch = serving.reload().unwrap_err();
        assert!(mismatch.to_string().contains("do not match"), "{mismatch}");
        let rustls = mismatch
            .source()
            .and_then(|s| s.downcast_ref::<rustls::Error>())
            .expect("rustls's refusal is the source");
        assert_eq!(
            mismatch.to_string(),
            format!("serving certificate: {CERT_FILE} and {KEY_FILE} do not match: {rustls}")
        );
        assert!(serving.is_loaded());

        write(dir.path(), &second);
        assert!(serving.reload().unwrap());

        std::fs::write(dir.path().join(CERT_FILE), "not a certificate").unwrap();
        let garbage = serving.reload().unwrap_err();
        assert!(
            garbage.to_string().contains("holds no certificate"),
            "{garbage}"
        );
        assert!(garbage.source().is_none(), "no other error said so");
        assert!(serving.is_loaded());
    }
}
