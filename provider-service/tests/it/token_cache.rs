//! The TokenReview cache against the real control plane from `testenv`: concurrent calls with one
//! new token cost one TokenReview, and a burst of garbage tokens (more than the cache used to hold
//! in all) does not evict the caller that was let in.

use futures::StreamExt;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use provider_service::auth::Caller;
use provider_service::metrics::ResultLabels;

const AUDIENCE: &str = "provider-service";
/// Garbage tokens sent: more than the 4096 entries the whole cache held before.
const GARBAGE: usize = 4200;

fn reviews(server: &crate::common::TestServer, result: &'static str) -> u64 {
    server
        .metrics
        .auth_reviews
        .get_or_create(&ResultLabels { result })
        .get()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_review_per_token_and_garbage_evicts_no_good_caller() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-token-cache").await;
    let caller = Caller {
        namespace: ns.clone(),
        name: "cloud-api-adaptor".into(),
    };
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start_with_token_review(
        dir.path(),
        &admin,
        AUDIENCE,
        vec![caller.clone().into()],
    )
    .await;
    let client = ProviderServiceClient::new(server.channel().await);
    let token = testenv::service_account_token(&admin, &ns, "cloud-api-adaptor", &[AUDIENCE]).await;

    // Fifty concurrent calls with one token nobody reviewed yet.
    let calls = (0..50).map(|_| {
        let mut client = client.clone();
        let request = crate::common::list_providers_with_token(&token);
        async move { client.list_providers(request).await }
    });
    for answer in futures::future::join_all(calls).await {
        answer.expect("the allowed caller gets in");
    }
    assert_eq!(
        reviews(&server, "allowed"),
        1,
        "one TokenReview for 50 calls"
    );

    // A burst of distinct garbage tokens, each refused after a review of its own: the caller's
    // token with its signature replaced, which only the API server can refuse (a token that is
    // no JWT, expired or for another audience is refused before any review).
    let (signed, _signature) = token.rsplit_once('.').unwrap();
    let garbage = futures::stream::iter(0..GARBAGE)
        .map(|i| {
            let mut client = client.clone();
            let forged = format!("{signed}.garbage-{i}");
            async move {
                client
                    .list_providers(crate::common::list_providers_with_token(&forged))
                    .await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await;
    for answer in garbage {
        assert_eq!(
            answer.expect_err("garbage is refused").code(),
            tonic::Code::Unauthenticated
        );
    }
    assert_eq!(reviews(&server, "unauthenticated"), GARBAGE as u64);

    // The good caller is still cached: no second review.
    client
        .clone()
        .list_providers(crate::common::list_providers_with_token(&token))
        .await
        .expect("still let in");
    assert_eq!(
        reviews(&server, "allowed"),
        1,
        "the garbage evicted the allowed caller"
    );
}
