//! Logs and traces: a `tracing` subscriber (text or JSON), an OTLP span exporter when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` is set, and W3C trace-context propagation over gRPC metadata.

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

use crate::Error;

/// How log lines are written to stderr.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (local development).
    #[default]
    Text,
    /// One JSON object per line (clusters).
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?} (text, json)")),
        }
    }
}

/// Owns the span exporter; call [`Telemetry::shutdown`] before exit so buffered spans are sent.
#[must_use = "spans are lost unless shutdown() is called before exit"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

/// Installs the global subscriber (filter from `RUST_LOG`, default `info`) and, when
/// `OTEL_EXPORTER_OTLP_ENDPOINT` is set, a batch OTLP/gRPC span exporter.
pub fn init(service_name: &'static str, format: LogFormat) -> Result<Telemetry, Error> {
    let endpoint = std::env::var("OTEL_EXPORTER_OTLP_ENDPOINT").ok();
    init_with(
        service_name,
        format,
        endpoint.as_deref().filter(|e| !e.is_empty()),
    )
}

/// As [`init`], with the OTLP endpoint given (`None`: no span export). The other `OTEL_*` variables still
/// apply to the exporter.
pub fn init_with(
    service_name: &'static str,
    format: LogFormat,
    otlp_endpoint: Option<&str>,
) -> Result<Telemetry, Error> {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = match format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let provider = otlp_endpoint
        .map(|endpoint| tracer_provider(service_name, endpoint))
        .transpose()?;
    let otel = provider
        .as_ref()
        .map(|p| tracing_opentelemetry::layer().with_tracer(p.tracer(service_name)));
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    tracing_subscriber::registry()
        .with(filter)
        .with(fmt)
        .with(otel)
        .try_init()
        .map_err(|e| Error::Telemetry {
            message: String::new(),
            source: Some(Box::new(e)),
        })?;
    Ok(Telemetry { provider })
}

fn tracer_provider(service_name: &'static str, endpoint: &str) -> Result<SdkTracerProvider, Error> {
    use opentelemetry_otlp::WithExportConfig;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| Error::Telemetry {
            message: "OTLP exporter".into(),
            source: Some(Box::new(e)),
        })?;
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name(service_name)
                .build(),
        )
        .build())
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exports_spans(&self) -> bool {
        self.provider.is_some()
    }

    /// Flushes buffered spans and stops the exporter. The SDK's flush blocks, and would
    /// deadlock the exporter on a current-thread runtime, so it runs on the blocking pool.
    pub async fn shutdown(self) {
        let Some(provider) = self.provider else {
            return;
        };
        let done = tokio::task::spawn_blocking(move || {
            if let Err(e) = provider.force_flush() {
                tracing::warn!(error = %e, "flushing spans failed");
            }
            if let Err(e) = provider.shutdown() {
                tracing::warn!(error = %e, "stopping the span exporter failed");
            }
        })
        .await;
        if let Err(e) = done {
            tracing::warn!(error = %e, "span exporter shutdown did not finish");
        }
    }
}

// opentelemetry-http has the same adapters for `http::HeaderMap` only; tonic's client side has
// a `MetadataMap`, so both directions are written here (a few lines each).
struct MetadataInjector<'a>(&'a mut tonic::metadata::MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(key), Ok(value)) = (
            tonic::metadata::MetadataKey::from_bytes(key.as_bytes()),
            tonic::metadata::MetadataValue::try_from(value),
        ) {
            self.0.insert(key, value);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }
    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Writes the current span's trace context (`traceparent`, `tracestate`) into outgoing metadata.
pub fn inject_current(metadata: &mut tonic::metadata::MetadataMap) {
    let cx = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(&cx, &mut MetadataInjector(metadata));
}

/// Makes `span` a child of the trace context the caller sent in `headers`, if any.
pub fn set_parent_from_headers(span: &tracing::Span, headers: &http::HeaderMap) {
    let cx = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    if opentelemetry::trace::TraceContextExt::span(&cx)
        .span_context()
        .is_valid()
    {
        // Fails only when the span is disabled; then there is nothing to link.
        let _ = span.set_parent(cx);
    }
}

/// The trace id of the current span in W3C hex form, if tracing is exporting.
pub fn current_trace_id() -> Option<String> {
    let cx = tracing::Span::current().context();
    let span = opentelemetry::trace::TraceContextExt::span(&cx);
    let sc = span.span_context();
    sc.is_valid().then(|| sc.trace_id().to_string())
}

/// One log line per period at most: [`RateLimitedLog::admit`] says whether to log now and how many events happened
/// since the last line (this one included). For refusals a flood can cause by the thousand: the metrics count each,
/// the log says that it happens.
#[derive(Debug)]
pub struct RateLimitedLog {
    every: std::time::Duration,
    last: std::sync::Mutex<Option<std::time::Instant>>,
    since: std::sync::atomic::AtomicU64,
}

impl RateLimitedLog {
    pub fn new(every: std::time::Duration) -> Self {
        RateLimitedLog {
            every,
            last: std::sync::Mutex::new(None),
            since: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// Counts one event; `Some(count)` when a line is due now.
    pub fn admit(&self) -> Option<u64> {
        use std::sync::atomic::Ordering;
        self.since.fetch_add(1, Ordering::AcqRel);
        let mut last = self.last.lock().ok()?;
        let due = last.is_none_or(|at| at.elapsed() >= self.every);
        if due {
            *last = Some(std::time::Instant::now());
            Some(self.since.swap(0, Ordering::AcqRel))
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_are_logged_once_per_period_with_a_count() {
        let log = RateLimitedLog::new(std::time::Duration::from_secs(3600));
        assert_eq!(log.admit(), Some(1));
        for _ in 0..99 {
            assert_eq!(log.admit(), None);
        }
    }

    #[test]
    fn log_format_parses() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert!("yaml".parse::<LogFormat>().is_err());
    }

    #[test]
    fn extracts_w3c_trace_context() {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            "traceparent",
            http::HeaderValue::from_static(
                "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            ),
        );
        let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
        let span = opentelemetry::trace::TraceContextExt::span(&cx);
        assert_eq!(
            span.span_context().trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
    }
}
