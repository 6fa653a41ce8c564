//! provider-service as deployed (its binary, configuration from a mounted-style directory) serving all eight of
//! cloud-api-adaptor's clouds at once, each against a local stand-in reached through the backend's real client
//! code: the emulators of Azure, GCP, IBM Cloud VPC and Power Virtual Server and Alibaba Cloud, moto for AWS,
//! libvirt's test driver, and a byom pool on the local control plane. grpcurl's ListProviders lists every cloud
//! healthy, and one DeleteInstance through gRPC on each deletes its VM with the parts created with it.

use std::net::SocketAddr;

use crate::common::free_addr;
use std::process::{Command, Stdio};

use peerpods_emulator_alibabacloud::AlibabaCloudEmulator;
use peerpods_emulator_azure::AzureEmulator;
use peerpods_emulator_gcp::GcpEmulator;
use peerpods_emulator_ibmcloud::{PowerVsEmulator, VpcEmulator};
use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use test_support::byom::Pool;
use test_support::cloud::{self, CloudEmulator};
use test_support::moto;

const ALL: [&str; 8] = [
    "alibabacloud",
    "aws",
    "azure",
    "byom",
    "gcp",
    "ibmcloud",
    "ibmcloud-powervs",
    "libvirt",
];

/// The provider-service binary, stopped when dropped.
struct Service(std::process::Child);

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn delete_request(provider: &str, instance_id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: provider.into(),
        instance_id: instance_id.into(),
        requester: None,
        accept_in_progress: false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn one_service_serves_all_eight_clouds_and_deletes_a_vm_with_its_parts_on_each() {
    let _moto = moto::SERIAL.lock().await;
    let ec2 = moto::moto().client();
    let aws_vm = moto::run_instances(&ec2, 1, &[]).await.remove(0);
    let emulators: Vec<Box<dyn CloudEmulator>> = vec![
        Box::new(AzureEmulator::start()),
        Box::new(GcpEmulator::start().unwrap()),
        Box::new(VpcEmulator::start().unwrap()),
        Box::new(PowerVsEmulator::start().unwrap()),
        Box::new(AlibabaCloudEmulator::start()),
    ];
    let pool = Pool::start(&["192.0.2.10", "192.0.2.11"]).await;
    pool.caa_allocate("192.0.2.10", "web", "worker-0").await;
    // The child's libvirt test driver starts with the driver's default domain "test"; ask ours for its UUID.
    let libvirt_vm = virt::connect::Connect::open(Some("test:///default"))
        .unwrap()
        .lookup_domain_by_name("test")
        .unwrap()
        .uuid_string()
        .unwrap();

    let config = cloud::merged_config(
        &ALL,
        emulators
            .iter()
            .flat_map(|e| e.config())
            .chain(moto::moto().config(&[]))
            .chain(pool.config())
            .chain([("LIBVIRT_URI".to_owned(), "test:///default".to_owned())])
            // The stand-ins' VMs carry no cluster tag: deleting them is allowed explicitly.
            .chain([("DELETE_UNTAGGED".to_owned(), "allow".to_owned())]),
    );
    let dir = tempfile::tempdir().unwrap();
    let pairs: Vec<(&str, &str)> = config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    crate::common::write_config(dir.path(), &pairs);

    let addr = free_addr();
    let admin = free_addr();
    let _service = Service(
        Command::new(env!("CARGO_BIN_EXE_provider-service"))
            // libvirt's test driver stands in for a host: development mode only.
            .args([
                "--development",
                "--auth",
                "none",
                "--listen",
                &addr.to_string(),
            ])
            .args(["--admin-listen", &admin.to_string()])
            .arg("--config-dir")
            .arg(dir.path())
            // byom's pool lives in this cluster; the service finds it as kubectl would.
            .env("KUBECONFIG", testenv::shared().kubeconfig_path())
            .env("LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let mut client = crate::common::eventually("provider-service answering", || async {
        let mut client = ProviderServiceClient::connect(format!("http://{addr}"))
            .await
            .ok()?;
        client
            .list_providers(pb::ListProvidersRequest {})
            .await
            .ok()
            .map(|_| client)
    })
    .await;

    // What an operator sees: every cloud configured and healthy.
    let shown = tokio::task::spawn_blocking(move || {
        let grpcurl = std::env::var_os("GRPCURL").map_or_else(
            || testenv::repo_root().join(".tools/venv/bin/grpcurl"),
            std::path::PathBuf::from,
        );
        let out = Command::new(grpcurl)
            .args([
                "-plaintext",
                &addr.to_string(),
                "peerpods.provider.v1.ProviderService/ListProviders",
            ])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stdout).unwrap()
    })
    .await
    .unwrap();
    let listed: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let providers = listed["providers"].as_array().unwrap();
    let names: Vec<&str> = providers
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ALL, "{shown}");
    for p in providers {
        assert_eq!(p["healthy"], true, "{p}");
    }

    // One VM on each cloud, deleted through gRPC with everything created with it.
    for emulator in &emulators {
        let vm = emulator.create_vm("podvm-web-0a1b2c3d", &[]);
        let answer = client
            .delete_instance(delete_request(emulator.provider(), &vm))
            .await
            .unwrap_or_else(|e| panic!("{}: {e}", emulator.provider()));
        assert_eq!(
            answer.into_inner().result(),
            pb::DeleteResult::Deleted,
            "{}",
            emulator.provider()
        );
        assert!(!emulator.vm_or_parts_exist(&vm), "{}", emulator.provider());
    }
    for (provider, vm) in [
        ("aws", aws_vm.as_str()),
        ("byom", "192.0.2.10"),
        ("libvirt", libvirt_vm.as_str()),
    ] {
        let answer = client
            .delete_instance(delete_request(provider, vm))
            .await
            .unwrap_or_else(|e| panic!("{provider}: {e}"));
        assert_eq!(
            answer.into_inner().result(),
            pb::DeleteResult::Deleted,
            "{provider}"
        );
    }
    assert_eq!(moto::state_of(&ec2, &aws_vm).await, "terminated");
    let mut available = pool.available().await;
    available.sort();
    assert_eq!(
        available,
        ["192.0.2.10", "192.0.2.11"],
        "byom machine back in the pool"
    );
    // Another delete of the same VM is no error: it is gone.
    let again = client
        .delete_instance(delete_request("libvirt", &libvirt_vm))
        .await
        .unwrap();
    assert_eq!(again.into_inner().result(), pb::DeleteResult::AlreadyGone);

    // Every backend timed the cloud calls it made (cloud_api_call_duration_seconds, by provider and operation).
    let scrape = test_support::metrics::Scrape::parse(&metrics_text(admin).await).unwrap();
    for provider in ALL {
        let timed = scrape.sum(
            "provider_service_cloud_api_call_duration_seconds_count",
            &[("provider", provider)],
        );
        assert!(timed >= 1.0, "{provider}: no cloud call timed");
    }
}

/// The admin server's `/metrics` text (HTTP/1.0: neither chunked nor kept alive).
async fn metrics_text(admin: SocketAddr) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(admin).await.unwrap();
    stream
        .write_all(format!("GET /metrics HTTP/1.0\r\nHost: {admin}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    assert!(
        head.starts_with("HTTP/1.0 200") || head.starts_with("HTTP/1.1 200"),
        "{head}"
    );
    body.to_owned()
}
