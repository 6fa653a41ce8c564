//! The run's own control plane (testenv: etcd, kube-apiserver, kube-controller-manager on 127.0.0.1) with both
//! CRDs, and the objects scenarios create in bulk.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::Path;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, ServiceAccount};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use peerpods_api::peerpod::{FINALIZER, PeerPod, PeerPodSpec};

use crate::Error;
use test_support::metrics::Scrape;

/// Objects created at once while arranging a scenario.
const CREATE_CONCURRENCY: usize = 32;

pub struct Cluster {
    control_plane: testenv::ControlPlane,
    pub client: kube::Client,
}

impl Cluster {
    /// Starts a control plane of its own (not the tests' shared one) and installs the CRDs.
    pub async fn start() -> Result<Cluster, Error> {
        let control_plane = tokio::task::spawn_blocking(testenv::ControlPlane::start)
            .await
            .map_err(|e| Error::setup_from("starting the control plane", e))??;
        let client = kube::Client::try_from(control_plane.config().await?)?;
        for crds in [
            "deploy/crds/peerpods.yaml",
            "deploy/crds/peerpodconfigs.yaml",
        ] {
            let client = client.clone();
            // testenv's helper panics on failure (it is made for tests); a task turns that into an error.
            tokio::spawn(async move { testenv::apply_crds(&client, crds).await })
                .await
                .map_err(|e| Error::setup_from(format!("applying {crds}"), e))?;
        }
        // The webhook configuration the chart creates (no webhooks): peer-pod-config-ctrl only adds its webhook to
        // it, and without it a PeerPodConfig waits (WebhookConfigurationMissing) and its reconciles back off.
        let configuration = MutatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(peer_pod_config_ctrl::objects::WEBHOOK_CONFIGURATION.into()),
                ..ObjectMeta::default()
            },
            webhooks: Some(vec![]),
        };
        Api::<MutatingWebhookConfiguration>::all(client.clone())
            .create(&PostParams::default(), &configuration)
            .await
            .map_err(|e| Error::setup_from("creating the chart's webhook configuration", e))?;
        Ok(Cluster {
            control_plane,
            client,
        })
    }

    pub fn kubeconfig(&self) -> &Path {
        self.control_plane.kubeconfig_path()
    }

    /// How the control plane is tuned for speed, as it announces itself.
    pub fn tuning(&self) -> &[String] {
        self.control_plane.tuning()
    }

    /// Creates namespace `name` with the ServiceAccounts peer-pod-config-ctrl's owned objects name.
    pub async fn namespace(&self, name: &str) -> Result<(), Error> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        namespaces
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: meta(name),
                    ..Namespace::default()
                },
            )
            .await?;
        let accounts: Api<ServiceAccount> = Api::namespaced(self.client.clone(), name);
        for account in ["cloud-api-adaptor", "peer-pods-webhook"] {
            accounts
                .create(
                    &PostParams::default(),
                    &ServiceAccount {
                        metadata: meta(account),
                        ..ServiceAccount::default()
                    },
                )
                .await?;
        }
        Ok(())
    }

    pub fn peerpods(&self, ns: &str) -> Api<PeerPod> {
        Api::namespaced(self.client.clone(), ns)
    }

    /// PeerPods `<prefix>-<i>` as cloud-api-adaptor creates them (with the finalizer), one per instance id.
    /// PeerPods `<prefix>-<i>` as cloud-api-adaptor creates them: the finalizer and, when `owned`, one
    /// controller ownerReference to a Pod of the same name created for it (a PeerPod whose owner does not exist
    /// would be deleted by the garbage collector).
    pub async fn create_peerpods(
        &self,
        ns: &str,
        prefix: &str,
        provider: &str,
        instance_ids: &[String],
        owned: bool,
    ) -> Result<(), Error> {
        let api = self.peerpods(ns);
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        futures::stream::iter(instance_ids.iter().enumerate())
            .map(|(i, id)| {
                let api = api.clone();
                let pods = pods.clone();
                let name = format!("{prefix}-{i}");
                let mut peerpod = PeerPod::new(
                    &name,
                    PeerPodSpec {
                        cloud_provider: provider.into(),
                        instance_id: id.clone(),
                    },
                );
                peerpod.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
                async move {
                    if owned {
                        let pod: Pod = serde_json::from_value(serde_json::json!({
                            "metadata": {"name": name},
                            "spec": {
                                "containers": [{"name": "app", "image": "registry.example/app"}]
                            }
                        }))
                        .map_err(kube::Error::SerdeError)?;
                        let pod = pods.create(&PostParams::default(), &pod).await?;
                        peerpod.metadata.owner_references = Some(vec![OwnerReference {
                            api_version: "v1".into(),
                            kind: "Pod".into(),
                            name: name.clone(),
                            uid: pod.metadata.uid.unwrap_or_default(),
                            controller: Some(true),
                            block_owner_deletion: Some(true),
                        }]);
                    }
                    api.create(&PostParams::default(), &peerpod).await
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        Ok(())
    }

    /// Write requests the API server has answered so far for `resource` (and `subresource`, "" for the object
    /// itself), by its own `apiserver_request_total`: the count on the server's side, whoever sent them.
    pub async fn api_writes(&self, resource: &str, subresource: &str) -> Result<f64, Error> {
        let scrape = Scrape::parse(&self.apiserver_metrics().await?)?;
        Ok(scrape
            .samples("apiserver_request_total")
            .filter(|s| {
                s.label("resource") == resource
                    && s.label("subresource") == subresource
                    && matches!(
                        s.label("verb"),
                        "POST" | "PUT" | "PATCH" | "APPLY" | "CREATE" | "UPDATE"
                    )
            })
            .map(|s| s.value)
            .sum())
    }

    /// Nodes `<prefix>-<i>` carrying `labels`, with a status of the size a kubelet reports (capacity, conditions,
    /// addresses, node info and a few dozen images), so memory figures reflect real nodes. Created through the API:
    /// there is no kubelet.
    pub async fn create_nodes(
        &self,
        prefix: &str,
        count: usize,
        labels: &BTreeMap<String, String>,
    ) -> Result<Vec<String>, Error> {
        let api: Api<Node> = Api::all(self.client.clone());
        let names: Vec<String> = (0..count).map(|i| format!("{prefix}-{i:05}")).collect();
        futures::stream::iter(names.iter())
            .map(|name| {
                let api = api.clone();
                let node = Node {
                    metadata: ObjectMeta {
                        name: Some(name.clone()),
                        labels: Some(labels.clone()),
                        ..ObjectMeta::default()
                    },
                    ..Node::default()
                };
                async move {
                    api.create(&PostParams::default(), &node).await?;
                    api.patch_status(
                        name,
                        &PatchParams::default(),
                        &Patch::Merge(realistic_node_status(name)),
                    )
                    .await
                }
            })
            .buffer_unordered(CREATE_CONCURRENCY)
            .try_for_each(|_| async { Ok(()) })
            .await?;
        Ok(names)
    }

    /// kube-apiserver's own Prometheus metrics (the admin user may read /metrics).
    pub async fn apiserver_metrics(&self) -> Result<String, Error> {
        let request = http::Request::get("/metrics")
            .body(Vec::new())
            .map_err(|e| Error::setup_from("building GET /metrics", e))?;
        Ok(self.client.request_text(request).await?)
    }
}

/// A node status as a kubelet of a small worker reports it: about 10 KiB of JSON, most of it images.
fn realistic_node_status(name: &str) -> serde_json::Value {
    let now = "2026-01-01T00:00:00Z";
    let condition = |kind: &str, status: &str, reason: &str| {
        serde_json::json!({"type": kind, "status": status, "reason": reason, "message": format!("kubelet reports {reason}"),
            "lastHeartbeatTime": now, "lastTransitionTime": now})
    };
    let images: Vec<serde_json::Value> = (0..40)
        .map(|i| {
            serde_json::json!({
                "names": [
                    format!("registry.example/team-{}/service-{i}@sha256:{:064x}", i % 7, i * 7919),
                    format!("registry.example/team-{}/service-{i}:v1.{i}.0", i % 7)
                ],
                "sizeBytes": 20_000_000 + i * 1_000_003
            })
        })
        .collect();
    let resources = serde_json::json!({"cpu": "8", "memory": "32827152Ki", "pods": "110", "ephemeral-storage": "102687672Ki", "hugepages-2Mi": "0"});
    serde_json::json!({"status": {
        "capacity": resources,
        "allocatable": resources,
        "conditions": [
            condition("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            condition("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            condition("PIDPressure", "False", "KubeletHasSufficientPID"),
            condition("Ready", "True", "KubeletReady")
        ],
        "addresses": [{"type": "InternalIP", "address": "192.0.2.10"}, {"type": "Hostname", "address": name}],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {"machineID": format!("{:032x}", name.len() * 104_729), "systemUUID": format!("{:032x}", name.len()),
            "bootID": "b0b0b0b0-0000-4000-8000-000000000000", "kernelVersion": "6.8.0-45-generic", "osImage": "Ubuntu 24.04.1 LTS",
            "containerRuntimeVersion": "containerd://2.0.0", "kubeletVersion": "v1.37.1", "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
        "images": images
    }})
}

/// The control plane stops with the run, however the run ends (it also watches this process and exits with it).
impl Drop for Cluster {
    fn drop(&mut self) {
        self.control_plane.stop();
    }
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..ObjectMeta::default()
    }
}

/// Polls `check` every `every` until it returns `Some`, for at most `timeout`.
pub async fn wait_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut check: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, Error>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if started.elapsed() > timeout {
            return Err(Error::Timeout {
                what: what.into(),
                seconds: timeout.as_secs(),
            });
        }
        tokio::time::sleep(every).await;
    }
}
