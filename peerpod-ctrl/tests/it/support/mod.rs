//! Real parts for the scenarios: the local control plane (testenv), provider-service started in-process on
//! 127.0.0.1 with libvirt's `test:///default` driver, and peerpod-ctrl itself, each stopped by the test.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::events::Reporter;
use kube::{Client, ResourceExt};
use peerpod_ctrl::Settings;
use peerpod_ctrl::controller::ReconcilerSettings;
use peerpod_ctrl::metrics::Metrics;
use peerpod_ctrl::orphans::{OrphanCap, OrphanPolicy, OrphanSettings};
use peerpod_ctrl::provider::{Provider, ProviderClientConfig};
use peerpods_api::peerpod::{FINALIZER, PeerPod, PeerPodSpec};
use peerpods_runtime::backoff::Backoff;
use peerpods_runtime::leader::LeaderConfig;
use peerpods_runtime::shutdown::CancellationToken;
use prometheus_client::registry::Registry;
use test_support::metrics::Scrape;
use tokio::sync::{Mutex, MutexGuard};
use virt::connect::Connect;

/// Every scenario runs alone: controllers watch all namespaces, and libvirt's test driver keeps one state
/// per process.
static SERIAL: Mutex<()> = Mutex::const_new(());

pub const TAG_KEY: &str = "peerpods.io/cluster";
pub const TAG_VALUE: &str = "scenario-cluster";

pub struct Scenario {
    pub client: Client,
    pub ns: String,
    /// Keeps libvirt's test driver state alive while the scenario runs.
    pub libvirt: Connect,
    _serial: MutexGuard<'static, ()>,
}

impl Scenario {
    pub async fn start(prefix: &str) -> Scenario {
        Self::start_on(testenv::shared(), prefix).await
    }

    /// A scenario on control plane `cp`, e.g. one of its own that keeps an audit log.
    pub async fn start_on(cp: &testenv::ControlPlane, prefix: &str) -> Scenario {
        let serial = SERIAL.lock().await;
        let client = cp.client().await;
        testenv::apply_crds(&client, "deploy/crds/peerpods.yaml").await;
        let ns = testenv::namespace(&client, prefix).await;
        let libvirt = Connect::open(Some("test:///default")).expect("libvirt test driver");
        Scenario {
            client,
            ns,
            libvirt,
            _serial: serial,
        }
    }

    /// A scenario with provider-service (libvirt test driver) and peerpod-ctrl (default options) running.
    pub async fn with_controller(prefix: &str) -> (Scenario, ProviderService, Controller) {
        let (s, provider) = Scenario::with_provider(prefix).await;
        let ctrl = s
            .start_controller(ControllerOptions::new(provider.addr))
            .await;
        (s, provider, ctrl)
    }

    /// A scenario with provider-service (libvirt test driver) running, for a controller the scenario starts.
    pub async fn with_provider(prefix: &str) -> (Scenario, ProviderService) {
        let s = Scenario::start(prefix).await;
        let provider = ProviderService::start(None).await;
        (s, provider)
    }

    /// peerpod-ctrl with `options`, on this scenario's cluster.
    pub async fn start_controller(&self, options: ControllerOptions) -> Controller {
        Controller::start(self.client.clone(), options).await
    }

    /// The end of a scenario: stops `ctrl` as SIGTERM would, then cleans up (see [`Scenario::cleanup`]).
    pub async fn finish(self, ctrl: Controller) {
        ctrl.stop().await;
        self.cleanup().await;
    }

    pub fn peerpods(&self) -> Api<PeerPod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub async fn create_pod(&self, name: &str) -> Pod {
        let pod = Pod {
            metadata: kube::api::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PodSpec {
                containers: vec![Container {
                    name: "app".into(),
                    image: Some("nginx".into()),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        self.pods()
            .create(&PostParams::default(), &pod)
            .await
            .expect("create Pod")
    }

    /// A PeerPod as cloud-api-adaptor creates it: in the Pod's namespace, the finalizer, and one controller
    /// ownerReference to the Pod.
    pub async fn create_peerpod(
        &self,
        name: &str,
        owner: Option<&Pod>,
        provider: &str,
        instance_id: &str,
    ) -> PeerPod {
        self.create_peerpod_with(
            name,
            owner,
            provider,
            instance_id,
            vec![FINALIZER.to_string()],
        )
        .await
    }

    pub async fn create_peerpod_with(
        &self,
        name: &str,
        owner: Option<&Pod>,
        provider: &str,
        instance_id: &str,
        finalizers: Vec<String>,
    ) -> PeerPod {
        let mut pp = PeerPod::new(
            name,
            PeerPodSpec {
                cloud_provider: provider.into(),
                instance_id: instance_id.into(),
            },
        );
        pp.metadata.finalizers = Some(finalizers);
        pp.metadata.owner_references = owner.map(|pod| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.name_any(),
                uid: pod.uid().expect("Pod has a uid"),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]
        });
        self.peerpods()
            .create(&PostParams::default(), &pp)
            .await
            .expect("create PeerPod")
    }

    pub async fn delete_peerpod(&self, name: &str) {
        self.peerpods()
            .delete(name, &DeleteParams::default())
            .await
            .expect("delete PeerPod");
    }

    pub async fn wait_peerpod_gone(&self, name: &str, timeout: Duration) {
        let api = self.peerpods();
        testenv::wait_for(&format!("PeerPod {name} to disappear"), timeout, || async {
            matches!(api.get_opt(name).await, Ok(None)).then_some(())
        })
        .await;
    }

    /// Waits until `check` holds for the PeerPod and returns it.
    pub async fn wait_peerpod(
        &self,
        name: &str,
        what: &str,
        check: impl Fn(&PeerPod) -> bool,
    ) -> PeerPod {
        let api = self.peerpods();
        let check = &check;
        testenv::wait_for(
            &format!("PeerPod {name}: {what}"),
            Duration::from_secs(60),
            || {
                let api = api.clone();
                async move { api.get_opt(name).await.ok().flatten().filter(|p| check(p)) }
            },
        )
        .await
    }

    /// Event reasons recorded for objects in this namespace.
    pub async fn event_reasons(&self, object_name: &str) -> Vec<String> {
        self.events(object_name)
            .await
            .into_iter()
            .map(|(reason, _)| reason)
            .filter(|reason| !reason.is_empty())
            .collect()
    }

    /// The Event reasons recorded for `object_name`, once one of them is `reason`: an Event is sent beside the
    /// status write or release it goes with, so it may land a moment after what the test waited for.
    pub async fn wait_event_reason(&self, object_name: &str, reason: &str) -> Vec<String> {
        testenv::wait_for(
            &format!("an Event {reason} for {object_name}"),
            Duration::from_secs(60),
            || async {
                let reasons = self.event_reasons(object_name).await;
                reasons.iter().any(|r| r == reason).then_some(reasons)
            },
        )
        .await
    }

    /// Events (reason, note) recorded for objects in this namespace.
    pub async fn events(&self, object_name: &str) -> Vec<(String, String)> {
        let events: Api<k8s_openapi::api::events::v1::Event> =
            Api::namespaced(self.client.clone(), &self.ns);
        events
            .list(&ListParams::default())
            .await
            .expect("list Events")
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(object_name))
            .map(|e| (e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
            .collect()
    }

    /// Waits until an Event in namespace `ns` matches `check` and returns it.
    pub async fn wait_event(
        &self,
        ns: &str,
        what: &str,
        check: impl Fn(&k8s_openapi::api::events::v1::Event) -> bool,
    ) -> k8s_openapi::api::events::v1::Event {
        let events = Api::namespaced(self.client.clone(), ns);
        testenv::wait_for_event(what, &events, Duration::from_secs(60), check).await
    }

    /// Removes every finalizer left in the namespace (scenarios that keep finalizers on purpose) and deletes
    /// the namespace, so the next scenario's controller has nothing of ours to look at.
    pub async fn cleanup(self) {
        let api = self.peerpods();
        if let Ok(list) = api.list(&ListParams::default()).await {
            for p in list.items {
                let patch = serde_json::json!({"metadata": {"finalizers": null}});
                let _ = api
                    .patch(
                        &p.name_any(),
                        &PatchParams::default(),
                        &Patch::Merge(&patch),
                    )
                    .await;
                let _ = api.delete(&p.name_any(), &DeleteParams::default()).await;
            }
        }
        let namespaces: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let _ = namespaces.delete(&self.ns, &DeleteParams::default()).await;
    }

    /// A persistent, running test-driver domain, optionally tagged as this cluster's. Returns its UUID.
    pub fn define_domain(&self, tagged: bool) -> String {
        let tags: &[(&str, &str)] = if tagged { &[(TAG_KEY, TAG_VALUE)] } else { &[] };
        self.define_domain_with_tags(tags)
    }

    /// A persistent, running test-driver domain carrying `tags`. Returns its UUID.
    pub fn define_domain_with_tags(&self, tags: &[(&str, &str)]) -> String {
        self.define_named_domain(None, tags)
    }

    /// A persistent, running test-driver domain named `name` (`podvm-<its UUID>` without one) carrying `tags`.
    /// Returns its UUID.
    pub fn define_named_domain(&self, name: Option<&str>, tags: &[(&str, &str)]) -> String {
        let uuid = uuid::Uuid::new_v4().to_string();
        let name = name.map_or_else(|| format!("podvm-{uuid}"), str::to_owned);
        let tags: String = tags
            .iter()
            .map(|(k, v)| format!("<peerpods:tag key='{k}'>{v}</peerpods:tag>"))
            .collect();
        let xml = format!(
            "<domain type='test'><name>{name}</name><uuid>{uuid}</uuid>\
             <memory unit='MiB'>128</memory><vcpu>1</vcpu><os><type arch='i686'>hvm</type></os>\
             <metadata><peerpods:tags xmlns:peerpods='urn:peerpods:tags:v1'>{tags}</peerpods:tags></metadata>\
             </domain>"
        );
        let domain = self.libvirt.define_domain_xml(&xml).expect("define domain");
        domain.create().expect("start domain");
        uuid
    }

    pub fn domain_exists(&self, uuid: &str) -> bool {
        self.libvirt.lookup_domain_by_uuid_string(uuid).is_ok()
    }

    /// A PeerPod of a fresh libvirt VM, deleted and waited out (a minute at most). Returns the VM's UUID.
    pub async fn delete_a_peerpod_of_a_new_vm(&self, name: &str) -> String {
        let vm = self.define_domain(false);
        self.create_peerpod(name, None, "libvirt", &vm).await;
        self.delete_peerpod(name).await;
        self.wait_peerpod_gone(name, Duration::from_secs(60)).await;
        vm
    }

    /// The Lease a peerpod-ctrl replica called `identity` competes for in this namespace.
    pub fn lease(
        &self,
        identity: &str,
        duration: Duration,
        renew_before: Duration,
    ) -> LeaderConfig {
        LeaderConfig {
            lease_duration: duration,
            renew_before,
            ..LeaderConfig::new("peerpod-ctrl", self.ns.clone(), identity)
        }
    }

    /// Who holds peerpod-ctrl's Lease in this namespace, if the Lease exists and names anyone.
    pub async fn lease_holder(&self) -> Option<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        leases
            .get_opt("peerpod-ctrl")
            .await
            .ok()
            .flatten()
            .and_then(|l| l.spec?.holder_identity)
    }

    /// Waits (a minute at most) until `identity` holds peerpod-ctrl's Lease.
    pub async fn wait_lease_holder(&self, what: &str, identity: &str) {
        testenv::wait_for(what, Duration::from_secs(60), || async {
            (self.lease_holder().await.as_deref() == Some(identity)).then_some(())
        })
        .await;
    }

    /// Destroys and undefines the domains a scenario leaves, so a later orphan scan in this process does not
    /// find them.
    pub fn remove_domains<'a>(&self, uuids: impl IntoIterator<Item = &'a String>) {
        for uuid in uuids {
            if let Ok(d) = self.libvirt.lookup_domain_by_uuid_string(uuid) {
                let _ = d.destroy();
                let _ = d.undefine();
            }
        }
    }
}

/// provider-service running in this process on 127.0.0.1 with the libvirt test driver and no auth.
pub struct ProviderService {
    pub addr: SocketAddr,
    pub registry: Arc<Registry>,
    shutdown: CancellationToken,
    _config: tempfile::TempDir,
}

impl Drop for ProviderService {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl ProviderService {
    /// Starts on a free port, or on `addr` (to restart where a controller already points).
    pub async fn start(addr: Option<SocketAddr>) -> ProviderService {
        Self::start_with_tls(addr, None).await
    }

    /// Like [`ProviderService::start`], serving TLS with the PEM `(certificate, key)` files.
    pub async fn start_with_tls(
        addr: Option<SocketAddr>,
        tls: Option<(&std::path::Path, &std::path::Path)>,
    ) -> ProviderService {
        Self::start_with(addr, tls, &[]).await
    }

    /// Like [`ProviderService::start`], with `config` added to (or replacing) the libvirt keys, e.g. a second
    /// cloud.
    pub async fn start_with_config(config: &[(String, String)]) -> ProviderService {
        Self::start_with(None, None, config).await
    }

    async fn start_with(
        addr: Option<SocketAddr>,
        tls: Option<(&std::path::Path, &std::path::Path)>,
        extra: &[(String, String)],
    ) -> ProviderService {
        use provider_service::service::{CallerAuth, Listen, Options};
        let config = tempfile::tempdir().expect("tempdir");
        let defaults = [
            ("CLOUD_PROVIDER", "libvirt"),
            ("LIBVIRT_URI", "test:///default"),
            // A second cloud with tags (AWS on moto) needs a cluster-tag choice; the scenarios'
            // VMs are told apart by peerpod-ctrl's own selector, so deletes are allowed explicitly.
            ("DELETE_UNTAGGED", "allow"),
        ];
        for (k, v) in defaults
            .iter()
            .map(|(k, v)| (*k, *v))
            .chain(extra.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        {
            std::fs::write(config.path().join(k), v).expect("write config");
        }
        let shutdown = CancellationToken::new();
        let bind = addr.unwrap_or_else(|| SocketAddr::from(([127, 0, 0, 1], 0)));
        let running = provider_service::service::start(
            Options {
                grpc: Listen::Bound(bind_retrying(bind).await),
                admin: None,
                secure_metrics: None,
                config_dirs: vec![config.path().to_owned()],
                // libvirt's test driver is accepted in development mode only.
                development: true,
                reload_interval: Duration::from_secs(1),
                tls: tls.map(|(cert, key)| (cert.to_owned(), key.to_owned())),
                auth: CallerAuth::None,
            },
            shutdown.clone(),
        )
        .await
        .expect("provider-service starts");
        ProviderService {
            addr: running.grpc_addr,
            registry: running.prometheus.clone(),
            shutdown,
            _config: config,
        }
    }

    pub fn stop(self) {}

    /// DeleteInstance calls received for `provider`, all results.
    pub fn delete_calls(&self, provider: &str) -> u64 {
        count_metric(
            &self.registry,
            "provider_service_grpc_calls_total",
            &[("method", "DeleteInstance"), ("provider", provider)],
        )
    }
}

async fn bind_retrying(addr: SocketAddr) -> tokio::net::TcpListener {
    // A port just released by a stopped server can take a moment to be free again.
    testenv::wait_for(
        &format!("binding {addr}"),
        Duration::from_secs(20),
        || async { tokio::net::TcpListener::bind(addr).await.ok() },
    )
    .await
}

/// A free loopback port nobody listens on (yet).
pub fn unused_addr() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr")
}

/// Sum of the samples named `name` (e.g. `x_total`, `x_count`) that carry every `(label, value)` of `labels`.
pub fn count_metric(registry: &Registry, name: &str, labels: &[(&str, &str)]) -> u64 {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, registry).expect("encode metrics");
    Scrape::parse(&text)
        .expect("the registry's own text parses")
        .sum(name, labels) as u64
}

/// peerpod-ctrl running in this process.
pub struct Controller {
    pub registry: Arc<Registry>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), peerpod_ctrl::Error>>,
}

pub struct ControllerOptions {
    pub provider: SocketAddr,
    pub retry_cap: Duration,
    pub orphan_policy: OrphanPolicy,
    pub orphan_interval: Duration,
    pub orphan_grace: Duration,
    pub cluster_tag: bool,
    /// The orphan deletion cap; the production default unless a scenario needs another.
    pub orphan_cap: OrphanCap,
    pub leader: Option<LeaderConfig>,
    pub concurrency: u16,
    /// Reach provider-service over TLS, trusting this CA file, verifying this name.
    pub provider_tls: Option<(std::path::PathBuf, String)>,
    /// Readiness and liveness to report to, as the admin server would.
    pub health: Option<peerpods_runtime::health::Health>,
    /// The deadline of each provider-service call (`--provider-timeout`).
    pub provider_timeout: Duration,
    /// The controller's namespace (`--namespace`): orphan Events go there.
    pub namespace: String,
    /// Reverse collection (`--reverse-scan-interval`, `--reverse-grace`); off unless a scenario turns it on.
    pub reverse_interval: Duration,
    pub reverse_grace: Duration,
    /// Where cloud-api-adaptor's ConfigMap is read from (`--caa-namespace`, `--caa-config-map`); by default
    /// CAA's namespace, which the control plane does not have: developer mode off.
    pub developer_mode: peerpod_ctrl::developer_mode::DeveloperModeSettings,
}

impl ControllerOptions {
    pub fn new(provider: SocketAddr) -> Self {
        ControllerOptions {
            provider,
            retry_cap: Duration::from_secs(2),
            orphan_policy: OrphanPolicy::Report,
            orphan_interval: Duration::from_secs(3600),
            orphan_grace: Duration::from_secs(3600),
            cluster_tag: false,
            orphan_cap: OrphanCap::default(),
            leader: None,
            concurrency: peerpod_ctrl::controller::DEFAULT_CONCURRENCY,
            provider_tls: None,
            health: None,
            provider_timeout: Duration::from_secs(10),
            namespace: "default".into(),
            reverse_interval: Duration::ZERO,
            reverse_grace: Duration::from_secs(3600),
            developer_mode: Default::default(),
        }
    }

    /// Orphan scans of this cluster's tagged VMs every half second, with no grace, reporting what they find
    /// (`policy` [`OrphanPolicy::Report`]) or deleting it ([`OrphanPolicy::Delete`]).
    pub fn scanning_orphans(provider: SocketAddr, policy: OrphanPolicy) -> Self {
        ControllerOptions {
            cluster_tag: true,
            orphan_interval: Duration::from_millis(500),
            orphan_grace: Duration::ZERO,
            orphan_policy: policy,
            ..ControllerOptions::new(provider)
        }
    }
}

impl Controller {
    pub async fn start(client: Client, options: ControllerOptions) -> Controller {
        let mut registry = Registry::default();
        let metrics = Metrics::register(&mut registry);
        let scheme = if options.provider_tls.is_some() {
            "https"
        } else {
            "http"
        };
        let provider = Provider::connect(&ProviderClientConfig {
            endpoint: format!("{scheme}://{}", options.provider),
            ca_file: options.provider_tls.as_ref().map(|(ca, _)| ca.clone()),
            tls_server_name: options.provider_tls.as_ref().map(|(_, name)| name.clone()),
            timeout: Some(options.provider_timeout),
            ..Default::default()
        })
        .expect("provider client");
        let identity = options
            .leader
            .as_ref()
            .map(|l| l.identity.clone())
            .unwrap_or_else(|| "scenario".into());
        let settings = Settings {
            reconciler: ReconcilerSettings {
                concurrency: options.concurrency,
                api_writes: peerpod_ctrl::controller::DEFAULT_API_WRITES,
                backoff: Backoff {
                    base: Duration::from_millis(200),
                    cap: options.retry_cap,
                },
            },
            orphans: OrphanSettings {
                interval: options.orphan_interval,
                grace: options.orphan_grace,
                policy: options.orphan_policy,
                cluster_tag: options
                    .cluster_tag
                    .then(|| (TAG_KEY.to_string(), TAG_VALUE.to_string())),
                event_namespace: options.namespace.clone(),
                cap: options.orphan_cap,
            },
            reverse: peerpod_ctrl::reverse::ReverseSettings {
                interval: options.reverse_interval,
                grace: options.reverse_grace,
            },
            developer_mode: options.developer_mode.clone(),
            in_use: None,
            reporter: Reporter {
                controller: "peerpod-ctrl".into(),
                instance: Some(identity),
            },
        };
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(peerpod_ctrl::run_until(
            client,
            provider,
            metrics,
            settings,
            options.leader,
            shutdown.clone(),
            options.health,
        ));
        Controller {
            registry: Arc::new(registry),
            shutdown,
            task,
        }
    }

    /// Stops like SIGTERM does (releasing the Lease when leading) and waits for it.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let _ = self.task.await;
    }

    /// Stops abruptly, like a crash: every reconcile in flight is dropped at its current await point.
    pub async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> u64 {
        count_metric(&self.registry, name, labels)
    }
}

/// The fields of the status subresource `manager` owns by server-side apply (its `managedFields` entry with
/// operation Apply), as the API server records them under `f:status` in `fieldsV1` (`f:state`,
/// `f:conditions` with one `k:{"type":"..."}` per condition). None when `manager` never applied the status.
pub fn applied_status_fields(p: &PeerPod, manager: &str) -> Option<serde_json::Value> {
    p.metadata
        .managed_fields
        .as_ref()?
        .iter()
        .find(|entry| {
            entry.manager.as_deref() == Some(manager)
                && entry.operation.as_deref() == Some("Apply")
                && entry.subresource.as_deref() == Some("status")
        })?
        .fields_v1
        .as_ref()
        .map(|fields| fields.0["f:status"].clone())
}
