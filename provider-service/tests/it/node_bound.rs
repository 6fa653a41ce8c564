//! Callers bound to their node, against the real control plane from `testenv` and libvirt's
//! `test:///default` driver: a caller granted `@node` (cloud-api-adaptor) presents the projected
//! token of its Pod, which the API server binds to that Pod's node, and may delete only the VMs whose
//! PeerPod's Pod runs on that node, or that no PeerPod names. Tried as an attacker on one node would:
//! its own token against another node's VM, and a token bound to no node.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Container, Node, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, PostParams};
use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use provider_service::auth::Grant;
use tonic_types::StatusExt;
use virt::connect::Connect;
use virt::error::ErrorNumber;

const AUDIENCE: &str = "provider-service";
/// The ServiceAccount of cloud-api-adaptor's DaemonSet, and the one of a controller.
const CAA: &str = "cloud-api-adaptor";
const CONTROLLER: &str = "peerpod-ctrl";

/// A defined, running domain of the test driver, with a fresh UUID.
fn define_domain(conn: &Connect) -> String {
    let uuid = uuid::Uuid::new_v4().to_string();
    let xml = format!(
        "<domain type='test'><name>pp-{uuid}</name><uuid>{uuid}</uuid>\
         <memory unit='MiB'>128</memory><vcpu>1</vcpu><os><type arch='i686'>hvm</type></os></domain>"
    );
    let domain = conn.define_domain_xml(&xml).unwrap();
    domain.create().unwrap();
    uuid
}

fn exists(conn: &Connect, uuid: &str) -> bool {
    match conn.lookup_domain_by_uuid_string(uuid) {
        Ok(_) => true,
        Err(e) if e.code().is(ErrorNumber::NoDomain) => false,
        Err(e) => panic!("looking up {uuid}: {e}"),
    }
}

async fn create_node(admin: &kube::Client, name: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Node::default()
    };
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node)
        .await
        .unwrap();
}

/// A Pod of ServiceAccount [`CAA`] scheduled to `node` (no kubelet runs it: the API server's view is
/// what counts). Returns its UID.
async fn create_pod(admin: &kube::Client, ns: &str, name: &str, node: &str) -> String {
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            node_name: Some(node.to_owned()),
            service_account_name: Some(CAA.to_owned()),
            automount_service_account_token: Some(false),
            containers: vec![Container {
                name: "c".into(),
                image: Some("registry.k8s.io/pause:3.10".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
        .metadata
        .uid
        .unwrap()
}

/// A PeerPod as cloud-api-adaptor writes it: naming `instance_id`, controlled by Pod `pod`.
async fn create_peerpod(
    admin: &kube::Client,
    ns: &str,
    pod: &str,
    pod_uid: &str,
    instance_id: &str,
) {
    let gvk = GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPod");
    let resource = ApiResource::from_gvk_with_plural(&gvk, "peerpods");
    let mut peerpod = DynamicObject::new(&format!("{pod}-resource-abcde"), &resource);
    peerpod.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: pod.to_owned(),
        uid: pod_uid.to_owned(),
        controller: Some(true),
        block_owner_deletion: Some(true),
    }]);
    peerpod.data = serde_json::json!({
        "spec": {"cloudProvider": "libvirt", "instanceID": instance_id}
    });
    Api::<DynamicObject>::namespaced_with(admin.clone(), ns, &resource)
        .create(&PostParams::default(), &peerpod)
        .await
        .unwrap();
}

/// The projected token of Pod `pod` (ServiceAccount [`CAA`]), as the kubelet mounts it: the API
/// server binds it to the Pod and the Pod's node.
async fn pod_token(admin: &kube::Client, ns: &str, pod: &str, pod_uid: &str) -> String {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![AUDIENCE.to_owned()]),
            expiration_seconds: Some(3600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.to_owned()),
                uid: Some(pod_uid.to_owned()),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    };
    Api::<k8s_openapi::api::core::v1::ServiceAccount>::namespaced(admin.clone(), ns)
        .create_token_request(CAA, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .and_then(|s| s.token)
        .unwrap()
}

fn delete(token: &str, instance_id: &str) -> tonic::Request<pb::DeleteInstanceRequest> {
    let mut request = tonic::Request::new(pb::DeleteInstanceRequest {
        cloud_provider: "libvirt".into(),
        instance_id: instance_id.into(),
        requester: None,
        accept_in_progress: false,
    });
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

fn reason(status: &tonic::Status) -> Option<String> {
    status.get_details_error_info().map(|i| i.reason)
}

#[tokio::test(flavor = "multi_thread")]
async fn a_caa_token_deletes_only_its_nodes_vms() {
    let _serial = crate::libvirt::LIBVIRT.lock().await;
    let cp = testenv::shared();
    let admin = cp.client().await;
    testenv::apply_crds(&admin, "deploy/crds/peerpods.yaml").await;
    let ns = testenv::namespace(&admin, "provider-node-bound").await;
    let (node_a, node_b) = (format!("{ns}-a"), format!("{ns}-b"));
    create_node(&admin, &node_a).await;
    create_node(&admin, &node_b).await;
    // The ServiceAccount must exist before Pods that name it; the plain token is one bound to nothing.
    let unbound = testenv::service_account_token(&admin, &ns, CAA, &[AUDIENCE]).await;
    let caa_pod = create_pod(&admin, &ns, "caa-a", &node_a).await;
    let caa_a = pod_token(&admin, &ns, "caa-a", &caa_pod).await;

    let conn = Connect::open(Some("test:///default")).unwrap();
    let (vm_a, vm_b, vm_free) = (
        define_domain(&conn),
        define_domain(&conn),
        define_domain(&conn),
    );
    let work_a = create_pod(&admin, &ns, "work-a", &node_a).await;
    let work_b = create_pod(&admin, &ns, "work-b", &node_b).await;
    create_peerpod(&admin, &ns, "work-a", &work_a, &vm_a).await;
    create_peerpod(&admin, &ns, "work-b", &work_b, &vm_b).await;

    let grants: Vec<Grant> = [
        format!("{ns}/{CAA}@node=GetCapacity+DeleteInstance"),
        format!("{ns}/{CONTROLLER}=DeleteInstance+ListInstances"),
    ]
    .iter()
    .map(|g| g.parse().unwrap())
    .collect();
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start_with_token_review(dir.path(), &admin, AUDIENCE, grants).await;
    let mut client = ProviderServiceClient::new(server.channel().await);

    // CAA on node A, another node's VM: refused, and the VM is still there.
    let refused = client
        .delete_instance(delete(&caa_a, &vm_b))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    assert_eq!(reason(&refused).as_deref(), Some("NotOnCallersNode"));
    for part in [
        format!("{ns}/{CAA}"),
        format!("node {node_a}"),
        format!("{ns}/work-b-resource-abcde"),
        format!("runs on node {node_b}"),
    ] {
        assert!(
            refused.message().contains(&part),
            "{part}: {}",
            refused.message()
        );
    }
    assert!(
        exists(&conn, &vm_b),
        "node B's VM was deleted by node A's caller"
    );

    // A token bound to no node: refused outright, whatever the VM or method.
    for (what, refused) in [
        (
            "delete",
            client
                .delete_instance(delete(&unbound, &vm_b))
                .await
                .map(drop),
        ),
        (
            "capacity",
            client
                .get_capacity({
                    let mut r = tonic::Request::new(pb::GetCapacityRequest {
                        cloud_provider: "libvirt".into(),
                    });
                    r.metadata_mut().insert(
                        "authorization",
                        format!("Bearer {unbound}").parse().unwrap(),
                    );
                    r
                })
                .await
                .map(drop),
        ),
    ] {
        let refused = refused.unwrap_err();
        assert_eq!(
            refused.code(),
            tonic::Code::PermissionDenied,
            "{what}: {refused:?}"
        );
        assert_eq!(reason(&refused).as_deref(), Some("NodeNotBound"), "{what}");
        assert!(
            refused.message().contains(&format!("{ns}/{CAA}")),
            "{}",
            refused.message()
        );
    }
    assert!(exists(&conn, &vm_b));
    assert!(exists(&conn, &vm_free), "the unbound token deleted nothing");

    // Its own node's VM, and one no PeerPod names: deleted.
    for vm in [&vm_a, &vm_free] {
        let answer = client
            .delete_instance(delete(&caa_a, vm))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(answer.result(), pb::DeleteResult::Deleted, "{vm}");
        assert!(!exists(&conn, vm), "{vm}");
    }

    // The controllers stay unrestricted: peerpod-ctrl deletes node B's VM with a plain token.
    let controller = testenv::service_account_token(&admin, &ns, CONTROLLER, &[AUDIENCE]).await;
    let answer = client
        .delete_instance(delete(&controller, &vm_b))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.result(), pb::DeleteResult::Deleted);
    assert!(!exists(&conn, &vm_b));

    let nodes: Api<Node> = Api::all(admin.clone());
    for node in [&node_a, &node_b] {
        let _ = nodes.delete(node, &Default::default()).await;
    }
}

/// A path under the service that names no method is PERMISSION_DENIED (reason UnknownMethod) for
/// everyone, the fully granted caller included, and costs no TokenReview.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_method_is_permission_denied() {
    use provider_service::metrics::ResultLabels;

    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-unknown-method").await;
    let grants: Vec<Grant> = vec![format!("{ns}/{CONTROLLER}").parse().unwrap()];
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start_with_token_review(dir.path(), &admin, AUDIENCE, grants).await;
    let token = testenv::service_account_token(&admin, &ns, CONTROLLER, &[AUDIENCE]).await;

    for token in [Some(token.as_str()), None] {
        let mut grpc = tonic::client::Grpc::new(server.channel().await);
        grpc.ready().await.unwrap();
        let mut request = tonic::Request::new(pb::ListProvidersRequest {});
        if let Some(token) = token {
            request
                .metadata_mut()
                .insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        let refused = grpc
            .unary::<_, pb::ListProvidersResponse, _>(
                request,
                http::uri::PathAndQuery::from_static(
                    "/peerpods.provider.v1.ProviderService/DeleteEverything",
                ),
                tonic_prost::ProstCodec::default(),
            )
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
        assert_eq!(reason(&refused).as_deref(), Some("UnknownMethod"));
        assert!(
            refused.message().contains("DeleteEverything"),
            "{}",
            refused.message()
        );
    }
    let reviews: u64 = ["allowed", "unauthenticated", "not_allowed", "error"]
        .into_iter()
        .map(|result| {
            server
                .metrics
                .auth_reviews
                .get_or_create(&ResultLabels { result })
                .get()
        })
        .sum();
    assert_eq!(
        reviews, 0,
        "an unknown method is refused before its token is reviewed"
    );
}

/// provider-service with only what it needs to review tokens: RBAC of its own, through a client
/// that is its ServiceAccount (the chart's ClusterRole before node binding), `rules` added.
async fn service_account_client(
    cp: &testenv::ControlPlane,
    admin: &kube::Client,
    ns: &str,
    rules: Vec<k8s_openapi::api::rbac::v1::PolicyRule>,
) -> kube::Client {
    use k8s_openapi::api::rbac::v1::{
        ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject,
    };
    use kube::api::{Patch, PatchParams};
    let name = format!("{ns}-provider-service");
    let mut all = vec![PolicyRule {
        api_groups: Some(vec!["authentication.k8s.io".into()]),
        resources: Some(vec!["tokenreviews".into()]),
        verbs: vec!["create".into()],
        ..PolicyRule::default()
    }];
    all.extend(rules);
    let role = ClusterRole {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        rules: Some(all),
        ..ClusterRole::default()
    };
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: name.clone(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "provider-service".into(),
            namespace: Some(ns.to_owned()),
            ..Subject::default()
        }]),
    };
    let apply = PatchParams::apply("node-bound-test").force();
    Api::<ClusterRole>::all(admin.clone())
        .patch(&name, &apply, &Patch::Apply(&role))
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .patch(&name, &apply, &Patch::Apply(&binding))
        .await
        .unwrap();
    let token = testenv::service_account_token(admin, ns, "provider-service", &[]).await;
    cp.client_with_token(&token).await
}

/// Fail closed: a provider-service that may not read PeerPods and Pods refuses a node-bound
/// caller's delete as UNAVAILABLE (reason PlacementUnavailable) and deletes nothing; once its
/// ServiceAccount may list PeerPods and get Pods (what node binding needs of it), the same delete
/// goes through.
#[tokio::test(flavor = "multi_thread")]
async fn a_placement_that_cannot_be_read_refuses_the_delete() {
    use k8s_openapi::api::rbac::v1::PolicyRule;

    let _serial = crate::libvirt::LIBVIRT.lock().await;
    let cp = testenv::shared();
    let admin = cp.client().await;
    testenv::apply_crds(&admin, "deploy/crds/peerpods.yaml").await;
    let ns = testenv::namespace(&admin, "provider-node-unreadable").await;
    let node = format!("{ns}-a");
    create_node(&admin, &node).await;
    testenv::service_account_token(&admin, &ns, CAA, &[AUDIENCE]).await;
    let caa_pod = create_pod(&admin, &ns, "caa-a", &node).await;
    let caa = pod_token(&admin, &ns, "caa-a", &caa_pod).await;
    let conn = Connect::open(Some("test:///default")).unwrap();
    let vm = define_domain(&conn);

    let reviewer = service_account_client(cp, &admin, &ns, vec![]).await;
    let grants = vec![
        format!("{ns}/{CAA}@node=DeleteInstance")
            .parse::<Grant>()
            .unwrap(),
    ];
    let dir = crate::common::libvirt_config_dir();
    let server =
        crate::common::start_with_token_review(dir.path(), &reviewer, AUDIENCE, grants).await;
    let mut client = ProviderServiceClient::new(server.channel().await);

    let refused = client.delete_instance(delete(&caa, &vm)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert_eq!(reason(&refused).as_deref(), Some("PlacementUnavailable"));
    assert!(refused.message().contains(&vm), "{}", refused.message());
    assert!(exists(&conn, &vm), "deleted without knowing whose it is");

    service_account_client(
        cp,
        &admin,
        &ns,
        vec![
            PolicyRule {
                api_groups: Some(vec!["confidentialcontainers.org".into()]),
                resources: Some(vec!["peerpods".into()]),
                verbs: vec!["list".into()],
                ..PolicyRule::default()
            },
            PolicyRule {
                api_groups: Some(vec![String::new()]),
                resources: Some(vec!["pods".into()]),
                verbs: vec!["get".into()],
                ..PolicyRule::default()
            },
        ],
    )
    .await;
    let answer = crate::common::eventually("the grant takes effect", || {
        let mut client = client.clone();
        let request = delete(&caa, &vm);
        async move { client.delete_instance(request).await.ok() }
    })
    .await;
    assert_eq!(answer.into_inner().result(), pb::DeleteResult::Deleted);
    assert!(!exists(&conn, &vm));
    let _ = Api::<Node>::all(admin.clone())
        .delete(&node, &Default::default())
        .await;
}
