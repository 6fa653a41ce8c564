//! The AWS backend end to end: a real gRPC client over loopback, provider-service configured
//! from a config directory (as the mounted ConfigMap and Secret), the real AWS SDK, moto server.

use std::collections::HashMap;

use futures::future::join_all;
use peerpods_proto::v1 as pb;
use test_support::moto::{
    ACCESS_KEY_ID, REGION, SECRET_ACCESS_KEY, SERIAL, moto, run_instances, state_of, unknown_id,
};

fn config_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    crate::common::write_config(
        dir.path(),
        &[
            ("CLOUD_PROVIDER", "aws"),
            ("AWS_REGION", REGION),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
            ("AWS_ENDPOINT_URL", &moto().endpoint),
            ("TAGS", "cluster=grpc"),
            // moto's instances carry no cluster tag: deleting them is allowed explicitly.
            ("DELETE_UNTAGGED", "allow"),
            // moto knows every instance at once: its NotFound is believed without EC2's
            // consistency window (tested in providers/aws).
            ("AWS_NOT_FOUND_WINDOW_SECS", "0"),
        ],
    );
    dir
}

fn delete_request(instance_id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: "aws".into(),
        instance_id: instance_id.into(),
        requester: Some(pb::Requester {
            component: "test".into(),
            namespace: "ns".into(),
            name: "pod-resource-abcde".into(),
            reason: "PeerPodDeleted".into(),
        }),
        accept_in_progress: false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_instance_over_grpc_deletes_then_reports_already_gone() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let ec2 = moto().client();
    let ids = run_instances(&ec2, 1, &[("cluster", "grpc")]).await;
    let dir = config_dir();
    let server = crate::common::start(dir.path(), Default::default()).await;
    let mut client = server.client().await;

    let first = client
        .delete_instance(delete_request(&ids[0]))
        .await
        .expect("first delete")
        .into_inner();
    let second = client
        .delete_instance(delete_request(&ids[0]))
        .await
        .expect("second delete")
        .into_inner();
    let unknown = client
        .delete_instance(delete_request(&unknown_id(42)))
        .await
        .expect("unknown id")
        .into_inner();

    assert_eq!(first.result(), pb::DeleteResult::Deleted);
    assert_eq!(state_of(&ec2, &ids[0]).await, "terminated");
    assert_eq!(second.result(), pb::DeleteResult::AlreadyGone);
    assert_eq!(unknown.result(), pb::DeleteResult::AlreadyGone);
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_instance_id_over_grpc_is_invalid_argument_naming_the_field() {
    let dir = config_dir();
    let server = crate::common::start(dir.path(), Default::default()).await;
    let mut client = server.client().await;

    let status = client
        .delete_instance(delete_request("i-NOTHEX"))
        .await
        .expect_err("malformed id");

    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("instance_id"),
        "{}",
        status.message()
    );
    assert_eq!(
        server
            .metrics
            .cloud
            .count("aws", "TerminateInstances", "ok")
            + server
                .metrics
                .cloud
                .count("aws", "TerminateInstances", "error"),
        0
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn two_hundred_concurrent_grpc_deletes_share_few_cloud_calls() {
    let _serial = SERIAL.lock().await;
    let _alone = crate::common::CPU_HEAVY.lock().await;
    moto().reset();
    let ec2 = moto().client();
    let real = run_instances(&ec2, 160, &[("cluster", "grpc")]).await;
    let dir = config_dir();
    let server = crate::common::start(dir.path(), Default::default()).await;
    let client = server.client().await;

    let mut expected: HashMap<String, pb::DeleteResult> = real
        .iter()
        .map(|id| (id.clone(), pb::DeleteResult::Deleted))
        .collect();
    expected.extend((0..40).map(|n| (unknown_id(5000 + n), pb::DeleteResult::AlreadyGone)));
    assert_eq!(expected.len(), 200);

    let answers = join_all(expected.keys().map(|id| {
        let mut client = client.clone();
        let id = id.clone();
        tokio::spawn(async move {
            let answer = client.delete_instance(delete_request(&id)).await;
            (id, answer)
        })
    }))
    .await;

    for joined in answers {
        let (id, answer) = joined.expect("task");
        let answer = answer.unwrap_or_else(|status| panic!("{id}: {status}"));
        assert_eq!(answer.into_inner().result(), expected[&id], "{id}");
    }
    let cloud = &server.metrics.cloud;
    let terminate = cloud.count("aws", "TerminateInstances", "ok")
        + cloud.count("aws", "TerminateInstances", "error");
    let describe = cloud.count("aws", "DescribeAddresses", "ok");
    println!(
        "200 concurrent gRPC deletes: {terminate} TerminateInstances, {describe} DescribeAddresses"
    );
    // One call per instance would be 160. How many batches the deletes form depends on how they arrive
    // (the batcher closes a batch after 100 ms idle or 1 s): 17 to 24 on two cores while other tests run. The
    // bound says "shared", with room for a loaded machine, not a figure of speed (that is `make bench`'s).
    assert!(terminate <= 40, "{terminate} TerminateInstances calls");
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_instances_and_health_over_grpc() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let ec2 = moto().client();
    let ours = run_instances(&ec2, 2, &[("cluster", "grpc")]).await;
    run_instances(&ec2, 1, &[("cluster", "other")]).await;
    let dir = config_dir();
    let server = crate::common::start(dir.path(), Default::default()).await;
    let mut client = server.client().await;

    let capacity = client
        .get_capacity(pb::GetCapacityRequest {
            cloud_provider: "aws".into(),
        })
        .await
        .expect("capacity")
        .into_inner();
    let listed = client
        .list_instances(pb::ListInstancesRequest {
            cloud_provider: "aws".into(),
            tag_selector: [("cluster".to_owned(), "grpc".to_owned())].into(),
        })
        .await
        .expect("list")
        .into_inner();
    let providers = client
        .list_providers(pb::ListProvidersRequest {})
        .await
        .expect("providers")
        .into_inner();

    let instances = capacity.instances.expect("instances figure");
    assert_eq!(instances.limit, Some(20), "moto's max-instances");
    assert_eq!(instances.in_use, Some(2), "instances tagged cluster=grpc");
    // EC2 says nothing about memory: the figure is unset as a whole (unknown).
    assert_eq!(capacity.memory_mib, None);
    let mut listed_ids: Vec<String> = listed
        .instances
        .iter()
        .map(|i| i.instance_id.clone())
        .collect();
    listed_ids.sort();
    let mut ours_sorted = ours.clone();
    ours_sorted.sort();
    assert_eq!(listed_ids, ours_sorted);
    assert!(listed.instances.iter().all(|i| i.create_time.is_some()));
    let aws = providers
        .providers
        .iter()
        .find(|p| p.name == "aws")
        .expect("aws listed");
    assert!(aws.healthy, "{}", aws.message);
}
