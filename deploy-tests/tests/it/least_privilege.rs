//! Least privilege the API server enforces beyond RBAC: the chart's ValidatingAdmissionPolicies, applied from
//! `helm template` to the local control plane and tried the way a compromised workload would try them, with its
//! ServiceAccount's own token.
//!
//! - cloud-api-adaptor: a token bound to a Pod on node A changes node A's `kata.peerpods.io/caa-owner`
//!   annotation and `kata.peerpods.io/vm` capacity, and nothing else of any Node; node B not at all, and a
//!   token bound to no node changes no Node.
//! - peer-pod-config-ctrl: it writes only the objects it renders, by name, with allowed images, its
//!   ServiceAccounts and Secrets, and a webhook configuration that never reaches kube-system; it patches neither
//!   provider-service's Deployment nor its Service. The DRA kubelet plugin it renders in capacityMode dra runs as
//!   root with host mounts, so the policy pins it to what the controller renders: its image, no token, no Secret,
//!   no host namespace or privilege, and no volume but its two kubelet directories.

use std::time::{Duration, Instant};

use crate::support::*;
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, Service, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};

const DEV_VALUES: &str = "deploy/tests/values-dev.yaml";
const CAA_SA: &str = "cloud-api-adaptor";
// The names peer-pod-config-ctrl renders (peer-pod-config-ctrl/src/objects/).
const CAA_DAEMONSET: &str = "peerpodconfig-ctrl-caa-daemon";
const WEBHOOK_SERVICE: &str = "peer-pods-webhook-service";
const WEBHOOK_CONFIGURATION: &str = "peer-pods-webhook-mutating-webhook-configuration";

/// The kinds of the chart that decide who may do what: applied, the rest (workloads that never run here) not.
/// provider-service's Namespace holds its ServiceAccount.
const POLICY_KINDS: [&str; 8] = [
    "Namespace",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionPolicyBinding",
    "ClusterRole",
    "ClusterRoleBinding",
    "Role",
    "RoleBinding",
    "ServiceAccount",
];

/// Renders release `release` into `ns` and applies its policies, RBAC and ServiceAccounts.
async fn apply_policies(cp: &testenv::ControlPlane, release: &str, ns: &str, values: &[&str]) {
    let manifest = render(release, ns, values).await;
    let policies = documents(&manifest)
        .into_iter()
        .filter(|d| POLICY_KINDS.contains(&kind_of(d)))
        .map(|d| format!("---\n{d}"))
        .collect::<String>();
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    run_ok(
        &tool("kubectl"),
        &[
            "--kubeconfig",
            &kubeconfig,
            "apply",
            "--server-side",
            "--field-manager=least-privilege",
            "-f",
            "-",
        ],
        Some(&policies),
    )
    .await;
}

fn refused_by_policy<T: std::fmt::Debug>(result: &Result<T, kube::Error>, says: &str) -> bool {
    matches!(result, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains(says))
}

/// Refused by RBAC (no policy is asked): `verb` on webhook configurations is not granted.
fn refused_by_rbac<T: std::fmt::Debug>(result: &Result<T, kube::Error>, verb: &str) -> bool {
    refused_by_policy(
        result,
        &format!("cannot {verb} resource \"mutatingwebhookconfigurations\""),
    )
}

/// A Pod of `sa` scheduled on `node` (it never runs: there is no kubelet) and the token a kubelet would mount
/// for it: the API server binds it to the Pod and records the Pod's node in the token.
async fn pod_bound_token(
    admin: &kube::Client,
    ns: &str,
    sa: &str,
    pod: &str,
    node: &str,
) -> String {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    let created = pods
        .create(
            &PostParams::default(),
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": pod},
                "spec": {
                    "serviceAccountName": sa,
                    "nodeName": node,
                    "containers": [{"name": "caa", "image": "cloud-api-adaptor:unused"}]
                }
            }))
            .expect("Pod"),
        )
        .await
        .expect("create Pod");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![]),
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.to_owned()),
                uid: created.metadata.uid.clone(),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .expect("TokenRequest")
        .status
        .expect("token status")
        .token
        .expect("token")
}

fn merge(value: serde_json::Value) -> Patch<serde_json::Value> {
    Patch::Merge(value)
}

#[tokio::test(flavor = "multi_thread")]
async fn caa_changes_only_its_own_node_and_only_the_keys_it_writes() {
    let cp = control_plane();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "caa-nodes").await;
    apply_policies(cp, &format!("lp-{ns}"), &ns, &[DEV_VALUES]).await;

    let nodes: Api<Node> = Api::all(admin.clone());
    let (node_a, node_b) = (format!("{ns}-a"), format!("{ns}-b"));
    for name in [&node_a, &node_b] {
        nodes
            .create(
                &PostParams::default(),
                &serde_json::from_value(serde_json::json!({
                    "metadata": {
                        "name": name,
                        "labels": {"node.kubernetes.io/worker": ""},
                        "annotations": {"example.com/owner": "platform"}
                    }
                }))
                .expect("Node"),
            )
            .await
            .expect("create Node");
    }
    let token = pod_bound_token(&admin, &ns, CAA_SA, "caa-on-a", &node_a).await;
    let caa: Api<Node> = Api::all(cp.client_with_token(&token).await);
    let params = PatchParams::default();
    let owner = |v: &str| {
        merge(serde_json::json!({"metadata": {"annotations": {"kata.peerpods.io/caa-owner": v}}}))
    };

    // The policy takes effect once the API server has loaded it: until then the first probe goes through.
    let deadline = Instant::now() + Duration::from_secs(60);
    let other_node = loop {
        let result = caa.patch(&node_b, &params, &owner("attacker")).await;
        if refused_by_policy(&result, "only the Node its Pod runs on") || Instant::now() > deadline
        {
            break result;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        refused_by_policy(&other_node, &format!("bound to {node_a}), not {node_b}")),
        "CAA on {node_a} annotated {node_b}: {other_node:?}"
    );
    let result = caa
        .patch_status(
            &node_b,
            &params,
            &merge(serde_json::json!({"status": {"capacity": {"kata.peerpods.io/vm": "0"}}})),
        )
        .await;
    assert!(
        refused_by_policy(&result, "only the Node its Pod runs on"),
        "CAA on {node_a} emptied {node_b}'s capacity: {result:?}"
    );
    let result = caa
        .patch(
            &node_b,
            &params,
            &merge(
                serde_json::json!({"spec": {"taints": [{"key": "evil", "effect": "NoExecute"}]}}),
            ),
        )
        .await;
    assert!(
        refused_by_policy(&result, "only the Node its Pod runs on"),
        "CAA on {node_a} tainted {node_b}: {result:?}"
    );

    // Its own node: what CAA writes goes through (the annotation, the capacity by JSON patch as CAA sends it).
    caa.patch(&node_a, &params, &owner("caa-pod-uid"))
        .await
        .expect("CAA sets kata.peerpods.io/caa-owner on its node");
    caa.patch_status(
        &node_a,
        &params,
        &merge(serde_json::json!({"status": {"capacity": {"kata.peerpods.io/vm": "10"}}})),
    )
    .await
    .expect("CAA advertises kata.peerpods.io/vm on its node");
    caa.patch_status(
        &node_a,
        &params,
        &Patch::<serde_json::Value>::Json(
            serde_json::from_value(serde_json::json!([
                {"op": "remove", "path": "/status/capacity/kata.peerpods.io~1vm"}
            ]))
            .expect("JSON patch"),
        ),
    )
    .await
    .expect("CAA removes kata.peerpods.io/vm from its node on shutdown");

    // Anything else of its own node is refused.
    for (what, patch, status, says) in [
        (
            "a label",
            serde_json::json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
            false,
            "labels",
        ),
        (
            "another annotation",
            serde_json::json!({"metadata": {"annotations": {"example.com/owner": null}}}),
            false,
            "annotation kata.peerpods.io/caa-owner",
        ),
        (
            "a taint",
            serde_json::json!({"spec": {"taints": [{"key": "evil", "effect": "NoSchedule"}]}}),
            false,
            "spec",
        ),
        (
            "unschedulable",
            serde_json::json!({"spec": {"unschedulable": true}}),
            false,
            "spec",
        ),
        (
            "another resource",
            serde_json::json!({"status": {"capacity": {"example.com/gpu": "8"}}}),
            true,
            "kata.peerpods.io/vm",
        ),
        (
            "a label through the status",
            serde_json::json!({"metadata": {"labels": {"evil": "true"}}}),
            true,
            "labels",
        ),
    ] {
        let result = if status {
            caa.patch_status(&node_a, &params, &merge(patch)).await
        } else {
            caa.patch(&node_a, &params, &merge(patch)).await
        };
        assert!(
            refused_by_policy(&result, says),
            "CAA changed {what} of its own node: {result:?}"
        );
    }

    // A CAA token bound to no Pod (no node) changes no Node.
    let unbound = testenv::service_account_token(&admin, &ns, CAA_SA, &[]).await;
    let result = Api::<Node>::all(cp.client_with_token(&unbound).await)
        .patch(&node_a, &params, &owner("unbound"))
        .await;
    assert!(
        refused_by_policy(&result, "bound to no node"),
        "a CAA token without a node annotated {node_a}: {result:?}"
    );

    // The policy is CAA's alone: the cluster's admin still changes node B.
    nodes
        .patch(&node_b, &params, &owner("admin"))
        .await
        .expect("the admin is not bound by CAA's policy");
    for name in [&node_a, &node_b] {
        let _ = nodes.delete(name, &Default::default()).await;
    }
}

/// A DaemonSet of `name` as peer-pod-config-ctrl renders CAA's, with `image`, run as `sa`, carrying the Secret
/// `secret` as environment and key `tls_key` of provider-service's TLS Secret `tls_secret` (ca.crt, as rendered).
fn caa_daemonset(
    name: &str,
    image: &str,
    sa: &str,
    secret: &str,
    (tls_secret, tls_key): (&str, &str),
) -> DaemonSet {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "selector": {"matchLabels": {"name": "caa-daemonset"}},
            "template": {
                "metadata": {"labels": {"name": "caa-daemonset"}},
                "spec": {
                    "serviceAccountName": sa,
                    "nodeSelector": {"peerpods.io/never": "true"},
                    "containers": [{
                        "name": "cloud-api-adaptor-con",
                        "image": image,
                        "envFrom": [{"secretRef": {"name": secret}}]
                    }],
                    "volumes": [{"name": "provider-service", "projected": {"sources": [
                        {"serviceAccountToken": {"audience": "provider-service", "path": "token"}},
                        {"secret": {"name": tls_secret, "items": [{"key": tls_key, "path": tls_key}]}}
                    ]}}]
                }
            }
        }
    }))
    .expect("DaemonSet")
}

/// A release's policies, RBAC and ServiceAccounts applied in a fresh namespace, on the control plane of the tests
/// that make cluster-wide webhook configurations, and clients of the admin and of peer-pod-config-ctrl's token.
struct PpcRelease {
    admin: kube::Client,
    ns: String,
    fullname: String,
    ppc: kube::Client,
}

async fn ppc_release(ns_prefix: &str) -> PpcRelease {
    let cp = testenv::shared_for(concat!(module_path!(), "::webhook_configuration"));
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, ns_prefix).await;
    let release = format!("lp-{ns}");
    let fullname = format!("{release}-peerpods");
    apply_policies(cp, &release, &ns, &[DEV_VALUES]).await;
    let token = testenv::service_account_token(
        &admin,
        &ns,
        &format!("{fullname}-peer-pod-config-ctrl"),
        &[],
    )
    .await;
    let ppc = cp.client_with_token(&token).await;
    PpcRelease {
        admin,
        ns,
        fullname,
        ppc,
    }
}

/// Waits until the API server enforces peer-pod-config-ctrl's policy in `ns`: until it has loaded it, the probe (a
/// DaemonSet of another name, created with peer-pod-config-ctrl's client `ppc`) goes through, and is removed again.
async fn wait_rendered_policy(ppc: &kube::Client, admin: &kube::Client, ns: &str) {
    let daemonsets: Api<DaemonSet> = Api::namespaced(ppc.clone(), ns);
    let admin_daemonsets: Api<DaemonSet> = Api::namespaced(admin.clone(), ns);
    let probe = format!("{ns}-probe");
    let deadline = Instant::now() + Duration::from_secs(60);
    let probed = loop {
        let result = daemonsets
            .create(
                &PostParams::default(),
                &caa_daemonset(
                    &probe,
                    "quay.io/confidential-containers/cloud-api-adaptor:v0.22.0",
                    CAA_SA,
                    "peer-pods-secret",
                    ("unused", "ca.crt"),
                ),
            )
            .await;
        if result.is_ok() {
            let _ = admin_daemonsets.delete(&probe, &Default::default()).await;
        }
        // Any refusal of the policy tells it is loaded.
        if refused_by_policy(&result, "ValidatingAdmissionPolicy") || Instant::now() > deadline {
            break result;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(
        refused_by_policy(&probed, "ValidatingAdmissionPolicy"),
        "the policy never took effect: {probed:?}"
    );
}

/// A MutatingWebhookConfiguration `name` calling `service` in `ns`, for `resource`, in namespaces but
/// `excluded`. Harmless while it exists: it fails open and selects no object.
fn webhook_configuration(
    name: &str,
    ns: &str,
    service: &str,
    resource: &str,
    excluded: &[&str],
) -> MutatingWebhookConfiguration {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "webhooks": [{
            "name": "mwebhook.peerpods.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "clientConfig": {"service": {"name": service, "namespace": ns, "path": "/mutate-v1-pod"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": [resource]}],
            "namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "NotIn", "values": excluded}
            ]},
            "objectSelector": {"matchLabels": {"peerpods.io/never": "true"}}
        }]
    }))
    .expect("MutatingWebhookConfiguration")
}

/// peer-pod-config-ctrl's ServiceAccount, as an attacker holding its token (a compromised controller, or one
/// driven by a hostile PeerPodConfig) would try: creating a webhook configuration of any name (by create, or by
/// a server-side apply of its own name while the chart's is missing), deleting the chart's, patching a webhook
/// into it that reaches kube-system, CAA's DaemonSet with a foreign image, provider-service's ServiceAccount or
/// credential, and patches of provider-service's Deployment and Service are all refused; what it renders goes
/// through. On a control plane of its own: it makes and deletes the chart's webhook configuration, one per
/// cluster, which a chart installed beside it would own.
#[tokio::test(flavor = "multi_thread")]
async fn peer_pod_config_ctrl_writes_only_what_it_renders() {
    let PpcRelease {
        admin,
        ns,
        fullname,
        ppc,
    } = ppc_release("ppc-rendered").await;
    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(ppc.clone());
    let admin_webhooks: Api<MutatingWebhookConfiguration> = Api::all(admin.clone());
    let post = PostParams::default();

    let daemonsets: Api<DaemonSet> = Api::namespaced(ppc.clone(), &ns);
    wait_rendered_policy(&ppc, &admin, &ns).await;

    // No webhook configuration of its own: RBAC grants no create, of any name.
    for name in [format!("{ns}-other"), WEBHOOK_CONFIGURATION.to_owned()] {
        let result = webhooks
            .create(
                &post,
                &webhook_configuration(&name, &ns, WEBHOOK_SERVICE, "pods", &["kube-system"]),
            )
            .await;
        if result.is_ok() {
            let _ = admin_webhooks.delete(&name, &Default::default()).await;
        }
        assert!(
            refused_by_rbac(&result, "create"),
            "peer-pod-config-ctrl created webhook configuration {name}: {result:?}"
        );
    }
    // Nor by a server-side apply of its name while the chart's is missing: RBAC grants the patch, but an apply
    // that would create the object is authorized as a create too.
    let apply = PatchParams::apply("peer-pod-config-ctrl").force();
    let rendered = webhook_configuration(
        WEBHOOK_CONFIGURATION,
        &ns,
        WEBHOOK_SERVICE,
        "pods",
        &["kube-system", &ns],
    );
    let result = webhooks
        .patch(WEBHOOK_CONFIGURATION, &apply, &Patch::Apply(&rendered))
        .await;
    if result.is_ok() {
        let _ = admin_webhooks
            .delete(WEBHOOK_CONFIGURATION, &Default::default())
            .await;
    }
    assert!(
        refused_by_rbac(&result, "create"),
        "peer-pod-config-ctrl created its webhook configuration by a server-side apply: {result:?}"
    );

    // The chart's (made by the admin, as Helm would): no webhook into it reaching kube-system, another Service or
    // other resources.
    admin_webhooks
        .create(
            &post,
            &serde_json::from_value(serde_json::json!({
                "metadata": {"name": WEBHOOK_CONFIGURATION, "labels": {"app.kubernetes.io/managed-by": "Helm"}},
                "webhooks": []
            }))
            .expect("MutatingWebhookConfiguration"),
        )
        .await
        .expect("the chart's webhook configuration");
    for (what, service, resource, excluded) in [
        (
            "reaching kube-system",
            WEBHOOK_SERVICE,
            "pods",
            vec![ns.as_str()],
        ),
        (
            "calling another Service",
            "provider-service",
            "pods",
            vec!["kube-system"],
        ),
        (
            "for Secrets",
            WEBHOOK_SERVICE,
            "secrets",
            vec!["kube-system"],
        ),
    ] {
        let result = webhooks
            .patch(
                WEBHOOK_CONFIGURATION,
                &apply,
                &Patch::Apply(&webhook_configuration(
                    WEBHOOK_CONFIGURATION,
                    &ns,
                    service,
                    resource,
                    &excluded,
                )),
            )
            .await;
        assert!(
            refused_by_policy(&result, "never in kube-system"),
            "peer-pod-config-ctrl patched a webhook {what} into the webhook configuration: {result:?}"
        );
    }
    // Its webhook as it renders it goes in; the chart's object it may not delete.
    let patched = webhooks
        .patch(WEBHOOK_CONFIGURATION, &apply, &Patch::Apply(&rendered))
        .await
        .expect("peer-pod-config-ctrl patches its webhook into the chart's webhook configuration");
    assert_eq!(
        patched.webhooks.map(|w| w.len()),
        Some(1),
        "its one webhook in the chart's configuration"
    );
    let result = webhooks
        .delete(WEBHOOK_CONFIGURATION, &Default::default())
        .await;
    assert!(
        refused_by_rbac(&result, "delete"),
        "peer-pod-config-ctrl deleted the chart's webhook configuration: {result:?}"
    );
    admin_webhooks
        .delete(WEBHOOK_CONFIGURATION, &Default::default())
        .await
        .expect("the admin (Helm, on uninstall) deletes it");

    // CAA's DaemonSet: a foreign image, provider-service's ServiceAccount or credential, another name.
    let allowed = "quay.io/confidential-containers/cloud-api-adaptor:v0.22.0";
    let provider_sa = format!("{fullname}-provider-service");
    let tls_secret = format!("{fullname}-provider-service-tls");
    // provider-service's CA, published (ca.crt only) in the release namespace.
    let ca_secret = format!("{fullname}-provider-service-tls-ca");
    let ca = (ca_secret.as_str(), "ca.crt");
    for (what, daemonset, says) in [
        (
            "a foreign image",
            caa_daemonset(
                CAA_DAEMONSET,
                "evil.example/miner:1",
                CAA_SA,
                "peer-pods-secret",
                ca,
            ),
            "only images of peerPodConfigCtrl.allowedImages",
        ),
        (
            "a look-alike image",
            caa_daemonset(
                CAA_DAEMONSET,
                "quay.io/confidential-containers/cloud-api-adaptor-evil:1",
                CAA_SA,
                "peer-pods-secret",
                ca,
            ),
            "only images of peerPodConfigCtrl.allowedImages",
        ),
        (
            "provider-service's ServiceAccount",
            caa_daemonset(CAA_DAEMONSET, allowed, &provider_sa, "peer-pods-secret", ca),
            "only as ServiceAccount cloud-api-adaptor",
        ),
        (
            "provider-service's credential",
            caa_daemonset(
                CAA_DAEMONSET,
                allowed,
                CAA_SA,
                "provider-service-credentials",
                ca,
            ),
            "refer only to the Secrets",
        ),
        (
            "provider-service's TLS key",
            caa_daemonset(
                CAA_DAEMONSET,
                allowed,
                CAA_SA,
                "peer-pods-secret",
                (&tls_secret, "tls.key"),
            ),
            "refer only to the Secrets",
        ),
        (
            "another key than ca.crt of the published CA",
            caa_daemonset(
                CAA_DAEMONSET,
                allowed,
                CAA_SA,
                "peer-pods-secret",
                (&ca_secret, "tls.key"),
            ),
            "refer only to the Secrets",
        ),
        (
            "another name",
            caa_daemonset("caa-elsewhere", allowed, CAA_SA, "peer-pods-secret", ca),
            "writes only the daemonsets it renders",
        ),
    ] {
        let result = daemonsets.create(&post, &daemonset).await;
        assert!(
            refused_by_policy(&result, says),
            "peer-pod-config-ctrl created CAA's DaemonSet with {what}: {result:?}"
        );
    }
    // What it renders goes through.
    daemonsets
        .create(
            &post,
            &caa_daemonset(CAA_DAEMONSET, allowed, CAA_SA, "peer-pods-secret", ca),
        )
        .await
        .expect("peer-pod-config-ctrl creates CAA's DaemonSet as it renders it");
    // provider-service's Deployment and Service (made by the admin, as Helm would): no patch by
    // peer-pod-config-ctrl, whose patches RBAC limits to the names it renders (the policy would refuse them too;
    // RBAC is the layer checked here).
    let provider = format!("{fullname}-provider-service");
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": provider},
        "spec": {
            "selector": {"matchLabels": {"app": "provider-service"}},
            "template": {
                "metadata": {"labels": {"app": "provider-service"}},
                "spec": {"containers": [{"name": "provider-service", "image": "provider-service:unused"}]}
            }
        }
    }))
    .expect("Deployment");
    Api::<Deployment>::namespaced(admin.clone(), &ns)
        .create(&post, &deployment)
        .await
        .expect("provider-service's Deployment");
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": provider},
        "spec": {"selector": {"app": "provider-service"}, "ports": [{"port": 50051}]}
    }))
    .expect("Service");
    Api::<Service>::namespaced(admin.clone(), &ns)
        .create(&post, &service)
        .await
        .expect("provider-service's Service");
    let params = PatchParams::default();
    let result = Api::<Deployment>::namespaced(ppc.clone(), &ns)
        .patch(
            &provider,
            &params,
            &merge(
                serde_json::json!({"spec": {"template": {"spec": {"containers": [
                    {"name": "provider-service", "image": "evil.example/collector:1"}
                ]}}}}),
            ),
        )
        .await;
    assert!(
        matches!(&result, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("cannot patch resource")),
        "peer-pod-config-ctrl patched provider-service's Deployment: {result:?}"
    );
    let result = Api::<Service>::namespaced(ppc.clone(), &ns)
        .patch(
            &provider,
            &params,
            &merge(serde_json::json!({"spec": {"selector": {"app": "peer-pods-webhook"}}})),
        )
        .await;
    assert!(
        matches!(&result, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("cannot patch resource")),
        "peer-pod-config-ctrl pointed provider-service's Service elsewhere: {result:?}"
    );
}

/// provider-service, its credential and its TLS key live where nothing privileged runs and where
/// peer-pod-config-ctrl creates nothing: installed with the chart's defaults, provider-service's Deployment,
/// Service, ServiceAccount, NetworkPolicies and TLS Secret are in a namespace of their own, which enforces Pod
/// Security "restricted" (a privileged Pod is refused there, provider-service's own Pod is not); the release
/// namespace, where the CAA DaemonSet runs, holds only provider-service's CA (ca.crt, no key); and
/// peer-pod-config-ctrl's ServiceAccount can create nothing in provider-service's namespace, nor patch its
/// Deployment or Service there.
#[tokio::test(flavor = "multi_thread")]
async fn provider_service_lives_apart_in_a_restricted_namespace_peer_pod_config_ctrl_cannot_write()
{
    use k8s_openapi::api::core::v1::{Namespace, Secret};
    use k8s_openapi::api::networking::v1::NetworkPolicy;
    // A control plane of its own: the whole chart is installed, whose cluster-wide objects a release installed
    // beside it on a shared one may also claim.
    let cp = testenv::shared_for(concat!(module_path!(), "::provider_namespace"));
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "ps-apart").await;
    let ps_ns = provider_namespace(&ns);
    let release = format!("lp-{ns}");
    let fullname = format!("{release}-peerpods");
    let provider = format!("{fullname}-provider-service");
    helm_ok(
        cp,
        &[
            "install",
            &release,
            CHART,
            "--skip-crds",
            "-f",
            DEV_VALUES,
            "--namespace",
            &ns,
        ],
    )
    .await;

    let namespace = Api::<Namespace>::all(admin.clone())
        .get(&ps_ns)
        .await
        .unwrap_or_else(|e| panic!("provider-service's namespace {ps_ns}: {e}"));
    assert_eq!(
        namespace
            .metadata
            .labels
            .unwrap_or_default()
            .get("pod-security.kubernetes.io/enforce")
            .map(String::as_str),
        Some("restricted"),
        "{ps_ns} enforces Pod Security restricted"
    );
    // provider-service's objects are there, none of them in the release namespace.
    let ps_deploy = Api::<Deployment>::namespaced(admin.clone(), &ps_ns)
        .get(&provider)
        .await
        .expect("provider-service's Deployment in its namespace");
    assert!(
        exists(
            &Api::<Service>::namespaced(admin.clone(), &ps_ns),
            &provider
        )
        .await,
        "provider-service's Service in its namespace"
    );
    assert!(
        exists(
            &Api::<ServiceAccount>::namespaced(admin.clone(), &ps_ns),
            &service_account_of(&ps_deploy)
        )
        .await,
        "provider-service's ServiceAccount in its namespace"
    );
    for policy in [provider.clone(), format!("{provider}-egress")] {
        assert!(
            exists(
                &Api::<NetworkPolicy>::namespaced(admin.clone(), &ps_ns),
                &policy
            )
            .await,
            "NetworkPolicy {policy} in provider-service's namespace"
        );
    }
    assert!(
        !exists(
            &Api::<Deployment>::namespaced(admin.clone(), &ns),
            &provider
        )
        .await,
        "a provider-service Deployment in the release namespace"
    );
    assert!(
        !exists(&Api::<Service>::namespaced(admin.clone(), &ns), &provider).await,
        "a provider-service Service in the release namespace"
    );
    // Its key (and the volumes of its credential: a Pod mounts only Secrets of its own namespace) are there;
    // the release namespace holds no key, only the CA its callers verify it with.
    let tls = Api::<Secret>::namespaced(admin.clone(), &ps_ns)
        .get(&secret_of(&ps_deploy, "tls"))
        .await
        .expect("provider-service's TLS Secret in its namespace");
    assert!(secret_files(&tls).contains_key("tls.key"));
    assert_eq!(
        secret_of(&ps_deploy, "credentials"),
        "provider-service-credentials"
    );
    let release_secrets = Api::<Secret>::namespaced(admin.clone(), &ns)
        .list(&Default::default())
        .await
        .expect("Secrets of the release namespace")
        .items;
    for secret in &release_secrets {
        assert!(
            !secret_files(secret).contains_key("tls.key"),
            "a key in the release namespace: {:?}",
            secret.metadata.name
        );
    }
    let ca = release_secrets
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(&format!("{provider}-tls-ca")))
        .expect("provider-service's CA published in the release namespace");
    assert_eq!(
        secret_files(ca).into_keys().collect::<Vec<_>>(),
        vec!["ca.crt".to_owned()]
    );
    assert_eq!(
        secret_files(ca).get("ca.crt"),
        secret_files(&tls).get("ca.crt"),
        "the published CA is the one that signed provider-service's certificate"
    );

    // Nothing privileged runs there: the API server refuses a privileged Pod (a CAA DaemonSet's); provider-service's
    // own Pod, as its Deployment renders it, is admitted.
    let pods = Api::<Pod>::namespaced(admin.clone(), &ps_ns);
    let privileged: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "privileged"},
        "spec": {
            "serviceAccountName": service_account_of(&ps_deploy),
            "automountServiceAccountToken": false,
            "hostNetwork": true,
            "containers": [{"name": "caa", "image": "cloud-api-adaptor:unused",
                            "securityContext": {"privileged": true}}]
        }
    }))
    .expect("Pod");
    let refused = pods.create(&PostParams::default(), &privileged).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(e)) if e.code == 403 && e.message.contains("violates PodSecurity")),
        "a privileged Pod in provider-service's namespace: {refused:?}"
    );
    let own = Pod {
        metadata: kube::api::ObjectMeta {
            name: Some("provider-service".into()),
            ..Default::default()
        },
        spec: ps_deploy.spec.template.spec.clone(),
        ..Default::default()
    };
    pods.create(
        &PostParams {
            dry_run: true,
            ..Default::default()
        },
        &own,
    )
    .await
    .expect("provider-service's Pod passes Pod Security restricted");

    // peer-pod-config-ctrl creates nothing there, not even the objects it renders, and patches nothing.
    let token = testenv::service_account_token(
        &admin,
        &ns,
        &format!("{fullname}-peer-pod-config-ctrl"),
        &[],
    )
    .await;
    let ppc = cp.client_with_token(&token).await;
    let post = PostParams::default();
    let cannot = |what: &str, result: Result<(), kube::Error>| {
        assert!(
            matches!(&result, Err(kube::Error::Api(e)) if e.code == 403 && e.reason == "Forbidden"),
            "peer-pod-config-ctrl {what} in provider-service's namespace: {result:?}"
        );
    };
    cannot(
        "created CAA's DaemonSet",
        Api::<DaemonSet>::namespaced(ppc.clone(), &ps_ns)
            .create(
                &post,
                &caa_daemonset(
                    CAA_DAEMONSET,
                    "quay.io/confidential-containers/cloud-api-adaptor:v0.22.0",
                    CAA_SA,
                    "peer-pods-secret",
                    (&format!("{provider}-tls-ca"), "ca.crt"),
                ),
            )
            .await
            .map(drop),
    );
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "peer-pods-webhook"},
        "spec": {
            "selector": {"matchLabels": {"app": "peer-pods-webhook"}},
            "template": {
                "metadata": {"labels": {"app": "peer-pods-webhook"}},
                "spec": {"containers": [{"name": "webhook", "image": "peer-pods-webhook:unused"}]}
            }
        }
    }))
    .expect("Deployment");
    cannot(
        "created a Deployment",
        Api::<Deployment>::namespaced(ppc.clone(), &ps_ns)
            .create(&post, &deployment)
            .await
            .map(drop),
    );
    let service: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": WEBHOOK_SERVICE},
        "spec": {"selector": {"app.kubernetes.io/name": "peer-pods-webhook"}, "ports": [{"port": 443}]}
    }))
    .expect("Service");
    cannot(
        "created a Service",
        Api::<Service>::namespaced(ppc.clone(), &ps_ns)
            .create(&post, &service)
            .await
            .map(drop),
    );
    let secret: Secret =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "webhook-server-cert"}}))
            .expect("Secret");
    cannot(
        "created a Secret",
        Api::<Secret>::namespaced(ppc.clone(), &ps_ns)
            .create(&post, &secret)
            .await
            .map(drop),
    );
    let params = PatchParams::default();
    cannot(
        "patched provider-service's Deployment",
        Api::<Deployment>::namespaced(ppc.clone(), &ps_ns)
            .patch(
                &provider,
                &params,
                &merge(serde_json::json!({"spec": {"replicas": 0}})),
            )
            .await
            .map(drop),
    );
    cannot(
        "patched provider-service's Service",
        Api::<Service>::namespaced(ppc.clone(), &ps_ns)
            .patch(
                &provider,
                &params,
                &merge(serde_json::json!({"spec": {"selector": {"app": "peer-pods-webhook"}}})),
            )
            .await
            .map(drop),
    );
    crate::uninstall::uninstall_uncounted(cp, &release, &ns).await;
}

/// peer-pod-config-ctrl's DRA rights (capacityMode dra, docs/capacity.md), with its ServiceAccount's own token:
/// it creates and changes the DeviceClass `vm.peerpods.io` and the pool's slices `peerpods-vm-<n>`, and removes
/// them; another driver's DeviceClass or ResourceSlice it can neither change nor remove; ResourceClaims it lists
/// and watches, and can neither create nor allocate (their status is the scheduler's).
#[tokio::test(flavor = "multi_thread")]
async fn peer_pod_config_ctrl_changes_only_its_own_dra_objects_and_only_reads_claims() {
    use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
    use kube::api::{DeleteParams, ListParams};
    let PpcRelease { admin, ns, ppc, .. } = ppc_release("ppc-dra").await;
    let apply = PatchParams::apply("peer-pod-config-ctrl").force();
    fn forbidden<T>(result: &Result<T, kube::Error>) -> bool {
        matches!(result, Err(kube::Error::Api(e)) if e.code == 403)
    }
    let slice = |name: &str, driver: &str| -> ResourceSlice {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": driver, "allNodes": true,
                     "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                     "devices": [{"name": "vm-0"}]}
        }))
        .expect("ResourceSlice")
    };
    let class = |name: &str| -> DeviceClass {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "resource.k8s.io/v1",
            "kind": "DeviceClass",
            "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == \"vm.peerpods.io\""}}],
                     "extendedResourceName": "kata.peerpods.io/vm"}
        }))
        .expect("DeviceClass")
    };

    // Its own: the pool's slice and the DeviceClass, created by server-side apply, changed, listed, removed.
    let slices: Api<ResourceSlice> = Api::all(ppc.clone());
    let own_slice = format!("peerpods-vm-{}", 127);
    slices
        .patch(
            &own_slice,
            &apply,
            &Patch::Apply(slice(&own_slice, "vm.peerpods.io")),
        )
        .await
        .expect("peer-pod-config-ctrl publishes a slice of its pool");
    slices
        .list(&ListParams::default().labels("app.kubernetes.io/managed-by=peer-pod-config-ctrl"))
        .await
        .expect("peer-pod-config-ctrl lists the pool's slices");
    let classes: Api<DeviceClass> = Api::all(ppc.clone());
    classes
        .patch(
            "vm.peerpods.io",
            &apply,
            &Patch::Apply(class("vm.peerpods.io")),
        )
        .await
        .expect("peer-pod-config-ctrl publishes its DeviceClass");
    classes
        .list(&ListParams::default().fields("metadata.name=vm.peerpods.io"))
        .await
        .expect("peer-pod-config-ctrl lists its DeviceClass by name");

    // Another driver's, made by the admin: no change, no removal, and no list of every DeviceClass.
    let admin_slices: Api<ResourceSlice> = Api::all(admin.clone());
    let other_slice = format!("{ns}-gpu");
    admin_slices
        .create(
            &PostParams::default(),
            &slice(&other_slice, "gpu.example.com"),
        )
        .await
        .expect("another driver's slice");
    let admin_classes: Api<DeviceClass> = Api::all(admin.clone());
    let other_class = format!("{ns}-gpu.example.com");
    admin_classes
        .create(&PostParams::default(), &class(&other_class))
        .await
        .expect("another DeviceClass");
    let result = slices
        .patch(
            &other_slice,
            &apply,
            &Patch::Apply(slice(&other_slice, "vm.peerpods.io")),
        )
        .await;
    assert!(
        forbidden(&result),
        "peer-pod-config-ctrl took over another driver's slice: {result:?}"
    );
    let result = slices.delete(&other_slice, &DeleteParams::default()).await;
    assert!(
        forbidden(&result),
        "peer-pod-config-ctrl deleted another driver's slice: {result:?}"
    );
    let result = classes
        .patch(&other_class, &apply, &Patch::Apply(class(&other_class)))
        .await;
    assert!(
        forbidden(&result),
        "peer-pod-config-ctrl changed another DeviceClass: {result:?}"
    );
    let result = classes.delete(&other_class, &DeleteParams::default()).await;
    assert!(
        forbidden(&result),
        "peer-pod-config-ctrl deleted another DeviceClass: {result:?}"
    );
    let result = classes.list(&ListParams::default()).await;
    assert!(
        forbidden(&result),
        "peer-pod-config-ctrl listed every DeviceClass: {result:?}"
    );

    // ResourceClaims: listed and watched everywhere, never created or allocated.
    Api::<ResourceClaim>::all(ppc.clone())
        .list(&ListParams::default())
        .await
        .expect("peer-pod-config-ctrl lists ResourceClaims");
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vm"},
        "spec": {"devices": {"requests": [{"name": "vm", "exactly": {"deviceClassName": "vm.peerpods.io"}}]}}
    }))
    .expect("ResourceClaim");
    let result = Api::<ResourceClaim>::namespaced(ppc.clone(), &ns)
        .create(&PostParams::default(), &claim)
        .await;
    assert!(
        forbidden(&result),
        "peer-pod-config-ctrl created a ResourceClaim: {result:?}"
    );
    Api::<ResourceClaim>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &claim)
        .await
        .expect("a claim");
    let result = Api::<ResourceClaim>::namespaced(ppc.clone(), &ns)
        .patch_status(
            "vm",
            &PatchParams::default(),
            &merge(
                serde_json::json!({"status": {"allocation": {"devices": {"results": [
                    {"request": "vm", "driver": "vm.peerpods.io", "pool": "p", "device": "vm-0"}
                ]}}}}),
            ),
        )
        .await;
    assert!(
        forbidden(&result),
        "peer-pod-config-ctrl allocated a claim: {result:?}"
    );

    // Removing its own.
    slices
        .delete(&own_slice, &DeleteParams::default())
        .await
        .expect("peer-pod-config-ctrl removes its pool's slice");
    classes
        .delete("vm.peerpods.io", &DeleteParams::default())
        .await
        .expect("peer-pod-config-ctrl removes its DeviceClass");
    let _ = admin_slices
        .delete(&other_slice, &DeleteParams::default())
        .await;
    let _ = admin_classes
        .delete(&other_class, &DeleteParams::default())
        .await;
}

/// The DRA kubelet plugin's DaemonSet (capacityMode dra) runs as root with hostPath mounts of the kubelet's
/// directories: a PeerPodConfig (or a compromised peer-pod-config-ctrl) that could choose its mounts, image or
/// privileges would own every selected node. With peer-pod-config-ctrl's token, the DaemonSet as the controller
/// renders it (`peer_pod_config_ctrl::dra::plugin_daemonset`) goes through; the same with the kubelet directory
/// moved to `/`, an added hostPath of `/`, a Secret volume, a ServiceAccount token, CAA's ServiceAccount, a
/// privileged container, an added capability, the host's network or PID namespace, or a foreign image is refused.
#[tokio::test(flavor = "multi_thread")]
async fn peer_pod_config_ctrl_runs_the_dra_plugin_only_as_it_renders_it() {
    let PpcRelease { admin, ns, ppc, .. } = ppc_release("ppc-plugin").await;
    wait_rendered_policy(&ppc, &admin, &ns).await;
    let daemonsets: Api<DaemonSet> = Api::namespaced(ppc.clone(), &ns);
    let post = PostParams::default();

    // Rendered by the controller from a PeerPodConfig in capacityMode dra; the chart's default kubelet directory.
    let rendered = |kubelet_dir: &str, image: &str| -> serde_json::Value {
        let config: peerpods_api::peerpodconfig::PeerPodConfig =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "confidentialcontainers.org/v1alpha1",
                "kind": "PeerPodConfig",
                "metadata": {"name": "peerpodconfig", "namespace": ns, "uid": "5f0c9d62-0000-4000-8000-000000000001"},
                "spec": {"capacityMode": "dra", "limit": 1,
                         "dra": {"pluginImage": image, "kubeletDir": kubelet_dir}}
            }))
            .expect("PeerPodConfig");
        let mut daemonset = serde_json::to_value(
            peer_pod_config_ctrl::dra::plugin_daemonset(&config, &ns)
                .expect("the plugin DaemonSet"),
        )
        .expect("json");
        // Owned by no live object here: the garbage collector would remove it meanwhile.
        daemonset["metadata"]
            .as_object_mut()
            .expect("metadata")
            .remove("ownerReferences");
        daemonset
    };
    let image = "ghcr.io/confidential-containers/peerpods-dra-plugin:0.1.0";
    let as_rendered = rendered("/var/lib/kubelet", image);
    let changed = |edit: &dyn Fn(&mut serde_json::Value)| {
        let mut daemonset = as_rendered.clone();
        edit(&mut daemonset["spec"]["template"]["spec"]);
        daemonset
    };
    const MOUNTS: &str = "mounts no ServiceAccount token and no volume but the kubelet directories";
    const PRIVILEGE: &str = "runs in no host namespace, unprivileged";
    let cases: Vec<(&str, serde_json::Value, &str)> = vec![
        (
            "its kubelet directory moved to /",
            rendered("/", image),
            MOUNTS,
        ),
        (
            "a hostPath of / beside its own",
            changed(&|spec| {
                spec["volumes"]
                    .as_array_mut()
                    .expect("volumes")
                    .push(serde_json::json!({"name": "root", "hostPath": {"path": "/"}}))
            }),
            MOUNTS,
        ),
        (
            "a Secret volume",
            changed(&|spec| {
                spec["volumes"].as_array_mut().expect("volumes").push(
                    serde_json::json!({"name": "s", "secret": {"secretName": "peer-pods-secret"}}),
                )
            }),
            MOUNTS,
        ),
        (
            "a ServiceAccount token",
            changed(&|spec| spec["automountServiceAccountToken"] = true.into()),
            MOUNTS,
        ),
        (
            "CAA's ServiceAccount",
            changed(&|spec| spec["serviceAccountName"] = CAA_SA.into()),
            "only as ServiceAccount default",
        ),
        (
            "a privileged container",
            // The API server itself refuses privileged beside allowPrivilegeEscalation false: an attacker drops both.
            changed(&|spec| {
                let context = &mut spec["containers"][0]["securityContext"];
                context["privileged"] = true.into();
                context
                    .as_object_mut()
                    .expect("securityContext")
                    .remove("allowPrivilegeEscalation");
            }),
            PRIVILEGE,
        ),
        (
            "an added capability",
            changed(&|spec| {
                spec["containers"][0]["securityContext"]["capabilities"]["add"] =
                    serde_json::json!(["SYS_ADMIN"])
            }),
            PRIVILEGE,
        ),
        (
            "privilege escalation",
            changed(&|spec| {
                spec["containers"][0]["securityContext"]
                    .as_object_mut()
                    .expect("securityContext")
                    .remove("allowPrivilegeEscalation");
            }),
            PRIVILEGE,
        ),
        (
            "the host's network",
            changed(&|spec| spec["hostNetwork"] = true.into()),
            PRIVILEGE,
        ),
        (
            "the host's PID namespace",
            changed(&|spec| spec["hostPID"] = true.into()),
            PRIVILEGE,
        ),
        (
            "a foreign image",
            rendered("/var/lib/kubelet", "evil.example/peerpods-dra-plugin:1"),
            "only images of peerPodConfigCtrl.allowedImages",
        ),
    ];
    for (what, daemonset, says) in cases {
        let daemonset: DaemonSet = serde_json::from_value(daemonset).expect("DaemonSet");
        let result = daemonsets.create(&post, &daemonset).await;
        assert!(
            refused_by_policy(&result, says),
            "peer-pod-config-ctrl created the DRA plugin's DaemonSet with {what}: {result:?}"
        );
    }
    let daemonset: DaemonSet = serde_json::from_value(as_rendered).expect("DaemonSet");
    daemonsets
        .create(&post, &daemonset)
        .await
        .expect("peer-pod-config-ctrl creates the DRA plugin's DaemonSet as it renders it");
}
