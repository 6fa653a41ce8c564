//! The Helm chart against the real API server of the local control plane.
//!
//! - Rendering: `helm lint` and `helm template` with the default, the full and the add-on values; every object
//!   is validated by kubeconform (schemas from this API server, CRDs included) and by the API server itself
//!   (server-side apply, dry run, strict field validation). The chart's values schema refuses bad values.
//! - Installing: `helm install`, then the three service binaries run out of cluster as the chart's
//!   ServiceAccounts with the chart's configuration, and a deleted PeerPod's VM is deleted and its finalizer
//!   released: the chart's RBAC is enough. Reading the cloud credentials as anything but provider-service is
//!   refused, and every permission the chart grants our services is one they used (the API server's audit
//!   log): it is not too much.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::support::*;
use deploy_tests::rbac;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, ServiceAccount};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use peerpods_api::peerpodconfig::CloudProvider;
use peerpods_proto::v1::{GetCapacityRequest, ListInstancesRequest};

/// Kinds from other projects (cert-manager, prometheus-operator) whose CRDs the local control plane lacks:
/// rendered and linted, but neither kubeconform nor the API server can check them here.
const FOREIGN_KINDS: [&str; 4] = ["Certificate", "Issuer", "ServiceMonitor", "PrometheusRule"];

/// The values of a release on libvirt's test driver (no tags there, provider-service in development mode): the
/// chart's defaults alone refuse to render without a cluster tag.
const DEV_VALUES: &str = "deploy/tests/values-dev.yaml";

/// provider-service's own credential by default (providerService.credentials.secretName); CAA keeps
/// peer-pods-secret.
const PROVIDER_CREDENTIALS: &str = "provider-service-credentials";

/// The MutatingWebhookConfiguration the chart creates and peer-pod-config-ctrl adds its webhook to.
const WEBHOOK_CONFIGURATION: &str = "peer-pods-webhook-mutating-webhook-configuration";

/// The CRDs are installed by whichever test comes first (Helm's crds/ or apply); never both at once.
static CRDS: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread")]
async fn every_rendered_object_is_valid_for_kubeconform_and_the_api_server() {
    let cp = control_plane();
    let client = cp.client().await;
    {
        let _crds = CRDS.lock().await;
        testenv::apply_crds(&client, "deploy/crds/peerpods.yaml").await;
        testenv::apply_crds(&client, "deploy/crds/peerpodconfigs.yaml").await;
    }
    wait_for_openapi_kind(&client, "confidentialcontainers.org", "PeerPod").await;
    wait_for_openapi_kind(&client, "confidentialcontainers.org", "PeerPodConfig").await;
    let schema_dir = tempfile::tempdir().expect("temp dir");
    let location = write_schemas(&client, schema_dir.path(), true).await;
    let kubeconfig = cp.kubeconfig_path().display().to_string();

    for (case, values) in [
        ("default", vec![DEV_VALUES]),
        ("full", vec!["deploy/tests/values-full.yaml"]),
        (
            "addons",
            vec![DEV_VALUES, "deploy/tests/values-addons.yaml"],
        ),
        // Beside cloud-api-adaptor's chart (docs/alongside-caa.md): peer-pod-config-ctrl off.
        (
            "alongside-caa",
            vec![
                DEV_VALUES,
                "deploy/chart/peerpods/examples/alongside-caa.yaml",
            ],
        ),
        // The same with our webhook instead of CAA's (webhook.enabled=true).
        (
            "alongside-caa-our-webhook",
            vec![
                DEV_VALUES,
                "deploy/chart/peerpods/examples/alongside-caa.yaml",
                "deploy/tests/values-our-webhook.yaml",
            ],
        ),
    ] {
        let mut lint = vec!["lint", "--strict", CHART, "--kube-version", KUBE_VERSION];
        for v in &values {
            lint.extend(["-f", v]);
        }
        run_ok(&tool("helm"), &lint, None).await;

        let ns = testenv::namespace(&client, &format!("render-{case}")).await;
        let manifest = render("peerpods", &ns, &values).await;
        let docs = documents(&manifest);
        // provider-service's own namespace: the chart creates it, but a dry run creates nothing for the objects
        // in it to be checked against.
        create_namespace(&client, &provider_namespace(&ns)).await;
        let (foreign, ours): (Vec<_>, Vec<_>) = docs
            .iter()
            .partition(|d| FOREIGN_KINDS.contains(&kind_of(d)));
        assert!(
            ours.iter()
                .filter(|d| kind_of(d) == "CustomResourceDefinition")
                .count()
                == 2,
            "{case}: the chart must carry both CRDs"
        );
        if case == "addons" {
            assert_eq!(
                foreign.len(),
                6,
                "addons: an Issuer, a Certificate, 3 ServiceMonitors and a PrometheusRule expected"
            );
        } else {
            assert!(foreign.is_empty(), "{case}: unexpected add-on objects");
        }
        let checked = ours.iter().map(|d| format!("---\n{d}")).collect::<String>();

        let summary = run_ok(
            &tool("kubeconform"),
            &[
                "-strict",
                "-summary",
                "-schema-location",
                &location,
                "-kubernetes-version",
                KUBE_VERSION,
                "-",
            ],
            Some(&checked),
        )
        .await;
        assert!(
            summary.contains(&format!(
                "Valid: {}, Invalid: 0, Errors: 0, Skipped: 0",
                ours.len()
            )),
            "{case}: kubeconform: {summary}"
        );

        let applied = run_ok(
            &tool("kubectl"),
            &[
                "--kubeconfig",
                &kubeconfig,
                "apply",
                "--server-side",
                "--force-conflicts",
                "--field-manager=chart-check",
                "--dry-run=server",
                "--validate=strict",
                "-f",
                "-",
            ],
            Some(&checked),
        )
        .await;
        assert_eq!(
            applied
                .lines()
                .filter(|l| l.ends_with("(server dry run)"))
                .count(),
            ours.len(),
            "{case}: the API server accepted only:\n{applied}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn validators_refuse_a_broken_object() {
    // The checks above are only worth something if they can fail: a Deployment with a misspelt field and a
    // string where a number belongs must be refused by both.
    let cp = control_plane();
    let client = cp.client().await;
    let schema_dir = tempfile::tempdir().expect("temp dir");
    let location = write_schemas(&client, schema_dir.path(), true).await;
    let ns = testenv::namespace(&client, "broken").await;
    let manifest = render("peerpods", &ns, &[DEV_VALUES]).await;
    let deployment = documents(&manifest)
        .into_iter()
        .find(|d| kind_of(d) == "Deployment")
        .expect("a Deployment");
    let broken = deployment.replacen("replicas: 2", "replicas: two\n  replica: 2", 1);
    assert_ne!(broken, deployment);

    let (ok, out, _) = run(
        &tool("kubeconform"),
        &["-strict", "-summary", "-schema-location", &location, "-"],
        Some(&broken),
    )
    .await;
    assert!(
        !ok && out.contains("Invalid: 1"),
        "kubeconform accepted: {out}"
    );

    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let (ok, _, err) = run(
        &tool("kubectl"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "apply",
            "--server-side",
            "--dry-run=server",
            "--validate=strict",
            "-f",
            "-",
        ],
        Some(&broken),
    )
    .await;
    assert!(
        !ok && err.contains(".spec.replica"),
        "the API server accepted: {err}"
    );
}

/// A checksum annotation is a hex string: unquoted, YAML reads one of digits and a single `e` as a number, and
/// the API server refuses the Deployment. In namespace `app-h6shj` the allowed callers hash to such a value.
#[tokio::test(flavor = "multi_thread")]
async fn checksum_annotations_stay_strings_whatever_they_hash_to() {
    let values = testenv::repo_root().join("deploy/tests/values-dev.yaml");
    let manifest = render("app", "app-h6shj", &[&values.display().to_string()]).await;
    let checksums: Vec<&str> = manifest
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with("checksum/"))
        .collect();
    assert!(!checksums.is_empty(), "no checksum annotation rendered");
    for line in checksums {
        let (_, value) = line.split_once(": ").expect("an annotation line");
        assert!(value.starts_with('"'), "unquoted: {line}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn values_schema_refuses_bad_values() {
    for (set, complaint) in [
        ("peerpodCtrl.replicas=-1", "replicas"),
        ("peerpodCtrl.orphans.policy=sometimes", "policy"),
        ("providerService.grpcPort=70000", "grpcPort"),
        ("providerService.deleteUntagged=yes", "deleteUntagged"),
        ("providerService.cloudProviders={nimbus}", "cloudProviders"),
        ("networkPolicy.caaNodeCIDRs[0]=not-a-cidr", "caaNodeCIDRs"),
        ("peerPodConfigCtrl.enabled=sometimes", "enabled"),
        ("webhook.enabled=sometimes", "enabled"),
        ("webhook.failurePolicy=Never", "failurePolicy"),
        (
            "webhook.targetRuntimeClass=Kata_Remote",
            "targetRuntimeClass",
        ),
        // The credential holder is reached only from inside the cluster.
        ("providerService.service.type=NodePort", "service/type"),
        ("providerService.service.type=LoadBalancer", "service/type"),
        (
            "providerService.credentials.shareWithCAA=maybe",
            "shareWithCAA",
        ),
        // provider-service's namespace is a DNS label; an issuer of cert-manager's needs its CA to publish.
        (
            "providerService.namespace.name=Not_A_Namespace",
            "namespace/name",
        ),
        (
            "tls.certManager.enabled=true,tls.certManager.issuerRef.name=company-ca",
            "caCert",
        ),
        ("unknownSetting=true", "unknownSetting"),
    ] {
        let (ok, _, err) = template_with(&[set]).await;
        assert!(
            !ok && err.contains(complaint),
            "--set {set} was accepted: {err}"
        );
    }
}

/// Only this cluster's VMs by default: with the chart's default values (no cluster tag, any cloud) `helm
/// template` and `helm install` fail and say what to set; so do values naming a cloud with tags. A cluster tag,
/// the explicit `deleteUntagged: allow`, or clouds without tags render, and pass the choice on to
/// provider-service.
#[tokio::test(flavor = "multi_thread")]
async fn default_values_fail_without_a_cluster_tag() {
    for sets in [
        &[][..],
        &["providerService.cloudProviders={aws}"][..],
        &[
            "providerService.cloudProviders={libvirt,gcp}",
            "providerService.deleteUntagged=deny",
        ][..],
    ] {
        let (ok, _, err) = template_with(sets).await;
        assert!(!ok, "{sets:?} rendered without a cluster tag");
        assert!(
            err.contains("no cluster tag")
                && err.contains("peerpodCtrl.orphans.clusterTag")
                && err.contains("providerService.deleteUntagged=allow"),
            "{sets:?}: {err}"
        );
    }
    // helm install refuses the defaults the same way, before creating anything (the CRDs are left to the
    // other tests).
    let cp = control_plane();
    let client = cp.client().await;
    let ns = testenv::namespace(&client, "no-cluster-tag").await;
    let (ok, _, err) = helm(
        cp,
        &["install", "x", CHART, "--skip-crds", "--namespace", &ns],
    )
    .await;
    assert!(!ok && err.contains("no cluster tag"), "helm install: {err}");
    let deployments: Api<Deployment> = Api::namespaced(client, &ns);
    assert!(
        deployments
            .list(&ListParams::default())
            .await
            .expect("list Deployments")
            .items
            .is_empty(),
        "helm install created Deployments"
    );

    for (sets, env) in [
        (
            &["peerpodCtrl.orphans.clusterTag=peerpods.io/cluster=prod"][..],
            "CLUSTER_TAG",
        ),
        (
            &["providerService.deleteUntagged=allow"][..],
            "DELETE_UNTAGGED",
        ),
        (&["providerService.cloudProviders={libvirt,byom}"][..], ""),
    ] {
        let (ok, out, err) = template_with(sets).await;
        assert!(ok, "{sets:?}: {err}");
        if !env.is_empty() {
            assert!(
                out.contains(&format!("name: {env}")),
                "{sets:?} does not set {env}"
            );
        }
        assert!(
            !out.contains("PROVIDER_SERVICE_DEVELOPMENT"),
            "development mode is never a default"
        );
    }
}

/// The chart's two per-cloud lists agree with the clouds' one place ([`CloudProvider`]): the values schema
/// accepts exactly the clouds there are, and the cluster-tag rule (a template's list of the clouds without tags)
/// refuses a release without a cluster tag exactly on the clouds that have tags. A new cloud that the chart does
/// not know, or knows with the wrong tag fact, fails here rather than silently dropping the guard.
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_knows_every_cloud_and_whether_it_has_tags() {
    let schema: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(testenv::repo_root().join(CHART).join("values.schema.json"))
            .expect("read the values schema"),
    )
    .expect("the values schema is JSON");
    let mut listed: Vec<&str> = schema
        .pointer("/properties/providerService/properties/cloudProviders/items/enum")
        .and_then(|e| e.as_array())
        .expect("providerService.cloudProviders lists its clouds")
        .iter()
        .map(|v| v.as_str().expect("a cloud name"))
        .collect();
    let mut clouds: Vec<&str> = CloudProvider::ALL.iter().map(|c| c.as_str()).collect();
    clouds.sort_unstable();
    listed.sort_unstable();
    assert_eq!(listed, clouds, "the values schema's clouds");

    for cloud in CloudProvider::ALL {
        let set = format!("providerService.cloudProviders={{{cloud}}}");
        let (ok, _, err) = template_with(&[&set]).await;
        assert_eq!(
            !ok && err.contains("no cluster tag"),
            cloud.has_tags(),
            "{cloud} without a cluster tag (has tags: {}): {err}",
            cloud.has_tags()
        );
        assert!(ok || err.contains("no cluster tag"), "{cloud}: {err}");
    }
}

/// A credential per job: CAA's DaemonSet runs on every selected node with peer-pods-secret, so the chart refuses
/// to give provider-service that Secret (as its credential or an extra configuration Secret), saying what to
/// set, unless `providerService.credentials.shareWithCAA` accepts it. By default provider-service mounts a Secret
/// of its own, and none at all when its name is empty (a workload identity).
#[tokio::test(flavor = "multi_thread")]
async fn the_chart_refuses_one_secret_for_caa_and_provider_service() {
    let template = |sets: Vec<String>| async move {
        let mut args = vec![
            "template".to_owned(),
            "x".into(),
            CHART.into(),
            "--kube-version".into(),
            KUBE_VERSION.into(),
            "-f".into(),
            DEV_VALUES.into(),
        ];
        for set in sets {
            args.extend(["--set".into(), set]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&tool("helm"), &args, None).await
    };
    let sets = |s: &[&str]| s.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    let credential_volume = |out: &str| {
        let parsed = documents(out)
            .into_iter()
            .filter(|d| kind_of(d) == "Deployment")
            .map(|d| serde_saphyr::from_str::<Deployment>(&d).expect("a Deployment"))
            .find(|d| {
                d.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with("-provider-service"))
            })
            .expect("provider-service's Deployment");
        parsed
            .spec
            .template
            .spec
            .and_then(|s| s.volumes)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|v| v.secret.and_then(|s| s.secret_name))
            .collect::<Vec<_>>()
    };

    for shared in [
        sets(&["providerService.credentials.secretName=peer-pods-secret"]),
        sets(&["providerService.extraConfigSecrets={peer-pods-secret}"]),
        sets(&[
            "peerpodsConfig.secretName=cloud",
            "providerService.credentials.secretName=cloud",
        ]),
    ] {
        let (ok, _, err) = template(shared.clone()).await;
        assert!(!ok, "{shared:?} rendered one Secret for both");
        assert!(
            err.contains("would share the Secret")
                && err.contains("providerService.credentials.secretName")
                && err.contains("providerService.credentials.shareWithCAA=true"),
            "{shared:?}: {err}"
        );
        let mut accepted = shared.clone();
        accepted.push("providerService.credentials.shareWithCAA=true".into());
        let (ok, out, err) = template(accepted.clone()).await;
        assert!(ok, "{accepted:?}: {err}");
        let caa_secret = if shared[0].starts_with("peerpodsConfig") {
            "cloud"
        } else {
            "peer-pods-secret"
        };
        assert!(
            credential_volume(&out).iter().any(|s| s == caa_secret),
            "{accepted:?}: provider-service does not mount {caa_secret}"
        );
    }

    let (ok, out, err) = template(vec![]).await;
    assert!(ok, "{err}");
    let mounted = credential_volume(&out);
    assert!(
        mounted.contains(&PROVIDER_CREDENTIALS.to_owned())
            && !mounted.contains(&"peer-pods-secret".to_owned()),
        "by default provider-service mounts its own credential only: {mounted:?}"
    );
    let (ok, out, err) = template(sets(&["providerService.credentials.secretName="])).await;
    assert!(ok, "{err}");
    let mounted = credential_volume(&out);
    assert!(
        !mounted.contains(&PROVIDER_CREDENTIALS.to_owned())
            && !mounted.contains(&"peer-pods-secret".to_owned()),
        "a workload identity mounts no credential Secret: {mounted:?}"
    );
}

/// provider-service connects only to DNS and HTTPS (the API server, the cloud's endpoints): a NetworkPolicy of
/// its own limits its egress beside the one limiting who reaches it. The webhook, whether the chart's or a
/// PeerPodConfig's, is reachable only on its serving and admin ports and connects nowhere. (The local control
/// plane runs no network plugin: the policies are checked as rendered and accepted by the API server in
/// `every_rendered_object_is_valid_for_kubeconform_and_the_api_server`.)
#[tokio::test(flavor = "multi_thread")]
async fn network_policies_limit_provider_service_egress_and_the_webhook() {
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    let policies = |manifest: &str| {
        documents(manifest)
            .into_iter()
            .filter(|d| kind_of(d) == "NetworkPolicy")
            .map(|d| serde_saphyr::from_str::<NetworkPolicy>(&d).expect("a NetworkPolicy"))
            .collect::<Vec<_>>()
    };
    let manifest = render(
        "np",
        "np",
        &[DEV_VALUES, "deploy/tests/values-our-webhook.yaml"],
    )
    .await;
    let all = policies(&manifest);
    let named = |suffix: &str| {
        all.iter()
            .find(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with(suffix))
            })
            .unwrap_or_else(|| panic!("no NetworkPolicy *{suffix}"))
            .spec
            .clone()
            .expect("spec")
    };
    // provider-service's, in its own namespace; its callers (the controllers, CAA) come from the release
    // namespace, named by its kubernetes.io/metadata.name label beside their Pod labels.
    for policy in all.iter().filter(|p| {
        p.metadata
            .name
            .as_deref()
            .is_some_and(|n| n.contains("-provider-service"))
    }) {
        assert_eq!(
            policy.metadata.namespace.as_deref(),
            Some("np-provider"),
            "{:?}",
            policy.metadata.name
        );
    }
    let callers = named("-provider-service")
        .ingress
        .unwrap_or_default()
        .into_iter()
        .next()
        .and_then(|rule| rule.from)
        .unwrap_or_default();
    assert_eq!(callers.len(), 3, "peerpod-ctrl, peer-pod-config-ctrl, CAA");
    for peer in &callers {
        assert_eq!(
            peer.namespace_selector
                .as_ref()
                .and_then(|s| s.match_labels.as_ref())
                .and_then(|l| l.get("kubernetes.io/metadata.name"))
                .map(String::as_str),
            Some("np"),
            "{peer:?}"
        );
        assert!(peer.pod_selector.is_some(), "{peer:?}");
    }
    let egress = named("-provider-service-egress");
    assert_eq!(egress.policy_types, Some(vec!["Egress".to_owned()]));
    let ports: Vec<(i32, String)> = egress
        .egress
        .unwrap_or_default()
        .iter()
        .flat_map(|rule| rule.ports.clone().unwrap_or_default())
        .map(|p| match p.port {
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(n)) => {
                (n, p.protocol.unwrap_or_default())
            }
            other => panic!("port {other:?}"),
        })
        .collect();
    assert_eq!(
        ports,
        vec![
            (53, "UDP".to_owned()),
            (53, "TCP".to_owned()),
            (443, "TCP".to_owned()),
            (6443, "TCP".to_owned())
        ],
        "provider-service's egress"
    );
    for webhook in ["-peerpods-webhook", "-peer-pods-webhook"] {
        let spec = named(webhook);
        assert_eq!(
            spec.policy_types,
            Some(vec!["Ingress".to_owned(), "Egress".to_owned()]),
            "{webhook}"
        );
        assert!(
            spec.egress.unwrap_or_default().is_empty(),
            "{webhook} may connect somewhere"
        );
        assert_eq!(spec.ingress.unwrap_or_default().len(), 2, "{webhook}");
    }
    // Off, none of them.
    let (ok, out, err) = run(
        &tool("helm"),
        &[
            "template",
            "np",
            CHART,
            "--kube-version",
            KUBE_VERSION,
            "-f",
            DEV_VALUES,
            "--set",
            "networkPolicy.enabled=false",
        ],
        None,
    )
    .await;
    assert!(ok, "{err}");
    assert!(policies(&out).is_empty());
}

/// Creates namespace `name` (the chart creates provider-service's; a dry run does not).
async fn create_namespace(admin: &kube::Client, name: &str) {
    let namespace: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("Namespace");
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .unwrap_or_else(|e| panic!("namespace {name}: {e}"));
}

async fn sa_client(
    cp: &testenv::ControlPlane,
    admin: &kube::Client,
    ns: &str,
    sa: &str,
) -> (String, kube::Client) {
    // The chart must have created it: service_account_token would otherwise create it quietly.
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .get(sa)
        .await
        .unwrap_or_else(|e| panic!("ServiceAccount {ns}/{sa} from the chart: {e}"));
    let token = testenv::service_account_token(admin, ns, sa, &[]).await;
    let client = cp.client_with_token(&token).await;
    (token, client)
}

fn forbidden<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> bool {
    matches!(result, Err(kube::Error::Api(e)) if e.code == 403)
}

/// The control plane of the installed chart (with an audit log): the chart's webhook configuration is one per
/// cluster (peer-pod-config-ctrl adds its webhook to it), so a release installed beside it on the shared control
/// plane (least_privilege's) could not be.
fn installed_control_plane() -> &'static testenv::ControlPlane {
    static INSTALLED: std::sync::OnceLock<testenv::ControlPlane> = std::sync::OnceLock::new();
    INSTALLED.get_or_init(|| {
        testenv::ControlPlane::start_with(testenv::Options {
            audit: true,
            ..Default::default()
        })
        .unwrap_or_else(|e| panic!("control plane of the installed chart: {e}"))
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn installed_chart_rbac_runs_the_peerpod_cleanup_story_and_guards_the_credentials() {
    let cp = installed_control_plane();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "chart").await;
    // provider-service, its credential and its certificate: in their own namespace, which the chart creates.
    let ps_ns = provider_namespace(&ns);
    let release = ns.clone();
    let fullname = format!("{release}-peerpods");
    let work = tempfile::tempdir().expect("temp dir");

    // helm install, as a user would (no --wait: the local control plane has no kubelet to run Pods).
    let installed = {
        let _crds = CRDS.lock().await;
        let started = Instant::now();
        helm_ok(
            cp,
            &[
                "install",
                &release,
                CHART,
                "-f",
                DEV_VALUES,
                "--namespace",
                &ns,
            ],
        )
        .await;
        started.elapsed()
    };
    eprintln!("helm install took {installed:?}");
    for crd in [
        "deploy/crds/peerpods.yaml",
        "deploy/crds/peerpodconfigs.yaml",
    ] {
        testenv::apply_crds(&admin, crd).await;
    }

    // The operator's provider configuration: libvirt's test driver with one VM.
    let vm = uuid::Uuid::new_v4().to_string();
    // Two more for CAA's node-bound deletes: one whose Pod runs on CAA's node, one whose Pod runs on another.
    let (vm_here, vm_there) = (
        uuid::Uuid::new_v4().to_string(),
        uuid::Uuid::new_v4().to_string(),
    );
    let host = work.path().join("libvirt-host.xml");
    std::fs::write(
        &host,
        libvirt_host(&[vm.clone(), vm_here.clone(), vm_there.clone()]),
    )
    .expect("libvirt host file");
    // CAA's (read by peer-pod-config-ctrl in the release namespace) and provider-service's copy in its own.
    for namespace in [&ns, &ps_ns] {
        let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), namespace);
        let mut cm = ConfigMap::default();
        cm.metadata.name = Some("peer-pods-cm".into());
        cm.data = Some(BTreeMap::from([
            ("CLOUD_PROVIDER".into(), "libvirt".into()),
            ("LIBVIRT_URI".into(), format!("test://{}", host.display())),
        ]));
        config_maps
            .create(&PostParams::default(), &cm)
            .await
            .expect("peer-pods-cm");
    }
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    let ps_secrets: Api<Secret> = Api::namespaced(admin.clone(), &ps_ns);
    // A credential per job: CAA's (peer-pods-secret) and provider-service's own, in its namespace.
    for (secrets, name) in [
        (&secrets, "peer-pods-secret"),
        (&ps_secrets, PROVIDER_CREDENTIALS),
    ] {
        let mut secret = Secret::default();
        secret.metadata.name = Some(name.into());
        secret.string_data = Some(BTreeMap::from([("LIBVIRT_POOL".into(), "default".into())]));
        secrets
            .create(&PostParams::default(), &secret)
            .await
            .unwrap_or_else(|e| panic!("{name}: {e}"));
    }

    // An upgrade keeps provider-service's certificate (and so the CA every client trusts).
    let tls_secret = format!("{fullname}-provider-service-tls");
    let issued = ps_secrets.get(&tls_secret).await.expect("TLS Secret").data;
    helm_ok(
        cp,
        &[
            "upgrade",
            &release,
            CHART,
            "-f",
            DEV_VALUES,
            "--namespace",
            &ns,
        ],
    )
    .await;
    let kept = ps_secrets.get(&tls_secret).await.expect("TLS Secret").data;
    assert!(
        issued.is_some() && issued == kept,
        "helm upgrade replaced the certificate"
    );

    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    let ps_deploy = deployment_of(
        &Api::namespaced(admin.clone(), &ps_ns),
        &fullname,
        "provider-service",
    )
    .await;
    let pc_deploy = deployment_of(&deployments, &fullname, "peerpod-ctrl").await;
    let cc_deploy = deployment_of(&deployments, &fullname, "peer-pod-config-ctrl").await;
    let (_, ps_client) = sa_client(cp, &admin, &ps_ns, &service_account_of(&ps_deploy)).await;
    let (_, pc_client) = sa_client(cp, &admin, &ns, &service_account_of(&pc_deploy)).await;
    let (_, cc_client) = sa_client(cp, &admin, &ns, &service_account_of(&cc_deploy)).await;
    let (_, caa_client) = sa_client(cp, &admin, &ns, "cloud-api-adaptor").await;

    // provider-service: its volumes laid out as a kubelet would; its own token, as the RBAC check below
    // counts its requests, not the test's.
    let ProviderServiceLayout {
        env: ps_env,
        grpc_port,
        admin: ps_admin,
        token: ps_token,
    } = lay_out_provider_service(cp, &admin, &ps_ns, &ps_deploy, work.path()).await;
    let mut provider = Service::start(
        "provider-service",
        &service_binary("provider-service"),
        &ps_env,
        ps_admin,
        work.path(),
    );
    provider.wait_ready().await;

    // The controllers: chart environment, a token for the audience of the chart's projected volume, the CA
    // from the chart's Secret, and provider-service on 127.0.0.1 verified under the chart's Service name.
    let start_controller =
        async |name: &str, replica: u32, deployment: &Deployment, client_for_api: &str| {
            let pod = format!("{name}-{replica}");
            let ControllerLayout {
                env,
                admin: admin_addr,
                ..
            } = lay_out_controller(
                cp,
                &admin,
                &ns,
                deployment,
                &pod,
                client_for_api,
                grpc_port,
                work.path(),
            )
            .await;
            let mut service =
                Service::start(&pod, &service_binary(name), &env, admin_addr, work.path());
            service.wait_ready().await;
            (service, env)
        };
    let pc_api_token =
        testenv::service_account_token(&admin, &ns, &service_account_of(&pc_deploy), &[]).await;
    let (peerpod_ctrl, pc_env) =
        start_controller("peerpod-ctrl", 0, &pc_deploy, &pc_api_token).await;
    let cc_api_token =
        testenv::service_account_token(&admin, &ns, &service_account_of(&cc_deploy), &[]).await;
    let (config_ctrl, _) =
        start_controller("peer-pod-config-ctrl", 0, &cc_deploy, &cc_api_token).await;
    // Each controller's second replica gets a token of its own, so the audit log tells its requests apart.
    let pc_standby_token =
        testenv::service_account_token(&admin, &ns, &service_account_of(&pc_deploy), &[]).await;
    let cc_follower_token =
        testenv::service_account_token(&admin, &ns, &service_account_of(&cc_deploy), &[]).await;
    let pc_standby_credential = testenv::credential_id(&admin, &pc_standby_token).await;
    let cc_follower_credential = testenv::credential_id(&admin, &cc_follower_token).await;
    // The credentials our services run with, as the API server names them in its audit log.
    let mut workloads = std::collections::BTreeSet::from([
        pc_standby_credential.clone(),
        cc_follower_credential.clone(),
    ]);
    for token in [&ps_token, &pc_api_token, &cc_api_token] {
        workloads.insert(testenv::credential_id(&admin, token).await);
    }

    // Both controllers elected themselves on their Leases in the release namespace.
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    for (lease, holder) in [
        (pc_env["LEASE_NAME"].as_str(), "peerpod-ctrl-0"),
        ("peer-pod-config-ctrl", "peer-pod-config-ctrl-0"),
    ] {
        testenv::wait_for(
            &format!("Lease {lease} held by {holder}"),
            Duration::from_secs(30),
            || async {
                let l = leases.get_opt(lease).await.ok().flatten()?;
                (l.spec?.holder_identity.as_deref() == Some(holder)).then_some(())
            },
        )
        .await;
    }

    // Only a replica waiting for its Lease watches it (for the release), and a lone replica may take its
    // Lease before that watch has started: so each controller gets a second replica, a follower, and the test
    // goes on only once the audit log shows the follower's watch. The chart's Lease grants are then used in
    // every run, whatever the timing.
    // peerpod-ctrl's follower then takes over when the leader stops, through that watch, and does the work
    // below.
    let (standby, _) = start_controller("peerpod-ctrl", 1, &pc_deploy, &pc_standby_token).await;
    lease_watch_seen(cp, &pc_standby_credential, &ns, &pc_env["LEASE_NAME"]).await;
    // peer-pod-config-ctrl's follower stays one to the end, beside the leader.
    let (config_follower, _) =
        start_controller("peer-pod-config-ctrl", 1, &cc_deploy, &cc_follower_token).await;
    lease_watch_seen(cp, &cc_follower_credential, &ns, "peer-pod-config-ctrl").await;
    let mut stopped = peerpod_ctrl;
    stopped.terminate().await;
    let peerpod_ctrl = standby;
    testenv::wait_for(
        "Lease taken over by peerpod-ctrl-1",
        Duration::from_secs(60),
        || async {
            let l = leases.get_opt(&pc_env["LEASE_NAME"]).await.ok().flatten()?;
            (l.spec?.holder_identity.as_deref() == Some("peerpod-ctrl-1")).then_some(())
        },
    )
    .await;

    // Callers' views through the chart's TLS name: each chart ServiceAccount may call exactly its methods
    // (providerService.callerMethods); an account the chart does not list is refused.
    let audience = pc_env_audience(&ps_env);
    let token_of =
        async |sa: &str| testenv::service_account_token(&admin, &ns, sa, &[&audience]).await;
    // CAA's grant is node-bound (`@node`): its token is a Pod's, bound to the Pod and its node, as the kubelet
    // mounts it.
    let caa_node = format!("{ns}-caa-node");
    let other_node = format!("{ns}-other-node");
    for node in [&caa_node, &other_node] {
        create_node(&admin, node).await;
    }
    let caa_token = caa_pod_token(&admin, &ns, "cloud-api-adaptor-0", &caa_node, &audience).await;
    let peerpod_ctrl_token = token_of(&format!("{fullname}-peerpod-ctrl")).await;
    let stranger = token_of("default").await;
    let ca_file = work.path().join("peerpod-ctrl-0/mount/ca.crt");
    let server_name = format!("{fullname}-provider-service.{ps_ns}.svc");
    let caller = |token: &str| {
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let token_file = work.path().join(format!("caller-token-{call}"));
        std::fs::write(&token_file, token).expect("token file");
        provider_client(grpc_port, &ca_file, &server_name, &token_file)
    };
    let list_vms = async |token: &str| {
        caller(token)
            .list_instances(ListInstancesRequest {
                cloud_provider: "libvirt".into(),
                tag_selector: Default::default(),
            })
            .await
            .map(|r| {
                r.into_inner()
                    .instances
                    .into_iter()
                    .map(|i| i.instance_id)
                    .collect::<Vec<_>>()
            })
    };
    let reason = |status: &tonic::Status| {
        use tonic_types::StatusExt;
        status.get_details_error_info().map(|i| i.reason)
    };
    // CAA asks for capacity, but lists nothing.
    caller(&caa_token)
        .get_capacity(GetCapacityRequest {
            cloud_provider: "libvirt".into(),
        })
        .await
        .expect("CAA asks for capacity");
    let refused = list_vms(&caa_token)
        .await
        .expect_err("CAA may not list instances");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused).as_deref(), Some("MethodNotAllowed"));
    // peerpod-ctrl lists (orphan scan).
    let vms = list_vms(&peerpod_ctrl_token)
        .await
        .expect("peerpod-ctrl lists VMs");
    assert!(vms.contains(&vm), "VM {vm} in {vms:?}");
    let refused = list_vms(&stranger)
        .await
        .expect_err("default ServiceAccount must be refused");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused).as_deref(), Some("CallerNotAllowed"));

    // CAA deletes only what runs on its node: provider-service finds the PeerPod naming the VM (a list by
    // spec.instanceID) and gets its Pod (the chart's peerpods list and pods get).
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let peerpods_as_caa =
        Api::<DynamicObject>::namespaced_with(caa_client.clone(), &ns, &peerpod_resource());
    for (pod, node, vm) in [
        ("here", &caa_node, &vm_here),
        ("there", &other_node, &vm_there),
    ] {
        let pod = pod_on(&pods, pod, node, "default").await;
        let name = format!(
            "{}-resource-ddddd",
            pod.metadata.name.clone().expect("name")
        );
        peerpods_as_caa
            .create(&PostParams::default(), &peerpod_of(&pod, &name, vm))
            .await
            .expect("CAA creates the PeerPod");
    }
    let caa_delete = async |vm: &str| {
        caller(&caa_token)
            .delete_instance(peerpods_proto::v1::DeleteInstanceRequest {
                cloud_provider: "libvirt".into(),
                instance_id: vm.to_owned(),
                requester: None,
                accept_in_progress: false,
            })
            .await
    };
    let deleted = caa_delete(&vm_here)
        .await
        .expect("CAA deletes the VM of a Pod on its node")
        .into_inner();
    assert_eq!(deleted.result(), peerpods_proto::v1::DeleteResult::Deleted);
    let refused = caa_delete(&vm_there)
        .await
        .expect_err("CAA may not delete the VM of a Pod on another node");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused).as_deref(), Some("NotOnCallersNode"));
    let vms = list_vms(&peerpod_ctrl_token)
        .await
        .expect("peerpod-ctrl lists VMs");
    assert!(
        !vms.contains(&vm_here) && vms.contains(&vm_there),
        "{vm_here} deleted, {vm_there} kept: {vms:?}"
    );
    // Their Pods end (at once: no kubelet confirms a scheduled Pod's end here): peerpod-ctrl cleans both
    // PeerPods up (one VM already gone, the other deleted now).
    for pod in ["here", "there"] {
        pods.delete(pod, &DeleteParams::background().grace_period(0))
            .await
            .expect("delete Pod");
    }
    let peerpods_of_caa =
        Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &peerpod_resource());
    for name in ["here-resource-ddddd", "there-resource-ddddd"] {
        wait_gone(
            &format!("PeerPod {name} cleaned up"),
            &peerpods_of_caa,
            name,
            Duration::from_secs(60),
        )
        .await;
    }

    // The PeerPod cleanup story: CAA (as its chart ServiceAccount) records the VM in a PeerPod owned by the
    // Pod; the Pod is deleted; the garbage collector deletes the PeerPod; peerpod-ctrl deletes the VM through
    // provider-service and releases the finalizer.
    let pod = workload_pod(&pods, "workload").await;
    let resource = peerpod_resource();
    let peerpod: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPod",
        "metadata": {
            "name": "workload-resource-x7k2p",
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": "workload",
                                 "uid": pod.metadata.uid, "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["peer.pod/finalizer"]
        },
        "spec": {"cloudProvider": "libvirt", "instanceID": vm},
        "status": {}
    }))
    .expect("PeerPod");
    Api::<DynamicObject>::namespaced_with(caa_client.clone(), &ns, &resource)
        .create(&PostParams::default(), &peerpod)
        .await
        .expect("cloud-api-adaptor creates the PeerPod");
    pods.delete("workload", &DeleteParams::background())
        .await
        .expect("delete Pod");
    let peerpods: Api<DynamicObject> = Api::namespaced_with(admin.clone(), &ns, &resource);
    wait_gone(
        "PeerPod gone (VM deleted, finalizer released)",
        &peerpods,
        "workload-resource-x7k2p",
        Duration::from_secs(60),
    )
    .await;
    let vms = list_vms(&peerpod_ctrl_token)
        .await
        .expect("peerpod-ctrl lists VMs");
    assert!(!vms.contains(&vm), "VM {vm} still there: {vms:?}");

    // peer-pod-config-ctrl with the chart's RBAC: a PeerPodConfig gets its CAA DaemonSet, which runs as the
    // chart's CAA ServiceAccount, and the webhook serving certificate.
    let ppc_gvk = GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPodConfig");
    let ppc_resource = ApiResource::from_gvk_with_plural(&ppc_gvk, "peerpodconfigs");
    let config: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPodConfig",
        "metadata": {"name": "peerpodconfig"},
        "spec": {"limit": "4", "nodeSelector": {"node.kubernetes.io/worker": ""}}
    }))
    .expect("PeerPodConfig");
    Api::<DynamicObject>::namespaced_with(admin.clone(), &ns, &ppc_resource)
        .create(&PostParams::default(), &config)
        .await
        .expect("create PeerPodConfig");
    let daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), &ns);
    let daemonset = testenv::wait_for("CAA DaemonSet", Duration::from_secs(60), || async {
        daemonsets
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .next()
    })
    .await;
    let caa_pod = daemonset.spec.template.spec.clone().expect("CAA pod spec");
    assert_eq!(
        caa_pod.service_account_name.as_deref(),
        Some("cloud-api-adaptor")
    );

    // CAA is wired to provider-service out of the box: endpoint, CA and a projected token in its environment.
    // Laid out as the kubelet would (the token minted for the DaemonSet's ServiceAccount and audience, ca.crt
    // from the projected Secret), CAA's settings reach provider-service and may ask what CAA asks.
    let caa_env: BTreeMap<String, String> = caa_pod.containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect();
    let endpoint = &caa_env["PROVIDER_SERVICE_ENDPOINT"];
    // The chart's Service port; the test's provider-service listens on a free loopback port instead.
    assert_eq!(endpoint, &format!("https://{server_name}:50051"));
    let projected = caa_pod
        .volumes
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|v| v.name == "provider-service")
        .and_then(|v| v.projected)
        .and_then(|p| p.sources)
        .expect("CAA's provider-service volume");
    let audience_of_caa = projected
        .iter()
        .find_map(|s| s.service_account_token.as_ref()?.audience.clone())
        .expect("projected token");
    let ca_secret = projected
        .iter()
        .find_map(|s| s.secret.as_ref().map(|s| s.name.clone()))
        .expect("projected CA");
    let mount = work.path().join("caa");
    std::fs::create_dir_all(&mount).expect("CAA mount");
    let caa_projected_token = caa_pod_token(
        &admin,
        &ns,
        "cloud-api-adaptor-1",
        &caa_node,
        &audience_of_caa,
    )
    .await;
    std::fs::write(mount.join("token"), caa_projected_token).expect("token");
    let ca = secrets
        .get(&ca_secret)
        .await
        .expect("CA Secret")
        .data
        .expect("data");
    std::fs::write(mount.join("ca.crt"), &ca["ca.crt"].0).expect("ca.crt");
    for (key, file) in [
        ("PROVIDER_SERVICE_TOKEN_FILE", "token"),
        ("PROVIDER_SERVICE_CA_FILE", "ca.crt"),
    ] {
        assert!(
            caa_env[key].ends_with(&format!("/{file}")),
            "{key}={}",
            caa_env[key]
        );
    }
    // The Service name resolves in a cluster; here provider-service listens on loopback.
    let mut caa = provider_client(
        grpc_port,
        &mount.join("ca.crt"),
        &server_name,
        &mount.join("token"),
    );
    caa.get_capacity(GetCapacityRequest {
        cloud_provider: "libvirt".into(),
    })
    .await
    .expect("CAA asks for capacity with its wiring");
    let gone = caa
        .delete_instance(peerpods_proto::v1::DeleteInstanceRequest {
            cloud_provider: "libvirt".into(),
            instance_id: uuid::Uuid::new_v4().to_string(),
            requester: None,
            accept_in_progress: false,
        })
        .await
        .expect("CAA deletes with its wiring")
        .into_inner();
    assert_eq!(gone.result(), peerpods_proto::v1::DeleteResult::AlreadyGone);
    testenv::wait_for(
        "webhook serving certificate",
        Duration::from_secs(60),
        || async { secrets.get_opt("webhook-server-cert").await.ok().flatten() },
    )
    .await;
    capacity_story(&admin, &ns, &ppc_resource).await;

    // CAA recorded a second PeerPod for the same Pod (a retried sandbox): peerpod-ctrl deletes the older one,
    // and cleans it up like any other.
    let retried = workload_pod(&pods, "retried").await;
    let older = peerpod_of(
        &retried,
        "retried-resource-aaaaa",
        &uuid::Uuid::new_v4().to_string(),
    );
    peerpods_as_caa
        .create(&PostParams::default(), &older)
        .await
        .expect("CAA creates the first PeerPod");
    // Creation times have whole seconds: make the second one visibly newer.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let newer = peerpod_of(
        &retried,
        "retried-resource-bbbbb",
        &uuid::Uuid::new_v4().to_string(),
    );
    peerpods_as_caa
        .create(&PostParams::default(), &newer)
        .await
        .expect("CAA creates the second PeerPod");
    wait_gone(
        "the older PeerPod of the Pod deleted and cleaned up",
        &peerpods,
        "retried-resource-aaaaa",
        Duration::from_secs(60),
    )
    .await;
    assert!(
        exists(&peerpods, "retried-resource-bbbbb").await,
        "the newer PeerPod stays"
    );

    // provider-service is down while a PeerPod waits for cleanup: peerpod-ctrl records why in the PeerPod's
    // status and in a Warning Event, which repeats (one Event with a count) while it retries; once
    // provider-service is back the cleanup completes.
    let flaky = workload_pod(&pods, "flaky").await;
    peerpods_as_caa
        .create(
            &PostParams::default(),
            &peerpod_of(
                &flaky,
                "flaky-resource-ccccc",
                &uuid::Uuid::new_v4().to_string(),
            ),
        )
        .await
        .expect("CAA creates the PeerPod");
    provider.terminate().await;
    pods.delete("flaky", &DeleteParams::background())
        .await
        .expect("delete Pod");
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), &ns);
    testenv::wait_for_event(
        "a repeated Warning Event about the PeerPod's cleanup",
        &events,
        Duration::from_secs(60),
        |e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("flaky-resource-ccccc")
                && e.type_.as_deref() == Some("Warning")
                && e.series.as_ref().is_some_and(|s| s.count >= 2)
        },
    )
    .await;
    let waiting = peerpods
        .get("flaky-resource-ccccc")
        .await
        .expect("the PeerPod waits for its cleanup");
    let conditions = waiting.data["status"]["conditions"].as_array().cloned();
    assert!(
        conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c["status"] == "False"),
        "the failure is in the status: {}",
        waiting.data["status"]
    );
    let mut provider = Service::start(
        "provider-service-again",
        &service_binary("provider-service"),
        &ps_env,
        ps_admin,
        work.path(),
    );
    provider.wait_ready().await;
    pods.delete("retried", &DeleteParams::background())
        .await
        .expect("delete Pod");
    for name in ["flaky-resource-ccccc", "retried-resource-bbbbb"] {
        wait_gone(
            &format!("PeerPod {name} cleaned up"),
            &peerpods,
            name,
            Duration::from_secs(120),
        )
        .await;
    }

    // Not too much: nobody reads the cloud credentials through the API; provider-service gets them mounted.
    let credentials = |c: &kube::Client| Api::<Secret>::namespaced(c.clone(), &ns);
    let ps_credentials = |c: &kube::Client| Api::<Secret>::namespaced(c.clone(), &ps_ns);
    assert!(
        forbidden(credentials(&ps_client).get("peer-pods-secret").await),
        "provider-service read peer-pods-secret through the API"
    );
    assert!(
        forbidden(credentials(&pc_client).get("peer-pods-secret").await),
        "peerpod-ctrl read peer-pods-secret"
    );
    assert!(
        forbidden(credentials(&cc_client).get("peer-pods-secret").await),
        "peer-pod-config-ctrl read peer-pods-secret"
    );
    assert!(
        forbidden(credentials(&caa_client).get("peer-pods-secret").await),
        "cloud-api-adaptor read peer-pods-secret"
    );
    for client in [&ps_client, &pc_client, &cc_client, &caa_client] {
        assert!(
            forbidden(ps_credentials(client).get(PROVIDER_CREDENTIALS).await),
            "provider-service's credential read through the API"
        );
    }
    assert!(
        forbidden(credentials(&pc_client).list(&ListParams::default()).await),
        "peerpod-ctrl listed Secrets"
    );
    assert!(
        forbidden(credentials(&cc_client).list(&ListParams::default()).await),
        "peer-pod-config-ctrl listed Secrets"
    );
    for secrets in [credentials(&ps_client), ps_credentials(&ps_client)] {
        assert!(
            forbidden(secrets.list(&ListParams::default()).await),
            "provider-service listed Secrets"
        );
    }
    assert!(
        forbidden(
            ps_credentials(&ps_client)
                .get(&secret_of(&ps_deploy, "tls"))
                .await
        ),
        "provider-service read its serving certificate through the API"
    );
    assert!(
        forbidden(
            Api::<Pod>::namespaced(pc_client.clone(), &ns)
                .get("any")
                .await
        ),
        "peerpod-ctrl read a Pod by name (it only lists them, metadata only, for adoption)"
    );
    // CAA's ConfigMap is watched by name (developer mode): no other ConfigMap, and no list of them all.
    let pc_config_maps = Api::<ConfigMap>::namespaced(pc_client.clone(), &ns);
    assert!(
        forbidden(pc_config_maps.get("kube-root-ca.crt").await),
        "peerpod-ctrl read a ConfigMap other than CAA's"
    );
    assert!(
        forbidden(pc_config_maps.list(&ListParams::default()).await),
        "peerpod-ctrl listed every ConfigMap of CAA's namespace"
    );

    // Enough, everywhere: no request of the controllers was refused along the way (a refused watch only
    // shows in the log).
    for service in [
        &stopped,
        &peerpod_ctrl,
        &config_ctrl,
        &config_follower,
        &provider,
    ] {
        let log = service.log_text();
        assert!(
            !log.to_lowercase().contains("forbidden"),
            "{} was refused something:\n{log}",
            service.name
        );
    }
    drop((
        stopped,
        peerpod_ctrl,
        config_ctrl,
        config_follower,
        provider,
    ));

    // No more than needed: every permission the installed chart grants was used by one of our services along
    // the way (the requests the API server allowed to the tokens they ran with, from its audit log).
    let uses = rbac::uses(&cp.audit_events().expect("audit log"), &workloads);
    let grants = rbac::grants(&rbac_of(&render(&release, &ns, &[DEV_VALUES]).await));
    let unused: Vec<String> = rbac::unused(&grants, &uses)
        .into_iter()
        .filter(|g| !unseen(g))
        .map(ToString::to_string)
        .collect();
    assert!(
        unused.is_empty(),
        "the chart grants permissions none of our services used; remove them, or add a scenario whose code \
         path needs them:\n  {}",
        unused.join("\n  ")
    );
    crate::uninstall::uninstall_uncounted(cp, &release, &ns).await;
}

/// Waits until the API server's audit log shows an allowed watch on the Lease `lease` in `ns`, made with
/// `credential` (as [`testenv::credential_id`] names it).
async fn lease_watch_seen(cp: &testenv::ControlPlane, credential: &str, ns: &str, lease: &str) {
    testenv::wait_for(
        &format!("a watch on Lease {ns}/{lease} by the follower ({credential}) in the audit log"),
        Duration::from_secs(60),
        || async {
            let events = cp.audit_events().ok()?;
            events
                .iter()
                .any(|e| {
                    e.verb == "watch"
                        && e.allowed()
                        && e.credential_id() == Some(credential)
                        && e.object_ref.as_ref().is_some_and(|o| {
                            o.api_group == "coordination.k8s.io"
                                && o.resource == "leases"
                                && o.namespace == ns
                                && o.name == lease
                        })
                })
                .then_some(())
        },
    )
    .await;
}

/// Node `name`, as a joining kubelet registers it (no kubelet here: the API server's view is what counts).
async fn create_node(admin: &kube::Client, name: &str) {
    let node: k8s_openapi::api::core::v1::Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).expect("Node");
    Api::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("Node {name}: {e}"));
}

/// Pod `name` of ServiceAccount `sa`, scheduled to `node`.
async fn pod_on(pods: &Api<Pod>, name: &str, node: &str, sa: &str) -> Pod {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"nodeName": node, "serviceAccountName": sa, "automountServiceAccountToken": false,
                 "containers": [{"name": "app", "image": "registry.example/app"}]}
    }))
    .expect("Pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("Pod {name}: {e}"))
}

/// The projected token (for `audience`) of a CAA Pod `pod` on `node`, as the kubelet mounts it: the API server
/// binds it to the Pod and so to the Pod's node.
async fn caa_pod_token(
    admin: &kube::Client,
    ns: &str,
    pod: &str,
    node: &str,
    audience: &str,
) -> String {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    let pod = pod_on(
        &Api::namespaced(admin.clone(), ns),
        pod,
        node,
        "cloud-api-adaptor",
    )
    .await;
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![audience.to_owned()]),
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request("cloud-api-adaptor", &PostParams::default(), &request)
        .await
        .expect("CAA's Pod token")
        .status
        .and_then(|s| s.token)
        .expect("token")
}

/// A PeerPod as cloud-api-adaptor records a VM: owned by the Pod, with its finalizer.
fn peerpod_of(pod: &Pod, name: &str, vm: &str) -> DynamicObject {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "confidentialcontainers.org/v1alpha1",
        "kind": "PeerPod",
        "metadata": {
            "name": name,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.metadata.name,
                                 "uid": pod.metadata.uid, "controller": true, "blockOwnerDeletion": true}],
            "finalizers": ["peer.pod/finalizer"]
        },
        "spec": {"cloudProvider": "libvirt", "instanceID": vm},
        "status": {}
    }))
    .expect("PeerPod")
}

/// peer-pod-config-ctrl's node story for the PeerPodConfig `peerpodconfig` in `ns`: a worker node joins and
/// gets its share of the limit; a new limit is advertised again (the same Event, counted); deleting the
/// PeerPodConfig takes the capacity back and removes the webhook configuration before the finalizer goes.
async fn capacity_story(admin: &kube::Client, ns: &str, ppc_resource: &ApiResource) {
    use k8s_openapi::api::core::v1::Node;
    let nodes: Api<Node> = Api::all(admin.clone());
    let node_name = format!("{ns}-worker");
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": {"name": node_name, "labels": {"node.kubernetes.io/worker": ""}}
    }))
    .expect("Node");
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create Node");
    let capacity = async |what: &str, want: fn(Option<&str>) -> bool| {
        testenv::wait_for(what, Duration::from_secs(60), || async {
            let node = nodes.get(&node_name).await.ok()?;
            let value = node
                .status
                .and_then(|s| s.capacity)
                .and_then(|mut c| c.remove("kata.peerpods.io/vm"))
                .map(|q| q.0);
            want(value.as_deref()).then_some(())
        })
        .await
    };
    capacity("the worker advertises peer-pod VMs", |v| v.is_some()).await;
    // The webhook went into the webhook configuration the chart created (peer-pod-config-ctrl may only patch
    // it), which keeps Helm's labels.
    let webhooks: Api<k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration> =
        Api::all(admin.clone());
    let configuration = testenv::wait_for(
        "the webhook in the chart's webhook configuration",
        Duration::from_secs(60),
        || async {
            let c = webhooks
                .get_opt(WEBHOOK_CONFIGURATION)
                .await
                .ok()
                .flatten()?;
            let ours = c.webhooks.as_ref()?.iter().any(|w| {
                w.client_config
                    .service
                    .as_ref()
                    .is_some_and(|s| s.namespace == ns)
            });
            ours.then_some(c)
        },
    )
    .await;
    let labels = configuration.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels
            .get("app.kubernetes.io/managed-by")
            .map(String::as_str),
        Some("Helm"),
        "Helm's label taken over: {labels:?}"
    );
    let configs = Api::<DynamicObject>::namespaced_with(admin.clone(), ns, ppc_resource);
    configs
        .patch(
            "peerpodconfig",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(serde_json::json!({"spec": {"limit": "1"}})),
        )
        .await
        .expect("change the limit");
    capacity("the worker advertises the new limit", |v| v == Some("1")).await;
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(admin.clone(), ns);
    testenv::wait_for_event(
        "one CapacityChanged Event, counted twice",
        &events,
        Duration::from_secs(30),
        |e| {
            e.reason.as_deref() == Some("CapacityChanged")
                && e.series.as_ref().is_some_and(|s| s.count >= 2)
        },
    )
    .await;
    configs
        .delete("peerpodconfig", &DeleteParams::default())
        .await
        .expect("delete PeerPodConfig");
    wait_gone(
        "the PeerPodConfig cleaned up and gone",
        &configs,
        "peerpodconfig",
        Duration::from_secs(60),
    )
    .await;
    capacity("no peer-pod VMs advertised any more", |v| {
        v.is_none_or(|v| v == "0")
    })
    .await;
    // The configuration is the chart's: it stays (Helm deletes it on uninstall), without the webhook.
    let left = webhooks
        .get(WEBHOOK_CONFIGURATION)
        .await
        .expect("the chart's webhook configuration stays");
    assert_eq!(left.metadata.uid, configuration.metadata.uid);
    assert!(
        left.webhooks.clone().unwrap_or_default().is_empty(),
        "the webhook was left in the configuration: {:?}",
        left.webhooks
    );
    nodes
        .delete(&node_name, &DeleteParams::default())
        .await
        .expect("delete Node");
}

/// Grants no audit event can show, each with the code path that needs it (ServiceAccount name or its suffix
/// after the release's full name, verb, API group, resource):
/// - cloud-api-adaptor is not in this repository, so no scenario here runs it. Upstream
///   (confidential-containers/cloud-api-adaptor, in the DaemonSet peer-pod-config-ctrl creates) it uses, under
///   the chart's `cloud-api-adaptor` ServiceAccount: `k8sops.PeerPodService.OwnPeerPod` (get its Pod, create
///   the PeerPod the Pod owns), `k8sops.PeerPodService.ReleasePeerPod` (get its Pod, patch the PeerPod's
///   finalizer away once the VM is gone) and `AdvertiseExtendedResources` (get its node, patch the node and its
///   status with the peer-pod VM capacity). Its PeerPod's owner reference to the Pod sets `blockOwnerDeletion`,
///   which the OwnerReferencesPermissionEnforcement admission plugin checks against `update` on `pods/finalizers`
///   inside admission (no audit event of its own): `owner_references.rs` shows the grant needed with that plugin on.
/// - peer-pod-config-ctrl's owned objects carry `blockOwnerDeletion` (`objects/mod.rs`, `controller_owner_ref`).
///   Clusters with the OwnerReferencesPermissionEnforcement admission plugin (OpenShift) then check `update` on
///   `peerpodconfigs/finalizers`; that check runs inside admission and writes no audit event of its own, and
///   this test's control plane runs without that plugin.
/// - With `metrics.secure` each service (and the webhook peer-pod-config-ctrl renders, always) reviews a scrape
///   of its metrics port (TokenReview, SubjectAccessReview; `peerpods_runtime::secure_metrics::Reviewer::check`);
///   no Prometheus scrapes here. Checked against the real API server in `runtime/tests/it/secure_metrics.rs` and
///   `webhook/tests/it/per_peer.rs` and, scraped by a real Prometheus, in `prometheus.rs`.
/// - peerpod-ctrl lists Pods (metadata only) when an orphan scan finds an untracked VM named the way
///   cloud-api-adaptor names a pod VM (`orphans::Scanner::live_pods`); no VM here carries such a name. Checked
///   against the real API server in `peerpod-ctrl/tests/it/adopt.rs`.
/// - peer-pod-config-ctrl creates its DeviceClass and the pool's ResourceSlices only with a PeerPodConfig in
///   `capacityMode: dra` (docs/capacity.md), and then writes (and removes) the kubelet plugin DaemonSet
///   `peerpods-dra-plugin`; the story here runs node mode. Checked with the controller's own token in
///   `least_privilege.rs` (`peer_pod_config_ctrl_changes_only_its_own_dra_objects_and_only_reads_claims`) and
///   against the real API server in `peer-pod-config-ctrl/tests/it/dra.rs` ([`unseen_dra`]).
const UNSEEN_GRANTS: [(&str, &str, &str, &str); 16] = [
    (
        "cloud-api-adaptor",
        "create",
        "confidentialcontainers.org",
        "peerpods",
    ),
    (
        "cloud-api-adaptor",
        "patch",
        "confidentialcontainers.org",
        "peerpods",
    ),
    ("cloud-api-adaptor", "get", "", "pods"),
    ("cloud-api-adaptor", "get", "", "nodes"),
    ("cloud-api-adaptor", "patch", "", "nodes"),
    ("cloud-api-adaptor", "patch", "", "nodes/status"),
    ("cloud-api-adaptor", "update", "", "pods/finalizers"),
    (
        "peer-pod-config-ctrl",
        "update",
        "confidentialcontainers.org",
        "peerpodconfigs/finalizers",
    ),
    (
        "peerpod-ctrl",
        "create",
        "authentication.k8s.io",
        "tokenreviews",
    ),
    (
        "peer-pod-config-ctrl",
        "create",
        "authentication.k8s.io",
        "tokenreviews",
    ),
    (
        "provider-service",
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
    ),
    (
        "peerpod-ctrl",
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
    ),
    ("peerpod-ctrl", "list", "", "pods"),
    (
        "peer-pod-config-ctrl",
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
    ),
    // The webhook peer-pod-config-ctrl renders serves its metrics so whatever metrics.secure says.
    (
        "peer-pods-webhook",
        "create",
        "authentication.k8s.io",
        "tokenreviews",
    ),
    (
        "peer-pods-webhook",
        "create",
        "authorization.k8s.io",
        "subjectaccessreviews",
    ),
];

/// peer-pod-config-ctrl's writes of capacityMode dra (see [`UNSEEN_GRANTS`]): its DeviceClass and slices, and
/// of the DaemonSets only the plugin's (CAA's is written here).
fn unseen_dra(grant: &rbac::Grant) -> bool {
    grant.user.ends_with("-peer-pod-config-ctrl")
        && matches!(grant.verb.as_str(), "create" | "patch" | "delete")
        && ((grant.api_group == "resource.k8s.io"
            && matches!(grant.resource.as_str(), "deviceclasses" | "resourceslices"))
            || (grant.api_group == "apps"
                && grant.resource == "daemonsets"
                && grant.name.as_deref() == Some("peerpods-dra-plugin")))
}

fn unseen(grant: &rbac::Grant) -> bool {
    if unseen_dra(grant) {
        return true;
    }
    let account = grant.user.rsplit(':').next().unwrap_or_default();
    UNSEEN_GRANTS.iter().any(|(sa, verb, group, resource)| {
        (account == *sa || account.ends_with(&format!("-{sa}")))
            && grant.verb == *verb
            && grant.api_group == *group
            && grant.resource == *resource
    })
}

/// The audience provider-service checks (from its chart environment).
fn pc_env_audience(ps_env: &BTreeMap<String, String>) -> String {
    ps_env.get("AUDIENCE").cloned().expect("AUDIENCE")
}

/// provider-service drains its deletes on SIGTERM (provider-service/README.md, "Deadlines"): the kubelet's grace
/// period must cover the SHUTDOWN_GRACE it is told and a moment to exit, and SHUTDOWN_GRACE the
/// longest a detached delete runs (330 s: Azure's 300 s wait and its last calls), or SIGKILL cuts deletes off.
#[tokio::test(flavor = "multi_thread")]
async fn provider_service_gets_the_time_to_finish_its_deletes_on_shutdown() {
    let manifest = render("peerpods", "drain", &[DEV_VALUES]).await;
    let deployment: Deployment = documents(&manifest)
        .iter()
        .filter(|d| kind_of(d) == "Deployment")
        .map(|d| serde_saphyr::from_str::<Deployment>(d).expect("a Deployment"))
        .find(|d| {
            d.metadata
                .name
                .as_deref()
                .is_some_and(|n| n.ends_with("provider-service"))
        })
        .expect("the provider-service Deployment");
    let pod = deployment.spec.template.spec.expect("pod spec");
    let container = &pod.containers[0];
    let grace = container
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "SHUTDOWN_GRACE")
        .and_then(|e| e.value.as_deref())
        .map(|v| peerpods_runtime::args::duration(v).expect("a duration"))
        .expect("SHUTDOWN_GRACE");
    let kubelet_grace = pod
        .termination_grace_period_seconds
        .expect("terminationGracePeriodSeconds");
    assert!(grace >= Duration::from_secs(330), "{grace:?}");
    assert!(
        kubelet_grace >= grace.as_secs() as i64 + 10,
        "terminationGracePeriodSeconds {kubelet_grace} < SHUTDOWN_GRACE {grace:?} + 10 s"
    );
}

/// peer-pod-config-ctrl's drain on SIGTERM (`SHUTDOWN_GRACE` in peer-pod-config-ctrl/src/controller.rs).
const PEER_POD_CONFIG_CTRL_DRAIN: Duration = Duration::from_secs(5);

/// The controllers drain their reconciles on SIGTERM (peerpod-ctrl for the runtime's DRAIN_GRACE, peer-pod-config-ctrl
/// for its own), and a reconcile may be waiting for a provider-service answer, which comes within provider-service's
/// answer window (DELETE_ANSWER_WITHIN): the kubelet's grace period must cover both, or SIGKILL cuts a cleanup off
/// between the cloud's answer and the finalizer's release.
#[tokio::test(flavor = "multi_thread")]
async fn the_controllers_get_their_drain_and_provider_services_answer_window_on_shutdown() {
    let manifest = render("peerpods", "drain", &[DEV_VALUES]).await;
    let deployments: Vec<Deployment> = documents(&manifest)
        .iter()
        .filter(|d| kind_of(d) == "Deployment")
        .map(|d| serde_saphyr::from_str::<Deployment>(d).expect("a Deployment"))
        .collect();
    let pod_of = |suffix: &str| {
        deployments
            .iter()
            .find(|d| {
                d.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.ends_with(suffix))
            })
            .and_then(|d| d.spec.template.spec.clone())
            .unwrap_or_else(|| panic!("the {suffix} Deployment"))
    };
    let provider_service = pod_of("provider-service");
    let answer_window = provider_service.containers[0]
        .env
        .iter()
        .flatten()
        .find(|e| e.name == "DELETE_ANSWER_WITHIN")
        .and_then(|e| e.value.as_deref())
        .map(|v| peerpods_runtime::args::duration(v).expect("a duration"))
        .expect("DELETE_ANSWER_WITHIN");
    assert!(
        answer_window >= Duration::from_secs(20),
        "{answer_window:?}"
    );
    for (controller, drain) in [
        ("peerpod-ctrl", peerpods_runtime::leader::DRAIN_GRACE),
        ("peer-pod-config-ctrl", PEER_POD_CONFIG_CTRL_DRAIN),
    ] {
        let kubelet_grace = pod_of(controller)
            .termination_grace_period_seconds
            .expect("terminationGracePeriodSeconds");
        let needed = (drain + answer_window).as_secs() as i64;
        assert!(
            kubelet_grace >= needed,
            "{controller}: terminationGracePeriodSeconds {kubelet_grace} < its drain {drain:?} + provider-service's \
             answer window {answer_window:?}"
        );
    }
}

/// The API server's answer to a review `body` POSTed to `path` as `client`: its status and the uids of the
/// FlowSchema and the priority level API Priority and Fairness classified it under (its response headers).
async fn review_classified(
    client: &kube::Client,
    path: &str,
    body: serde_json::Value,
) -> (http::StatusCode, Option<String>, Option<String>) {
    let request = http::Request::post(path)
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(kube::client::Body::from(
            serde_json::to_vec(&body).expect("JSON"),
        ))
        .expect("request");
    let response = client.send(request).await.expect("the API server answers");
    let header = |name: &str| {
        response
            .headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
    };
    (
        response.status(),
        header("X-Kubernetes-PF-FlowSchema-UID"),
        header("X-Kubernetes-PF-PriorityLevel-UID"),
    )
}

/// provider-service's TokenReviews (and its metrics' SubjectAccessReviews) run at a priority level of their own:
/// the installed chart's FlowSchema matches provider-service's ServiceAccount, and the API server says so in its
/// answer to each review (API Priority and Fairness names the FlowSchema and priority level it chose). Another
/// ServiceAccount's review is not classified there.
#[tokio::test(flavor = "multi_thread")]
async fn provider_services_reviews_run_at_a_priority_level_of_their_own() {
    use k8s_openapi::api::flowcontrol::v1::{FlowSchema, PriorityLevelConfiguration};
    let cp = control_plane();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "chart-apf").await;
    let release = ns.clone();
    {
        let _crds = CRDS.lock().await;
        helm_ok(
            cp,
            &[
                "install",
                &release,
                CHART,
                "-f",
                DEV_VALUES,
                "--namespace",
                &ns,
            ],
        )
        .await;
    }
    let name = format!("{release}-peerpods-provider-service-reviews");
    let schema = Api::<FlowSchema>::all(admin.clone())
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("FlowSchema {name} from the chart: {e}"));
    let level = Api::<PriorityLevelConfiguration>::all(admin.clone())
        .get(&name)
        .await
        .unwrap_or_else(|e| panic!("PriorityLevelConfiguration {name} from the chart: {e}"));
    // provider-service's ServiceAccount as its Deployment names it, wherever the chart puts it.
    let deployment = Api::<Deployment>::all(admin.clone())
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={release},app.kubernetes.io/component=provider-service"
        )))
        .await
        .expect("Deployments")
        .items
        .into_iter()
        .next()
        .expect("provider-service's Deployment");
    let ps_ns = deployment.metadata.namespace.clone().expect("namespace");
    let ps_sa = service_account_of(&deployment);
    let (_, provider_service) = sa_client(cp, &admin, &ps_ns, &ps_sa).await;
    let token_review = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenReview",
        "spec": {"token": "not-a-token"}
    });
    let access_review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {"user": "prometheus", "nonResourceAttributes": {"path": "/metrics", "verb": "get"}}
    });
    let ours = (
        http::StatusCode::CREATED,
        schema.metadata.uid.clone(),
        level.metadata.uid.clone(),
    );
    assert_eq!(
        review_classified(
            &provider_service,
            "/apis/authentication.k8s.io/v1/tokenreviews",
            token_review.clone()
        )
        .await,
        ours,
        "provider-service's TokenReview"
    );
    assert_eq!(
        review_classified(
            &provider_service,
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            access_review
        )
        .await,
        ours,
        "provider-service's SubjectAccessReview (secure metrics)"
    );
    // Another ServiceAccount's review goes elsewhere.
    let (_, peerpod_ctrl) =
        sa_client(cp, &admin, &ns, &format!("{release}-peerpods-peerpod-ctrl")).await;
    let (_, other_schema, other_level) = review_classified(
        &peerpod_ctrl,
        "/apis/authentication.k8s.io/v1/tokenreviews",
        token_review,
    )
    .await;
    assert!(other_schema.is_some(), "API Priority and Fairness is on");
    assert_ne!(
        other_schema, schema.metadata.uid,
        "peerpod-ctrl's TokenReview"
    );
    assert_ne!(
        other_level, level.metadata.uid,
        "peerpod-ctrl's TokenReview"
    );

    crate::uninstall::uninstall_uncounted(cp, &release, &ns).await;
}
