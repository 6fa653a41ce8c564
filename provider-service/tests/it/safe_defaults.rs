//! Safe by default: the binary as deployed, with nothing configured, serves no fake backend. It is
//! not ready (the reason on `/readyz`) and refuses every call with FAILED_PRECONDITION; a libvirt
//! `test:` URI and a cloud with tags but no cluster-tag choice are refused the same way. Only
//! `--development` (what `make dev` passes) runs on the embedded default, libvirt's test driver.

use std::net::SocketAddr;

use crate::common::free_addr;
use std::process::{Command, Stdio};

use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic_types::StatusExt;

/// The provider-service binary, stopped when dropped.
struct Service {
    child: std::process::Child,
    grpc: SocketAddr,
    admin: SocketAddr,
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts the binary with only `args` and `config_dir` (if any): the environment is emptied, so no
/// configuration key of the test's own environment leaks in.
fn start(args: &[&str], config_dir: Option<&std::path::Path>) -> Service {
    start_with_env(args, config_dir, &[])
}

fn start_with_env(
    args: &[&str],
    config_dir: Option<&std::path::Path>,
    env: &[(&str, &str)],
) -> Service {
    let grpc = free_addr();
    let admin = free_addr();
    let mut command = Command::new(env!("CARGO_BIN_EXE_provider-service"));
    command
        .env_clear()
        .envs(env.iter().copied())
        .args(["--auth", "none", "--listen", &grpc.to_string()])
        .args(["--admin-listen", &admin.to_string(), "--log-format", "json"])
        .args(args)
        .stdout(Stdio::null());
    if let Some(dir) = config_dir {
        command.arg("--config-dir").arg(dir);
    }
    Service {
        child: command.spawn().unwrap(),
        grpc,
        admin,
    }
}

/// `GET /readyz`: the status code and body.
async fn readyz(admin: SocketAddr) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(admin).await.ok()?;
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.ok()?;
    let code = answer.split(' ').nth(1)?.parse().ok()?;
    let body = answer.split_once("\r\n\r\n")?.1.to_owned();
    Some((code, body))
}

/// The first `/readyz` answer that `accept` takes, waiting for the service to come up.
async fn readyz_until(
    service: &Service,
    what: &str,
    accept: impl Fn(u16, &str) -> bool,
) -> (u16, String) {
    crate::common::eventually(what, || async {
        readyz(service.admin)
            .await
            .filter(|(code, body)| accept(*code, body))
    })
    .await
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

fn delete(provider: &str, instance_id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: provider.into(),
        instance_id: instance_id.into(),
        requester: None,
        accept_in_progress: false,
    }
}

fn reason(status: &tonic::Status) -> Option<String> {
    status.get_details_error_info().map(|i| i.reason)
}

/// A real-looking libvirt domain UUID that no host knows.
const UUID: &str = "0e8e3d58-1a9c-4b8e-9d7f-3c2a1b0f9e6d";

#[tokio::test(flavor = "multi_thread")]
async fn with_no_configuration_it_is_not_ready_and_refuses_every_call() {
    let empty = tempfile::tempdir().unwrap();
    for config_dir in [None, Some(empty.path())] {
        let service = start(&[], config_dir);
        let (code, body) = readyz_until(&service, "a /readyz answer", |_, _| true).await;
        assert_eq!(code, 503, "{body}");
        assert!(body.contains("ProviderNotConfigured"), "{body}");
        assert!(body.contains("CLOUD_PROVIDER is not set"), "{body}");

        let mut client = client(&service).await;
        let refused = client
            .delete_instance(delete("libvirt", UUID))
            .await
            .expect_err("a delete with nothing configured");
        assert_eq!(
            refused.code(),
            tonic::Code::FailedPrecondition,
            "{refused:?}"
        );
        assert_eq!(reason(&refused).as_deref(), Some("ProviderNotConfigured"));
        for provider in ["aws", "libvirt"] {
            let listed = client
                .list_instances(pb::ListInstancesRequest {
                    cloud_provider: provider.into(),
                    tag_selector: Default::default(),
                })
                .await
                .expect_err("a list with nothing configured");
            assert_eq!(reason(&listed).as_deref(), Some("ProviderNotConfigured"));
            let capacity = client
                .get_capacity(pb::GetCapacityRequest {
                    cloud_provider: provider.into(),
                })
                .await
                .expect_err("a capacity query with nothing configured");
            assert_eq!(capacity.code(), tonic::Code::FailedPrecondition);
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn development_mode_runs_on_the_embedded_test_driver() {
    // As `make dev` starts it: no configuration at all.
    let service = start(&["--development"], None);
    let (_, body) = readyz_until(&service, "/readyz 200", |code, _| code == 200).await;
    assert!(body.contains("providers: libvirt"), "{body}");
    let mut client = client(&service).await;
    let answer = client
        .delete_instance(delete("libvirt", UUID))
        .await
        .expect("a delete on the embedded default")
        .into_inner();
    assert_eq!(answer.result(), pb::DeleteResult::AlreadyGone);

    // The environment variable is the same switch.
    let by_env = start_with_env(&[], None, &[("PROVIDER_SERVICE_DEVELOPMENT", "true")]);
    readyz_until(&by_env, "/readyz 200 with the env switch", |code, _| {
        code == 200
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn libvirt_test_uris_are_refused_outside_development_mode() {
    let config = tempfile::tempdir().unwrap();
    crate::common::write_config(config.path(), &[("CLOUD_PROVIDER", "libvirt")]);
    let service = start(&["--reload-interval-seconds", "1"], Some(config.path()));
    let (code, body) = readyz_until(&service, "a /readyz answer", |_, _| true).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("LIBVIRT_URI"), "{body}");
    assert!(body.contains("not set"), "{body}");

    // The test driver named explicitly is refused too, and the reload reports it.
    crate::common::write_config(config.path(), &[("LIBVIRT_URI", "test:///default")]);
    let (code, body) = readyz_until(&service, "the test: URI refused", |_, body| {
        body.contains("test driver")
    })
    .await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("config LIBVIRT_URI"), "{body}");
    let mut client = client(&service).await;
    let refused = client
        .delete_instance(delete("libvirt", UUID))
        .await
        .expect_err("a delete on a refused configuration");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused).as_deref(), Some("InvalidConfig"));
    assert!(refused.message().contains("LIBVIRT_URI"), "{refused:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_cloud_with_tags_is_served_only_with_a_cluster_tag_or_an_explicit_allow() {
    let config = tempfile::tempdir().unwrap();
    // Credentials for moto's fixed account; nothing here calls AWS before a delete.
    crate::common::write_config(
        config.path(),
        &[
            ("CLOUD_PROVIDER", "aws"),
            ("AWS_REGION", "us-east-1"),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "not-a-real-secret"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:9"),
        ],
    );
    let service = start(&["--reload-interval-seconds", "1"], Some(config.path()));
    let (code, body) = readyz_until(&service, "a /readyz answer", |_, _| true).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("CLUSTER_TAG"), "{body}");
    assert!(body.contains("DELETE_UNTAGGED=allow"), "{body}");
    let mut client = client(&service).await;
    let refused = client
        .delete_instance(delete("aws", "i-0123456789abcdef0"))
        .await
        .expect_err("a delete without a cluster-tag choice");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition);
    assert_eq!(reason(&refused).as_deref(), Some("InvalidConfig"));
    assert!(refused.message().contains("CLUSTER_TAG"), "{refused:?}");

    // The documented escape hatch makes it servable, picked up without a restart.
    crate::common::write_config(config.path(), &[("DELETE_UNTAGGED", "allow")]);
    let (_, body) = readyz_until(
        &service,
        "/readyz 200 after DELETE_UNTAGGED=allow",
        |code, _| code == 200,
    )
    .await;
    assert!(body.contains("providers: aws"), "{body}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_configuration_makes_an_unconfigured_service_ready_without_a_restart() {
    let config = tempfile::tempdir().unwrap();
    let service = start(&["--reload-interval-seconds", "1"], Some(config.path()));
    readyz_until(&service, "/readyz 503", |code, _| code == 503).await;
    // The operator creates peer-pods-cm later; the kubelet fills the mounted directory.
    crate::common::write_config(
        config.path(),
        &[
            ("CLOUD_PROVIDER", "libvirt"),
            ("LIBVIRT_URI", "qemu+tcp://127.0.0.1:9/system"),
        ],
    );
    let (_, body) = readyz_until(&service, "/readyz 200 once configured", |code, _| {
        code == 200
    })
    .await;
    assert!(body.contains("providers: libvirt"), "{body}");
}
