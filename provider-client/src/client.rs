//! The provider-service client every caller uses: a tonic channel (TLS with a CA file, or
//! plaintext for local development) whose calls carry the caller's projected ServiceAccount
//! token as `authorization: Bearer ...` and the current W3C trace context.
//!
//! The CA file is watched: when it changes (a CA rotation updates the mounted ConfigMap or
//! Secret in place), later calls go through a new channel that trusts the new CA, without a
//! restart. Connections have TCP_NODELAY set, so small gRPC frames are not held back by Nagle's
//! algorithm.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime};

use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use tonic::codegen::Service;
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
pub type ProviderClient =
    ProviderServiceClient<InterceptedService<ProviderChannel, CallCredentials>>;

/// Builds a client. The channel connects lazily, so a caller starts even while provider-service
/// is down; calls then fail with `UNAVAILABLE` until it is up.
pub fn connect(config: &ProviderClientConfig) -> Result<ProviderClient, Error> {
    let credentials = CallCredentials {
        token: config.token_file.as_deref().map(TokenFile::new),
        timeout: config.timeout,
    };
    Ok(ProviderServiceClient::with_interceptor(
        ProviderChannel::new(config.clone())?,
        credentials,
    ))
}

/// How often, at most, a call looks at the CA file for a change: a stat per second is nothing,
/// and the kubelet takes far longer than that to update a mounted ConfigMap or Secret.
const CA_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The channel to provider-service, rebuilt when the CA file changes (see the module doc).
/// Clones share one channel.
#[derive(Clone)]
pub struct ProviderChannel {
    config: Arc<ProviderClientConfig>,
    current: Arc<RwLock<Current>>,
    next_check: Arc<Mutex<Instant>>,
}

struct Current {
    /// The CA file's contents the channel trusts (`None` for plaintext).
    ca: Option<CaFile>,
    channel: Channel,
    /// How many times the channel was rebuilt for a new CA.
    generation: u64,
}

#[derive(PartialEq, Eq)]
struct CaFile {
    modified: Option<SystemTime>,
    pem: Vec<u8>,
}

impl std::fmt::Debug for ProviderChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProviderChannel")
            .field("endpoint", &self.config.endpoint)
            .field("ca_file", &self.config.ca_file)
            .field("generation", &self.generation())
            .finish()
    }
}

impl ProviderChannel {
    /// A lazily connecting channel for `config`; fails when the endpoint or TLS settings are
    /// unusable (an https endpoint needs a readable CA file).
    pub fn new(config: ProviderClientConfig) -> Result<Self, Error> {
        let ca = match (config.endpoint.starts_with("https://"), &config.ca_file) {
            (true, Some(path)) => Some(read_ca(path)?),
            (true, None) => {
                return Err(Error::Config {
                    message: "an https endpoint needs a CA file".into(),
                });
            }
            (false, Some(_)) => {
                return Err(Error::Config {
                    message: "a CA file was given but the endpoint is not https://".into(),
                });
            }
            (false, None) => None,
        };
        let channel = endpoint(&config, ca.as_ref().map(|c| c.pem.as_slice()))?.connect_lazy();
        Ok(ProviderChannel {
            config: Arc::new(config),
            current: Arc::new(RwLock::new(Current {
                ca,
                channel,
                generation: 0,
            })),
            next_check: Arc::new(Mutex::new(Instant::now() + CA_CHECK_INTERVAL)),
        })
    }

    /// How many times the channel was rebuilt because the CA changed.
    pub fn generation(&self) -> u64 {
        self.current.read().map_or(0, |c| c.generation)
    }

    /// Reads the CA file now and switches to a new channel when its contents changed. `Ok(true)`
    /// when it switched. A CA file that cannot be read or parsed keeps the channel in use.
    pub fn reload_ca(&self) -> Result<bool, Error> {
        let Some(path) = &self.config.ca_file else {
            return Ok(false);
        };
        let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
        let unchanged = |current: &Current| {
            current
                .ca
                .as_ref()
                .is_some_and(|ca| ca.modified == modified && modified.is_some())
        };
        if self.current.read().is_ok_and(|c| unchanged(&c)) {
            return Ok(false);
        }
        let ca = read_ca(path)?;
        if self
            .current
            .read()
            .is_ok_and(|c| c.ca.as_ref().is_some_and(|old| old.pem == ca.pem))
        {
            // Touched but the same CA: remember the new time, keep the channel (and its
            // connections).
            if let Ok(mut current) = self.current.write() {
                current.ca = Some(ca);
            }
            return Ok(false);
        }
        let channel = endpoint(&self.config, Some(&ca.pem))?.connect_lazy();
        if let Ok(mut current) = self.current.write() {
            current.ca = Some(ca);
            current.channel = channel;
            current.generation += 1;
        }
        tracing::info!(ca_file = %path.display(), "provider-service CA changed: new connections trust it");
        Ok(true)
    }

    /// The channel for the next call, after a CA check when one is due.
    fn channel(&self) -> Channel {
        let due = self.next_check.lock().is_ok_and(|mut next| {
            let now = Instant::now();
            if now >= *next {
                *next = now + CA_CHECK_INTERVAL;
                true
            } else {
                false
            }
        });
        if due && let Err(e) = self.reload_ca() {
            tracing::warn!(error = %e, "provider-service CA file unusable; keeping the CA in use");
        }
        match self.current.read() {
            Ok(c) => c.channel.clone(),
            Err(poisoned) => poisoned.into_inner().channel.clone(),
        }
    }
}

impl Service<http::Request<tonic::body::Body>> for ProviderChannel {
    type Response = http::Response<tonic::body::Body>;
    type Error = tonic::transport::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    // Readiness is the chosen channel's, awaited in `call`: which channel serves a call is only
    // known once the CA is checked.
    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<tonic::body::Body>) -> Self::Future {
        let mut channel = self.channel();
        Box::pin(async move {
            std::future::poll_fn(|cx| channel.poll_ready(cx)).await?;
            channel.call(request).await
        })
    }
}

fn read_ca(path: &Path) -> Result<CaFile, Error> {
    let modified = std::fs::metadata(path).and_then(|m| m.modified()).ok();
    let pem = std::fs::read(path).map_err(|source| Error::Io {
        context: format!("reading CA file {}", path.display()),
        source,
    })?;
    if !pem.windows(27).any(|w| w == b"-----BEGIN CERTIFICATE-----") {
        return Err(Error::Config {
            message: format!("CA file {} holds no PEM certificate", path.display()),
        });
    }
    Ok(CaFile { modified, pem })
}

/// The endpoint for `config`, trusting `ca_pem` when it is https.
fn endpoint(config: &ProviderClientConfig, ca_pem: Option<&[u8]>) -> Result<Endpoint, Error> {
    let mut endpoint = Endpoint::from_shared(config.endpoint.clone())
        .map_err(|source| Error::Transport {
            context: format!("endpoint {:?}", config.endpoint),
            source,
        })?
        .tcp_nodelay(true);
    if let Some(timeout) = config.timeout {
        endpoint = endpoint.timeout(timeout);
    }
    if let Some(pem) = ca_pem {
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(pem));
        if let Some(name) = &config.tls_server_name {
            tls = tls.domain_name(name.clone());
        }
        endpoint = endpoint
            .tls_config(tls)
            .map_err(|source| Error::Transport {
                context: "TLS settings".into(),
                source,
            })?;
    }
    Ok(endpoint)
}

/// Adds the bearer token (when configured) and the trace context to each call.
#[derive(Clone, Debug)]
pub struct CallCredentials {
    token: Option<TokenFile>,
    /// The call's deadline, also sent as `grpc-timeout`: provider-service answers within it (a delete
    /// still running is answered "in progress") instead of the caller timing out on its own.
    timeout: Option<Duration>,
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
        peerpods_runtime::telemetry::inject_current(request.metadata_mut());
        if let Some(timeout) = self.timeout
            && !request.metadata().contains_key("grpc-timeout")
        {
            request.set_timeout(timeout);
        }
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
    fn the_call_deadline_is_sent_so_the_server_answers_within_it() {
        let mut credentials = CallCredentials {
            token: None,
            timeout: Some(Duration::from_secs(90)),
        };
        let request = credentials.call(tonic::Request::new(())).unwrap();
        let sent = request.metadata().get("grpc-timeout").unwrap();
        assert_eq!(sent.to_str().unwrap(), "90000000u");
        // A deadline the call set itself wins.
        let mut own = tonic::Request::new(());
        own.set_timeout(Duration::from_secs(2));
        let request = credentials.call(own).unwrap();
        assert_eq!(
            request
                .metadata()
                .get("grpc-timeout")
                .unwrap()
                .to_str()
                .unwrap(),
            "2000000u"
        );
    }

    #[test]
    fn missing_token_file_is_an_error_not_an_empty_token() {
        let token = TokenFile::new(Path::new("/nonexistent/token"));
        assert!(token.bearer().is_err());
    }

    #[test]
    fn connections_have_nodelay() {
        let config = ProviderClientConfig {
            endpoint: "http://127.0.0.1:1".into(),
            ..Default::default()
        };
        assert!(endpoint(&config, None).unwrap().get_tcp_nodelay());
    }

    const CA_A: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
    const CA_B: &str = "-----BEGIN CERTIFICATE-----\nBBBB\n-----END CERTIFICATE-----\n";

    fn https_channel(dir: &Path) -> ProviderChannel {
        std::fs::write(dir.join("ca.crt"), CA_A).unwrap();
        ProviderChannel::new(ProviderClientConfig {
            endpoint: "https://provider-service:50051".into(),
            ca_file: Some(dir.join("ca.crt")),
            ..Default::default()
        })
        .unwrap()
    }

    /// Replaces `ca.crt` as the kubelet does (a new file moved into place) with a later time.
    fn rotate(dir: &Path, pem: &str, seconds_later: u64) {
        let next = dir.join("ca.crt.new");
        std::fs::write(&next, pem).unwrap();
        std::fs::File::options()
            .write(true)
            .open(&next)
            .unwrap()
            .set_modified(SystemTime::now() + Duration::from_secs(seconds_later))
            .unwrap();
        std::fs::rename(&next, dir.join("ca.crt")).unwrap();
    }

    #[tokio::test]
    async fn a_new_ca_gives_a_new_channel_and_the_same_ca_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let channel = https_channel(dir.path());
        assert!(!channel.reload_ca().unwrap(), "nothing changed yet");
        rotate(dir.path(), CA_A, 5);
        assert!(!channel.reload_ca().unwrap(), "same CA, newer file");
        assert_eq!(channel.generation(), 0);
        rotate(dir.path(), CA_B, 10);
        assert!(channel.reload_ca().unwrap());
        assert_eq!(channel.generation(), 1);
    }

    #[tokio::test]
    async fn an_unusable_new_ca_keeps_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let channel = https_channel(dir.path());
        rotate(dir.path(), "not a certificate", 5);
        assert!(channel.reload_ca().is_err());
        assert_eq!(channel.generation(), 0);
        std::fs::remove_file(dir.path().join("ca.crt")).unwrap();
        assert!(channel.reload_ca().is_err());
        assert_eq!(channel.generation(), 0);
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
