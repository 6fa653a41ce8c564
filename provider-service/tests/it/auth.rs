//! Caller authentication against the real control plane from `testenv`: tokens are minted with
//! TokenRequest and checked by provider-service with TokenReview.

use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use peerpods_provider_client::{ProviderClientConfig, connect};
use provider_service::auth::Caller;

const AUDIENCE: &str = "provider-service";

#[tokio::test(flavor = "multi_thread")]
async fn only_allowed_service_accounts_with_our_audience_get_in() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-auth").await;
    let allowed = Caller {
        namespace: ns.clone(),
        name: "peerpod-ctrl".into(),
    };
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start_with_token_review(
        dir.path(),
        &admin,
        AUDIENCE,
        vec![allowed.clone().into()],
    )
    .await;
    let mut client = ProviderServiceClient::new(server.channel().await);

    // No token.
    let status = client
        .list_providers(pb::ListProvidersRequest {})
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // Not a token at all.
    let status = client
        .list_providers(crate::common::list_providers_with_token("garbage"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // A valid token of a ServiceAccount that is not in the allow-list.
    let intruder = testenv::service_account_token(&admin, &ns, "intruder", &[AUDIENCE]).await;
    let status = client
        .list_providers(crate::common::list_providers_with_token(&intruder))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(
        status.message().contains(&format!("{ns}/intruder")),
        "{}",
        status.message()
    );

    // The allowed ServiceAccount, but its token is for another audience.
    let elsewhere =
        testenv::service_account_token(&admin, &ns, "peerpod-ctrl", &["some-other-service"]).await;
    let status = client
        .list_providers(crate::common::list_providers_with_token(&elsewhere))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // The allowed ServiceAccount with the right audience, through the runtime client that
    // reads the projected token file as controllers do.
    let token = testenv::service_account_token(&admin, &ns, "peerpod-ctrl", &[AUDIENCE]).await;
    let token_dir = tempfile::tempdir().unwrap();
    let token_file = token_dir.path().join("token");
    std::fs::write(&token_file, &token).unwrap();
    let mut runtime_client = connect(&ProviderClientConfig {
        endpoint: server.url(),
        token_file: Some(token_file),
        ..Default::default()
    })
    .unwrap();
    let providers = runtime_client
        .list_providers(pb::ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(providers.providers[0].name, "libvirt");
    let gone = runtime_client
        .delete_instance(pb::DeleteInstanceRequest {
            cloud_provider: "libvirt".into(),
            instance_id: "2f0c1c55-8d7e-4f43-a4b6-1f9e6c0b7a11".into(),
            requester: None,
            accept_in_progress: false,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(gone.result(), pb::DeleteResult::AlreadyGone);

    // Health checks need no token (kubelet gRPC probes cannot send one).
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "peerpods.provider.v1.ProviderService".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        serving.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
}

/// Each caller may call only the methods granted to it: the chart's defaults give peerpod-ctrl
/// DeleteInstance + ListInstances, peer-pod-config-ctrl GetCapacity, CAA GetCapacity +
/// DeleteInstance. Anything else is PERMISSION_DENIED with reason `MethodNotAllowed`, before any
/// provider is asked.
#[tokio::test(flavor = "multi_thread")]
async fn callers_may_call_only_their_methods() {
    use provider_service::auth::Grant;
    use tonic_types::StatusExt;

    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-methods").await;
    let grants: Vec<Grant> = [
        format!("{ns}/peerpod-ctrl=DeleteInstance+ListInstances"),
        format!("{ns}/peer-pod-config-ctrl=GetCapacity"),
        format!("{ns}/caa=GetCapacity+DeleteInstance"),
    ]
    .iter()
    .map(|g| g.parse().unwrap())
    .collect();
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start_with_token_review(dir.path(), &admin, AUDIENCE, grants).await;
    let channel = server.channel().await;

    let delete = |token: &str| {
        let mut request = tonic::Request::new(pb::DeleteInstanceRequest {
            cloud_provider: "libvirt".into(),
            instance_id: "2f0c1c55-8d7e-4f43-a4b6-1f9e6c0b7a11".into(),
            requester: None,
            accept_in_progress: false,
        });
        request
            .metadata_mut()
            .insert("authorization", format!("bearer {token}").parse().unwrap());
        request
    };
    let capacity = |token: &str| {
        let mut request = tonic::Request::new(pb::GetCapacityRequest {
            cloud_provider: "libvirt".into(),
        });
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        request
    };
    let list = |token: &str| {
        let mut request = tonic::Request::new(pb::ListInstancesRequest {
            cloud_provider: "libvirt".into(),
            tag_selector: Default::default(),
        });
        request
            .metadata_mut()
            .insert("authorization", format!("BEARER {token}").parse().unwrap());
        request
    };
    let assert_refused = |status: tonic::Status, who: &str, method: &str| {
        assert_eq!(
            status.code(),
            tonic::Code::PermissionDenied,
            "{who} {method}: {status:?}"
        );
        assert_eq!(
            status.get_details_error_info().map(|i| i.reason),
            Some("MethodNotAllowed".to_owned()),
            "{who} {method}"
        );
        assert!(
            status.message().contains(&format!("{ns}/{who}")) && status.message().contains(method),
            "{}",
            status.message()
        );
    };

    let mut client = ProviderServiceClient::new(channel);
    let token = |name: &'static str| {
        let admin = admin.clone();
        let ns = ns.clone();
        async move { testenv::service_account_token(&admin, &ns, name, &[AUDIENCE]).await }
    };

    // peerpod-ctrl: deletes and lists, but asks no capacity. (The scheme is case-insensitive.)
    let peerpod_ctrl = token("peerpod-ctrl").await;
    client.delete_instance(delete(&peerpod_ctrl)).await.unwrap();
    client.list_instances(list(&peerpod_ctrl)).await.unwrap();
    let refused = client
        .get_capacity(capacity(&peerpod_ctrl))
        .await
        .unwrap_err();
    assert_refused(refused, "peerpod-ctrl", "GetCapacity");

    // peer-pod-config-ctrl: capacity only.
    let config_ctrl = token("peer-pod-config-ctrl").await;
    client.get_capacity(capacity(&config_ctrl)).await.unwrap();
    let refused = client
        .delete_instance(delete(&config_ctrl))
        .await
        .unwrap_err();
    assert_refused(refused, "peer-pod-config-ctrl", "DeleteInstance");
    let refused = client.list_instances(list(&config_ctrl)).await.unwrap_err();
    assert_refused(refused, "peer-pod-config-ctrl", "ListInstances");

    // CAA: capacity and deletes, no listing; everyone listed may see the providers.
    let caa = token("caa").await;
    client.get_capacity(capacity(&caa)).await.unwrap();
    client.delete_instance(delete(&caa)).await.unwrap();
    let refused = client.list_instances(list(&caa)).await.unwrap_err();
    assert_refused(refused, "caa", "ListInstances");
    client
        .list_providers(crate::common::list_providers_with_token(&caa))
        .await
        .unwrap();

    // Refused methods are counted apart from refused callers.
    let refused = server
        .metrics
        .auth_reviews
        .get_or_create(&provider_service::metrics::ResultLabels {
            result: "method_not_allowed",
        })
        .get();
    assert_eq!(refused, 4);
}
