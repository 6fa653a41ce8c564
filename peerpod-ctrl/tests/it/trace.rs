//! One trace runs from the reconcile of a deleted PeerPod into provider-service's handling of the
//! DeleteInstance call: the controller sends the W3C trace context, provider-service continues it.
//! It runs in a process of its own (`testenv::in_a_process_of_its_own`): it installs the process-wide tracing
//! subscriber.

use std::time::Duration;

use crate::support::{Controller, ControllerOptions, ProviderService, Scenario};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::{InMemorySpanExporter, SdkTracerProvider};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[test]
fn one_trace_runs_from_the_reconcile_into_provider_service() {
    let test = testenv::test_name!("one_trace_runs_from_the_reconcile_into_provider_service");
    if testenv::in_a_process_of_its_own(&test, &[]) {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("runtime")
            .block_on(scenario());
    }
}

async fn scenario() {
    let exporter = InMemorySpanExporter::default();
    let tracer_provider = SdkTracerProvider::builder()
        .with_simple_exporter(exporter.clone())
        .build();
    tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(tracer_provider.tracer("scenario")))
        .init();

    let s = Scenario::start("trace").await;
    let provider = ProviderService::start(None).await;
    let ctrl = Controller::start(s.client.clone(), ControllerOptions::new(provider.addr)).await;
    let vm = s.define_domain(false);
    s.create_peerpod("traced", None, "libvirt", &vm).await;
    s.delete_peerpod("traced").await;
    s.wait_peerpod_gone("traced", Duration::from_secs(60)).await;
    ctrl.stop().await;

    let spans = exporter.get_finished_spans().expect("spans");
    let attribute = |span: &opentelemetry_sdk::trace::SpanData, key: &str| {
        span.attributes
            .iter()
            .find(|kv| kv.key.as_str() == key)
            .map(|kv| kv.value.to_string())
    };
    let served = spans
        .iter()
        .find(|s| {
            s.name == "grpc" && attribute(s, "path").is_some_and(|p| p.ends_with("/DeleteInstance"))
        })
        .expect("provider-service's span for DeleteInstance");
    // The PeerPod was reconciled twice (created, then deleted); the deletion's reconcile made the call.
    let same_trace = spans.iter().any(|s| {
        s.name == "reconcile"
            && attribute(s, "name").as_deref() == Some("traced")
            && s.span_context.trace_id() == served.span_context.trace_id()
    });
    assert!(
        same_trace,
        "provider-service continues the trace of the reconcile that called it"
    );
    s.cleanup().await;
}
