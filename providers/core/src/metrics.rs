//! Calls a backend makes to its cloud, counted by provider, operation and result, and timed by provider and
//! operation.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The `result` values of [`CloudCalls::record_attempt`].
pub const ATTEMPT_RESULTS: [&str; 5] = [
    "ok",
    "throttled",
    "server_error",
    "client_error",
    "transport_error",
];

/// The attempt result of an HTTP status (`None`: no answer), for the backends that speak HTTP.
pub fn attempt_result(status: Option<u16>) -> &'static str {
    match status {
        None => "transport_error",
        Some(429) => "throttled",
        Some(s) if (200..400).contains(&s) => "ok",
        Some(s) if s >= 500 => "server_error",
        Some(_) => "client_error",
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CloudCallLabels {
    pub provider: &'static str,
    pub operation: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OperationLabels {
    pub provider: &'static str,
    pub operation: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 5 ms .. ~82 s: a local libvirt answers in milliseconds, a cloud API in tens to hundreds, a throttled or
    // slow one (the SDKs' own retries included) in seconds; past a minute is an outage.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn batch_histogram() -> Histogram {
    // 1 .. 512 ids per cloud call.
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

/// Calls a backend makes to its cloud. Cheap to clone; each backend gets one.
#[derive(Clone, Debug)]
pub struct CloudCalls {
    calls: Family<CloudCallLabels, Counter>,
    /// Every HTTP attempt, the SDKs' own retries included (see [`CloudCalls::record_attempt`]).
    attempts: Family<CloudCallLabels, Counter>,
    batch_sizes: HistogramFamily<ProviderLabels>,
    durations: HistogramFamily<OperationLabels>,
}

impl Default for CloudCalls {
    fn default() -> Self {
        CloudCalls {
            calls: Family::default(),
            attempts: Family::default(),
            batch_sizes: Family::new_with_constructor(batch_histogram),
            durations: Family::new_with_constructor(latency_histogram),
        }
    }
}

impl CloudCalls {
    /// Counts one cloud API call; `result` is `ok`, `error` or `throttled`.
    pub fn record(&self, provider: &'static str, operation: &'static str, result: &'static str) {
        self.calls
            .get_or_create(&CloudCallLabels {
                provider,
                operation,
                result,
            })
            .inc();
    }

    /// Counts one cloud API call as [`CloudCalls::record`] does and records how long it took, whatever its
    /// result: a throttled or failing cloud is often a slow one too.
    pub fn record_timed(
        &self,
        provider: &'static str,
        operation: &'static str,
        result: &'static str,
        took: Duration,
    ) {
        self.record(provider, operation, result);
        self.durations
            .get_or_create(&OperationLabels {
                provider,
                operation,
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one attempt of a cloud call: each HTTP request sent, a retry by the cloud's SDK
    /// included, so throttling and errors the SDK absorbed inside one counted call still show.
    /// `result` is one of [`ATTEMPT_RESULTS`]: `ok`, `throttled` (HTTP 429, or the cloud's own
    /// throttling answer), `server_error` (5xx), `client_error` (other 4xx) or `transport_error`
    /// (no answer: connect, TLS, timeout).
    pub fn record_attempt(
        &self,
        provider: &'static str,
        operation: &'static str,
        result: &'static str,
    ) {
        self.attempts
            .get_or_create(&CloudCallLabels {
                provider,
                operation,
                result,
            })
            .inc();
    }

    /// Attempts recorded so far with these labels (for tests and figures).
    pub fn attempts(
        &self,
        provider: &'static str,
        operation: &'static str,
        result: &'static str,
    ) -> u64 {
        self.attempts
            .get_or_create(&CloudCallLabels {
                provider,
                operation,
                result,
            })
            .get()
    }

    /// Records how many instance ids one batched cloud call carried.
    pub fn record_batch(&self, provider: &'static str, ids: usize) {
        self.batch_sizes
            .get_or_create(&ProviderLabels { provider })
            .observe(ids as f64);
    }

    /// Registers `cloud_api_calls`, `cloud_api_call_duration_seconds` and `cloud_batch_size` in `registry`
    /// (under its prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cloud_api_calls",
            "Calls to cloud APIs by provider, operation and result",
            self.calls.clone(),
        );
        registry.register(
            "cloud_api_attempts",
            "HTTP attempts of cloud API calls (SDK retries included) by provider, operation and result: ok, throttled, server_error, client_error, transport_error",
            self.attempts.clone(),
        );
        registry.register(
            "cloud_api_call_duration_seconds",
            "Latency of calls to cloud APIs by provider and operation",
            self.durations.clone(),
        );
        registry.register(
            "cloud_batch_size",
            "Instance ids per batched cloud call",
            self.batch_sizes.clone(),
        );
    }

    /// Number of calls recorded so far with these labels (for tests and figures).
    pub fn count(
        &self,
        provider: &'static str,
        operation: &'static str,
        result: &'static str,
    ) -> u64 {
        self.calls
            .get_or_create(&CloudCallLabels {
                provider,
                operation,
                result,
            })
            .get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exposition(calls: &CloudCalls) -> String {
        let mut registry = Registry::default();
        calls.register(registry.sub_registry_with_prefix("provider_service"));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        text
    }

    #[test]
    fn a_timed_call_is_counted_and_its_latency_observed_per_provider_and_operation() {
        let calls = CloudCalls::default();
        calls.record_timed(
            "aws",
            "TerminateInstances",
            "throttled",
            Duration::from_millis(300),
        );
        calls.record_timed("aws", "TerminateInstances", "ok", Duration::from_millis(20));
        assert_eq!(calls.count("aws", "TerminateInstances", "throttled"), 1);
        assert_eq!(calls.count("aws", "TerminateInstances", "ok"), 1);
        let text = exposition(&calls);
        assert!(
            text.contains(
                r#"provider_service_cloud_api_call_duration_seconds_count{provider="aws",operation="TerminateInstances"} 2"#
            ),
            "{text}"
        );
        // 20 ms falls in the 40 ms bucket, 300 ms does not.
        assert!(
            text.contains(
                r#"provider_service_cloud_api_call_duration_seconds_bucket{le="0.04",provider="aws",operation="TerminateInstances"} 1"#
            ),
            "{text}"
        );
    }
}
