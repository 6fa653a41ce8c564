//! Every Kubernetes API call of this backend: reading and replacing the pool ConfigMap, each
//! bounded in time, retried on outages, counted in `CloudCalls` (each try also as an attempt in
//! `cloud_api_attempts`, classified as the HTTP clouds' are).

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use peerpods_provider_core::{CloudCalls, Error, ExposeSecret, Redactor};
use tokio::sync::OnceCell;

use crate::failure::{Failure, attempt_result, classify, timed_out};
use crate::pool_state::{PoolState, STATE_KEY};
use crate::settings::NAME;

/// Operation names in `provider_service_cloud_api_calls_total`.
pub const GET_CONFIGMAP: &str = "GetConfigMap";
pub const REPLACE_CONFIGMAP: &str = "ReplaceConfigMap";

/// Longest wait for one API answer.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// Tries of one call when the API is unavailable (5xx, 408, no answer).
const TRANSIENT_ATTEMPTS: u32 = 3;
/// First wait before another try; it doubles each time.
const TRANSIENT_BACKOFF: Duration = Duration::from_millis(200);

/// How this backend reaches the Kubernetes API.
pub enum Connection {
    /// In-cluster ServiceAccount or `KUBECONFIG`, inferred on first use.
    Infer,
    /// The kubeconfig file at this path (`BYOM_KUBECONFIG`), read on first use.
    Kubeconfig(std::path::PathBuf),
    /// This client configuration, turned into a client on first use.
    Config(Box<kube::Config>),
    /// This client, as its owner built it.
    Client(kube::Client),
}

struct Connected {
    client: kube::Client,
    redactor: Redactor,
}

/// The pool ConfigMap `namespace/name`.
pub struct PoolConfigMap {
    connection: Connection,
    connected: OnceCell<Connected>,
    namespace: String,
    name: String,
    calls: CloudCalls,
}

impl PoolConfigMap {
    /// The pool state as CAA last wrote it, with the ConfigMap it came from.
    pub async fn read_state(&self) -> Result<(ConfigMap, PoolState), Error> {
        let configmap = self.get().await.map_err(|f| self.error_of(f))?;
        let state = state_of(&configmap, &self.path())?;
        Ok((configmap, state))
    }

    pub fn error_of(&self, failure: Failure) -> Error {
        match failure {
            Failure::NotFound => Error::config(
                "POOL_CONFIGMAP_NAME",
                format!(
                    "ConfigMap {} does not exist: cloud-api-adaptor creates it when it starts \
                     with CLOUD_PROVIDER=byom; check POOL_NAMESPACE and POOL_CONFIGMAP_NAME",
                    self.path()
                ),
            ),
            Failure::Conflict => {
                Error::unavailable(format!("ConfigMap {} changed meanwhile", self.path()))
            }
            Failure::Transient(error) | Failure::Final(error) => error,
        }
    }

    pub fn new(connection: Connection, namespace: String, name: String, calls: CloudCalls) -> Self {
        Self {
            connection,
            connected: OnceCell::new(),
            namespace,
            name,
            calls,
        }
    }

    /// `namespace/name`, for messages.
    pub fn path(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The ConfigMap; `Failure::NotFound` when it does not exist.
    pub async fn get(&self) -> Result<ConfigMap, Failure> {
        let api = self.api().await?;
        let operation = format!("reading ConfigMap {}", self.path());
        self.call(GET_CONFIGMAP, &operation, || api.get(&self.name))
            .await
    }

    /// Writes `configmap` back if nobody changed it since it was read (its resourceVersion is
    /// the precondition): `Failure::Conflict` when somebody did.
    pub async fn replace(&self, configmap: &ConfigMap) -> Result<(), Failure> {
        let api = self.api().await?;
        let operation = format!("updating ConfigMap {}", self.path());
        let params = PostParams {
            field_manager: Some("provider-service".to_owned()),
            ..PostParams::default()
        };
        self.call(REPLACE_CONFIGMAP, &operation, || {
            api.replace(&self.name, &params, configmap)
        })
        .await
        .map(drop)
    }

    async fn api(&self) -> Result<Api<ConfigMap>, Failure> {
        let connected = self
            .connected
            .get_or_try_init(|| connect(&self.connection))
            .await
            .map_err(Failure::Final)?;
        Ok(Api::namespaced(connected.client.clone(), &self.namespace))
    }

    fn redactor(&self) -> Redactor {
        self.connected
            .get()
            .map(|c| c.redactor.clone())
            .unwrap_or_default()
    }

    /// One API call, retried while the API is unavailable, each try counted.
    async fn call<T, F, Fut>(
        &self,
        name: &'static str,
        operation: &str,
        mut attempt: F,
    ) -> Result<T, Failure>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, kube::Error>>,
    {
        let mut backoff = TRANSIENT_BACKOFF;
        let mut tries = 0;
        loop {
            tries += 1;
            let started = std::time::Instant::now();
            let failure = match tokio::time::timeout(CALL_TIMEOUT, attempt()).await {
                Ok(Ok(value)) => {
                    self.calls.record_timed(NAME, name, "ok", started.elapsed());
                    self.calls.record_attempt(NAME, name, "ok");
                    return Ok(value);
                }
                Ok(Err(error)) => {
                    if let Some(result) = attempt_result(&error) {
                        self.calls.record_attempt(NAME, name, result);
                    }
                    classify(error, operation, &self.redactor())
                }
                Err(_) => {
                    self.calls.record_attempt(NAME, name, "transport_error");
                    timed_out(operation, CALL_TIMEOUT)
                }
            };
            self.calls
                .record_timed(NAME, name, failure.result_label(), started.elapsed());
            match failure {
                Failure::Transient(error) if tries < TRANSIENT_ATTEMPTS => {
                    tracing::debug!(operation, tries, %error, "Kubernetes API unavailable, trying again");
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                other => return Err(other),
            }
        }
    }
}

/// The client for `connection`. A client this backend builds itself does not retry on its own
/// (kube's default retries 429 up to 15 times): throttling goes back to the caller with the
/// server's wait (a plain-text 429's too: `throttling`), outages are retried by [`PoolConfigMap::call`] a bounded number of times.
async fn connect(connection: &Connection) -> Result<Connected, Error> {
    let config = match connection {
        Connection::Client(client) => {
            return Ok(Connected {
                client: client.clone(),
                redactor: Redactor::default(),
            });
        }
        Connection::Config(config) => (**config).clone(),
        Connection::Kubeconfig(path) => {
            let unusable = |e: kube::config::KubeconfigError| {
                Error::config("BYOM_KUBECONFIG", format!("kubeconfig {}: {e}", path.display()))
                    .with_source(e)
            };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(unusable)?;
            kube::Config::from_custom_kubeconfig(
                kubeconfig,
                &kube::config::KubeConfigOptions::default(),
            )
            .await
            .map_err(unusable)?
        }
        Connection::Infer => kube::Config::infer().await.map_err(|e| {
            Error::config(
                "KUBECONFIG",
                format!(
                    "no Kubernetes client configuration (in-cluster ServiceAccount or KUBECONFIG): {e}"
                ),
            )
            .with_source(e)
        })?,
    };
    let redactor = redactor_for(&config);
    let mut config = config;
    config.default_retry = false;
    let client = kube::client::ClientBuilder::try_from(config)
        // No source: the builder's error may quote the configured credentials, and only the
        // redacted text may be shown.
        .map_err(|e| {
            Error::config(
                "KUBECONFIG",
                redactor.redact(&format!("cannot build a Kubernetes client: {e}")),
            )
        })?
        .with_layer(&tower::util::MapResponseLayer::new(
            crate::throttling::restate_plain_throttling::<Box<kube::client::DynBody>>,
        ))
        .build();
    Ok(Connected { client, redactor })
}

/// Keeps the client's own credentials out of every text this backend reports.
fn redactor_for(config: &kube::Config) -> Redactor {
    let auth = &config.auth_info;
    Redactor::new(
        [&auth.token, &auth.password, &auth.client_key_data]
            .into_iter()
            .flatten()
            .map(|secret| secret.expose_secret().to_owned()),
    )
}
/// The pool state of `configmap`; an error when there is none or it is not CAA's JSON.
pub(crate) fn state_of(configmap: &ConfigMap, path: &str) -> Result<PoolState, Error> {
    let text = configmap
        .data
        .as_ref()
        .and_then(|data| data.get(STATE_KEY))
        .ok_or_else(|| Error::config("POOL_CONFIGMAP_NAME", format!(
                "ConfigMap {path} has no key {STATE_KEY}: it is not cloud-api-adaptor's byom pool state"
            )))?;
    PoolState::parse(text).map_err(|e| {
        Error::internal(format!(
            "ConfigMap {path} key {STATE_KEY} is not cloud-api-adaptor's pool state: {e}"
        ))
        .with_source(e)
    })
}
