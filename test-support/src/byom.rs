//! A bring-your-own-machine pool on the local control plane, written the way cloud-api-adaptor
//! writes it (ConfigMap `byom-ip-pool-state`, key `allocation-state`): the "cloud" of the byom
//! backend, for its own tests and for provider-service's and peerpod-ctrl's.
#![allow(clippy::unwrap_used, clippy::expect_used)] // test support: a failed arrangement is a failed test

use k8s_openapi::api::core::v1::ConfigMap;
use kube::Client;
use kube::api::{Api, ObjectMeta, PostParams};
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

    /// provider-service's configuration for this pool (cloud-api-adaptor's keys), with
    /// `CLOUD_PROVIDER=byom`.
    pub fn config(&self) -> Vec<(String, String)> {
        vec![
            ("CLOUD_PROVIDER".to_owned(), "byom".to_owned()),
            ("VM_POOL_IPS".to_owned(), self.ips.join(",")),
            ("POOL_NAMESPACE".to_owned(), self.ns.clone()),
        ]
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
