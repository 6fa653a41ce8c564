//! Prometheus metrics of provider-service. Label values are bounded: method and result names are
//! fixed strings, providers come from the registry (a handful), never from caller input as-is.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use peerpods_provider_core::Capacity;
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
    /// The configured provider's name, or `unknown` (as in [`CallLabels`]).
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapacityLabels {
    pub provider: String,
    /// `instances`, `vcpus` or `memory_mib`.
    pub resource: &'static str,
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
    /// The last capacity a provider reported, per resource; a figure the cloud cannot tell is not exported.
    pub capacity_limit: Family<CapacityLabels, Gauge>,
    pub capacity_in_use: Family<CapacityLabels, Gauge>,
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
            capacity_limit: Family::default(),
            capacity_in_use: Family::default(),
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
        r.register(
            "capacity_limit",
            "The limit of a resource the provider last reported (GetCapacity), by provider and resource",
            m.capacity_limit.clone(),
        );
        r.register(
            "capacity_in_use",
            "The usage of a resource the provider last reported (GetCapacity), by provider and resource",
            m.capacity_in_use.clone(),
        );
        m
    }

    /// Counts one finished gRPC call and records its latency.
    pub fn record_call(
        &self,
        method: &'static str,
        provider: &str,
        result: String,
        took: std::time::Duration,
    ) {
        self.calls
            .get_or_create(&CallLabels {
                method,
                provider: provider.to_owned(),
                result,
            })
            .inc();
        self.latency
            .get_or_create(&MethodLabels {
                method,
                provider: provider.to_owned(),
            })
            .observe(took.as_secs_f64());
    }

    /// Keeps the figures of one capacity answer. A figure the cloud could not tell removes the series rather
    /// than leaving an old value (or a zero) that looks like a fact.
    pub fn record_capacity(&self, provider: &str, capacity: &Capacity) {
        for (resource, figure) in [
            ("instances", capacity.instances),
            ("vcpus", capacity.vcpus),
            ("memory_mib", capacity.memory_mib),
        ] {
            let labels = CapacityLabels {
                provider: provider.to_owned(),
                resource,
            };
            for (family, value) in [
                (&self.capacity_limit, figure.limit),
                (&self.capacity_in_use, figure.in_use),
            ] {
                match value {
                    Some(v) => {
                        family
                            .get_or_create(&labels)
                            .set(i64::try_from(v).unwrap_or(i64::MAX));
                    }
                    None => {
                        family.remove(&labels);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_provider_core::Figure;

    fn exposition(registry: &Registry) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
        text
    }

    #[test]
    fn grpc_latency_is_recorded_per_method_and_provider() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.record_call(
            "DeleteInstance",
            "libvirt",
            "deleted".into(),
            std::time::Duration::from_millis(3),
        );
        let text = exposition(&registry);
        assert!(
            text.contains(
                r#"provider_service_grpc_call_duration_seconds_count{method="DeleteInstance",provider="libvirt"} 1"#
            ),
            "{text}"
        );
        assert!(text.contains(
            r#"provider_service_grpc_calls_total{method="DeleteInstance",provider="libvirt",result="deleted"} 1"#
        ));
    }

    #[test]
    fn capacity_figures_are_kept_and_unknown_ones_dropped() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let known = Figure {
            limit: Some(20),
            in_use: Some(18),
        };
        m.record_capacity(
            "aws",
            &Capacity {
                instances: known,
                vcpus: known,
                memory_mib: Figure::default(),
            },
        );
        let text = exposition(&registry);
        assert!(text.contains(
            r#"provider_service_capacity_limit{provider="aws",resource="instances"} 20"#
        ));
        assert!(
            text.contains(
                r#"provider_service_capacity_in_use{provider="aws",resource="vcpus"} 18"#
            )
        );
        assert!(!text.contains(r#"resource="memory_mib""#), "{text}");
        // The cloud stops telling: the old figure goes.
        m.record_capacity("aws", &Capacity::default());
        let text = exposition(&registry);
        assert!(
            !text.contains(r#"provider="aws",resource="instances""#),
            "{text}"
        );
    }
}
