//! Starts provider-service in-process on 127.0.0.1 (a free port) with a config directory, the
//! way main.rs wires it, and stops it when dropped.
#![allow(dead_code)]
#![allow(clippy::unwrap_used)] // test support may unwrap (the workspace denies it elsewhere)

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use peerpods_runtime::admin::Readiness;
use provider_service::auth::TokenReviewer;
use provider_service::grpc::ProviderApi;
use provider_service::metrics::Metrics;
use provider_service::reload::ConfigReloader;
use provider_service::server::{GrpcServer, serve};
use provider_service::tls::ReloadingCert;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

pub struct TestServer {
    pub addr: SocketAddr,
    pub metrics: Metrics,
    pub readiness: Readiness,
    shutdown: CancellationToken,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub struct Options {
    pub reviewer: Option<Arc<TokenReviewer>>,
    pub tls: Option<Arc<ReloadingCert>>,
    pub reload_interval: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            reviewer: None,
            tls: None,
            reload_interval: Duration::from_millis(100),
        }
    }
}

/// Writes `pairs` as config files into `dir`.
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

pub async fn start(config_dir: &Path, options: Options) -> TestServer {
    start_with_metrics(config_dir, options, Metrics::default()).await
}

pub async fn start_with_metrics(
    config_dir: &Path,
    options: Options,
    metrics: Metrics,
) -> TestServer {
    let readiness = Readiness::default();
    let shutdown = CancellationToken::new();
    let reloader = ConfigReloader::start(
        vec![config_dir.to_owned()],
        metrics.clone(),
        readiness.clone(),
    )
    .await
    .expect("initial config");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let api = ProviderApi::new(reloader.registry(), metrics.clone());
    tokio::spawn(reloader.run(
        options.reload_interval,
        options.tls.clone(),
        shutdown.clone(),
    ));
    let server = GrpcServer {
        listener,
        api,
        reviewer: options.reviewer,
        tls: options.tls,
        readiness: readiness.clone(),
    };
    let stop = shutdown.clone();
    tokio::spawn(async move {
        serve(server, stop).await.expect("gRPC server");
    });
    TestServer {
        addr,
        metrics,
        readiness,
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
