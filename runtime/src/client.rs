//! The provider-service client every caller uses: a tonic channel (TLS with a CA file, or
//! plaintext for local development) whose calls carry the caller's projected ServiceAccount
//! token as `authorization: Bearer ...` and the current W3C trace context.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use tonic::metadata::MetadataValue;
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};

use crate::Error;

/// Where provider-service is and how to reach it.
#[derive(Debug, Clone, Default)]
pub struct ProviderClientConfig {
    /// `https://host:port` (TLS, needs `ca_file`) or `http://host:port` (plaintext, local only).
    pub endpoint: String,
    /// PEM file with the CA that signed provider-service's certificate.
    pub ca_file: Option<PathBuf>,
    /// Name to verify the server certificate against, when it differs from the endpoint's host.
    pub tls_server_name: Option<String>,
    /// Projected ServiceAccount token file (audience = provider-service). Re-read when it changes.
    pub token_file: Option<PathBuf>,
    /// Deadline of each call.
    pub timeout: Option<Duration>,
}

/// A provider-service client with credentials and trace context on every call.
pub type ProviderClient = ProviderServiceClient<InterceptedService<Channel, CallCredentials>>;

/// Builds a client. The channel connects lazily, so a caller starts even while provider-service
/// is down; calls then fail with `UNAVAILABLE` until it is up.
pub fn connect(config: &ProviderClientConfig) -> Result<ProviderClient, Error> {
    let mut endpoint =
        Endpoint::from_shared(config.endpoint.clone()).map_err(|e| Error::ProviderClient {
            message: format!("endpoint {:?}: {e}", config.endpoint),
        })?;
    if let Some(timeout) = config.timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if config.endpoint.starts_with("https://") {
        let ca_file = config
            .ca_file
            .as_ref()
            .ok_or_else(|| Error::ProviderClient {
                message: "an https endpoint needs a CA file".into(),
            })?;
        let pem = std::fs::read(ca_file)
            .map_err(|e| Error::io(format!("reading CA file {}", ca_file.display()), e))?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
        if let Some(name) = &config.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|e| Error::ProviderClient {
                message: format!("TLS settings: {e}"),
            })?;
    } else if config.ca_file.is_some() {
        return Err(Error::ProviderClient {
            message: "a CA file was given but the endpoint is not https://".into(),
        });
    }
    let credentials = CallCredentials {
        token: config.token_file.as_deref().map(TokenFile::new),
    };
    Ok(ProviderServiceClient::with_interceptor(
        endpoint.connect_lazy(),
        credentials,
    ))
}

/// Adds the bearer token (when configured) and the trace context to each call.
#[derive(Clone, Debug)]
pub struct CallCredentials {
    token: Option<TokenFile>,
}

impl Interceptor for CallCredentials {
    fn call(
        &mut self,
        mut request: tonic::Request<()>,
    ) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(token) = &self.token {
            let value = token.bearer().map_err(|e| {
                tonic::Status::unauthenticated(format!("cannot read own token: {e}"))
            })?;
            request.metadata_mut().insert("authorization", value);
        }
        crate::telemetry::inject_current(request.metadata_mut());
        Ok(request)
    }
}

/// A token file read again whenever it changes (the kubelet rotates projected tokens by
/// swapping a symlink, which changes the modification time seen through it) or once a minute.
#[derive(Clone, Debug)]
pub struct TokenFile {
    path: PathBuf,
    cached: Arc<Mutex<Option<CachedToken>>>,
}

#[derive(Debug)]
struct CachedToken {
    modified: Option<SystemTime>,
    read_at: std::time::Instant,
    header: MetadataValue<tonic::metadata::Ascii>,
}

const TOKEN_MAX_AGE: Duration = Duration::from_secs(60);

impl TokenFile {
    pub fn new(path: &Path) -> Self {
        TokenFile {
            path: path.to_owned(),
            cached: Arc::new(Mutex::new(None)),
        }
    }

    /// `Bearer <token>`, from the cache when the file is unchanged.
    pub fn bearer(&self) -> Result<MetadataValue<tonic::metadata::Ascii>, String> {
        let modified = std::fs::metadata(&self.path)
            .and_then(|m| m.modified())
            .ok();
        let mut cached = self
            .cached
            .lock()
            .map_err(|_| "token cache poisoned".to_owned())?;
        if let Some(c) = cached.as_ref()
            && c.modified == modified
            && modified.is_some()
            && c.read_at.elapsed() < TOKEN_MAX_AGE
        {
            return Ok(c.header.clone());
        }
        let token = std::fs::read_to_string(&self.path)
            .map_err(|e| format!("{}: {e}", self.path.display()))?;
        let header = MetadataValue::try_from(format!("Bearer {}", token.trim()))
            .map_err(|_| format!("{}: token is not printable ASCII", self.path.display()))?;
        *cached = Some(CachedToken {
            modified,
            read_at: std::time::Instant::now(),
            header: header.clone(),
        });
        Ok(header)
    }
}

/// How long a `RESOURCE_EXHAUSTED` answer asks to wait (its `google.rpc.RetryInfo` detail).
pub fn retry_after(status: &tonic::Status) -> Option<Duration> {
    use tonic_types::StatusExt;
    status
        .get_details_retry_info()
        .and_then(|info| info.retry_delay)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_file_is_reread_after_rotation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("token");
        std::fs::write(&path, "first\n").unwrap();
        let token = TokenFile::new(&path);
        assert_eq!(token.bearer().unwrap(), "Bearer first");
        // Rotate as the kubelet does: a new file moved into place (new modification time).
        let next = dir.path().join("token.new");
        std::fs::write(&next, "second").unwrap();
        let later = SystemTime::now() + Duration::from_secs(5);
        std::fs::File::options()
            .write(true)
            .open(&next)
            .unwrap()
            .set_modified(later)
            .unwrap();
        std::fs::rename(&next, &path).unwrap();
        assert_eq!(token.bearer().unwrap(), "Bearer second");
    }

    #[test]
    fn missing_token_file_is_an_error_not_an_empty_token() {
        let token = TokenFile::new(Path::new("/nonexistent/token"));
        assert!(token.bearer().is_err());
    }

    #[test]
    fn https_needs_a_ca_file() {
        let config = ProviderClientConfig {
            endpoint: "https://provider-service:50051".into(),
            ..Default::default()
        };
        assert!(connect(&config).is_err());
    }

    #[test]
    fn retry_info_round_trips() {
        use tonic_types::{ErrorDetails, StatusExt};
        let status = tonic::Status::with_error_details(
            tonic::Code::ResourceExhausted,
            "throttled",
            ErrorDetails::with_retry_info(Some(Duration::from_millis(1500))),
        );
        assert_eq!(retry_after(&status), Some(Duration::from_millis(1500)));
    }
}
