//! Starts provider-service in-process on 127.0.0.1 (free ports) with a config directory, through
//! the same `service::start` main.rs uses, and stops it when dropped.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use peerpods_runtime::admin::Readiness;
use provider_service::metrics::Metrics;
pub use provider_service::service::CallerAuth;
use provider_service::service::{Listen, Options as ServiceOptions};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// Held by the flood test (thousands of connections and looping streams) and by the tests whose verdict
/// counts calls that coalesce while others are in flight (the AWS backend's batching): on a 2-core machine the
/// flood would spread those calls out and split their batches, whatever the code does.
pub static CPU_HEAVY: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// A loopback address no one listens on now, for a binary the test starts (it binds it itself).
pub fn free_addr() -> SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics: Metrics,
    pub readiness: Readiness,
    /// The bound on calls in flight (load shedding).
    pub load: provider_service::load::Load,
    shutdown: CancellationToken,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub struct Options {
    pub auth: CallerAuth,
    /// PEM certificate and key files of the gRPC port.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub reload_interval: Duration,
    /// Development mode (`--development`): needed for libvirt's `test:` driver.
    pub development: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            auth: CallerAuth::None,
            tls: None,
            reload_interval: Duration::from_millis(100),
            development: false,
        }
    }
}

impl Options {
    /// The default options in development mode, as the tests on libvirt's test driver need.
    pub fn development() -> Self {
        Options {
            development: true,
            ..Options::default()
        }
    }
}

/// A fresh config directory holding `pairs` (see [`write_config`]).
pub fn config_dir(pairs: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_config(dir.path(), pairs);
    dir
}

/// A fresh config directory for libvirt's test driver (`test:///default`, development mode only).
pub fn libvirt_config_dir() -> tempfile::TempDir {
    config_dir(&[
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", "test:///default"),
    ])
}

/// A ListProviders request carrying `token` as its bearer token.
pub fn list_providers_with_token(
    token: &str,
) -> tonic::Request<peerpods_proto::v1::ListProvidersRequest> {
    let mut request = tonic::Request::new(peerpods_proto::v1::ListProvidersRequest {});
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

/// provider-service in development mode on `config_dir`, letting in the callers of `grants` whose tokens the
/// API server behind `admin` reviews as issued for `audience`.
pub async fn start_with_token_review(
    config_dir: &Path,
    admin: &kube::Client,
    audience: &str,
    grants: Vec<provider_service::auth::Grant>,
) -> TestServer {
    start(
        config_dir,
        Options {
            auth: CallerAuth::TokenReview {
                client: Some(admin.clone()),
                audience: audience.into(),
                grants,
            },
            ..Options::development()
        },
    )
    .await
}

/// Writes each key as a file, atomically (a temporary file renamed into place), as the kubelet updates a
/// mounted ConfigMap: a reload that polls in between never sees a truncated file, which would read as an empty
/// value (= the default) and switch to a config the test never meant.
pub fn write_config(dir: &Path, pairs: &[(&str, &str)]) {
    use std::io::Write;
    for (k, v) in pairs {
        let mut staged = tempfile::NamedTempFile::new_in(dir.parent().unwrap()).unwrap();
        staged.write_all(v.as_bytes()).unwrap();
        staged.persist(dir.join(k)).unwrap();
    }
}

/// provider-service started the way main.rs starts it ([`provider_service::service::start`]), on
/// free loopback ports, reading `config_dir`.
pub async fn start(config_dir: &Path, options: Options) -> TestServer {
    let loopback = || Listen::Addr(SocketAddr::from(([127, 0, 0, 1], 0)));
    let shutdown = CancellationToken::new();
    let running = provider_service::service::start(
        ServiceOptions {
            grpc: loopback(),
            // The admin port's own tests are runtime's; here readiness is read from `readiness`.
            admin: None,
            secure_metrics: None,
            config_dirs: vec![config_dir.to_owned()],
            development: options.development,
            reload_interval: options.reload_interval,
            tls: options.tls,
            auth: options.auth,
        },
        shutdown.clone(),
    )
    .await
    .expect("provider-service starts");
    TestServer {
        addr: running.grpc_addr,
        metrics: running.metrics.clone(),
        readiness: running.readiness.clone(),
        load: running.load.clone(),
        shutdown,
    }
}

impl TestServer {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub async fn channel(&self) -> Channel {
        Channel::from_shared(self.url())
            .unwrap()
            .connect()
            .await
            .unwrap()
    }

    pub async fn client(&self) -> ProviderServiceClient<Channel> {
        ProviderServiceClient::new(self.channel().await)
    }
}

/// Polls `check` every 50 ms until it returns `Some`, failing with `what` after 20 s.
pub async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() > deadline {
            panic!("timed out waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
