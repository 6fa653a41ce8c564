//! Tokens no review could accept are refused before one is asked, against the real control plane
//! from `testenv`: a token that is not a JWT, one whose payload says it expired, one for another
//! audience. Each is UNAUTHENTICATED and costs the API server nothing; a real token still gets in.

use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use provider_service::metrics::ResultLabels;

const AUDIENCE: &str = "provider-service";

fn count(server: &crate::common::TestServer, result: &'static str) -> u64 {
    server
        .metrics
        .auth_reviews
        .get_or_create(&ResultLabels { result })
        .get()
}

/// Unpadded base64url, as JWT segments are written (the pre-check's own engine).
fn base64url(bytes: &[u8]) -> String {
    use base64::Engine as _;
    provider_service::token_cache::JWT_SEGMENT.encode(bytes)
}

#[tokio::test(flavor = "multi_thread")]
async fn tokens_no_review_could_accept_cost_no_review() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-token-precheck").await;
    let grants = vec![format!("{ns}/peerpod-ctrl=ListInstances").parse().unwrap()];
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start_with_token_review(dir.path(), &admin, AUDIENCE, grants).await;
    let mut client = ProviderServiceClient::new(server.channel().await);
    let token = testenv::service_account_token(&admin, &ns, "peerpod-ctrl", &[AUDIENCE]).await;

    // The real token's header and signature around a payload that expired long ago.
    let mut segments = token.split('.');
    let (header, _payload, signature) = (
        segments.next().unwrap(),
        segments.next().unwrap(),
        segments.next().unwrap(),
    );
    let claims = serde_json::json!({
        "aud": [AUDIENCE],
        "exp": 1_000_000_000,
        "sub": format!("system:serviceaccount:{ns}:peerpod-ctrl"),
    });
    let expired = format!(
        "{header}.{}.{signature}",
        base64url(claims.to_string().as_bytes())
    );
    let elsewhere =
        testenv::service_account_token(&admin, &ns, "peerpod-ctrl", &["some-other-service"]).await;

    for (token, says) in [
        ("garbage", "not a JWT"),
        (expired.as_str(), "expired"),
        (elsewhere.as_str(), "audience"),
    ] {
        let refused = client
            .list_providers(crate::common::list_providers_with_token(token))
            .await
            .unwrap_err();
        assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
        assert!(
            refused.message().contains(says),
            "{says}: {}",
            refused.message()
        );
    }
    assert_eq!(count(&server, "refused_before_review"), 3);
    for result in ["unauthenticated", "allowed", "not_allowed", "error"] {
        assert_eq!(
            count(&server, result),
            0,
            "{result}: no TokenReview was made"
        );
    }

    client
        .list_providers(crate::common::list_providers_with_token(&token))
        .await
        .expect("a real token is reviewed and let in");
    assert_eq!(count(&server, "allowed"), 1);
}
