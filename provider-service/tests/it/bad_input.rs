//! Bad input through real gRPC over loopback: every malformed request gets a precise status
//! naming the field, and nothing (not even garbage bytes on the port) stops the server.

use std::collections::HashMap;

use peerpods_proto::v1 as pb;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn delete(provider: &str, id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: provider.into(),
        instance_id: id.into(),
        requester: None,
        accept_in_progress: false,
    }
}

const SOME_UUID: &str = "0b2e8b53-6f6e-4a4e-9d2b-3b1c2f1a0d4e";

#[tokio::test(flavor = "multi_thread")]
async fn malformed_requests_get_precise_statuses() {
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;
    let long = "x".repeat(5000);

    let cases: Vec<(pb::DeleteInstanceRequest, tonic::Code, &str)> = vec![
        (
            delete("", SOME_UUID),
            tonic::Code::InvalidArgument,
            "cloud_provider: must not be empty",
        ),
        (
            delete("libvirt", ""),
            tonic::Code::InvalidArgument,
            "instance_id: must not be empty",
        ),
        (
            delete("nimbus", SOME_UUID),
            tonic::Code::InvalidArgument,
            "cloud_provider: unknown provider",
        ),
        (
            delete("aws", SOME_UUID),
            tonic::Code::FailedPrecondition,
            "cloud_provider: provider \"aws\" is not configured",
        ),
        (
            delete(&long, SOME_UUID),
            tonic::Code::InvalidArgument,
            "cloud_provider: is 5000 bytes",
        ),
        (
            delete("libvirt", &long),
            tonic::Code::InvalidArgument,
            "instance_id: is 5000 bytes",
        ),
        (
            pb::DeleteInstanceRequest {
                requester: Some(pb::Requester {
                    name: long.clone(),
                    ..Default::default()
                }),
                ..delete("libvirt", SOME_UUID)
            },
            tonic::Code::InvalidArgument,
            "requester.name: is 5000 bytes",
        ),
    ];
    for (request, code, message) in cases {
        let status = client.delete_instance(request.clone()).await.unwrap_err();
        assert_eq!(status.code(), code, "{request:?}: {status:?}");
        assert!(
            status.message().starts_with(message),
            "{:?} does not start with {message:?}",
            status.message()
        );
    }

    let too_many: HashMap<String, String> = (0..100)
        .map(|i| (format!("k{i}"), "v".to_owned()))
        .collect();
    let status = client
        .list_instances(pb::ListInstancesRequest {
            cloud_provider: "libvirt".into(),
            tag_selector: too_many,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().starts_with("tag_selector:"),
        "{}",
        status.message()
    );

    let status = client
        .get_capacity(pb::GetCapacityRequest {
            cloud_provider: "gcp".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);

    // The rejected calls are counted by reason, with caller input never used as a label.
    let mut metrics = String::new();
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register("calls", "", server.metrics.calls.clone());
    prometheus_client::encoding::text::encode(&mut metrics, &registry).unwrap();
    assert!(metrics.contains("result=\"UnknownProvider\""), "{metrics}");
    assert!(
        !metrics.contains("nimbus"),
        "caller input leaked into labels: {metrics}"
    );
}

/// The ErrorInfo reason of an error status (every error carries one).
fn reason(status: &tonic::Status) -> String {
    use tonic_types::StatusExt;
    status
        .get_details_error_info()
        .map(|info| {
            assert_eq!(info.domain, provider_service::grpc::ERROR_DOMAIN);
            info.reason
        })
        .unwrap_or_else(|| panic!("no ErrorInfo in {status:?}"))
}

/// A message far above the limit is refused before it is decoded.
#[tokio::test(flavor = "multi_thread")]
async fn oversized_messages_are_refused() {
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;
    let status = client
        .delete_instance(delete("libvirt", &"x".repeat(1024 * 1024)))
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::OutOfRange, "{status:?}");
    assert_eq!(reason(&status), "MessageTooLarge");
    // And the server still answers normally.
    client
        .list_providers(pb::ListProvidersRequest {})
        .await
        .unwrap();
}

/// A request whose bytes are not a DeleteInstanceRequest (wrong wire type for field 1).
#[derive(Clone, PartialEq, prost::Message)]
struct NotARequest {
    #[prost(uint64, tag = "1")]
    cloud_provider_as_number: u64,
}

#[tokio::test(flavor = "multi_thread")]
async fn undecodable_messages_and_garbage_bytes_do_not_stop_the_server() {
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;

    let mut grpc = tonic::client::Grpc::new(server.channel().await);
    grpc.ready().await.unwrap();
    let path = http::uri::PathAndQuery::from_static(
        "/peerpods.provider.v1.ProviderService/DeleteInstance",
    );
    let codec = tonic_prost::ProstCodec::<NotARequest, pb::DeleteInstanceResponse>::default();
    let status = grpc
        .unary(
            tonic::Request::new(NotARequest {
                cloud_provider_as_number: 7,
            }),
            path,
            codec,
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Internal, "{status:?}");
    assert_eq!(reason(&status), "MalformedRequest");

    // A method the service does not have: tonic answers, with an ErrorInfo like ours.
    grpc.ready().await.unwrap();
    let status = grpc
        .unary(
            tonic::Request::new(pb::ListProvidersRequest {}),
            http::uri::PathAndQuery::from_static("/peerpods.provider.v1.ProviderService/Reboot"),
            tonic_prost::ProstCodec::<pb::ListProvidersRequest, pb::ListProvidersResponse>::default(
            ),
        )
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unimplemented, "{status:?}");
    assert_eq!(reason(&status), "MethodNotFound");

    // Raw garbage, then an HTTP/2 preface followed by garbage frames.
    for payload in [
        (0..65536u32)
            .map(|i| (i * 7919 % 251) as u8)
            .collect::<Vec<u8>>(),
        [
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".as_slice(),
            &[0xff; 4096],
        ]
        .concat(),
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec(),
    ] {
        let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
        // The server may close before reading everything; that is fine.
        let _ = tcp.write_all(&payload).await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(
            std::time::Duration::from_secs(5),
            tcp.read_to_end(&mut sink),
        )
        .await;
    }

    let mut client = server.client().await;
    let providers = client
        .list_providers(pb::ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(providers.providers.len(), 1);
}
