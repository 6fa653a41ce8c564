//! The chart's own webhook (`webhook.enabled=true`, the "ours" choice of docs/alongside-caa.md) on the local control
//! plane: installed with the alongside-caa example, the API server calls peerpods-webhook through the
//! MutatingWebhookConfiguration the chart rendered and trusts it by that configuration's caBundle, the CA Helm
//! issued into the chart's TLS Secret (no cert-manager). A kata-remote Pod is stored mutated, a pod of no peer
//! runtime class is never sent (and so is admitted while the webhook is down), and `helm upgrade` keeps the
//! certificate and the bundle.
//!
//! There is no kubelet: peerpods-webhook runs here as the Deployment would run it (its environment, the Secret's
//! `tls.crt` and `tls.key` in its certificate directory), on 127.0.0.1. The only stand-in is for kube-proxy: the
//! chart's Service is turned into an ExternalName for 127.0.0.1, which the API server resolves for webhooks
//! (dialing `<externalName>:<the configuration's port>`), while it still checks the certificate against
//! `<service>.<namespace>.svc`, as for a ClusterIP Service. Runs on a control plane of its own (its own test
//! binary): the configuration is cluster-wide.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service as KubeService};
use k8s_openapi::api::node::v1::RuntimeClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const RELEASE: &str = "peerpods-ctrl";
const ALONGSIDE_VALUES: &str = "deploy/chart/peerpods/examples/alongside-caa.yaml";
/// libvirt's test driver: the release renders without a cluster tag.
const DEV_VALUES: &str = "deploy/tests/values-dev.yaml";
const VCPUS: &str = "io.katacontainers.config.hypervisor.default_vcpus";
const MEMORY: &str = "io.katacontainers.config.hypervisor.default_memory";

/// A pod asking for 1-2 CPUs and 1-2Gi; `runtime_class` None: the cluster's default runtime.
fn pod(name: &str, runtime_class: Option<&str>) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "runtimeClassName": runtime_class,
            "containers": [{"name": "app", "image": "nginx", "resources": {
                "requests": {"cpu": "1", "memory": "1Gi"},
                "limits": {"cpu": "2", "memory": "2Gi"}}}]
        }
    }))
    .expect("pod")
}

fn size_annotations(pod: &Pod) -> BTreeMap<String, String> {
    let mut annotations = pod.metadata.annotations.clone().unwrap_or_default();
    annotations.retain(|k, _| k.starts_with("io.katacontainers."));
    annotations
}

/// Waits until a peer pod created in `pods` (a dry run) comes back mutated: the API server has taken up the
/// webhook configuration as it now is.
async fn wait_mutated(pods: &Api<Pod>, what: &str) {
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    testenv::wait_for(what, Duration::from_secs(60), || async {
        let created = pods
            .create(&dry_run, &pod("probe", Some("kata-remote")))
            .await
            .ok()?;
        (!size_annotations(&created).is_empty()).then_some(())
    })
    .await;
}

fn first_container_resources(pod: &Pod) -> serde_json::Value {
    let spec = pod.spec.as_ref().expect("pod spec");
    serde_json::to_value(spec.containers[0].resources.clone().unwrap_or_default())
        .expect("resources")
}

fn secret_key(secret: &Secret, key: &str) -> Vec<u8> {
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(key))
        .map(|b| b.0.clone())
        .unwrap_or_else(|| panic!("{key} in Secret {:?}", secret.metadata.name))
}

fn ca_bundle(configuration: &MutatingWebhookConfiguration) -> Vec<u8> {
    configuration.webhooks.as_ref().expect("webhooks")[0]
        .client_config
        .ca_bundle
        .as_ref()
        .expect("caBundle")
        .0
        .clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn the_charts_webhook_mutates_a_peer_pod_through_its_helm_issued_ca_bundle() {
    let cp = testenv::shared_for(module_path!());
    let admin = cp.client().await;
    let work = tempfile::tempdir().expect("temp dir");
    let ns = testenv::namespace(&admin, "peerpods").await;
    // The Service's port is the one the API server dials; the webhook listens on it here.
    let webhook_port = free_port();
    helm_ok(
        cp,
        &[
            "install",
            RELEASE,
            CHART,
            "--namespace",
            &ns,
            "-f",
            ALONGSIDE_VALUES,
            "-f",
            DEV_VALUES,
            "--set",
            "webhook.enabled=true",
            "--set",
            &format!("webhook.service.port={webhook_port}"),
        ],
    )
    .await;
    let name = format!("{RELEASE}-peerpods-webhook");

    // What the chart rendered: the CA in the Secret is the bundle the API server trusts.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    let secret = secrets
        .get(&format!("{name}-tls"))
        .await
        .expect("TLS Secret");
    let configurations: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let configuration = configurations.get(&name).await.expect("configuration");
    assert_eq!(ca_bundle(&configuration), secret_key(&secret, "ca.crt"));
    assert!(String::from_utf8_lossy(&ca_bundle(&configuration)).contains("BEGIN CERTIFICATE"));

    // An upgrade keeps the certificate and the bundle (Helm's lookup): no rotation under running webhook pods.
    helm_ok(
        cp,
        &[
            "upgrade",
            RELEASE,
            CHART,
            "--namespace",
            &ns,
            "--reuse-values",
        ],
    )
    .await;
    let upgraded = secrets
        .get(&format!("{name}-tls"))
        .await
        .expect("TLS Secret");
    for key in ["ca.crt", "tls.crt", "tls.key"] {
        assert_eq!(
            secret_key(&upgraded, key),
            secret_key(&secret, key),
            "{key} changed on upgrade"
        );
    }
    let upgraded = configurations.get(&name).await.expect("configuration");
    assert_eq!(ca_bundle(&upgraded), secret_key(&secret, "ca.crt"));

    // peerpods-webhook as the Deployment runs it: its environment, the Secret's files in its certificate
    // directory; listening on 127.0.0.1 instead of the Pod's address.
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &ns);
    let deployment = deployments.get(&name).await.expect("webhook Deployment");
    let pod_spec = deployment.spec.template.spec.clone();
    assert_eq!(
        pod_spec
            .as_ref()
            .and_then(|s| s.service_account_name.clone()),
        Some("peer-pods-webhook".to_owned())
    );
    let mut env = container_env(&deployment, "peerpods-webhook-0");
    assert_eq!(
        env.get("TARGET_RUNTIMECLASS").map(String::as_str),
        Some("kata-remote")
    );
    assert_eq!(
        env.get("POD_VM_EXTENDED_RESOURCE").map(String::as_str),
        Some("kata.peerpods.io/vm")
    );
    let cert_dir = work.path().join("serving-certs");
    relocate(&mut env, &mount_path(&deployment, "cert"), &cert_dir);
    let items = volume(&deployment, "cert")
        .secret
        .as_ref()
        .and_then(|s| s.items.clone())
        .expect("the certificate volume's items");
    mount_files(
        &cert_dir,
        &items
            .iter()
            .map(|i| (i.path.clone(), secret_key(&secret, &i.key)))
            .collect(),
    );
    let admin_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    env.insert(
        "WEBHOOK_BIND_ADDRESS".into(),
        format!("127.0.0.1:{webhook_port}"),
    );
    env.insert("HEALTH_PROBE_BIND_ADDRESS".into(), admin_addr.to_string());
    // With metrics.secure the Pod mounts its ServiceAccount's token to review scrapes of /metrics: that token
    // here, and the secure metrics port on a free one.
    assert_eq!(env.get("METRICS_SECURE").map(String::as_str), Some("true"));
    let token = testenv::service_account_token(&admin, &ns, "peer-pods-webhook", &[]).await;
    let kubeconfig = work.path().join("kubeconfig");
    token_kubeconfig(cp, &kubeconfig, &token);
    env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    env.insert("METRICS_LISTEN".into(), "127.0.0.1:0".into());
    let mut webhook = Service::start(
        "peerpods-webhook",
        &service_binary("peerpods-webhook"),
        &env,
        admin_addr,
        work.path(),
    );
    webhook.wait_ready().await;

    // kube-proxy's part: the Service leads to this machine.
    let services: Api<KubeService> = Api::namespaced(admin.clone(), &ns);
    services
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "type": "ExternalName", "externalName": "127.0.0.1",
                "clusterIP": null, "clusterIPs": null, "selector": null,
                "ipFamilies": null, "ipFamilyPolicy": null, "internalTrafficPolicy": null
            }})),
        )
        .await
        .expect("Service to ExternalName");

    // Pods must name an existing RuntimeClass (the RuntimeClass admission plugin checks).
    let classes: Api<RuntimeClass> = Api::all(admin.clone());
    classes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
                "apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
                "metadata": {"name": "kata-remote"}, "handler": "kata-remote"
            }))
            .expect("RuntimeClass"),
        )
        .await
        .expect("RuntimeClass kata-remote");

    let workloads = testenv::namespace(&admin, "workload").await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &workloads);
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // The API server takes up a new configuration within moments; dry-run creates show when.
    wait_mutated(&pods, "the chart's webhook configuration in effect").await;

    pods.create(&PostParams::default(), &pod("peer", Some("kata-remote")))
        .await
        .expect("peer pod");
    pods.create(&PostParams::default(), &pod("plain", None))
        .await
        .expect("plain pod");
    let peer = pods.get("peer").await.expect("peer pod");
    assert_eq!(
        size_annotations(&peer),
        BTreeMap::from([
            (VCPUS.to_owned(), "2".to_owned()),
            (MEMORY.to_owned(), "2048".to_owned()),
        ])
    );
    let vm = json!({"kata.peerpods.io/vm": "1"});
    assert_eq!(
        first_container_resources(&peer),
        json!({"requests": vm, "limits": vm})
    );
    let plain = pods.get("plain").await.expect("plain pod");
    assert!(size_annotations(&plain).is_empty());
    assert_eq!(
        first_container_resources(&plain),
        json!({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}})
    );
    // Not in the webhook's own namespace (its pods must start while it is down), as CAA's.
    let own: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let unchanged = own
        .create(&dry_run, &pod("own", Some("kata-remote")))
        .await
        .expect("a peer pod in the release namespace");
    assert!(size_annotations(&unchanged).is_empty());

    // The bundle is what the API server trusts: with another CA in it (provider-service's, also the chart's own)
    // the webhook's certificate is refused and so is the peer pod; with the chart's back, it is mutated again.
    let other_ca = secret_key(
        &secrets
            .get(&format!("{RELEASE}-provider-service-tls-ca"))
            .await
            .expect("provider-service's CA, published in the release namespace"),
        "ca.crt",
    );
    assert_ne!(other_ca, secret_key(&secret, "ca.crt"));
    let set_bundle = |bundle: Vec<u8>| {
        let configurations = configurations.clone();
        let name = name.clone();
        async move {
            let mut configuration = configurations.get(&name).await.expect("configuration");
            configuration.webhooks.as_mut().expect("webhooks")[0]
                .client_config
                .ca_bundle = Some(k8s_openapi::ByteString(bundle));
            configurations
                .replace(&name, &PostParams::default(), &configuration)
                .await
                .expect("replace configuration");
        }
    };
    set_bundle(other_ca).await;
    testenv::wait_for(
        "a peer pod refused while the bundle holds another CA",
        Duration::from_secs(60),
        || async {
            match pods
                .create(&dry_run, &pod("probe", Some("kata-remote")))
                .await
            {
                Err(kube::Error::Api(e)) if e.message.contains("mwebhook.peerpods.io") => Some(()),
                _ => None,
            }
        },
    )
    .await;
    set_bundle(secret_key(&secret, "ca.crt")).await;
    wait_mutated(&pods, "a peer pod mutated again with the chart's bundle").await;

    // failurePolicy Fail, limited to peer pods: with the webhook down a peer pod is refused, any other admitted.
    webhook.terminate().await;
    let refused = pods
        .create(&dry_run, &pod("peer-while-down", Some("kata-remote")))
        .await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.message.contains("mwebhook.peerpods.io")),
        "a peer pod admitted without the webhook: {refused:?}"
    );
    pods.create(&dry_run, &pod("plain-while-down", None))
        .await
        .expect("a plain pod while the webhook is down");
}

fn parse<T: k8s_openapi::serde::de::DeserializeOwned>(doc: &str) -> T {
    serde_saphyr::from_str(doc).unwrap_or_else(|e| panic!("{e}\n{doc}"))
}

/// The one object of `kind` in a manifest whose name contains `name`.
fn object_of<T: k8s_openapi::serde::de::DeserializeOwned + kube::Resource>(
    manifest: &str,
    kind: &str,
    name: &str,
) -> T {
    let mut found: Vec<T> = documents(manifest)
        .iter()
        .filter(|d| kind_of(d) == kind)
        .map(|d| parse::<T>(d))
        .filter(|o| o.meta().name.as_deref().is_some_and(|n| n.contains(name)))
        .collect();
    assert_eq!(found.len(), 1, "one {kind} named *{name}*");
    found.remove(0)
}

fn first_container(deployment: &Deployment) -> k8s_openapi::api::core::v1::Container {
    deployment
        .spec
        .template
        .spec
        .clone()
        .expect("pod spec")
        .containers[0]
        .clone()
}

/// What the API server and the webhook see of the chart's webhook is what cloud-api-adaptor's chart renders, for
/// every cloud: the configuration's webhook (name, path, rules, failure and reinvocation policy, side effects,
/// review versions, the namespace selector with our namespace for theirs), the webhook's environment and where it
/// reads its certificate. The only additions are the match condition on the runtime class and the explicit
/// timeout (the API server's default, 10 s).
#[tokio::test(flavor = "multi_thread")]
async fn the_charts_webhook_is_wired_as_caas_chart_wires_its_own() {
    let ns = "confidential-containers-system";
    let ours = render(
        RELEASE,
        ns,
        &[
            ALONGSIDE_VALUES,
            DEV_VALUES,
            "deploy/tests/values-our-webhook.yaml",
        ],
    )
    .await;
    let our_configuration: MutatingWebhookConfiguration =
        object_of(&ours, "MutatingWebhookConfiguration", "peerpods-webhook");
    let our_deployment: Deployment = object_of(&ours, "Deployment", "peerpods-webhook");
    let our_hook = our_configuration.webhooks.clone().expect("webhooks")[0].clone();
    let our_container = first_container(&our_deployment);
    let our_env: BTreeMap<String, Option<String>> = our_container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, e.value))
        .collect();

    let fixtures = testenv::repo_root().join("peer-pod-config-ctrl/tests/fixtures/caa-chart");
    let mut clouds = 0;
    for entry in std::fs::read_dir(&fixtures).expect("CAA chart fixtures") {
        let path = entry.expect("fixture").path();
        if path.extension().and_then(|e| e.to_str()) != Some("yaml") {
            continue;
        }
        clouds += 1;
        let theirs = std::fs::read_to_string(&path).expect("fixture");
        let cloud = path.display().to_string();
        let configuration: MutatingWebhookConfiguration =
            object_of(&theirs, "MutatingWebhookConfiguration", "peer-pods-webhook");
        let mut hook = configuration.webhooks.expect("webhooks")[0].clone();
        let their_service = hook
            .client_config
            .service
            .clone()
            .expect("service reference");
        assert_eq!(
            our_hook
                .client_config
                .service
                .as_ref()
                .and_then(|s| s.path.clone()),
            their_service.path,
            "{cloud}: path"
        );
        // Their namespace is the webhook's own, as ours is.
        let selector = hook
            .namespace_selector
            .as_mut()
            .expect("namespace selector");
        for requirement in selector.match_expressions.iter_mut().flatten() {
            for value in requirement.values.iter_mut().flatten() {
                if *value == their_service.namespace {
                    *value = ns.to_owned();
                }
            }
            if let Some(values) = requirement.values.as_mut() {
                values.sort();
            }
        }
        let mut our_selector = our_hook
            .namespace_selector
            .clone()
            .expect("namespace selector");
        for requirement in our_selector.match_expressions.iter_mut().flatten() {
            if let Some(values) = requirement.values.as_mut() {
                values.sort();
            }
        }
        assert_eq!(
            Some(our_selector),
            hook.namespace_selector,
            "{cloud}: namespace selector"
        );
        assert_eq!(our_hook.name, hook.name, "{cloud}: name");
        assert_eq!(our_hook.rules, hook.rules, "{cloud}: rules");
        assert_eq!(
            our_hook.failure_policy, hook.failure_policy,
            "{cloud}: failurePolicy"
        );
        assert_eq!(
            our_hook.reinvocation_policy, hook.reinvocation_policy,
            "{cloud}: reinvocationPolicy"
        );
        assert_eq!(
            our_hook.side_effects, hook.side_effects,
            "{cloud}: sideEffects"
        );
        assert_eq!(
            our_hook.admission_review_versions, hook.admission_review_versions,
            "{cloud}: admissionReviewVersions"
        );
        assert_eq!(
            hook.timeout_seconds, None,
            "{cloud}: theirs has the default timeout"
        );
        assert_eq!(
            our_hook.timeout_seconds,
            Some(10),
            "the API server's default"
        );

        let deployment: Deployment = object_of(
            &theirs,
            "Deployment",
            "peer-pods-webhook-controller-manager",
        );
        let container = first_container(&deployment);
        for var in container.env.clone().unwrap_or_default() {
            assert_eq!(
                our_env.get(&var.name),
                Some(&var.value),
                "{cloud}: {} as CAA's chart sets it",
                var.name
            );
        }
        let mount = |c: &k8s_openapi::api::core::v1::Container| {
            c.volume_mounts
                .clone()
                .unwrap_or_default()
                .into_iter()
                .find(|m| m.name == "cert")
                .map(|m| m.mount_path)
        };
        assert_eq!(
            mount(&our_container),
            mount(&container),
            "{cloud}: certificate directory"
        );
    }
    assert_eq!(clouds, 8, "the eight clouds of CAA's chart");
    assert_eq!(
        our_hook.match_conditions.expect("match conditions")[0].expression,
        "has(object.spec.runtimeClassName) && object.spec.runtimeClassName == 'kata-remote'"
    );
}
