//! TokenReviews have a budget of their own, against the real control plane from `testenv` reached
//! through a proxy that stops answering: at most 64 reviews run at once, a new token past them is
//! UNAVAILABLE at once, and a review the API server never answers ends UNAVAILABLE after its own
//! timeout rather than holding its caller.

use std::net::SocketAddr;

use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use provider_service::metrics::ResultLabels;

const AUDIENCE: &str = "provider-service";
/// The reviews provider-service runs at once at most.
const CAP: usize = 64;
/// Calls past the cap.
const PAST: usize = 8;

#[tokio::test(flavor = "multi_thread")]
async fn reviews_past_the_cap_or_their_timeout_are_unavailable() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-review-budget").await;
    // The reviewer's client reaches the API server through a proxy that forwards nothing.
    let mut config = cp.config().await.unwrap();
    let api_server: SocketAddr = config
        .cluster_url
        .authority()
        .unwrap()
        .as_str()
        .parse()
        .unwrap();
    let proxy = testenv::proxy::Proxy::start(api_server).await.unwrap();
    proxy.black_hole();
    config.cluster_url = format!("https://{}", proxy.addr()).parse().unwrap();
    let silent = kube::Client::try_from(config).unwrap();
    let grants = vec![format!("{ns}/peerpod-ctrl=ListInstances").parse().unwrap()];
    let dir = crate::common::libvirt_config_dir();
    let server =
        crate::common::start_with_token_review(dir.path(), &silent, AUDIENCE, grants).await;

    // Distinct tokens that pass the local pre-check: a real token with its signature replaced.
    let token = testenv::service_account_token(&admin, &ns, "peerpod-ctrl", &[AUDIENCE]).await;
    let (signed, _signature) = token.rsplit_once('.').unwrap();
    let mut calls = Vec::new();
    for c in 0..(CAP + PAST).div_ceil(8) {
        let channel = server.channel().await;
        for s in 0..8 {
            let mut client = ProviderServiceClient::new(channel.clone());
            let request =
                crate::common::list_providers_with_token(&format!("{signed}.forged-{c}-{s}"));
            calls.push(tokio::spawn(
                async move { client.list_providers(request).await },
            ));
        }
    }
    // Without a timeout of their own, the reviews would hang for as long as the client waits.
    let answers = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        futures::future::join_all(calls),
    )
    .await
    .expect("every call is answered, none held by a review that never ends");
    let (mut busy, mut timed_out) = (0, 0);
    for answer in answers {
        let refused = answer.unwrap().expect_err("no forged token gets in");
        assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
        if refused.message().contains("in flight already") {
            busy += 1;
        } else if refused.message().contains("did not answer within") {
            timed_out += 1;
        } else {
            panic!("{refused:?}");
        }
    }
    assert_eq!((busy, timed_out), (PAST, CAP));
    let count = |result| {
        server
            .metrics
            .auth_reviews
            .get_or_create(&ResultLabels { result })
            .get()
    };
    assert_eq!(count("too_many_in_flight"), PAST as u64);
    assert_eq!(count("timeout"), CAP as u64);
}
