//! A VM tagged `peerpods.io/do-not-delete` survives every DeleteInstance, with or without a cluster tag
//! configured: FAILED_PRECONDITION, reason `DoNotDelete`, the VM and its parts untouched. Through gRPC on AWS
//! (the real SDK against moto) and on Alibaba Cloud (its emulator), whose delete paths ask the shared owner
//! check (`OwnerTag::check`); the value `false` does not protect.

use peerpods_emulator_alibabacloud::AlibabaCloudEmulator;
use peerpods_proto::DO_NOT_DELETE;
use peerpods_proto::v1 as pb;
use test_support::cloud::{self, CloudEmulator};
use test_support::moto;
use tonic_types::StatusExt;

const CLUSTER: (&str, &str) = ("peerpods-cluster", "c1");

fn delete(provider: &str, instance_id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: provider.into(),
        instance_id: instance_id.into(),
        requester: None,
        accept_in_progress: false,
    }
}

/// provider-service serving AWS (moto) and Alibaba Cloud (`alibaba`) from `dir`, with one owner choice
/// (`CLUSTER_TAG` or `DELETE_UNTAGGED`).
async fn serve(
    alibaba: &AlibabaCloudEmulator,
    dir: &std::path::Path,
    owner_choice: (&str, &str),
) -> crate::common::TestServer {
    let config = cloud::merged_config(
        &["aws", "alibabacloud"],
        alibaba
            .config()
            .into_iter()
            .chain(moto::moto().config(&[]))
            .chain([(owner_choice.0.to_owned(), owner_choice.1.to_owned())]),
    );
    let pairs: Vec<(&str, &str)> = config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    crate::common::write_config(dir, &pairs);
    crate::common::start(dir, Default::default()).await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_vm_marked_do_not_delete_survives_every_delete() {
    let _moto = moto::SERIAL.lock().await;
    moto::moto().reset();
    let ec2 = moto::moto().client();
    let alibaba = AlibabaCloudEmulator::start();
    let marked_tags = [CLUSTER, (DO_NOT_DELETE, "true")];
    let aws_marked = moto::run_instances(&ec2, 1, &marked_tags).await.remove(0);
    let aws_unmarked = moto::run_instances(&ec2, 1, &[CLUSTER, (DO_NOT_DELETE, "false")])
        .await
        .remove(0);
    let ali_marked = alibaba.create_vm("pod-marked", &marked_tags);
    let ali_unmarked = alibaba.create_vm("pod-unmarked", &[CLUSTER, (DO_NOT_DELETE, "false")]);

    for owner_choice in [
        ("CLUSTER_TAG", format!("{}={}", CLUSTER.0, CLUSTER.1)),
        ("DELETE_UNTAGGED", "allow".to_owned()),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let server = serve(&alibaba, dir.path(), (owner_choice.0, &owner_choice.1)).await;
        let mut client = server.client().await;

        for (provider, id) in [("aws", &aws_marked), ("alibabacloud", &ali_marked)] {
            let refused = client
                .delete_instance(delete(provider, id))
                .await
                .expect_err("a VM marked do-not-delete");
            assert_eq!(
                refused.code(),
                tonic::Code::FailedPrecondition,
                "{provider} with {owner_choice:?}: {refused:?}"
            );
            assert_eq!(
                refused.get_details_error_info().map(|i| i.reason),
                Some("DoNotDelete".to_owned()),
                "{provider}"
            );
            assert!(refused.message().contains(id.as_str()), "{refused:?}");
        }
        assert_eq!(moto::state_of(&ec2, &aws_marked).await, "running");
        assert!(alibaba.vm_or_parts_exist(&ali_marked));
    }

    // `false` does not protect: those are deleted as usual.
    let dir = tempfile::tempdir().unwrap();
    let server = serve(&alibaba, dir.path(), ("DELETE_UNTAGGED", "allow")).await;
    let mut client = server.client().await;
    for (provider, id) in [("aws", &aws_unmarked), ("alibabacloud", &ali_unmarked)] {
        let answer = client
            .delete_instance(delete(provider, id))
            .await
            .unwrap_or_else(|e| panic!("{provider}: {e:?}"))
            .into_inner();
        assert_eq!(answer.result(), pb::DeleteResult::Deleted, "{provider}");
    }
    assert_eq!(moto::state_of(&ec2, &aws_unmarked).await, "terminated");
    assert_eq!(moto::state_of(&ec2, &aws_marked).await, "running");
}
