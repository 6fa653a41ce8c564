//! The one way to start provider-service: configuration (loaded, then polled), TLS, caller
//! authentication, the admin server and the gRPC server, wired once. `main.rs` turns flags into
//! [`Options`] and calls [`run`]; the tests and the bench call [`start`] and keep the
//! [`Running`] handle for its address and metrics.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use peerpods_runtime::admin::{AdminServer, Readiness};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::auth::{Grant, TokenReviewer};
use crate::deletes::{DeleteCaps, DeleteSettings, Deletes};
use crate::grpc::ProviderApi;
use crate::load::{Load, LoadLimits};
use crate::metrics::Metrics;
use crate::reload::ConfigReloader;
use crate::server::{GrpcServer, serve};
use crate::tls::{ReloadingCert, TlsPolicy, TlsVersion};

/// Where a server listens: an address to bind, or a listener already bound (a test that must
/// know the port first, or restarts on the same one).
#[derive(Debug)]
pub enum Listen {
    Addr(SocketAddr),
    Bound(TcpListener),
}

impl Listen {
    async fn bind(self, what: &str) -> Result<TcpListener, Error> {
        match self {
            Listen::Addr(addr) => TcpListener::bind(addr)
                .await
                .map_err(|e| Error::io(format!("binding the {what} port to {addr}"), e)),
            Listen::Bound(listener) => Ok(listener),
        }
    }
}

/// How callers are authenticated.
pub enum CallerAuth {
    /// Nobody is checked. Local development only.
    None,
    /// Projected ServiceAccount tokens checked with TokenReview (`client`, or the in-cluster /
    /// KUBECONFIG client when `None`) for `audience`, and each caller's methods by `grants`.
    TokenReview {
        client: Option<kube::Client>,
        audience: String,
        grants: Vec<Grant>,
    },
}

/// Everything provider-service needs to run.
pub struct Options {
    pub grpc: Listen,
    /// `/healthz`, `/readyz` and `/metrics`; `None` runs without them.
    pub admin: Option<Listen>,
    /// With the admin port: `/metrics` on this TLS port only, behind TokenReview and SubjectAccessReview
    /// (`--metrics-secure`).
    pub secure_metrics: Option<peerpods_runtime::secure_metrics::SecureMetrics>,
    /// Directories whose files are configuration keys (later ones win; the environment fills
    /// in).
    pub config_dirs: Vec<PathBuf>,
    /// Development mode (`--development`): without `CLOUD_PROVIDER` the embedded default
    /// (libvirt's in-memory test driver) is served, and `test:` libvirt URIs are accepted.
    /// Off, an unconfigured service serves nothing and is not ready.
    pub development: bool,
    /// How often the configuration and TLS files are checked for changes.
    pub reload_interval: Duration,
    /// PEM certificate and key of the gRPC port; `None` speaks plaintext.
    pub tls: Option<(PathBuf, PathBuf)>,
    pub auth: CallerAuth,
}

/// A started provider-service.
pub struct Running {
    pub grpc_addr: SocketAddr,
    pub admin_addr: Option<SocketAddr>,
    pub metrics: Metrics,
    /// The Prometheus registry `/metrics` serves.
    pub prometheus: Arc<prometheus_client::registry::Registry>,
    pub readiness: Readiness,
    /// The detached deletes (how many run, for tests and the bench).
    pub deletes: Deletes,
    /// The bound on calls in flight (how many run, for tests and the bench).
    pub load: Load,
    task: tokio::task::JoinHandle<Result<(), Error>>,
}

impl Running {
    /// Waits until the service has stopped (after the shutdown token is cancelled).
    pub async fn wait(self) -> Result<(), Error> {
        self.task
            .await
            .map_err(|e| Error::internal_from("provider-service task", e))?
    }
}

/// Runs until `shutdown` is cancelled.
pub async fn run(options: Options, shutdown: CancellationToken) -> Result<(), Error> {
    start(options, shutdown).await?.wait().await
}

/// Loads the configuration, binds both ports and starts serving; fails (before serving) on a
/// bad configuration, TLS pair or port. Deletes run with the default [`DeleteSettings`].
pub async fn start(options: Options, shutdown: CancellationToken) -> Result<Running, Error> {
    start_with(options, DeleteSettings::default(), shutdown).await
}

/// [`start`] with other delete settings (answer window, retry advice, drain grace).
///
/// Shutdown (`shutdown` cancelled): not ready and no new delete first, then the gRPC server stops
/// taking calls, then the detached deletes get up to `deletes.drain_grace` to end; the admin
/// server (`/healthz`, `/readyz`, `/metrics`) answers until then, and [`Running::wait`] returns
/// after it.
pub async fn start_with(
    options: Options,
    delete_settings: DeleteSettings,
    shutdown: CancellationToken,
) -> Result<Running, Error> {
    let mut prometheus = prometheus_client::registry::Registry::default();
    let metrics = Metrics::register(&mut prometheus);
    let load = Load::new(LoadLimits::default());
    load.register(prometheus.sub_registry_with_prefix("provider_service"));
    let deletes = Deletes::new(delete_settings);
    deletes.register(prometheus.sub_registry_with_prefix("provider_service"));
    let prometheus = Arc::new(prometheus);
    let readiness = Readiness::default();

    let reloader = ConfigReloader::start(
        options.config_dirs,
        options.development,
        metrics.clone(),
        readiness.clone(),
    )
    .await?;
    // The configuration's limits and TLS settings take effect at start.
    let mut tls_policy = TlsPolicy::default();
    if let Some(config) = reloader.config() {
        load.set_limits(LoadLimits::from_config(config)?);
        deletes.set_caps(DeleteCaps::from_config(config)?);
        tls_policy = tls_policy_from(config)?;
    }
    let tls = match &options.tls {
        Some((cert, key)) => Some(ReloadingCert::load(cert, key)?.with_policy(tls_policy)),
        None => {
            tracing::warn!("no TLS certificate: the gRPC port speaks plaintext");
            None
        }
    };
    let reviewer = match options.auth {
        CallerAuth::None => {
            tracing::warn!("callers are NOT authenticated; use this for local development only");
            None
        }
        CallerAuth::TokenReview {
            client,
            audience,
            grants,
        } => {
            if grants.is_empty() {
                tracing::warn!("no caller is allowed: every call will be refused");
            }
            for grant in grants.iter().filter(|g| g.is_unrestricted()) {
                tracing::warn!(caller = %grant.caller, "caller may call every method; name its methods (namespace/name=Method+Method)");
            }
            let client = match client {
                Some(client) => client,
                None => kube::Client::try_default()
                    .await
                    .map_err(|e| Error::AuthUnavailable {
                        message: "no Kubernetes client for TokenReview".into(),
                        source: Some(std::sync::Arc::new(e)),
                    })?,
            };
            Some(Arc::new(TokenReviewer::new(
                client,
                audience,
                grants,
                metrics.clone(),
            )))
        }
    };

    let admin = match options.admin {
        Some(listen) => Some(
            AdminServer::on(
                listen.bind("admin").await?,
                readiness.clone(),
                prometheus.clone(),
            )
            .with_secure_metrics(options.secure_metrics),
        ),
        None => None,
    };
    let admin_addr = match &admin {
        Some(a) => Some(
            a.local_addr()
                .map_err(|e| Error::internal_from("admin address", e))?,
        ),
        None => None,
    };
    let listener = options.grpc.bind("gRPC").await?;
    let grpc_addr = listener
        .local_addr()
        .map_err(|e| Error::io("gRPC address", e))?;
    let api = ProviderApi::new(reloader.registry(), metrics.clone(), deletes.clone());

    let task = tokio::spawn({
        let readiness = readiness.clone();
        let deletes = deletes.clone();
        let load = load.clone();
        async move {
            // The admin server outlives the gRPC server: /readyz says "not ready" and /healthz
            // "alive" while the deletes drain, so the kubelet neither routes to nor kills us.
            let admin_stop = CancellationToken::new();
            let admin_task = admin.map(|admin| {
                tokio::spawn(admin.serve({
                    let admin_stop = admin_stop.clone();
                    async move { admin_stop.cancelled().await }
                }))
            });
            let reload_task = tokio::spawn(reloader.run(
                options.reload_interval.max(Duration::from_millis(10)),
                tls.clone(),
                shutdown.clone(),
            ));
            let served = serve(
                GrpcServer {
                    listener,
                    api,
                    reviewer,
                    tls,
                    readiness,
                    deletes: deletes.clone(),
                    load,
                },
                shutdown.clone(),
            )
            .await;
            shutdown.cancel();
            // Deletes are resumable, so one cut off here is finished by the next call (to another
            // replica, or this one restarted); waiting spares the cloud a half-done delete.
            deletes.close();
            let draining = deletes.in_flight();
            if draining > 0 {
                tracing::info!(
                    deletes = draining,
                    grace_s = delete_settings.drain_grace.as_secs(),
                    "waiting for the deletes in flight"
                );
                let left = deletes.drain(delete_settings.drain_grace).await;
                if left > 0 {
                    tracing::warn!(
                        deletes = left,
                        "deletes still running at the end of the grace period are abandoned; the next call resumes them"
                    );
                } else {
                    tracing::info!("every delete in flight has ended");
                }
            }
            admin_stop.cancel();
            let _ = reload_task.await;
            if let Some(admin_task) = admin_task
                && let Ok(Err(e)) = admin_task.await
            {
                tracing::warn!(error = %e, "admin server stopped with an error");
            }
            served
        }
    });
    Ok(Running {
        grpc_addr,
        admin_addr,
        metrics,
        prometheus,
        readiness,
        deletes,
        load,
        task,
    })
}

/// `TLS_MIN_VERSION` and `TLS_CIPHER_SUITES` (comma-separated) from the configuration or the
/// environment, by the names and rules of cloud-api-adaptor's webhook.
fn tls_policy_from(config: &crate::config::ProviderConfig) -> Result<TlsPolicy, Error> {
    let refused = |key: &str, message: String| crate::error::ProviderError::config(key, message);
    let min_version = match config.get("TLS_MIN_VERSION").map(str::trim) {
        None | Some("") | Some("VersionTLS12") => TlsVersion::Tls12,
        Some("VersionTLS13") => TlsVersion::Tls13,
        Some(other) => {
            return Err(refused(
                "TLS_MIN_VERSION",
                format!(
                    "{other:?}: use VersionTLS12 or VersionTLS13 (TLS 1.0 and 1.1 are not supported)"
                ),
            )
            .into());
        }
    };
    let suites: Vec<String> = config
        .get("TLS_CIPHER_SUITES")
        .map(|s| s.split(',').map(str::to_owned).collect())
        .unwrap_or_default();
    let (policy, left_out) = TlsPolicy::new(min_version, &suites)
        .map_err(|e| refused("TLS_CIPHER_SUITES", e.to_string()).with_source(e))?;
    if !left_out.is_empty() {
        tracing::warn!(
            suites = %left_out.join(","),
            "TLS_CIPHER_SUITES names cipher suites this service does not implement; they are left out"
        );
    }
    Ok(policy)
}
