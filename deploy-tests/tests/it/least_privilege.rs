//! Least privilege the API server enforces beyond RBAC: the chart's ValidatingAdmissionPolicies, applied from
//! `helm template` to the local control plane and tried the way a compromised workload would try them, with its
//! ServiceAccount's own token.
//!
//! - cloud-api-adaptor: a token bound to a Pod on node A changes node A's `kata.peerpods.io/caa-owner`
//!   annotation and `kata.peerpods.io/vm` capacity, and nothing else of any Node; node B not at all, and a
//!   token bound to no node changes no Node.

use std::time::{Duration, Instant};

use crate::support::*;
use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};

const DEV_VALUES: &str = "deploy/tests/values-dev.yaml";
const CAA_SA: &str = "cloud-api-adaptor";

/// The kinds of the chart that decide who may do what: applied, the rest (workloads that never run here) not.
const POLICY_KINDS: [&str; 7] = [
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
