//! Prometheus metrics of provider-service. Label values are bounded: method and result names are
//! fixed strings, providers come from the registry (a handful), never from caller input as-is.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

pub use peerpods_provider_core::CloudCalls;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CallLabels {
    pub method: &'static str,
    pub provider: String,
    /// `deleted`, `already_gone`, `ok`, or an error `reason()`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct MethodLabels {
    pub method: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    pub result: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    // 1 ms .. ~16 s: libvirt answers in milliseconds, cloud deletes can take seconds.
    Histogram::new(exponential_buckets(0.001, 2.0, 15))
}

/// Every metric of the service.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub calls: Family<CallLabels, Counter>,
    pub latency: HistogramFamily<MethodLabels>,
    pub cloud: CloudCalls,
    pub config_reloads: Family<ResultLabels, Counter>,
    /// 1 while the configuration on disk is the one in use, 0 while a bad one is being ignored.
    pub config_valid: Gauge,
    pub auth_reviews: Family<ResultLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            calls: Family::default(),
            latency: Family::new_with_constructor(latency_histogram),
            cloud: CloudCalls::default(),
            config_reloads: Family::default(),
            config_valid: Gauge::default(),
            auth_reviews: Family::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them under `provider_service_`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("provider_service");
        r.register(
            "grpc_calls",
            "gRPC calls by method, provider and result",
            m.calls.clone(),
        );
        r.register(
            "grpc_call_duration_seconds",
            "gRPC call latency by method",
            m.latency.clone(),
        );
        m.cloud.register(r);
        r.register(
            "config_reloads",
            "Configuration reloads by result",
            m.config_reloads.clone(),
        );
        r.register(
            "config_valid",
            "1 when the configuration on disk is in use, 0 when a bad one is ignored",
            m.config_valid.clone(),
        );
        r.register(
            "auth_token_reviews",
            "TokenReview lookups by result (cache hits are not counted), and calls of a method the caller is not granted (method_not_allowed)",
            m.auth_reviews.clone(),
        );
        m
    }
}
