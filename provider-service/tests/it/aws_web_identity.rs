//! provider-service on AWS with a workload identity and no static key: the binary as deployed
//! with EKS's IAM roles for service accounts, whose webhook puts only `AWS_WEB_IDENTITY_TOKEN_FILE`
//! and `AWS_ROLE_ARN` in the pod's environment. The real SDK exchanges the token with STS
//! `AssumeRoleWithWebIdentity` (moto's STS, at the configured endpoint override) and signs the
//! EC2 calls with the role's temporary keys.

use std::net::SocketAddr;

use crate::common::free_addr;
use std::path::Path;
use std::process::{Command, Stdio};

use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use test_support::moto::{ACCESS_KEY_ID, REGION, SERIAL, moto, run_instances, state_of};

const ROLE_ARN: &str = "arn:aws:iam::123456789012:role/peerpods-provider-service";

/// The provider-service binary, stopped when dropped.
struct Service {
    child: std::process::Child,
    grpc: SocketAddr,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The binary reading `config_dir` (the ConfigMap: region, endpoint, tags) with only `env` as its
/// environment: no static key anywhere.
fn start(config_dir: &Path, env: &[(&str, &str)]) -> Service {
    let grpc = free_addr();
    let admin = free_addr();
    let child = Command::new(env!("CARGO_BIN_EXE_provider-service"))
        .env_clear()
        .envs(env.iter().copied())
        .args(["--auth", "none", "--listen", &grpc.to_string()])
        .args(["--admin-listen", &admin.to_string()])
        .arg("--config-dir")
        .arg(config_dir)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    Service { child, grpc }
}

async fn client(service: &Service) -> ProviderServiceClient<tonic::transport::Channel> {
    let url = format!("http://{}", service.grpc);
    let channel = crate::common::eventually("the gRPC port", || async {
        tonic::transport::Channel::from_shared(url.clone())
            .unwrap()
            .connect()
            .await
            .ok()
    })
    .await;
    ProviderServiceClient::new(channel)
}

/// The ConfigMap's keys: moto as EC2 (and so as STS), no credential.
fn config_dir() -> tempfile::TempDir {
    crate::common::config_dir(&[
        ("CLOUD_PROVIDER", "aws"),
        ("AWS_REGION", REGION),
        ("AWS_ENDPOINT_URL", &moto().endpoint),
        ("TAGS", "cluster=irsa"),
        // moto's instances carry no cluster tag: deleting them is allowed explicitly.
        ("DELETE_UNTAGGED", "allow"),
        ("AWS_NOT_FOUND_WINDOW_SECS", "0"),
        ("AWS_MAX_ATTEMPTS", "1"),
    ])
}

fn delete(instance_id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: "aws".into(),
        instance_id: instance_id.into(),
        requester: None,
        accept_in_progress: false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_web_identity_token_and_role_without_static_keys_delete_an_instance() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let ec2 = moto().client();
    let ids = run_instances(&ec2, 1, &[("cluster", "irsa")]).await;
    let config = config_dir();
    let token = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(
        token.path(),
        "eyJhbGciOiJSUzI1NiJ9.projected-token.signature\n",
    )
    .unwrap();
    let token_path = token.path().to_str().unwrap();
    let service = start(
        config.path(),
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token_path),
            ("AWS_ROLE_ARN", ROLE_ARN),
        ],
    );
    let mut client = client(&service).await;

    let answer = client
        .delete_instance(delete(&ids[0]))
        .await
        .expect("a delete with the web identity")
        .into_inner();

    assert_eq!(answer.result(), pb::DeleteResult::Deleted);
    assert_eq!(state_of(&ec2, &ids[0]).await, "terminated");
    // The token was exchanged with moto's STS (unsigned, as STS takes it), and the termination
    // was signed by the role's keys it answered, not by any key of this test.
    let unsigned = moto().requests_signed_by("-");
    assert_eq!(
        unsigned.get("AssumeRoleWithWebIdentity"),
        Some(&1),
        "{unsigned:?}"
    );
    let ours = moto().requests_signed_by(ACCESS_KEY_ID);
    assert!(!ours.contains_key("TerminateInstances"), "{ours:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_web_identity_whose_token_file_is_missing_is_unavailable_and_deletes_nothing() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let ec2 = moto().client();
    let ids = run_instances(&ec2, 1, &[("cluster", "irsa")]).await;
    let config = config_dir();
    let missing = tempfile::tempdir().unwrap();
    let token_path = missing.path().join("token");
    let service = start(
        config.path(),
        &[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", token_path.to_str().unwrap()),
            ("AWS_ROLE_ARN", ROLE_ARN),
        ],
    );
    let mut client = client(&service).await;

    let refused = client
        .delete_instance(delete(&ids[0]))
        .await
        .expect_err("no token to exchange");

    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(
        refused.message().contains("web identity token"),
        "{}",
        refused.message()
    );
    assert_eq!(state_of(&ec2, &ids[0]).await, "running");
}
