//! Telemetry end to end: spans reach an OTLP collector (in-process, on 127.0.0.1) once
//! `shutdown()` flushes, and trace context goes out in and comes back from gRPC metadata.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use peerpods_runtime::telemetry::{self, LogFormat};

/// Exported spans as (name, trace id bytes).
type Spans = Arc<Mutex<Vec<(String, Vec<u8>)>>>;

#[derive(Clone, Default)]
struct Collector {
    spans: Spans,
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for rs in request.into_inner().resource_spans {
            for ss in rs.scope_spans {
                for s in ss.spans {
                    spans.push((s.name, s.trace_id));
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Set in the child process that runs the scenario (see below).
/// Where the child process's collector listens (see below).
const COLLECTOR: &str = "PEERPODS_TELEMETRY_TEST_COLLECTOR";

/// The exporter reads `OTEL_EXPORTER_OTLP_ENDPOINT` from the environment, as deployed. A test cannot set
/// a variable for its own process without unsafe code (other threads may read the environment), so the
/// scenario runs in a child process of this test binary that gets the variable from the start.
#[test]
fn spans_are_exported_and_trace_context_propagates() {
    // A free port for the child's collector.
    let addr = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let test = testenv::test_name!("spans_are_exported_and_trace_context_propagates");
    let env = [
        (COLLECTOR, addr.to_string()),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{addr}")),
    ];
    if testenv::in_a_process_of_its_own(&test, &env) {
        tokio::runtime::Runtime::new().unwrap().block_on(scenario());
    }
}

// One scenario only: the subscriber and the exporter are process-wide.
async fn scenario() {
    let collector = Collector::default();
    let addr: std::net::SocketAddr = std::env::var(COLLECTOR).unwrap().parse().unwrap();
    let listener = tokio::net::TcpListener::bind(addr).await.unwrap();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(collector.clone()))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    let telemetry = telemetry::init("runtime-test", LogFormat::Json).unwrap();
    assert!(telemetry.exports_spans());

    // Outgoing: the current span's context is injected as `traceparent`.
    let outgoing_trace = {
        let span = tracing::info_span!("delete_call");
        let _entered = span.enter();
        let mut metadata = tonic::metadata::MetadataMap::new();
        telemetry::inject_current(&mut metadata);
        let traceparent = metadata
            .get("traceparent")
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned();
        let trace_id = traceparent.split('-').nth(1).unwrap().to_owned();
        assert_eq!(Some(trace_id.clone()), telemetry::current_trace_id());
        trace_id
    };

    // Incoming: a span whose parent comes from the caller's headers joins the caller's trace.
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "traceparent",
        http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    {
        let span = tracing::info_span!("grpc_handler");
        telemetry::set_parent_from_headers(&span, &headers);
        let _entered = span.enter();
        assert_eq!(
            telemetry::current_trace_id().as_deref(),
            Some("4bf92f3577b34da6a3ce929d0e0e4736")
        );
    }

    telemetry.shutdown().await;
    let spans = collector.spans.lock().unwrap().clone();
    let find = |name: &str| spans.iter().find(|(n, _)| n == name).map(|(_, t)| hex(t));
    assert_eq!(find("delete_call"), Some(outgoing_trace), "{spans:?}");
    assert_eq!(
        find("grpc_handler").as_deref(),
        Some("4bf92f3577b34da6a3ce929d0e0e4736"),
        "{spans:?}"
    );
}
