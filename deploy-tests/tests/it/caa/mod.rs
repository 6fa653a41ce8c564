//! cloud-api-adaptor's own Helm chart (`peerpods` 0.4.0, CAA v0.22) on the local control plane, by itself or as the
//! CoCo umbrella chart's `peerpods` subchart ([`Beside`]), and our release beside it, for the alongside and
//! migration tests.
//!
//! CAA's chart is rebuilt from what it renders for libvirt (`peer-pod-config-ctrl/tests/fixtures/caa-chart/`):
//! its own objects, the `resourceCtrl` subchart (upstream's peerpod-ctrl, `peerpodctrl-controller-manager`) behind
//! the same `resourceCtrl.enabled` switch, and the PeerPod CRD in a `crds/` directory as the subchart ships it, so
//! Helm installs it without ownership metadata. Nothing runs CAA's Pods (there is no kubelet): what matters here
//! is their objects, RBAC and CRDs.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use peerpods_proto::v1::ListInstancesRequest;

use crate::support::*;

/// CAA's namespace; ours installs into it too, beside CAA (its callers of provider-service run there).
pub const CAA_NS: &str = "confidential-containers-system";
/// CAA's release, as its README installs it.
pub const CAA_RELEASE: &str = "peerpods";
/// Ours, beside it (release names are per namespace: it cannot be `peerpods` too).
pub const OUR_RELEASE: &str = "peerpods-ctrl";
pub const ALONGSIDE_VALUES: &str = "deploy/chart/peerpods/examples/alongside-caa.yaml";

/// Where CAA's chart is installed, and so where ours goes beside it.
pub struct Beside {
    /// The Helm release that owns CAA's objects (its ServiceAccount, peer-pods-cm, the PeerPod CRD).
    pub caa_release: &'static str,
    /// CAA's namespace (`.Release.Namespace` of that release); ours installs there too.
    pub namespace: &'static str,
    /// Where CAA's chart's values sit in that release: at the top, or under its subchart's name.
    pub values_prefix: &'static str,
    /// The values ours installs with.
    pub our_values: &'static str,
}

/// CAA's own chart, as its README installs it.
pub const CAAS_CHART: Beside = Beside {
    caa_release: CAA_RELEASE,
    namespace: CAA_NS,
    values_prefix: "",
    our_values: ALONGSIDE_VALUES,
};

impl Beside {
    /// Our provider-service's own namespace (the chart's default beside CAA).
    pub fn provider_ns(&self) -> String {
        provider_namespace(self.namespace)
    }
}
/// libvirt's test driver needs provider-service's development mode.
pub const DEV_VALUES: &str = "deploy/tests/values-dev.yaml";
pub const CRD_CHART: &str = "deploy/chart/peerpods-crds";
pub const PEERPODS_CRD: &str = "peerpods.confidentialcontainers.org";
/// The finalizer CAA puts on every PeerPod.
pub const FINALIZER: &str = "peer.pod/finalizer";
const FIXTURE: &str = "peer-pod-config-ctrl/tests/fixtures/caa-chart/libvirt.yaml";
/// The body CAA POSTs for a PeerPod.
const PEERPOD_BODY: &str = "api/tests/fixtures/caa-peerpod.json";

/// The PeerPod CRD as upstream's peerpod-ctrl chart ships it in `crds/` (controller-gen output for
/// `spec.cloudProvider`, `spec.instanceID` and `status.cleand`; docs upstream-contract).
const UPSTREAM_PEERPOD_CRD: &str = "\
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  annotations:
    controller-gen.kubebuilder.io/version: v0.14.0
  name: peerpods.confidentialcontainers.org
spec:
  group: confidentialcontainers.org
  names:
    kind: PeerPod
    listKind: PeerPodList
    plural: peerpods
    singular: peerpod
  scope: Namespaced
  versions:
  - name: v1alpha1
    schema:
      openAPIV3Schema:
        properties:
          apiVersion:
            type: string
          kind:
            type: string
          metadata:
            type: object
          spec:
            properties:
              cloudProvider:
                type: string
              instanceID:
                type: string
            type: object
          status:
            properties:
              cleand:
                type: boolean
            type: object
        type: object
    served: true
    storage: true
    subresources:
      status: {}
";

/// Writes CAA's chart to `dir`, its peer-pods-cm pointing libvirt at `libvirt_uri` (as its
/// `providerConfigs.libvirt.LIBVIRT_URI` does).
///
/// Its webhook subchart is off (`webhook.enabled=false`): its Certificate needs cert-manager, and with no kubelet
/// to run it, its `failurePolicy: Fail` configuration would refuse every Pod of the test. Which webhook mutates
/// Pods plays no part in the cleanup story.
pub fn write_caa_chart(dir: &Path, libvirt_uri: &str) {
    let fixture =
        std::fs::read_to_string(testenv::repo_root().join(FIXTURE)).expect("CAA chart fixture");
    let (mut own, mut resource_ctrl, mut webhook) = (String::new(), String::new(), String::new());
    for doc in documents(&fixture) {
        let source = doc
            .lines()
            .find_map(|l| l.strip_prefix("# Source: "))
            .unwrap_or_default()
            .to_owned();
        // The chart's templates put its objects (and its bindings' subjects) in the release's namespace.
        let doc = doc.replace(CAA_NS, "{{ .Release.Namespace }}");
        let doc = if kind_of(&doc) == "ConfigMap" && doc.contains("  name: peer-pods-cm\n") {
            let with_uri = doc.replace(
                "  CLOUD_PROVIDER: \"libvirt\"\n",
                &format!("  CLOUD_PROVIDER: \"libvirt\"\n  LIBVIRT_URI: \"{libvirt_uri}\"\n"),
            );
            assert_ne!(with_uri, doc, "peer-pods-cm of the fixture names no cloud");
            with_uri
        } else {
            doc
        };
        let target = if source.starts_with("peerpods/charts/resourceCtrl/") {
            &mut resource_ctrl
        } else if source.starts_with("peerpods/charts/webhook/") {
            if ["Certificate", "Issuer"].contains(&kind_of(&doc)) {
                continue;
            }
            &mut webhook
        } else {
            &mut own
        };
        target.push_str("---\n");
        target.push_str(&doc);
    }
    assert!(
        resource_ctrl.contains("name: peerpodctrl-controller-manager"),
        "the fixture holds upstream's peerpod-ctrl"
    );
    std::fs::create_dir_all(dir.join("templates")).expect("chart dir");
    std::fs::create_dir_all(dir.join("crds")).expect("chart dir");
    let files = [
        (
            "Chart.yaml",
            "apiVersion: v2\nname: peerpods\ndescription: cloud-api-adaptor's chart, from its rendered objects\n\
             type: application\nversion: 0.4.0\nappVersion: \"v0.22.0\"\n"
                .to_owned(),
        ),
        (
            "values.yaml",
            "resourceCtrl:\n  enabled: true\nwebhook:\n  enabled: false\n".to_owned(),
        ),
        (
            "crds/confidentialcontainers.org_peerpods.yaml",
            UPSTREAM_PEERPOD_CRD.to_owned(),
        ),
        ("templates/caa.yaml", own),
        (
            "templates/resourcectrl.yaml",
            format!("{{{{- if .Values.resourceCtrl.enabled }}}}\n{resource_ctrl}{{{{- end }}}}\n"),
        ),
        (
            "templates/webhook.yaml",
            format!("{{{{- if .Values.webhook.enabled }}}}\n{webhook}{{{{- end }}}}\n"),
        ),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("chart file");
    }
}

/// The CoCo umbrella chart (`confidential-containers`, confidential-containers/charts), which carries CAA's chart as
/// its `peerpods` subchart (confidential-containers/charts#54) behind `peerpods.enabled` (off by default), installed
/// as its README does (release `coco` in `kube-system`).
pub const COCO_UMBRELLA: Beside = Beside {
    caa_release: "coco",
    namespace: "kube-system",
    values_prefix: "peerpods.",
    our_values: "deploy/chart/peerpods/examples/beside-coco-umbrella.yaml",
};

/// Writes the umbrella chart to `dir` with CAA's chart (as [`write_caa_chart`]) as its `peerpods` subchart. Only
/// that subchart: the umbrella's kata-deploy subcharts lay down the Kata runtime on nodes and own none of the
/// objects ours meets.
pub fn write_coco_umbrella(dir: &Path, libvirt_uri: &str) {
    write_caa_chart(&dir.join("charts/peerpods"), libvirt_uri);
    let files = [
        (
            "Chart.yaml",
            "apiVersion: v2\nname: confidential-containers\n\
             description: the CoCo umbrella chart, with only its peerpods subchart\ntype: application\n\
             version: 0.21.0\nappVersion: \"0.21.0\"\ndependencies:\n- name: peerpods\n  version: 0.4.0\n\
             \x20 condition: peerpods.enabled\n",
        ),
        ("values.yaml", "peerpods:\n  enabled: false\n"),
    ];
    for (name, text) in files {
        std::fs::write(dir.join(name), text).expect("umbrella chart file");
    }
}

/// The umbrella chart with peer pods on, written under `work` with libvirt pointed at a test host holding `vms`,
/// and installed as [`COCO_UMBRELLA`] says. Returns the chart's directory.
pub async fn install_coco_umbrella(
    cp: &testenv::ControlPlane,
    work: &Path,
    vms: &[String],
) -> String {
    let host = work.join("libvirt-host.xml");
    std::fs::write(&host, libvirt_host(vms)).expect("host");
    let chart = work.join("coco-chart");
    write_coco_umbrella(&chart, &format!("test://{}", host.display()));
    let chart = chart.display().to_string();
    install_caa_release(
        cp,
        &COCO_UMBRELLA,
        &chart,
        &["--set", "peerpods.enabled=true"],
    )
    .await;
    chart
}

/// CAA's chart as its users run it today (upstream's peerpod-ctrl on, the PeerPod CRD from `crds/` without Helm
/// metadata), written under `work` with libvirt pointed at a test host holding `vms`, and installed as
/// [`CAA_RELEASE`] in [`CAA_NS`]. Returns the chart's directory, for the upgrades that follow.
pub async fn install_caa(cp: &testenv::ControlPlane, work: &Path, vms: &[String]) -> String {
    let host = work.join("libvirt-host.xml");
    std::fs::write(&host, libvirt_host(vms)).expect("host");
    let chart = work.join("caa-chart");
    write_caa_chart(&chart, &format!("test://{}", host.display()));
    let chart = chart.display().to_string();
    install_caa_release(cp, &CAAS_CHART, &chart, &[]).await;
    chart
}

/// `helm install` of CAA's release as `at` says, from `chart`, with `extra` arguments.
pub async fn install_caa_release(
    cp: &testenv::ControlPlane,
    at: &Beside,
    chart: &str,
    extra: &[&str],
) {
    let args = [
        "install",
        at.caa_release,
        chart,
        "--namespace",
        at.namespace,
        "--create-namespace",
    ];
    helm_ok(cp, &[&args[..], extra].concat()).await;
}

/// `helm upgrade --install` of `peerpods-crds` (in `default`), as docs/alongside-caa.md and docs/migrating.md
/// take the PeerPod CRD over.
pub const INSTALL_CRDS: [&str; 6] = [
    "upgrade",
    "--install",
    "peerpods-crds",
    CRD_CHART,
    "--namespace",
    "default",
];

/// CAA's release (its chart in `chart`) upgraded with its cleanup controller off (`resourceCtrl.enabled=false`),
/// so only ours acts on PeerPods.
pub async fn turn_off_upstream_controller(cp: &testenv::ControlPlane, chart: &str) {
    turn_off_upstream_controller_at(cp, &CAAS_CHART, chart).await;
}

/// As [`turn_off_upstream_controller`], for CAA's release where `at` says.
pub async fn turn_off_upstream_controller_at(cp: &testenv::ControlPlane, at: &Beside, chart: &str) {
    let switch = format!("{}resourceCtrl.enabled=false", at.values_prefix);
    helm_ok(
        cp,
        &[
            "upgrade",
            at.caa_release,
            chart,
            "--namespace",
            at.namespace,
            "--reuse-values",
            "--set",
            &switch,
        ],
    )
    .await;
}

/// Our chart as docs/alongside-caa.md installs it: in CAA's namespace with `examples/alongside-caa.yaml`, and
/// libvirt's test driver behind provider-service in development mode; then, as the document says, a copy of
/// the peer-pods-cm CAA's chart manages in provider-service's namespace.
pub async fn install_ours(cp: &testenv::ControlPlane) {
    install_ours_beside(cp, &CAAS_CHART).await;
}

/// As [`install_ours`], beside CAA's release where `at` says, with its values.
pub async fn install_ours_beside(cp: &testenv::ControlPlane, at: &Beside) {
    helm_ok(
        cp,
        &[
            "install",
            OUR_RELEASE,
            CHART,
            "--namespace",
            at.namespace,
            "-f",
            at.our_values,
            // libvirt's test driver: provider-service in development mode.
            "-f",
            DEV_VALUES,
        ],
    )
    .await;
    let caas = kubectl_ok(
        cp,
        &[
            "get",
            "configmap",
            "peer-pods-cm",
            "--namespace",
            at.namespace,
            "-o",
            "json",
        ],
    )
    .await;
    let mut copy: serde_json::Value = serde_json::from_str(&caas).expect("peer-pods-cm JSON");
    copy["metadata"] = serde_json::json!({"name": "peer-pods-cm", "namespace": at.provider_ns()});
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    run_ok(
        &tool("kubectl"),
        &["--kubeconfig", &kubeconfig, "apply", "-f", "-"],
        Some(&copy.to_string()),
    )
    .await;
}

/// Our release's provider-service and peerpod-ctrl, running out of cluster as the chart's ServiceAccounts with
/// the chart's environment (as `chart.rs` runs them).
pub struct Ours {
    pub provider: Option<Service>,
    pub peerpod_ctrl: Option<Service>,
    pub provider_admin: SocketAddr,
    pc_admin: SocketAddr,
    ps_env: BTreeMap<String, String>,
    pc_env: BTreeMap<String, String>,
    work: PathBuf,
    grpc_port: u16,
    ca_file: PathBuf,
    token_file: PathBuf,
    server_name: String,
    /// peerpod-ctrl's ServiceAccount, as provider-service names its callers (`namespace/name`).
    pub peerpod_ctrl_caller: String,
}

impl Ours {
    /// Starts provider-service, then peerpod-ctrl.
    pub async fn start(cp: &testenv::ControlPlane, work: &Path) -> Ours {
        Ours::start_beside(cp, &CAAS_CHART, work).await
    }

    /// As [`Ours::start`], for our release beside CAA's where `at` says.
    pub async fn start_beside(cp: &testenv::ControlPlane, at: &Beside, work: &Path) -> Ours {
        let mut ours = Ours::prepare_beside(cp, at, work).await;
        ours.start_provider().await;
        ours.start_peerpod_ctrl().await;
        ours
    }

    /// provider-service as the chart renders it with `metrics.secure=false` (`/metrics` plain on the admin port),
    /// for a test that counts provider-service's cloud calls ([`Ours::metric`]) rather than testing how the chart
    /// serves metrics (`prometheus.rs` scrapes them over TLS with a reader's token). Before [`Ours::start_provider`].
    pub fn plain_metrics(&mut self) {
        self.ps_env.insert("METRICS_SECURE".into(), "false".into());
        self.ps_env.remove("METRICS_LISTEN");
    }

    /// provider-service (up to ready).
    pub async fn start_provider(&mut self) {
        let mut provider = Service::start(
            "provider-service",
            &service_binary("provider-service"),
            &self.ps_env,
            self.provider_admin,
            &self.work,
        );
        provider.wait_ready().await;
        self.provider = Some(provider);
    }

    /// peerpod-ctrl (up to ready: it reaches provider-service only when it has a VM to delete).
    pub async fn start_peerpod_ctrl(&mut self) {
        let mut peerpod_ctrl = Service::start(
            "peerpod-ctrl-0",
            &service_binary("peerpod-ctrl"),
            &self.pc_env,
            self.pc_admin,
            &self.work,
        );
        peerpod_ctrl.wait_ready().await;
        self.peerpod_ctrl = Some(peerpod_ctrl);
    }

    /// Lays out what the chart's Deployments mount and sets their environment; starts nothing.
    pub async fn prepare(cp: &testenv::ControlPlane, work: &Path) -> Ours {
        Ours::prepare_beside(cp, &CAAS_CHART, work).await
    }

    /// As [`Ours::prepare`], for our release beside CAA's where `at` says.
    pub async fn prepare_beside(cp: &testenv::ControlPlane, at: &Beside, work: &Path) -> Ours {
        let (ns, provider_ns) = (at.namespace, at.provider_ns());
        let admin = cp.client().await;
        let fullname = OUR_RELEASE.to_owned();
        let deployments: Api<Deployment> = Api::namespaced(admin.clone(), ns);
        let ps_deploy = deployment_of(
            &Api::namespaced(admin.clone(), &provider_ns),
            &fullname,
            "provider-service",
        )
        .await;
        let pc_deploy = deployment_of(&deployments, &fullname, "peerpod-ctrl").await;
        for (ns, sa) in [
            (provider_ns.as_str(), service_account_of(&ps_deploy)),
            (ns, service_account_of(&pc_deploy)),
        ] {
            Api::<ServiceAccount>::namespaced(admin.clone(), ns)
                .get(&sa)
                .await
                .unwrap_or_else(|e| panic!("ServiceAccount {ns}/{sa} from the chart: {e}"));
        }

        // provider-service: the copy of peer-pods-cm (CAA's chart's), its own credential and its certificate, in
        // its namespace, mounted as a kubelet would.
        let provider = lay_out_provider_service(cp, &admin, &provider_ns, &ps_deploy, work).await;
        // peerpod-ctrl: a token for provider-service's audience and its CA, from the projected volume.
        let sa = service_account_of(&pc_deploy);
        let api_token = testenv::service_account_token(&admin, ns, &sa, &[]).await;
        let controller = lay_out_controller(
            cp,
            &admin,
            ns,
            &pc_deploy,
            "peerpod-ctrl-0",
            &api_token,
            provider.grpc_port,
            work,
        )
        .await;
        Ours {
            provider: None,
            peerpod_ctrl: None,
            provider_admin: provider.admin,
            pc_admin: controller.admin,
            ps_env: provider.env,
            pc_env: controller.env,
            work: work.to_path_buf(),
            grpc_port: provider.grpc_port,
            ca_file: controller.mount.join("ca.crt"),
            token_file: controller.mount.join("token"),
            server_name: controller.server_name,
            peerpod_ctrl_caller: format!("{ns}/{sa}"),
        }
    }

    /// The VMs libvirt holds, asked through provider-service as peerpod-ctrl (its orphan scan's call).
    pub async fn vms(&self) -> Vec<String> {
        provider_client(
            self.grpc_port,
            &self.ca_file,
            &self.server_name,
            &self.token_file,
        )
        .list_instances(ListInstancesRequest {
            cloud_provider: "libvirt".into(),
            tag_selector: Default::default(),
        })
        .await
        .expect("ListInstances")
        .into_inner()
        .instances
        .into_iter()
        .map(|i| i.instance_id)
        .collect()
    }

    /// What each delete provider-service ran against the cloud came to, from its JSON log: (instance id,
    /// outcome, caller), one per backend delete (the events of a `delete_instance` span that carry an outcome).
    pub fn delete_answers(&self) -> Vec<(String, String, String)> {
        self.provider
            .as_ref()
            .map(Service::log_text)
            .unwrap_or_default()
            .lines()
            .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
            .filter(|entry| {
                entry["span"]["name"] == "delete_instance" && entry["fields"]["outcome"].is_string()
            })
            .map(|entry| {
                let field =
                    |name: &str| entry["span"][name].as_str().unwrap_or_default().to_owned();
                (
                    field("instance_id"),
                    entry["fields"]["outcome"]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned(),
                    field("caller"),
                )
            })
            .collect()
    }

    /// provider-service's `/metrics` on its admin port (started after [`Ours::plain_metrics`]): the sum of the
    /// samples of `metric` whose labels include every one of `labels`.
    pub async fn metric(&self, metric: &str, labels: &[(&str, &str)]) -> f64 {
        let (status, text) = http_get(self.provider_admin, "/metrics")
            .await
            .expect("provider-service /metrics");
        assert_eq!(
            status, 200,
            "provider-service /metrics on its admin port: {text}"
        );
        text.lines()
            .filter(|l| l.starts_with(&format!("{metric}{{")))
            .filter(|l| {
                labels
                    .iter()
                    .all(|(k, v)| l.contains(&format!("{k}=\"{v}\"")))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

/// CAA records the VM of `pod` in a PeerPod, with the body it POSTs (fixture), as the client `caa` (its
/// ServiceAccount).
pub async fn caa_records_vm(caa: &kube::Client, pod: &Pod, vm: &str) -> String {
    caa_creates_peerpod(caa, pod, vm)
        .await
        .unwrap_or_else(|e| panic!("CAA's ServiceAccount creates the PeerPod of VM {vm}: {e}"))
}

/// As [`caa_records_vm`], returning what the API server answered: the PeerPod's name, or its refusal.
pub async fn caa_creates_peerpod(
    caa: &kube::Client,
    pod: &Pod,
    vm: &str,
) -> Result<String, kube::Error> {
    let text = std::fs::read_to_string(testenv::repo_root().join(PEERPOD_BODY))
        .expect("CAA's PeerPod body");
    let mut body: serde_json::Value = serde_json::from_str(&text).expect("PeerPod JSON");
    let pod_name = pod.metadata.name.clone().expect("Pod name");
    let ns = pod.metadata.namespace.clone().expect("Pod namespace");
    let name = format!(
        "{pod_name}-resource-{}",
        &uuid::Uuid::new_v4().simple().to_string()[..5]
    );
    body["metadata"]["name"] = name.clone().into();
    body["metadata"]["namespace"] = ns.clone().into();
    body["metadata"]["ownerReferences"][0]["name"] = pod_name.into();
    body["metadata"]["ownerReferences"][0]["uid"] = pod.metadata.uid.clone().into();
    body["spec"]["cloudProvider"] = "libvirt".into();
    body["spec"]["instanceID"] = vm.into();
    let peerpod: DynamicObject = serde_json::from_value(body).expect("PeerPod");
    Api::<DynamicObject>::namespaced_with(caa.clone(), &ns, &peerpod_resource())
        .create(&PostParams::default(), &peerpod)
        .await?;
    Ok(name)
}

/// The cleanup story as CAA lives it: CAA (client `caa`) records `vm` for a new Pod `name` in `pods`; the Pod is
/// deleted; the garbage collector deletes the PeerPod and our peerpod-ctrl cleans it up (waited for in
/// `peerpods`). Returns the PeerPod's name.
pub async fn caa_vm_cleaned_up(
    caa: &kube::Client,
    pods: &Api<Pod>,
    peerpods: &Api<DynamicObject>,
    name: &str,
    vm: &str,
) -> String {
    let pod = workload_pod(pods, name).await;
    let peerpod = caa_records_vm(caa, &pod, vm).await;
    pods.delete(name, &DeleteParams::background())
        .await
        .expect("delete Pod");
    wait_gone(
        &format!("PeerPod {peerpod} cleaned up and gone"),
        peerpods,
        &peerpod,
        Duration::from_secs(120),
    )
    .await;
    peerpod
}

/// A client acting as CAA's ServiceAccount (`cloud-api-adaptor` in CAA's namespace, made by CAA's chart: it must
/// exist, or the token request would quietly create it).
pub async fn caa_client(cp: &testenv::ControlPlane) -> kube::Client {
    caa_client_at(cp, &CAAS_CHART).await
}

/// As [`caa_client`], for CAA's release where `at` says.
pub async fn caa_client_at(cp: &testenv::ControlPlane, at: &Beside) -> kube::Client {
    let admin = cp.client().await;
    let account = Api::<ServiceAccount>::namespaced(admin.clone(), at.namespace)
        .get("cloud-api-adaptor")
        .await
        .expect("CAA's ServiceAccount from its chart");
    let owner = account
        .metadata
        .annotations
        .unwrap_or_default()
        .get("meta.helm.sh/release-name")
        .cloned();
    assert_eq!(
        owner.as_deref(),
        Some(at.caa_release),
        "CAA's ServiceAccount belongs to CAA's release"
    );
    let token =
        testenv::service_account_token(&admin, at.namespace, "cloud-api-adaptor", &[]).await;
    cp.client_with_token(&token).await
}
