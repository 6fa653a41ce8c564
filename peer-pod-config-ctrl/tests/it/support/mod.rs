//! A PeerPodConfig controller running in-process against the local control plane, with helpers to create Node
//! objects through the API and read back what they advertise.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::core::v1::{Node, ServiceAccount};
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Client, ResourceExt};
use peer_pod_config_ctrl::controller::{self, Context, Settings};
use peer_pod_config_ctrl::metrics::Metrics;
use peer_pod_config_ctrl::objects::{EXTENDED_RESOURCE, WEBHOOK_CONFIGURATION};
use peerpods_api::peerpodconfig::{PeerPodConfig, PeerPodConfigSpec};
use tokio::sync::{Mutex, MutexGuard};
use tokio_util::sync::CancellationToken;

/// Nodes are cluster-scoped and every controller here watches all of them: scenarios run one at a time.
static SERIAL: Mutex<()> = Mutex::const_new(());

pub const TIMEOUT: Duration = Duration::from_secs(60);

pub struct Scenario {
    pub client: Client,
    pub ns: String,
    /// Label every node of this scenario carries when selected: `<LABEL_PREFIX><prefix>`.
    pub label: String,
    pub prefix: String,
    pub controller: Option<Running>,
    _serial: MutexGuard<'static, ()>,
}

pub struct Running {
    pub context: Arc<Context>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

/// cloud-api-adaptor's PeerPod, read as a dynamic object: this controller only cares whether one exists.
pub fn peer_pod_resource() -> kube::core::ApiResource {
    kube::core::ApiResource::from_gvk_with_plural(
        &kube::core::GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPod"),
        "peerpods",
    )
}

/// Deletes every PeerPod of the control plane (there are none unless their CRD is installed). A PeerPodConfig's
/// deletion waits for the peer pods of the whole cluster, so each scenario starts with none: one that an earlier
/// scenario left behind (on purpose, as forcing a held deletion does, or by failing) would hold this one's.
async fn remove_every_peer_pod(client: &Client) {
    let resource = peer_pod_resource();
    let all: Api<kube::core::DynamicObject> = Api::all_with(client.clone(), &resource);
    let Ok(list) = all.list(&ListParams::default()).await else {
        return;
    };
    for peer_pod in list.items {
        let namespace = peer_pod.namespace().unwrap_or_default();
        let api: Api<kube::core::DynamicObject> =
            Api::namespaced_with(client.clone(), &namespace, &resource);
        let _ = api
            .delete(&peer_pod.name_any(), &DeleteParams::default())
            .await;
    }
}

impl Scenario {
    /// A namespace (the controller's PEERPODS_NAMESPACE) with the ServiceAccounts the owned objects name, and a
    /// running controller.
    pub async fn start(prefix: &str) -> Scenario {
        Self::start_with(prefix, None).await
    }

    /// The namespace and ServiceAccounts only; the test starts its own controllers.
    pub async fn start_idle(prefix: &str) -> Scenario {
        let mut scenario = Self::start_with(prefix, None).await;
        if let Some(running) = scenario.controller.take() {
            // Dropping the task handle does not stop it; abort: it has had nothing to do yet.
            running.task.abort();
            let _ = running.task.await;
        }
        scenario
    }

    pub async fn start_with(prefix: &str, provider: Option<String>) -> Scenario {
        let serial = SERIAL.lock().await;
        let client = testenv::shared().client().await;
        testenv::apply_crds(&client, "deploy/crds/peerpodconfigs.yaml").await;
        remove_every_peer_pod(&client).await;
        let ns = testenv::namespace(&client, prefix).await;
        charts_webhook_configuration(&client).await;
        let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
        for name in ["cloud-api-adaptor", "peer-pods-webhook"] {
            let sa = ServiceAccount {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..ObjectMeta::default()
                },
                ..ServiceAccount::default()
            };
            accounts
                .create(&PostParams::default(), &sa)
                .await
                .expect("create ServiceAccount");
        }
        let mut scenario = Scenario {
            client,
            ns,
            label: format!("peerpods-test/{prefix}"),
            prefix: prefix.to_owned(),
            controller: None,
            _serial: serial,
        };
        scenario.run_controller(provider);
        scenario
    }

    pub fn run_controller(&mut self, provider: Option<String>) {
        self.run_controller_paced(provider, Default::default());
    }

    /// A controller whose node patches go at `pace`.
    pub fn run_controller_paced(
        &mut self,
        provider: Option<String>,
        pace: peer_pod_config_ctrl::nodes::Pace,
    ) {
        let provider = provider.map(|endpoint| {
            peerpods_provider_client::connect(&peerpods_provider_client::ProviderClientConfig {
                endpoint,
                timeout: Some(Duration::from_secs(10)),
                ..Default::default()
            })
            .expect("provider client")
        });
        let stop = CancellationToken::new();
        let settings = Settings {
            namespace: self.ns.clone(),
            provider,
            instance: Some("test".into()),
            caa_provider_service: None,
            service_accounts: Default::default(),
            node_patch_pace: pace,
        };
        let running = controller::new(
            self.client.clone(),
            settings,
            Metrics::default(),
            stop.clone().cancelled_owned(),
        );
        let task = tokio::spawn(running.run);
        self.controller = Some(Running {
            context: running.context,
            stop,
            task,
        });
    }

    /// Stops the controller loop; its context (caches as last seen) stays usable for direct reconciles.
    pub async fn stop_controller(&mut self) -> Arc<Context> {
        let running = self.controller.take().expect("controller running");
        running.stop.cancel();
        running.task.await.expect("controller task");
        running.context
    }

    pub fn context(&self) -> Arc<Context> {
        self.controller
            .as_ref()
            .expect("controller running")
            .context
            .clone()
    }

    pub fn configs(&self) -> Api<PeerPodConfig> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// The nodeSelector that picks this scenario's selected nodes.
    pub fn selector(&self) -> serde_json::Value {
        serde_json::json!({ self.label.clone(): "yes" })
    }

    pub async fn create_config(&self, name: &str, spec: serde_json::Value) -> PeerPodConfig {
        let spec: PeerPodConfigSpec = serde_json::from_value(spec).expect("spec");
        self.configs()
            .create(&PostParams::default(), &PeerPodConfig::new(name, spec))
            .await
            .expect("create PeerPodConfig")
    }

    /// Node `<prefix>-<i>`; selected ones carry the scenario label.
    pub fn node_name(&self, i: usize) -> String {
        format!("{}-{i:04}", self.prefix)
    }

    pub async fn create_nodes(
        &self,
        range: std::ops::Range<usize>,
        selected: impl Fn(usize) -> bool,
    ) {
        let api = self.nodes();
        let nodes: Vec<Node> = range
            .map(|i| {
                let mut labels =
                    BTreeMap::from([("peerpods-test/prefix".to_owned(), self.prefix.clone())]);
                if selected(i) {
                    labels.insert(self.label.clone(), "yes".into());
                }
                Node {
                    metadata: ObjectMeta {
                        name: Some(self.node_name(i)),
                        labels: Some(labels),
                        ..ObjectMeta::default()
                    },
                    ..Node::default()
                }
            })
            .collect();
        futures::stream::iter(nodes)
            .map(|node| {
                let api = api.clone();
                async move {
                    api.create(&PostParams::default(), &node)
                        .await
                        .expect("create Node")
                }
            })
            .buffer_unordered(32)
            .collect::<Vec<_>>()
            .await;
    }

    /// This scenario's nodes: name → (advertised value, resourceVersion).
    pub async fn node_state(&self) -> BTreeMap<String, (Option<u32>, String)> {
        let list = self
            .nodes()
            .list(&ListParams::default().labels(&format!("peerpods-test/prefix={}", self.prefix)))
            .await
            .expect("list Nodes");
        list.items
            .into_iter()
            .map(|node| {
                let value = node
                    .status
                    .as_ref()
                    .and_then(|s| s.capacity.as_ref())
                    .and_then(|c| c.get(EXTENDED_RESOURCE))
                    // The API server stores the canonical form ("1000" reads "1k").
                    .map(|q| {
                        peer_pod_config_ctrl::nodes::quantity_count(&q.0)
                            .expect("kata.peerpods.io/vm is a whole count")
                    });
                (
                    node.name_any(),
                    (value, node.resource_version().unwrap_or_default()),
                )
            })
            .collect()
    }

    /// Waits until the selected nodes (by label) carry values summing to `total` that differ by at most one, and
    /// no other node of this scenario carries the resource. Returns name → value of the selected nodes.
    pub async fn wait_spread(&self, total: u32) -> BTreeMap<String, u32> {
        let selected_api = self.nodes();
        let label = format!("{}=yes,peerpods-test/prefix={}", self.label, self.prefix);
        let this = self;
        testenv::wait_for(
            &format!("kata.peerpods.io/vm summing to {total}"),
            TIMEOUT,
            || {
                let selected_api = selected_api.clone();
                let label = label.clone();
                async move {
                    let selected: Vec<String> = selected_api
                        .list(&ListParams::default().labels(&label))
                        .await
                        .ok()?
                        .items
                        .iter()
                        .map(ResourceExt::name_any)
                        .collect();
                    let state = this.node_state().await;
                    let mut values = BTreeMap::new();
                    for (name, (value, _)) in &state {
                        match (selected.contains(name), value) {
                            (true, Some(v)) => {
                                values.insert(name.clone(), *v);
                            }
                            (false, None) => {}
                            _ => return None,
                        }
                    }
                    let (min, max) = (values.values().min()?, values.values().max()?);
                    (values.values().sum::<u32>() == total && max - min <= 1).then_some(values)
                }
            },
        )
        .await
    }

    /// Deletes the scenario's PeerPodConfigs (waiting for the finalizer), its nodes, and stops the controller.
    pub async fn finish(mut self) {
        let configs = self.configs();
        for config in configs
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
        {
            let _ = configs
                .delete(&config.name_any(), &DeleteParams::default())
                .await;
        }
        testenv::wait_for("PeerPodConfigs gone", TIMEOUT, || async {
            configs
                .list(&ListParams::default())
                .await
                .ok()
                .filter(|l| l.items.is_empty())
                .map(|_| ())
        })
        .await;
        let nodes = self.nodes();
        let _ = nodes
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&format!("peerpods-test/prefix={}", self.prefix)),
            )
            .await;
        if self.controller.is_some() {
            self.stop_controller().await;
        }
    }
}

/// The label and annotation Helm gives the webhook configuration the chart creates: the controller's writes
/// must leave them alone.
pub const HELM_LABEL: (&str, &str) = ("app.kubernetes.io/managed-by", "Helm");
pub const HELM_ANNOTATION: (&str, &str) = ("meta.helm.sh/release-name", "peerpods");

/// The MutatingWebhookConfiguration as the chart creates it (no webhooks, Helm's label and annotation), unless it
/// exists: the controller only adds its webhook to it. One per cluster, like the chart's; scenarios run one at a
/// time, and one that deletes it has it back at the next scenario's start.
pub async fn charts_webhook_configuration(client: &Client) -> MutatingWebhookConfiguration {
    let api: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    if let Some(existing) = api.get_opt(WEBHOOK_CONFIGURATION).await.expect("get") {
        return existing;
    }
    let chart: MutatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "metadata": {
            "name": WEBHOOK_CONFIGURATION,
            "labels": {HELM_LABEL.0: HELM_LABEL.1},
            "annotations": {HELM_ANNOTATION.0: HELM_ANNOTATION.1}
        },
        "webhooks": []
    }))
    .expect("MutatingWebhookConfiguration");
    api.create(&PostParams::default(), &chart)
        .await
        .expect("create the chart's webhook configuration")
}

/// provider-service in-process on 127.0.0.1 with the libvirt test driver (`test:///default`).
pub struct ProviderService {
    pub addr: SocketAddr,
    shutdown: CancellationToken,
    _config: tempfile::TempDir,
}

impl Drop for ProviderService {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl ProviderService {
    pub async fn start() -> ProviderService {
        use provider_service::service::{CallerAuth, Listen, Options};
        let config = tempfile::tempdir().expect("tempdir");
        for (k, v) in [
            ("CLOUD_PROVIDER", "libvirt"),
            ("LIBVIRT_URI", "test:///default"),
        ] {
            std::fs::write(config.path().join(k), v).expect("write config");
        }
        let shutdown = CancellationToken::new();
        let running = provider_service::service::start(
            Options {
                grpc: Listen::Addr(SocketAddr::from(([127, 0, 0, 1], 0))),
                admin: None,
                secure_metrics: None,
                config_dirs: vec![config.path().to_owned()],
                // libvirt's test driver is accepted in development mode only.
                development: true,
                reload_interval: Duration::from_secs(1),
                tls: None,
                auth: CallerAuth::None,
            },
            shutdown.clone(),
        )
        .await
        .expect("provider-service starts");
        ProviderService {
            addr: running.grpc_addr,
            shutdown,
            _config: config,
        }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The free vCPUs of libvirt's test driver host, as GetCapacity reports them. Ask within a scenario:
    /// scenarios run one at a time, and one may define domains that take the host's vCPUs.
    pub async fn free_vcpus(&self) -> u64 {
        let mut client =
            peerpods_proto::v1::provider_service_client::ProviderServiceClient::connect(self.url())
                .await
                .expect("connect");
        let figures = client
            .get_capacity(peerpods_proto::v1::GetCapacityRequest {
                cloud_provider: "libvirt".into(),
            })
            .await
            .expect("GetCapacity")
            .into_inner();
        let vcpus = figures.vcpus.expect("vCPU figure");
        vcpus.limit.expect("host vCPUs") - vcpus.in_use.expect("vCPUs in use")
    }
}

/// A TCP proxy to the API server that can stop answering: while stalled it moves no bytes either way (they wait
/// in the kernel, as behind a server that hangs), and connections made meanwhile hang too.
pub struct StallingProxy {
    pub addr: SocketAddr,
    stalled: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for StallingProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl StallingProxy {
    /// A proxy to the local control plane's API server.
    pub async fn start() -> StallingProxy {
        let upstream: SocketAddr = testenv::shared()
            .server_url()
            .trim_start_matches("https://")
            .parse()
            .expect("API server address");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("address");
        let (stalled, watch_stalled) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let stalled = watch_stalled.clone();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(upstream).await else {
                        return;
                    };
                    let (from_client, to_client) = inbound.into_split();
                    let (from_server, to_server) = outbound.into_split();
                    tokio::join!(
                        pipe(from_client, to_server, stalled.clone()),
                        pipe(from_server, to_client, stalled)
                    );
                });
            }
        });
        StallingProxy {
            addr,
            stalled,
            task,
        }
    }

    /// A client of the control plane that goes through this proxy.
    pub async fn client(&self) -> Client {
        let mut config = testenv::shared().config().await.expect("client config");
        config.cluster_url = format!("https://{}", self.addr).parse().expect("URL");
        Client::try_from(config).expect("client")
    }

    pub fn stall(&self) {
        self.stalled.send_replace(true);
    }

    pub fn resume(&self) {
        self.stalled.send_replace(false);
    }
}

async fn pipe(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut stalled: tokio::sync::watch::Receiver<bool>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => {
                let _ = to.shutdown().await;
                return;
            }
            Ok(n) => n,
        };
        // Read just before a stall began: held back too.
        if stalled.wait_for(|s| !*s).await.is_err() {
            return;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

/// GET `path` from an HTTP server on `addr`: (status code, body).
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    tcp.write_all(
        format!("GET {path} HTTP/1.1\r\nHost: admin\r\nConnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .expect("request");
    let mut raw = String::new();
    tcp.read_to_string(&mut raw).await.expect("response");
    let code = raw
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = raw
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (code, body)
}
