//! A byom pool on the local control plane, written the way cloud-api-adaptor writes it, and a
//! Kubernetes client that counts its requests and can run a competing write just before the
//! first update it forwards.
#![allow(dead_code)]

pub mod fake_apiserver;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{Method, Request, Response};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::client::Body;
use peerpods_provider_byom::ByomProvider;
use peerpods_provider_core::{CloudCalls, ProviderConfig};
use serde_json::{Value, json};

/// CAA's defaults for the ConfigMap name and data key.
pub const CONFIGMAP: &str = "byom-ip-pool-state";
pub const STATE_KEY: &str = "allocation-state";

/// A namespace holding one pool ConfigMap.
pub struct Pool {
    pub client: Client,
    pub ns: String,
    pub ips: Vec<String>,
}

impl Pool {
    /// A fresh namespace without a pool ConfigMap.
    pub async fn empty_namespace(ips: &[&str]) -> Pool {
        let client = testenv::shared().client().await;
        let ns = testenv::namespace(&client, "byom").await;
        Pool {
            client,
            ns,
            ips: ips.iter().map(|ip| (*ip).to_owned()).collect(),
        }
    }

    /// A pool as CAA's first start leaves it (`initializeAndSaveEmptyState`): every machine
    /// available, version 1, the ConfigMap labelled as CAA labels it.
    pub async fn start(ips: &[&str]) -> Pool {
        let pool = Self::empty_namespace(ips).await;
        let state = json!({
            "allocatedIPs": {},
            "availableIPs": pool.ips,
            "lastUpdated": now(),
            "version": 1,
        });
        let configmap = ConfigMap {
            metadata: ObjectMeta {
                name: Some(CONFIGMAP.into()),
                namespace: Some(pool.ns.clone()),
                labels: Some(
                    [
                        ("app.kubernetes.io/name", "cloud-api-adaptor"),
                        ("app.kubernetes.io/component", "byom-ip-pool-state"),
                    ]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                ),
                ..ObjectMeta::default()
            },
            data: Some([(STATE_KEY.to_owned(), pretty(&state))].into()),
            ..ConfigMap::default()
        };
        pool.api()
            .create(&PostParams::default(), &configmap)
            .await
            .expect("create pool ConfigMap");
        pool
    }

    pub fn api(&self) -> Api<ConfigMap> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The provider-service config of this pool (CAA's keys), plus `extra`.
    pub fn config(&self, extra: &[(&str, &str)]) -> ProviderConfig {
        let ips = self.ips.join(",");
        let mut pairs = vec![
            ("VM_POOL_IPS".to_owned(), ips),
            ("POOL_NAMESPACE".to_owned(), self.ns.clone()),
        ];
        pairs.extend(
            extra
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
        );
        ProviderConfig::from_pairs(pairs)
    }

    /// The provider as provider-service builds it, reaching the control plane as its admin.
    pub async fn provider(&self, calls: &CloudCalls) -> ByomProvider {
        let kube_config = testenv::shared().config().await.expect("kube config");
        ByomProvider::with_kube_config(&self.config(&[]), kube_config, calls.clone())
            .expect("provider")
    }

    /// The pool state as stored now, with the ConfigMap's resourceVersion.
    pub async fn state(&self) -> (Value, String) {
        let configmap = self.api().get(CONFIGMAP).await.expect("get pool ConfigMap");
        let text = configmap
            .data
            .as_ref()
            .and_then(|d| d.get(STATE_KEY))
            .expect("allocation-state")
            .clone();
        (
            serde_json::from_str(&text).expect("state JSON"),
            configmap.metadata.resource_version.unwrap_or_default(),
        )
    }

    pub async fn available(&self) -> Vec<String> {
        let (state, _) = self.state().await;
        let mut ips: Vec<String> = state["availableIPs"]
            .as_array()
            .expect("availableIPs")
            .iter()
            .map(|v| v.as_str().expect("ip").to_owned())
            .collect();
        ips.sort();
        ips
    }

    /// Allocation id → IP of every allocation.
    pub async fn allocated(&self) -> Vec<(String, String)> {
        let (state, _) = self.state().await;
        state["allocatedIPs"]
            .as_object()
            .expect("allocatedIPs")
            .iter()
            .map(|(id, a)| (id.clone(), a["ip"].as_str().expect("ip").to_owned()))
            .collect()
    }

    /// Allocates `ip` to `pod` on `node` the way CAA's `doAllocateIP` does: read, move the IP
    /// from `availableIPs` to `allocatedIPs["<pod>-<sandbox>"]`, bump version, update with the
    /// read's resourceVersion (again from a fresh read on conflict).
    pub async fn caa_allocate(&self, ip: &str, pod: &str, node: &str) -> String {
        caa_allocate(&self.api(), ip, pod, node).await
    }
}

pub async fn caa_allocate(api: &Api<ConfigMap>, ip: &str, pod: &str, node: &str) -> String {
    let allocation_id = format!("{pod}-0123456789abcdef");
    for _ in 0..10 {
        let mut configmap = api.get(CONFIGMAP).await.expect("get pool ConfigMap");
        let data = configmap.data.get_or_insert_default();
        let mut state: Value =
            serde_json::from_str(data.get(STATE_KEY).expect("allocation-state")).expect("JSON");
        let available = state["availableIPs"].as_array_mut().expect("availableIPs");
        let before = available.len();
        available.retain(|v| v != ip);
        assert_eq!(available.len() + 1, before, "{ip} is not available");
        state["allocatedIPs"][&allocation_id] = json!({
            "allocationID": allocation_id,
            "ip": ip,
            "nodeName": node,
            "podName": pod,
            "allocatedAt": now(),
        });
        state["lastUpdated"] = json!(now());
        state["version"] = json!(state["version"].as_i64().unwrap_or(0) + 1);
        data.insert(STATE_KEY.to_owned(), pretty(&state));
        match api
            .replace(CONFIGMAP, &PostParams::default(), &configmap)
            .await
        {
            Ok(_) => return allocation_id,
            Err(kube::Error::Api(s)) if s.code == 409 => continue,
            Err(e) => panic!("CAA-style allocation of {ip}: {e}"),
        }
    }
    panic!("CAA-style allocation of {ip} kept conflicting");
}

/// `metav1.Now()` as JSON: RFC 3339, UTC, whole seconds.
pub fn now() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

/// `json.MarshalIndent(state, "", "  ")`.
pub fn pretty(state: &Value) -> String {
    serde_json::to_string_pretty(state).expect("JSON")
}

type Hook = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A Kubernetes client that forwards to `inner`, counting requests, and runs a hook (once)
/// before forwarding the first PUT.
#[derive(Clone)]
pub struct Tap {
    inner: Client,
    requests: Arc<AtomicUsize>,
    before_first_put: Arc<Mutex<Option<Hook>>>,
}

impl Tap {
    pub fn new(inner: Client) -> Self {
        Self {
            inner,
            requests: Arc::default(),
            before_first_put: Arc::default(),
        }
    }

    pub fn before_first_put(&self, hook: impl Future<Output = ()> + Send + 'static) {
        *self.before_first_put.lock().expect("hook") = Some(Box::pin(hook));
    }

    pub fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }

    pub fn client(&self, ns: &str) -> Client {
        Client::new(self.clone(), ns)
    }
}

impl tower::Service<Request<Body>> for Tap {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        self.requests.fetch_add(1, Ordering::SeqCst);
        let hook = if request.method() == Method::PUT {
            self.before_first_put.lock().expect("hook").take()
        } else {
            None
        };
        let inner = self.inner.clone();
        Box::pin(async move {
            if let Some(hook) = hook {
                hook.await;
            }
            inner.send(request).await
        })
    }
}
