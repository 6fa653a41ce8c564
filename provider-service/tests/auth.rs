//! Caller authentication against the real control plane from `testenv`: tokens are minted with
//! TokenRequest and checked by provider-service with TokenReview.

mod common;

use std::sync::Arc;

use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use peerpods_runtime::client::{ProviderClientConfig, connect};
use provider_service::auth::{Caller, TokenReviewer};
use provider_service::metrics::Metrics;

const AUDIENCE: &str = "provider-service";

fn config_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    common::write_config(
        dir.path(),
        &[
            ("CLOUD_PROVIDER", "libvirt"),
            ("LIBVIRT_URI", "test:///default"),
        ],
    );
    dir
}

fn with_token(token: &str) -> tonic::Request<pb::ListProvidersRequest> {
    let mut request = tonic::Request::new(pb::ListProvidersRequest {});
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

#[tokio::test(flavor = "multi_thread")]
async fn only_allowed_service_accounts_with_our_audience_get_in() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-auth").await;
    let allowed = Caller {
        namespace: ns.clone(),
        name: "peerpod-ctrl".into(),
    };
    let metrics = Metrics::default();
    let reviewer = Arc::new(TokenReviewer::new(
        admin.clone(),
        AUDIENCE,
        [allowed.clone()],
        metrics.clone(),
    ));
    let dir = config_dir();
    let server = common::start_with_metrics(
        dir.path(),
        common::Options {
            reviewer: Some(reviewer),
            ..Default::default()
        },
        metrics,
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
        .list_providers(with_token("garbage"))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unauthenticated, "{status:?}");

    // A valid token of a ServiceAccount that is not in the allow-list.
    let intruder = testenv::service_account_token(&admin, &ns, "intruder", &[AUDIENCE]).await;
    let status = client
        .list_providers(with_token(&intruder))
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
        .list_providers(with_token(&elsewhere))
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
