//! The local control plane behaves like a real cluster where our controllers depend on it.

use std::time::Duration;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::Client;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams,
};
use kube::core::GroupVersionKind;
use serde_json::json;

const GC_TIMEOUT: Duration = Duration::from_secs(30);

async fn setup(prefix: &str) -> (Client, String) {
    let client = testenv::shared().client().await;
    let ns = testenv::namespace(&client, prefix).await;
    (client, ns)
}

fn config_map(name: &str, owner: Option<(&ConfigMap, bool)>, finalizers: &[&str]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            finalizers: (!finalizers.is_empty())
                .then(|| finalizers.iter().map(|f| (*f).to_owned()).collect()),
            owner_references: owner.map(|(o, block)| {
                vec![OwnerReference {
                    api_version: "v1".into(),
                    kind: "ConfigMap".into(),
                    name: o.metadata.name.clone().unwrap_or_default(),
                    uid: o.metadata.uid.clone().unwrap_or_default(),
                    block_owner_deletion: Some(block),
                    controller: Some(true),
                }]
            }),
            ..ObjectMeta::default()
        },
        ..ConfigMap::default()
    }
}

#[tokio::test]
async fn api_server_is_ready_and_reports_its_version() {
    let client = testenv::shared().client().await;
    let readyz = client
        .request_text(
            http::Request::get("/readyz")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("GET /readyz");
    assert_eq!(readyz, "ok");
    let version = client.apiserver_version().await.expect("GET /version");
    assert_eq!(
        (version.major.as_str(), version.minor.as_str()),
        ("1", "37")
    );
    // Benchmarks record how the control plane is tuned for speed; it says so itself.
    let tuning = testenv::shared().tuning();
    assert!(
        tuning.iter().any(|t| t == "etcd-unsafe-no-fsync"),
        "{tuning:?}"
    );
}

#[tokio::test]
async fn crd_from_yaml_is_established_and_serves_custom_objects() {
    let (client, ns) = setup("crd").await;
    testenv::apply_crds(&client, "testenv/tests/fixtures/widgets.yaml").await;
    let resource = ApiResource::from_gvk(&GroupVersionKind::gvk(
        "testenv.example.com",
        "v1",
        "Widget",
    ));
    let widgets: Api<DynamicObject> = Api::namespaced_with(client, &ns, &resource);
    let widget: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "testenv.example.com/v1", "kind": "Widget",
        "metadata": {"name": "w1"}, "spec": {"size": 3}
    }))
    .expect("widget");
    widgets
        .create(&PostParams::default(), &widget)
        .await
        .expect("create widget");
    let read = widgets.get("w1").await.expect("get widget");
    assert_eq!(read.data["spec"]["size"], 3);

    // The schema is enforced by the API server.
    let mut invalid = widget.clone();
    invalid.metadata.name = Some("w2".into());
    invalid.data["spec"]["size"] = json!(0);
    let err = widgets
        .create(&PostParams::default(), &invalid)
        .await
        .expect_err("size 0 violates minimum");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 422),
        "{err}"
    );
}

#[tokio::test]
async fn garbage_collector_deletes_dependents_of_a_deleted_owner() {
    let (client, ns) = setup("gc-background").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    let owner = cms
        .create(&PostParams::default(), &config_map("owner", None, &[]))
        .await
        .expect("owner");
    cms.create(
        &PostParams::default(),
        &config_map("dependent", Some((&owner, false)), &[]),
    )
    .await
    .expect("dependent");

    cms.delete("owner", &DeleteParams::background())
        .await
        .expect("delete owner");
    testenv::wait_for(
        "dependent deleted by the garbage collector",
        GC_TIMEOUT,
        || async {
            cms.get_opt("dependent")
                .await
                .expect("get")
                .is_none()
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn foreground_deletion_keeps_the_owner_until_its_dependent_is_gone() {
    let (client, ns) = setup("gc-foreground").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    let hold = "testenv.example.com/hold";
    let owner = cms
        .create(&PostParams::default(), &config_map("owner", None, &[]))
        .await
        .expect("owner");
    cms.create(
        &PostParams::default(),
        &config_map("dependent", Some((&owner, true)), &[hold]),
    )
    .await
    .expect("dependent");

    cms.delete("owner", &DeleteParams::foreground())
        .await
        .expect("delete owner");
    // The garbage collector deletes the dependent first; our finalizer holds it there.
    testenv::wait_for("dependent marked for deletion", GC_TIMEOUT, || async {
        cms.get("dependent")
            .await
            .expect("get")
            .metadata
            .deletion_timestamp
            .map(|_| ())
    })
    .await;
    let owner = cms
        .get("owner")
        .await
        .expect("owner must wait for its dependent");
    assert!(owner.metadata.deletion_timestamp.is_some());
    assert!(
        owner
            .metadata
            .finalizers
            .unwrap_or_default()
            .contains(&"foregroundDeletion".to_owned())
    );

    let release = json!([{"op": "remove", "path": "/metadata/finalizers"}]);
    cms.patch(
        "dependent",
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(release).expect("patch")),
    )
    .await
    .expect("release dependent");
    testenv::wait_for("owner deleted after its dependent", GC_TIMEOUT, || async {
        cms.get_opt("owner")
            .await
            .expect("get")
            .is_none()
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn finalizer_blocks_deletion_until_removed() {
    let (client, ns) = setup("finalizer").await;
    let cms: Api<ConfigMap> = Api::namespaced(client, &ns);
    cms.create(
        &PostParams::default(),
        &config_map("held", None, &["testenv.example.com/hold"]),
    )
    .await
    .expect("create");

    cms.delete("held", &DeleteParams::default())
        .await
        .expect("delete");
    let held = cms
        .get("held")
        .await
        .expect("still there while the finalizer is");
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp visible meanwhile"
    );

    let release = json!([{"op": "remove", "path": "/metadata/finalizers"}]);
    cms.patch(
        "held",
        &PatchParams::default(),
        &Patch::<()>::Json(serde_json::from_value(release).expect("patch")),
    )
    .await
    .expect("remove finalizer");
    assert!(
        cms.get_opt("held").await.expect("get").is_none(),
        "gone once the finalizer is removed"
    );
}

#[tokio::test]
async fn rbac_denies_a_service_account_until_a_role_allows_it() {
    let (admin, ns) = setup("rbac").await;
    let token = testenv::service_account_token(&admin, &ns, "reader", &[]).await;
    let as_reader = testenv::shared().client_with_token(&token).await;
    let cms: Api<ConfigMap> = Api::namespaced(as_reader, &ns);

    let err = cms
        .list(&Default::default())
        .await
        .expect_err("no role yet");
    assert!(
        matches!(err, kube::Error::Api(ref s) if s.code == 403),
        "{err}"
    );

    let role = Role {
        metadata: ObjectMeta {
            name: Some("read-configmaps".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            verbs: vec!["list".into()],
            ..PolicyRule::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("role");
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("reader".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "read-configmaps".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "reader".into(),
            namespace: Some(ns.clone()),
            ..Subject::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("binding");
    testenv::wait_for(
        "list allowed by the new Role",
        Duration::from_secs(10),
        || async { cms.list(&Default::default()).await.ok() },
    )
    .await;
}

#[tokio::test]
async fn token_review_authenticates_a_service_account_token_for_its_audience() {
    let (admin, ns) = setup("tokenreview").await;
    let token = testenv::service_account_token(&admin, &ns, "caller", &["provider-service"]).await;
    let reviews: Api<TokenReview> = Api::all(admin);
    let review = |audience: &str| TokenReview {
        spec: TokenReviewSpec {
            token: token.clone(),
            audiences: Some(vec![audience.to_owned()]),
        },
        ..TokenReview::default()
    };

    let ok = reviews
        .create(&PostParams::default(), &review("provider-service"))
        .await
        .expect("review");
    let status = ok.status.expect("status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    assert_eq!(
        status.user.and_then(|u| u.username).as_deref(),
        Some(format!("system:serviceaccount:{ns}:caller").as_str())
    );

    let wrong = reviews
        .create(&PostParams::default(), &review("someone-else"))
        .await
        .expect("review");
    assert_ne!(
        wrong.status.and_then(|s| s.authenticated),
        Some(true),
        "wrong audience must not authenticate"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn audit_log_records_who_did_what_with_which_credential() {
    // A control plane of its own: the shared one keeps no audit log.
    let cp = testenv::ControlPlane::start_audited()
        .await
        .expect("audited control plane");
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "audit").await;
    let first = testenv::service_account_token(&admin, &ns, "app", &[]).await;
    let second = testenv::service_account_token(&admin, &ns, "app", &[]).await;
    let (first_id, second_id) = (
        testenv::credential_id(&admin, &first).await,
        testenv::credential_id(&admin, &second).await,
    );
    assert_ne!(first_id, second_id, "each token is its own credential");

    // Allowed: every ServiceAccount may review its own access. Refused: reading ConfigMaps.
    let as_first = cp.client_with_token(&first).await;
    let review = k8s_openapi::api::authorization::v1::SelfSubjectAccessReview {
        spec: k8s_openapi::api::authorization::v1::SelfSubjectAccessReviewSpec {
            resource_attributes: Some(k8s_openapi::api::authorization::v1::ResourceAttributes {
                resource: Some("configmaps".into()),
                verb: Some("get".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<k8s_openapi::api::authorization::v1::SelfSubjectAccessReview>::all(as_first.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("self review");
    let refused = Api::<ConfigMap>::namespaced(as_first, &ns)
        .get("settings")
        .await
        .expect_err("no grant");
    assert!(matches!(refused, kube::Error::Api(ref s) if s.code == 403));
    let as_second = cp.client_with_token(&second).await;
    let _ = Api::<ConfigMap>::namespaced(as_second, &ns)
        .list(&Default::default())
        .await;

    let user = format!("system:serviceaccount:{ns}:app");
    let events = testenv::wait_for("the requests in the audit log", GC_TIMEOUT, || async {
        let events: Vec<_> = cp
            .audit_events()
            .expect("audit events")
            .into_iter()
            .filter(|e| e.user.username == user)
            .collect();
        (events.len() >= 3).then_some(events)
    })
    .await;
    let seen: Vec<_> = events
        .iter()
        .map(|e| {
            let o = e.object_ref.clone().unwrap_or_default();
            (
                e.credential_id().unwrap_or_default().to_owned(),
                e.verb.clone(),
                o.api_group,
                o.resource,
                o.namespace,
                o.name,
                e.allowed(),
                e.code(),
            )
        })
        .collect();
    let expected = [
        (
            first_id.clone(),
            "create".to_owned(),
            "authorization.k8s.io".to_owned(),
            "selfsubjectaccessreviews".to_owned(),
            String::new(),
            String::new(),
            true,
            Some(201),
        ),
        (
            first_id,
            "get".into(),
            String::new(),
            "configmaps".into(),
            ns.clone(),
            "settings".into(),
            false,
            Some(403),
        ),
        (
            second_id,
            "list".into(),
            String::new(),
            "configmaps".into(),
            ns.clone(),
            String::new(),
            false,
            Some(403),
        ),
    ];
    assert_eq!(seen, expected);
    cp.stop();
}

#[tokio::test]
async fn the_shared_control_plane_keeps_no_audit_log() {
    let err = testenv::shared()
        .audit_events()
        .expect_err("no audit log by default");
    assert!(matches!(err, testenv::Error::AuditOff), "{err}");
}
