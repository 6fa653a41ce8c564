//! The chart's alerts and dashboards against a real Prometheus (Debian's `prometheus` package) scraping the
//! three services on the local control plane.
//!
//! provider-service (libvirt's test driver, TokenReview auth) first grants peerpod-ctrl ListInstances only: the
//! VM delete of a deleted PeerPod is refused, the PeerPod stays held by its finalizer, and the chart's
//! `PeerPodCleanupStuck` (threshold and `for` shortened through the chart's values) fires. provider-service is
//! restarted granting DeleteInstance; the finalizer is released and the alert resolves. Then every query of
//! every panel of the chart's dashboards is evaluated by that Prometheus and must return series.
//!
//! The services serve their metrics as the chart runs them (`metrics.secure`): over TLS on a port of their own,
//! to a token the API server authenticates and allows to `get` `/metrics`. Prometheus scrapes with the token of a
//! ServiceAccount bound to the chart's metrics-reader ClusterRole, as the ServiceMonitors do; its scrape of the
//! same port without a token is refused (401).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use tokio::process::{Child, Command};

const RELEASE: &str = "peerpods";
/// The chart's values the test overrides: the stuck-cleanup alert after 5 s held, 5 s in a row (the defaults,
/// 900 s and 5 min, are what promtool's tests check).
const OVERRIDES: &str = "prometheusRule:\n  enabled: true\n  cleanupStuckAfterSeconds: 5\n  \
                         for:\n    PeerPodCleanupStuck: 5s\ngrafanaDashboards:\n  enabled: true\n";

/// Percent-encodes a query parameter's value.
fn encode(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The Prometheus API's `data`, once it answers `success`.
async fn api(prometheus: SocketAddr, path_and_query: &str) -> Option<serde_json::Value> {
    let (status, body) = http_get(prometheus, path_and_query).await?;
    let mut answer: serde_json::Value = serde_json::from_str(&body).ok()?;
    (status == 200 && answer["status"] == "success").then(|| answer["data"].take())
}

/// The alerts named `name` Prometheus holds (pending or firing), with their state.
async fn alerts(prometheus: SocketAddr, name: &str) -> Option<Vec<serde_json::Value>> {
    let data = api(prometheus, "/api/v1/alerts").await?;
    Some(
        data["alerts"]
            .as_array()?
            .iter()
            .filter(|a| a["labels"]["alertname"] == name)
            .cloned()
            .collect(),
    )
}

/// A real Prometheus on 127.0.0.1 with its storage in `dir`, stopped when dropped.
struct Prometheus {
    addr: SocketAddr,
    child: Child,
    log: std::path::PathBuf,
}

impl Prometheus {
    async fn start(dir: &Path, config: &serde_json::Value) -> Prometheus {
        let binary = ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
            .into_iter()
            .map(Path::new)
            .find(|p| p.exists())
            .expect(
                "prometheus is missing: run `make system-packages` (Debian's prometheus package)",
            );
        let config_file = dir.join("prometheus.yml");
        // JSON is YAML: Prometheus reads it as its configuration.
        std::fs::write(&config_file, config.to_string()).expect("writing prometheus.yml");
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port())
            .parse()
            .expect("address");
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("log file");
        let child = Command::new(binary)
            .arg(format!("--config.file={}", config_file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(std::process::Stdio::null())
            .stdout(out.try_clone().expect("log file"))
            .stderr(out)
            .kill_on_drop(true)
            .spawn()
            .expect("starting prometheus");
        let mut prometheus = Prometheus { addr, child, log };
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = prometheus.child.try_wait() {
                panic!(
                    "prometheus exited with {status}:\n{}",
                    prometheus.log_text()
                );
            }
            if matches!(http_get(addr, "/-/ready").await, Some((200, _))) {
                return prometheus;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "prometheus not ready after 60s:\n{}",
                prometheus.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            eprintln!("---- prometheus log ----\n{}", self.log_text());
        }
    }
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// provider-service on libvirt's test driver, checking callers with TokenReview; `peerpod_ctrl_methods` are the
/// methods peerpod-ctrl's ServiceAccount is granted.
fn provider_service(
    kubeconfig: &Path,
    ns: &str,
    (grpc, admin, metrics): (u16, u16, u16),
    peerpod_ctrl_methods: &str,
    dir: &Path,
) -> Service {
    let env = BTreeMap::from([
        ("KUBECONFIG".into(), kubeconfig.display().to_string()),
        ("PROVIDER_SERVICE_DEVELOPMENT".into(), "true".into()),
        ("AUTH".into(), "tokenreview".into()),
        (
            "ALLOWED_CALLERS".into(),
            format!(
                "{ns}/peerpod-ctrl={peerpod_ctrl_methods},{ns}/peer-pod-config-ctrl=GetCapacity"
            ),
        ),
        ("LISTEN".into(), local(grpc).to_string()),
        ("ADMIN_LISTEN".into(), local(admin).to_string()),
        ("METRICS_SECURE".into(), "true".into()),
        ("METRICS_LISTEN".into(), local(metrics).to_string()),
    ]);
    Service::start(
        "provider-service",
        &service_binary("provider-service"),
        &env,
        local(admin),
        dir,
    )
}

/// Creates the chart's ClusterRole `name` as rendered in `manifest` and binds it to ServiceAccount `ns/sa`.
async fn bind_chart_cluster_role(
    client: &kube::Client,
    manifest: &str,
    name: &str,
    ns: &str,
    sa: &str,
) {
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
    let role: ClusterRole = documents(manifest)
        .iter()
        .filter(|doc| kind_of(doc) == "ClusterRole")
        .map(|doc| serde_saphyr::from_str::<ClusterRole>(doc).expect("a rendered ClusterRole"))
        .find(|role| role.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("the chart renders no ClusterRole {name}"));
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("create ClusterRole");
    let binding = ClusterRoleBinding {
        metadata: kube::api::ObjectMeta {
            name: Some(format!("{name}-{ns}")),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: name.to_owned(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: sa.to_owned(),
            namespace: Some(ns.to_owned()),
            ..Default::default()
        }]),
    };
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&PostParams::default(), &binding)
        .await
        .expect("create ClusterRoleBinding");
}

fn peerpod(name: &str, vm: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPod",
        "metadata": {"name": name, "finalizers": ["peer.pod/finalizer"]},
        "spec": {"cloudProvider": "libvirt", "instanceID": vm},
    }))
    .expect("PeerPod")
}

#[tokio::test(flavor = "multi_thread")]
async fn stuck_cleanup_alert_fires_and_resolves_and_every_dashboard_query_returns_series() {
    // No audit log needed here: the shared control plane is cheaper than the chart tests' audited one.
    let cp = testenv::shared_for(module_path!());
    let client = cp.client().await;
    testenv::apply_crds(&client, "deploy/crds/peerpods.yaml").await;
    testenv::apply_crds(&client, "deploy/crds/peerpodconfigs.yaml").await;
    let ns = testenv::namespace(&client, "prometheus").await;
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = cp.kubeconfig_path();

    // The chart's rules and dashboards, rendered for this release and namespace.
    let overrides = dir.path().join("overrides.yaml");
    std::fs::write(&overrides, OVERRIDES).expect("writing values");
    let manifest = render(
        RELEASE,
        &ns,
        &[
            "deploy/tests/values-dev.yaml",
            &overrides.display().to_string(),
        ],
    )
    .await;
    let mut rules = None;
    let mut dashboards = Vec::new();
    let mut webhook_configuration = None;
    for doc in documents(&manifest) {
        let object: serde_json::Value = serde_saphyr::from_str(&doc).expect("rendered YAML");
        match kind_of(&doc) {
            "PrometheusRule" => rules = Some(object["spec"].clone()),
            "MutatingWebhookConfiguration" => webhook_configuration = Some(object),
            "ConfigMap" if object["metadata"]["labels"]["grafana_dashboard"] == "1" => {
                for (key, json) in object["data"].as_object().expect("data") {
                    let dashboard: serde_json::Value =
                        serde_json::from_str(json.as_str().expect("text")).expect("dashboard JSON");
                    dashboards.push((key.clone(), dashboard));
                }
            }
            _ => {}
        }
    }
    let rules = rules.expect("the chart renders a PrometheusRule");
    // The chart's (empty) webhook configuration, which peer-pod-config-ctrl adds its webhook to. Without it each
    // reconcile ends in WebhookConfigurationMissing and backs off further each time: the capacity refresh, and
    // so the capacity panel's series after provider-service's restart, would wait out that backoff.
    let webhook_configuration: MutatingWebhookConfiguration = serde_json::from_value(
        webhook_configuration.expect("the chart renders a MutatingWebhookConfiguration"),
    )
    .expect("MutatingWebhookConfiguration");
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &webhook_configuration)
        .await
        .expect("create the chart's MutatingWebhookConfiguration");
    assert_eq!(
        dashboards.len(),
        4,
        "cleanup, cloud calls, capacity, provider-service"
    );
    check_runbook_anchors(&rules);
    std::fs::write(dir.path().join("rules.yml"), rules.to_string()).expect("writing rules");

    // The three services, as the chart's ServiceAccounts would call provider-service.
    let token_file = |sa: &str| dir.path().join(format!("{sa}.token"));
    for sa in ["peerpod-ctrl", "peer-pod-config-ctrl"] {
        let token = testenv::service_account_token(&client, &ns, sa, &["provider-service"]).await;
        std::fs::write(token_file(sa), token).expect("writing token");
    }
    let (grpc, ps_admin, pc_admin, ppc_admin) =
        (free_port(), free_port(), free_port(), free_port());
    let (ps_metrics, pc_metrics, ppc_metrics) = (free_port(), free_port(), free_port());
    let ps_ports = (grpc, ps_admin, ps_metrics);
    let mut ps = provider_service(kubeconfig, &ns, ps_ports, "ListInstances", dir.path());
    ps.wait_ready().await;
    let controller_env = |sa: &str, admin: u16, metrics: u16| {
        BTreeMap::from([
            ("METRICS_SECURE".into(), "true".into()),
            ("METRICS_LISTEN".into(), local(metrics).to_string()),
            ("KUBECONFIG".into(), kubeconfig.display().to_string()),
            (
                "PROVIDER_ENDPOINT".into(),
                format!("http://{}", local(grpc)),
            ),
            ("PROVIDER_AUTH".into(), "token".into()),
            ("TOKEN_FILE".into(), token_file(sa).display().to_string()),
            ("ADMIN_LISTEN".into(), local(admin).to_string()),
            ("LEADER_ELECT".into(), "true".into()),
            ("POD_NAME".into(), format!("{sa}-0")),
        ])
    };
    let mut env = controller_env("peerpod-ctrl", pc_admin, pc_metrics);
    env.extend([
        ("POD_NAMESPACE".into(), ns.clone()),
        ("RETRY_MAX_DELAY".into(), "2s".into()),
        (
            "CLUSTER_TAG".into(),
            "peerpods-cluster=prometheus-test".into(),
        ),
        ("ORPHAN_SCAN_INTERVAL".into(), "2s".into()),
        ("REVERSE_SCAN_INTERVAL".into(), "2s".into()),
        ("REVERSE_GRACE".into(), "1s".into()),
    ]);
    let mut peerpod_ctrl = Service::start(
        "peerpod-ctrl",
        &service_binary("peerpod-ctrl"),
        &env,
        local(pc_admin),
        dir.path(),
    );
    let mut env = controller_env("peer-pod-config-ctrl", ppc_admin, ppc_metrics);
    env.insert("PEERPODS_NAMESPACE".into(), ns.clone());
    let mut config_ctrl = Service::start(
        "peer-pod-config-ctrl",
        &service_binary("peer-pod-config-ctrl"),
        &env,
        local(ppc_admin),
        dir.path(),
    );
    peerpod_ctrl.wait_ready().await;
    config_ctrl.wait_ready().await;

    // Prometheus scrapes each service as the chart's ServiceMonitors do: `namespace` the release's,
    // provider-service's job named after its Service, over TLS with its ServiceAccount's token (bound to the
    // chart's metrics-reader ClusterRole), the services' self-signed certificates unverified.
    let reader = format!("{RELEASE}-metrics-reader");
    bind_chart_cluster_role(&client, &manifest, &reader, &ns, "prometheus").await;
    let prometheus_token = dir.path().join("prometheus.token");
    std::fs::write(
        &prometheus_token,
        testenv::service_account_token(&client, &ns, "prometheus", &[]).await,
    )
    .expect("writing token");
    let target = |job: String, port: u16| {
        serde_json::json!({
            "job_name": job,
            "scheme": "https",
            "tls_config": {"insecure_skip_verify": true},
            "authorization": {"type": "Bearer", "credentials_file": prometheus_token.display().to_string()},
            "static_configs": [{"targets": [local(port).to_string()], "labels": {"namespace": ns}}],
        })
    };
    // provider-service's metrics port scraped without a token, to see it refused.
    let mut anonymous = target("anonymous".into(), ps_metrics);
    anonymous
        .as_object_mut()
        .expect("a scrape config")
        .remove("authorization");
    let config = serde_json::json!({
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": [dir.path().join("rules.yml").display().to_string()],
        "scrape_configs": [
            target(format!("{RELEASE}-provider-service"), ps_metrics),
            target(format!("{RELEASE}-peerpod-ctrl-metrics"), pc_metrics),
            target(format!("{RELEASE}-peer-pod-config-ctrl-metrics"), ppc_metrics),
            anonymous,
        ],
    });
    let prometheus = Prometheus::start(dir.path(), &config).await;
    let prom = prometheus.addr;
    let anonymous_scrape = testenv::wait_for(
        "Prometheus's scrape without a token refused",
        Duration::from_secs(60),
        || async {
            let data = api(prom, "/api/v1/targets").await?;
            data["activeTargets"]
                .as_array()?
                .iter()
                .find(|t| t["labels"]["job"] == "anonymous" && t["health"] == "down")
                .cloned()
        },
    )
    .await;
    assert!(
        anonymous_scrape["lastError"]
            .as_str()
            .unwrap_or_default()
            .contains("401"),
        "{anonymous_scrape}"
    );

    // A PeerPodConfig asking provider-service for capacity, and its node.
    let ppc = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "confidentialcontainers.org",
        "v1alpha1",
        "PeerPodConfig",
    ));
    let node: k8s_openapi::api::core::v1::Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": format!("{ns}-worker"), "labels": {"node.kubernetes.io/worker": ""}}
    }))
    .expect("Node");
    Api::<k8s_openapi::api::core::v1::Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
        .expect("create Node");
    let config: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPodConfig",
        "metadata": {"name": "peerpodconfig"},
        "spec": {
            "cloudSecretName": "peer-pods-secret",
            "configMapName": "peer-pods-cm",
            "limit": "10",
            "nodeSelector": {"node.kubernetes.io/worker": ""},
            "capacityFromProvider": {"cloudProvider": "libvirt", "refreshSeconds": 10},
        },
    }))
    .expect("PeerPodConfig");
    Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &ppc)
        .create(&PostParams::default(), &config)
        .await
        .expect("create PeerPodConfig");

    // A live PeerPod (its VM never existed: the reverse scan has something to report), and one being deleted
    // whose VM delete provider-service refuses.
    let peerpod_resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "confidentialcontainers.org",
        "v1alpha1",
        "PeerPod",
    ));
    let peerpods = Api::<DynamicObject>::namespaced_with(client.clone(), &ns, &peerpod_resource);
    for (name, vm) in [
        ("live", "6f1a3c55-0d7e-4a4e-9d59-3c0f2b8c9a01"),
        ("stuck", "6f1a3c55-0d7e-4a4e-9d59-3c0f2b8c9a02"),
    ] {
        peerpods
            .create(&PostParams::default(), &peerpod(name, vm))
            .await
            .expect("create PeerPod");
    }
    peerpods
        .delete("stuck", &DeleteParams::default())
        .await
        .expect("delete PeerPod");

    let firing = testenv::wait_for(
        "PeerPodCleanupStuck firing",
        Duration::from_secs(180),
        || async {
            let alerts = alerts(prom, "PeerPodCleanupStuck").await?;
            alerts.into_iter().find(|a| a["state"] == "firing")
        },
    )
    .await;
    assert_eq!(firing["labels"]["provider"], "libvirt", "{firing}");
    assert_eq!(firing["labels"]["namespace"], ns.as_str(), "{firing}");
    assert_eq!(
        firing["annotations"]["runbook_url"], "docs/runbook.md#peerpodcleanupstuck",
        "{firing}"
    );
    assert!(
        peerpods
            .get_opt("stuck")
            .await
            .expect("get PeerPod")
            .is_some(),
        "the finalizer holds while the VM delete is refused"
    );

    // The refusal itself is what ProviderServiceRejectingCallers watches (pending: its `for` is the default).
    let refused = testenv::wait_for(
        "ProviderServiceRejectingCallers pending or firing",
        Duration::from_secs(60),
        || async { alerts(prom, "ProviderServiceRejectingCallers").await?.pop() },
    )
    .await;
    assert_eq!(
        refused["labels"]["result"], "method_not_allowed",
        "{refused}"
    );

    // The delete is allowed again: the VM is confirmed gone, the finalizer released, the alert resolved.
    ps.terminate().await;
    let mut ps = provider_service(
        kubeconfig,
        &ns,
        ps_ports,
        "DeleteInstance+ListInstances",
        dir.path(),
    );
    ps.wait_ready().await;
    testenv::wait_for(
        "the stuck PeerPod released",
        Duration::from_secs(120),
        || async {
            peerpods
                .get_opt("stuck")
                .await
                .ok()?
                .is_none()
                .then_some(())
        },
    )
    .await;
    testenv::wait_for(
        "PeerPodCleanupStuck resolved",
        Duration::from_secs(120),
        || async {
            alerts(prom, "PeerPodCleanupStuck")
                .await?
                .is_empty()
                .then_some(())
        },
    )
    .await;

    // The other alerts the chart's rules hold about the services themselves see them healthy: provider-service
    // is up under the job its alert watches (a brief `pending` while it restarted clears), and each
    // controller has a leader.
    for quiet in [
        "ProviderServiceUnavailable",
        "PeerPodControllerLeaderMissing",
    ] {
        testenv::wait_for(
            &format!("no {quiet} alert"),
            Duration::from_secs(60),
            || async { alerts(prom, quiet).await?.is_empty().then_some(()) },
        )
        .await;
    }

    // Every query of every dashboard panel returns series. Some series appear only after a scan or a
    // capacity refresh has run, so each query is given time.
    for (dashboard, definition) in &dashboards {
        for panel in definition["panels"].as_array().expect("panels") {
            for query in panel["targets"].as_array().expect("targets") {
                let expr = query["expr"].as_str().expect("expr");
                let what = format!("{dashboard} / {}: {expr}", panel["title"]);
                testenv::wait_for(&what, Duration::from_secs(60), || async {
                    let data = api(prom, &format!("/api/v1/query?query={}", encode(expr))).await?;
                    let series = data["result"].as_array()?.len();
                    (series > 0).then_some(())
                })
                .await;
            }
        }
    }
    drop(prometheus);
}

/// Every alert's runbook_url names a section of docs/runbook.md (its heading is the alert's name).
fn check_runbook_anchors(rules: &serde_json::Value) {
    let runbook = std::fs::read_to_string(testenv::repo_root().join("docs/runbook.md"))
        .expect("docs/runbook.md");
    let headings: Vec<String> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(|h| h.trim().to_lowercase())
        .collect();
    let mut checked = 0;
    for group in rules["groups"].as_array().expect("groups") {
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("alert name");
            let url = rule["annotations"]["runbook_url"]
                .as_str()
                .expect("runbook_url");
            let anchor = url
                .strip_prefix("docs/runbook.md#")
                .unwrap_or_else(|| panic!("{name}: runbook_url {url}"));
            assert_eq!(anchor, name.to_lowercase(), "{name}: runbook_url {url}");
            assert!(
                headings.contains(&anchor.to_owned()),
                "docs/runbook.md has no section for {name}"
            );
            checked += 1;
        }
    }
    assert_eq!(checked, 10, "every alert is checked");
}
