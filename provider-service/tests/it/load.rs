//! provider-service under load, through the real gRPC client: capacity polls share one cloud
//! call (AWS through the real SDK against moto, counted by moto per access key), deletes run
//! beside a flood of polls, calls past the service's bound are refused at once with
//! RESOURCE_EXHAUSTED and retry advice (a libvirt host that accepts connections and never
//! answers holds calls in flight), the health service still answers meanwhile, and ListProviders
//! answers without waiting for any cloud.

use std::time::Duration;

use futures::future::join_all;
use peerpods_proto::v1 as pb;
use test_support::moto::{REGION, SECRET_ACCESS_KEY, SERIAL, moto, run_instances, state_of};
use test_support::silent_host::SilentHost;
use tonic_types::StatusExt;

/// provider-service's own AWS key: moto counts the calls signed with it apart from the test's.
const SERVICE_KEY: &str = "AKIDLOADSHEDDING";

fn aws_config_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    crate::common::write_config(
        dir.path(),
        &[
            ("CLOUD_PROVIDER", "aws"),
            ("AWS_REGION", REGION),
            ("AWS_ACCESS_KEY_ID", SERVICE_KEY),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
            ("AWS_ENDPOINT_URL", &moto().endpoint),
            ("DELETE_UNTAGGED", "allow"),
            ("AWS_NOT_FOUND_WINDOW_SECS", "0"),
        ],
    );
    dir
}

fn capacity(provider: &str) -> pb::GetCapacityRequest {
    pb::GetCapacityRequest {
        cloud_provider: provider.into(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_capacity_polls_costs_one_cloud_call_and_deletes_proceed() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let ec2 = moto().client();
    let ids = run_instances(&ec2, 20, &[("cluster", "load")]).await;
    let dir = aws_config_dir();
    let server = crate::common::start(dir.path(), Default::default()).await;
    let client = server.client().await;

    let polls = (0..300).map(|_| {
        let mut client = client.clone();
        async move { client.get_capacity(capacity("aws")).await }
    });
    let deletes = ids.iter().map(|id| {
        let mut client = client.clone();
        let request = pb::DeleteInstanceRequest {
            cloud_provider: "aws".into(),
            instance_id: id.clone(),
            requester: None,
            accept_in_progress: false,
        };
        async move { client.delete_instance(request).await }
    });
    let (polls, deletes) = tokio::join!(join_all(polls), join_all(deletes));

    for answer in polls {
        let answer = answer.expect("GetCapacity").into_inner();
        assert!(answer.instances.is_some(), "{answer:?}");
    }
    for answer in deletes {
        let answer = answer.expect("DeleteInstance").into_inner();
        assert_eq!(answer.result(), pb::DeleteResult::Deleted);
    }
    for id in &ids {
        assert_eq!(state_of(&ec2, id).await, "terminated");
    }
    let requests = moto().requests_signed_by(SERVICE_KEY);
    assert_eq!(
        requests.get("DescribeAccountAttributes").copied(),
        Some(1),
        "300 concurrent polls, one cloud call: {requests:?}"
    );
}

fn hung_libvirt_config_dir(host: &SilentHost, extra: &[(&str, &str)]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let uri = host.libvirt_uri();
    let mut pairs = vec![
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", uri.as_str()),
        // Longer than the test: the calls stay in flight until it ends.
        ("LIBVIRT_CALL_TIMEOUT_SECS", "600"),
    ];
    pairs.extend_from_slice(extra);
    crate::common::write_config(dir.path(), &pairs);
    dir
}

#[tokio::test(flavor = "multi_thread")]
async fn calls_past_the_bound_are_refused_with_retry_advice() {
    let host = SilentHost::start().await;
    let dir = hung_libvirt_config_dir(&host, &[("MAX_CALLS_IN_FLIGHT", "3")]);
    let server = crate::common::start(dir.path(), Default::default()).await;
    let client = server.client().await;

    let held: Vec<_> = (0..3)
        .map(|_| {
            let mut client = client.clone();
            tokio::spawn(async move { client.get_capacity(capacity("libvirt")).await })
        })
        .collect();
    crate::common::eventually("three calls in flight", || async {
        (server.load.in_flight() == 3).then_some(())
    })
    .await;

    let refused = client
        .clone()
        .get_capacity(capacity("libvirt"))
        .await
        .expect_err("past the bound");
    assert_eq!(
        refused.code(),
        tonic::Code::ResourceExhausted,
        "{refused:?}"
    );
    assert_eq!(
        refused.get_details_error_info().map(|i| i.reason),
        Some("Overloaded".to_owned())
    );
    assert!(
        refused
            .get_details_retry_info()
            .and_then(|r| r.retry_delay)
            .is_some_and(|d| d > Duration::ZERO),
        "{refused:?}"
    );
    // The kubelet's probe still hears the service alive.
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let serving = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: String::new(),
        })
        .await
        .expect("health answers while shedding")
        .into_inner();
    assert_eq!(
        serving.status(),
        tonic_health::pb::health_check_response::ServingStatus::Serving
    );
    for call in held {
        call.abort();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn list_providers_answers_without_waiting_for_the_cloud() {
    let host = SilentHost::start().await;
    let dir = hung_libvirt_config_dir(&host, &[]);
    let server = crate::common::start(dir.path(), Default::default()).await;
    let mut client = server.client().await;

    // Generous: a listing that checks the hung host's health waits as long as the host hangs.
    let listed = tokio::time::timeout(
        Duration::from_secs(60),
        client.list_providers(pb::ListProvidersRequest {}),
    )
    .await
    .expect("ListProviders answers while the host hangs")
    .expect("ListProviders")
    .into_inner();
    let names: Vec<&str> = listed.providers.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["libvirt"]);
    assert!(!listed.providers[0].healthy, "never checked: not healthy");
}
