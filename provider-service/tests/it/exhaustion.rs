//! provider-service against what anyone who reaches its port can send, with callers checked by
//! the real API server from `testenv`: a flood of connections, streams and forged tokens leaves an
//! authenticated DeleteInstance served; a peer past its connection cap is closed while its other
//! connections go on; deletes left running past their caps are refused with RESOURCE_EXHAUSTED.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures::future::BoxFuture;
use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use provider_service::auth::Grant;
use test_support::silent_host::SilentHost;
use tonic::transport::{Channel, Endpoint};
use tonic_types::StatusExt;

const AUDIENCE: &str = "provider-service";

/// Holds the API server's answers to TokenReviews while closed, so a review stays in flight for as
/// long as the test needs: the requests go to the real API server, only their answers wait.
#[derive(Clone)]
struct ReviewGate {
    open: Arc<tokio::sync::watch::Sender<bool>>,
    held: Arc<AtomicUsize>,
}

impl ReviewGate {
    fn new() -> Self {
        ReviewGate {
            open: Arc::new(tokio::sync::watch::Sender::new(true)),
            held: Arc::default(),
        }
    }

    fn close(&self) {
        self.open.send_replace(false);
    }

    fn open(&self) {
        self.open.send_replace(true);
    }

    /// Reviews held now.
    fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// An admin client of `cp` whose TokenReviews pass this gate.
    async fn client(&self, cp: &testenv::ControlPlane) -> kube::Client {
        let config = cp.config().await.unwrap();
        kube::client::ClientBuilder::try_from(config)
            .unwrap()
            .with_layer(self)
            .build()
    }
}

impl<S> tower::Layer<S> for ReviewGate {
    type Service = Gated<S>;
    fn layer(&self, inner: S) -> Gated<S> {
        Gated {
            inner,
            gate: self.clone(),
        }
    }
}

struct Gated<S> {
    inner: S,
    gate: ReviewGate,
}

impl<S, B> tower::Service<http::Request<B>> for Gated<S>
where
    S: tower::Service<http::Request<B>>,
    S::Future: Send + 'static,
    S::Response: Send + 'static,
    S::Error: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<'static, Result<S::Response, S::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let review = request.uri().path().ends_with("/tokenreviews");
        let answer = self.inner.call(request);
        let mut open = self.gate.open.subscribe();
        let held = self.gate.held.clone();
        Box::pin(async move {
            let answer = answer.await;
            if review && !*open.borrow() {
                held.fetch_add(1, Ordering::SeqCst);
                let _ = open.wait_for(|open| *open).await;
                held.fetch_sub(1, Ordering::SeqCst);
            }
            answer
        })
    }
}

/// `token` with its signature replaced: the shape, audience and expiry of a real token, which only
/// the API server can refuse.
fn forged(token: &str, i: usize) -> String {
    let (signed, _signature) = token.rsplit_once('.').unwrap();
    format!("{signed}.{}", "A".repeat(300) + &format!("{i:08}"))
}

fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request
        .metadata_mut()
        .insert("authorization", format!("Bearer {token}").parse().unwrap());
    request
}

fn delete(instance_id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: "libvirt".into(),
        instance_id: instance_id.into(),
        requester: None,
        accept_in_progress: true,
    }
}

/// A TCP connection from `source` (any address of 127/8 is this host's) to `to`, left idle.
async fn idle_connection(source: Ipv4Addr, to: SocketAddr) -> Option<tokio::net::TcpStream> {
    let socket = tokio::net::TcpSocket::new_v4().ok()?;
    socket.bind(SocketAddr::from((source, 0))).ok()?;
    socket.connect(to).await.ok()
}

#[tokio::test(flavor = "multi_thread")]
async fn an_authenticated_delete_is_served_through_a_flood_of_unauthenticated_calls() {
    let _alone = crate::common::CPU_HEAVY.lock().await;
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-flood").await;
    let gate = ReviewGate::new();
    let reviewer = gate.client(cp).await;
    // One slot for every call and no delete reserve: one unauthenticated call holding a slot
    // while its token is reviewed would refuse the delete.
    let dir = crate::common::config_dir(&[
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", "test:///default"),
        ("MAX_CALLS_IN_FLIGHT", "1"),
        ("DELETE_CALLS_RESERVE", "0"),
    ]);
    let grants: Vec<Grant> = vec![format!("{ns}/caa=DeleteInstance").parse().unwrap()];
    let server =
        crate::common::start_with_token_review(dir.path(), &reviewer, AUDIENCE, grants).await;
    // The caller's connection and token, established and reviewed before the flood, as CAA's are.
    let mut caa = ProviderServiceClient::new(server.channel().await);
    let token = testenv::service_account_token(&admin, &ns, "caa", &[AUDIENCE]).await;
    caa.list_providers(with_token(pb::ListProvidersRequest {}, &token))
        .await
        .expect("the caller is let in");

    gate.close();
    // Idle connections from many peers, past their caps.
    let mut idle = Vec::new();
    for peer in 2..12u8 {
        for _ in 0..80 {
            idle.extend(idle_connection(Ipv4Addr::new(127, 0, 0, peer), server.addr).await);
        }
    }
    // Connections with many streams each: forged tokens (each reviewed, its answer held) and calls
    // with no token at all.
    let mut flood = Vec::new();
    for c in 0..16 {
        let channel = server.channel().await;
        for s in 0..32 {
            let mut client = ProviderServiceClient::new(channel.clone());
            let i = c * 32 + s;
            let request = if i % 4 == 0 {
                tonic::Request::new(delete("2f0c1c55-8d7e-4f43-a4b6-1f9e6c0b7a11"))
            } else {
                with_token(
                    delete("2f0c1c55-8d7e-4f43-a4b6-1f9e6c0b7a11"),
                    &forged(&token, i),
                )
            };
            flood.push(tokio::spawn(async move {
                client.delete_instance(request).await
            }));
        }
    }
    crate::common::eventually("forged tokens in review", || async {
        (gate.held() > 0).then_some(())
    })
    .await;

    let served = caa
        .delete_instance(with_token(
            delete("2f0c1c55-8d7e-4f43-a4b6-1f9e6c0b7a11"),
            &token,
        ))
        .await;
    gate.open();
    let served = served.expect("the authenticated delete is served during the flood");
    assert!(
        matches!(
            served.get_ref().result(),
            pb::DeleteResult::AlreadyGone | pb::DeleteResult::InProgress
        ),
        "{served:?}"
    );
    for call in flood {
        if let Ok(Ok(answer)) = call.await {
            panic!("an unauthenticated call was served: {answer:?}");
        }
    }
    drop(idle);
}

async fn connect(server: &crate::common::TestServer) -> Result<Channel, tonic::transport::Error> {
    Endpoint::from_shared(server.url()).unwrap().connect().await
}

async fn health(channel: Channel) -> Result<(), tonic::Status> {
    tonic_health::pb::health_client::HealthClient::new(channel)
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_past_the_peers_cap_is_closed_and_the_others_go_on() {
    let dir = crate::common::config_dir(&[
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", "test:///default"),
        ("MAX_CONNECTIONS_PER_PEER", "3"),
    ]);
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let channel = connect(&server).await.expect("within the cap");
        health(channel.clone()).await.expect("within the cap");
        held.push(channel);
    }

    // The fourth from the same address is closed before it is served.
    let refused = match connect(&server).await {
        Err(e) => format!("{e:?}"),
        Ok(channel) => format!("{:?}", health(channel).await.expect_err("past the cap")),
    };
    let refusals = server
        .load
        .connections_refused
        .get_or_create(&provider_service::load::CapLabels { cap: "per_peer" })
        .get();
    // At least this one: a client's own reconnect after the refusal is refused too.
    assert!(refusals >= 1, "{refused}");
    assert_eq!(server.load.connections(), 3, "{refused}");
    for channel in &held {
        health(channel.clone())
            .await
            .expect("the connections within the cap go on");
    }

    // A connection that closes gives its place back.
    held.pop();
    crate::common::eventually("a place given back", || async {
        (server.load.connections() == 2).then_some(())
    })
    .await;
    let channel = connect(&server).await.expect("a place came back");
    health(channel).await.expect("a place came back");
}

#[tokio::test(flavor = "multi_thread")]
async fn deletes_left_running_past_their_caps_are_refused_with_resource_exhausted() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-delete-caps").await;
    // A libvirt host that never answers: every delete runs until the test ends.
    let host = SilentHost::start().await;
    let uri = host.libvirt_uri();
    let dir = crate::common::config_dir(&[
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", uri.as_str()),
        ("LIBVIRT_CALL_TIMEOUT_SECS", "600"),
        ("MAX_DETACHED_DELETES_PER_CALLER", "2"),
        ("MAX_DETACHED_DELETES", "3"),
    ]);
    let grants: Vec<Grant> = ["caa-a", "caa-b"]
        .iter()
        .map(|sa| format!("{ns}/{sa}=DeleteInstance").parse().unwrap())
        .collect();
    let server = crate::common::start_with_token_review(dir.path(), &admin, AUDIENCE, grants).await;
    let client = ProviderServiceClient::new(server.channel().await);
    let a = testenv::service_account_token(&admin, &ns, "caa-a", &[AUDIENCE]).await;
    let b = testenv::service_account_token(&admin, &ns, "caa-b", &[AUDIENCE]).await;
    let ask = |token: &str, id: &str| {
        let mut request = with_token(delete(id), token);
        // A short deadline, so each call answers "in progress" soon and leaves its delete running.
        request.set_timeout(Duration::from_secs(1));
        let mut client = client.clone();
        async move { client.delete_instance(request).await }
    };
    let ids: Vec<String> = (0..4)
        .map(|i| format!("2f0c1c55-8d7e-4f43-a4b6-1f9e6c0b7a1{i}"))
        .collect();

    for id in &ids[..2] {
        let answer = ask(&a, id).await.expect("within caa-a's cap");
        assert_eq!(answer.get_ref().result(), pb::DeleteResult::InProgress);
    }
    let refused = ask(&a, &ids[2]).await.expect_err("past caa-a's cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        refused.get_details_error_info().map(|i| i.reason),
        Some("TooManyDeletes".to_owned())
    );
    assert!(
        refused.get_details_retry_info().is_some(),
        "{refused:?} carries retry advice"
    );
    assert_eq!(
        refused.message(),
        format!(
            "{ns}/caa-a run 2 deletes already, the most MAX_DETACHED_DELETES_PER_CALLER allows (2); ask again in 5 s"
        )
    );
    // Joining a delete that runs is no new one.
    let joined = ask(&a, &ids[0]).await.expect("joining is never refused");
    assert_eq!(joined.get_ref().result(), pb::DeleteResult::InProgress);

    // Another caller has a cap of its own, until all of them run as many as the service may.
    let answer = ask(&b, &ids[2]).await.expect("caa-b is within its cap");
    assert_eq!(answer.get_ref().result(), pb::DeleteResult::InProgress);
    let refused = ask(&b, &ids[3]).await.expect_err("past the total cap");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        refused.message(),
        "all callers run 3 deletes already, the most MAX_DETACHED_DELETES allows (3); ask again in 5 s"
    );
}
