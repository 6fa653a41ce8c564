//! Every delete runs to its end on provider-service, whatever its caller does: on the Azure emulator,
//! whose VM deletions take several polls a second apart (as ARM's take minutes), a caller that gives
//! up, a deadline shorter than the delete, two callers at once and a shutdown in the middle each
//! still end with the VM and every part it owns gone, deleted once.

use std::net::SocketAddr;
use std::time::Duration;

use peerpods_emulator_azure::{AzureEmulator, VmOptions, VmParts};
use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use provider_service::deletes::DeleteSettings;
use provider_service::service::{CallerAuth, Listen, Options, Running, start_with};
use test_support::cloud::CloudEmulator;
use tokio_util::sync::CancellationToken;
use tonic_types::StatusExt;

/// How many looks an emulated VM deletion takes, each [`PACE_MS`] apart: a delete of several
/// seconds, longer than every caller deadline below.
const POLLS: u32 = 4;
/// The deletion engine's wait between two looks at a VM ARM is deleting (`AZURE_POLL_INTERVAL_MS`).
const PACE_MS: &str = "1000";

struct Azure {
    emulator: AzureEmulator,
    _config: tempfile::TempDir,
}

impl Azure {
    fn start() -> Azure {
        let emulator = AzureEmulator::start();
        emulator.set_operation_polls(POLLS, 1);
        let config = tempfile::tempdir().unwrap();
        let pairs: Vec<(String, String)> = emulator
            .config()
            .into_iter()
            .chain([
                ("DELETE_UNTAGGED".to_owned(), "allow".to_owned()),
                ("AZURE_POLL_INTERVAL_MS".to_owned(), PACE_MS.to_owned()),
            ])
            .collect();
        for (k, v) in &pairs {
            std::fs::write(config.path().join(k), v).unwrap();
        }
        Azure {
            emulator,
            _config: config,
        }
    }

    /// A VM as cloud-api-adaptor creates it, with a public IP address, whose parts ARM does NOT
    /// delete with it: only provider-service's own deletes of them make them go.
    fn vm(&self, name: &str) -> (String, VmParts) {
        let id = self.emulator.create_vm_with(
            name,
            &[],
            VmOptions {
                public_ip: true,
                parts_deleted_with_vm: false,
            },
        );
        (id, self.emulator.parts_of(name).unwrap())
    }

    fn all_gone(&self, name: &str, parts: &VmParts) -> bool {
        !self.emulator.vm_exists(name)
            && !self
                .emulator
                .network_interface_exists(&parts.network_interface)
            && !self.emulator.disk_exists(&parts.disk)
            && !parts
                .public_ip
                .as_deref()
                .is_some_and(|ip| self.emulator.public_ip_exists(ip))
    }

    fn vm_deletes(&self, name: &str) -> usize {
        self.emulator
            .arm_requests_matching("DELETE", &format!("/virtualMachines/{name}"))
    }

    /// provider-service on this emulator with `settings`, and the token that shuts it down.
    async fn serve(&self, settings: DeleteSettings) -> (CancellationToken, Running) {
        let shutdown = CancellationToken::new();
        let running = start_with(
            Options {
                grpc: Listen::Addr(SocketAddr::from(([127, 0, 0, 1], 0))),
                admin: None,
                secure_metrics: None,
                config_dirs: vec![self._config.path().to_owned()],
                development: false,
                reload_interval: Duration::from_secs(1),
                tls: None,
                auth: CallerAuth::None,
            },
            settings,
            shutdown.clone(),
        )
        .await
        .unwrap();
        (shutdown, running)
    }
}

async fn client(running: &Running) -> ProviderServiceClient<tonic::transport::Channel> {
    ProviderServiceClient::connect(format!("http://{}", running.grpc_addr))
        .await
        .unwrap()
}

/// Shuts provider-service down and waits until it has stopped.
async fn stop(shutdown: CancellationToken, running: Running) {
    shutdown.cancel();
    running.wait().await.unwrap();
}

/// The answer to a delete of `instance_id` by a caller that accepts IN_PROGRESS and waits at most
/// `deadline`.
async fn answered(
    grpc: &mut ProviderServiceClient<tonic::transport::Channel>,
    instance_id: &str,
    deadline: Duration,
) -> pb::DeleteInstanceResponse {
    grpc.delete_instance(delete(instance_id, true, deadline))
        .await
        .unwrap()
        .into_inner()
}

fn delete(
    instance_id: &str,
    accept_in_progress: bool,
    deadline: Duration,
) -> tonic::Request<pb::DeleteInstanceRequest> {
    let mut request = tonic::Request::new(pb::DeleteInstanceRequest {
        cloud_provider: "azure".into(),
        instance_id: instance_id.into(),
        requester: None,
        accept_in_progress,
    });
    request.set_timeout(deadline);
    request
}

#[tokio::test(flavor = "multi_thread")]
async fn a_delete_outlives_its_callers_deadline_and_cancellation_and_is_answered_in_progress_meanwhile()
 {
    let azure = Azure::start();
    let (shutdown, running) = azure.serve(DeleteSettings::default()).await;
    let mut grpc = client(&running).await;
    let (id, parts) = azure.vm("podvm-slow");

    // A caller that gives up after 300 ms: the call is cancelled mid-delete.
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        grpc.delete_instance(delete(&id, true, Duration::from_secs(60))),
    )
    .await;
    assert!(gave_up.is_err(), "the delete takes seconds: {gave_up:?}");

    // A caller whose deadline (1 s) is shorter than the delete hears "in progress" before it, with
    // retry advice, and joins the running delete instead of starting another.
    let answer = answered(&mut grpc, &id, Duration::from_secs(1)).await;
    assert_eq!(answer.result(), pb::DeleteResult::InProgress);
    assert_eq!(
        answer.retry_after,
        Some(prost_types::Duration {
            seconds: 5,
            nanos: 0
        })
    );
    // A caller that does not know IN_PROGRESS is never told anything it could read as done.
    let refused = grpc
        .delete_instance(delete(&id, false, Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unavailable);
    assert_eq!(
        refused.get_details_error_info().map(|i| i.reason),
        Some("DeleteInProgress".to_owned())
    );
    assert_eq!(
        refused.get_details_retry_info().and_then(|r| r.retry_delay),
        Some(Duration::from_secs(5))
    );

    // Nobody asks any more: the delete still runs to its end, the parts included.
    crate::common::eventually("the VM and every part it owns to be gone", || async {
        azure.all_gone("podvm-slow", &parts).then_some(())
    })
    .await;
    assert_eq!(azure.vm_deletes("podvm-slow"), 1, "one cloud delete");
    // The delete ends by itself once its last lookup of a part confirms what the cloud already shows.
    crate::common::eventually("the delete to end", || async {
        (running.deletes.in_flight() == 0).then_some(())
    })
    .await;
    // Asked again, a fresh lookup confirms the end.
    let again = answered(&mut grpc, &id, Duration::from_secs(10)).await;
    assert_eq!(again.result(), pb::DeleteResult::AlreadyGone);
    stop(shutdown, running).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn two_concurrent_calls_cause_one_cloud_delete() {
    let azure = Azure::start();
    let (shutdown, running) = azure.serve(DeleteSettings::default()).await;
    let (mut first, mut second) = (client(&running).await, client(&running).await);
    let (id, parts) = azure.vm("podvm-twice");
    // The second caller spells the ARM id in other letter case: the same VM (ARM ids are
    // case-insensitive), so the same delete.
    let respelled = id.replacen("/subscriptions/", "/SUBSCRIPTIONS/", 1);
    assert_ne!(respelled, id);

    let (a, b) = tokio::join!(
        first.delete_instance(delete(&id, true, Duration::from_secs(30))),
        second.delete_instance(delete(&respelled, true, Duration::from_secs(30))),
    );
    // Both wait for the one delete and hear its end.
    assert_eq!(a.unwrap().into_inner().result(), pb::DeleteResult::Deleted);
    assert_eq!(b.unwrap().into_inner().result(), pb::DeleteResult::Deleted);
    assert!(azure.all_gone("podvm-twice", &parts));
    assert_eq!(azure.vm_deletes("podvm-twice"), 1);
    assert_eq!(
        azure.emulator.arm_requests_matching(
            "DELETE",
            &format!("/networkInterfaces/{}", parts.network_interface)
        ),
        1
    );
    stop(shutdown, running).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn shutdown_turns_not_ready_refuses_new_deletes_and_waits_for_the_one_in_flight() {
    let azure = Azure::start();
    let (shutdown, running) = azure.serve(DeleteSettings::default()).await;
    let mut grpc = client(&running).await;
    let (id, parts) = azure.vm("podvm-draining");

    let answer = answered(&mut grpc, &id, Duration::from_millis(500)).await;
    assert_eq!(answer.result(), pb::DeleteResult::InProgress);
    assert_eq!(running.deletes.in_flight(), 1);
    assert!(running.readiness.is_ready());

    shutdown.cancel();
    let readiness = running.readiness.clone();
    let deletes = running.deletes.clone();
    crate::common::eventually("not ready once shutdown begins", || async {
        (!readiness.is_ready()).then_some(())
    })
    .await;
    // No new delete starts while the old one drains (the gRPC port may already be closed too).
    let (late_id, late_parts) = azure.vm("podvm-late");
    if let Ok(mut late) =
        ProviderServiceClient::connect(format!("http://{}", running.grpc_addr)).await
    {
        // Refused (ShuttingDown), or cut off by the server going away: never started.
        let late_answer = late
            .delete_instance(delete(&late_id, true, Duration::from_secs(5)))
            .await;
        assert!(late_answer.is_err(), "{late_answer:?}");
    }

    running.wait().await.unwrap();
    assert_eq!(deletes.in_flight(), 0);
    assert!(
        azure.all_gone("podvm-draining", &parts),
        "the service stopped only after the delete in flight had ended"
    );
    assert!(
        !azure.all_gone("podvm-late", &late_parts),
        "no delete started during shutdown"
    );
    assert_eq!(azure.vm_deletes("podvm-late"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn the_drain_ends_at_its_grace_period() {
    let azure = Azure::start();
    // A deletion far longer than the grace period.
    azure.emulator.set_operation_polls(1000, 1);
    let settings = DeleteSettings {
        drain_grace: Duration::from_secs(2),
        ..DeleteSettings::default()
    };
    let (shutdown, running) = azure.serve(settings).await;
    let mut grpc = client(&running).await;
    let (id, _parts) = azure.vm("podvm-endless");
    let answer = answered(&mut grpc, &id, Duration::from_millis(500)).await;
    assert_eq!(answer.result(), pb::DeleteResult::InProgress);
    shutdown.cancel();
    let deletes = running.deletes.clone();
    let stopped = tokio::time::timeout(Duration::from_secs(60), running.wait()).await;
    assert!(stopped.is_ok(), "shutdown waits at most its grace period");
    assert_eq!(deletes.in_flight(), 1, "the endless delete was abandoned");
    assert!(azure.emulator.vm_exists("podvm-endless"));
}
