//! Calls a backend makes to its cloud, counted by provider, operation and result.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

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

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn batch_histogram() -> Histogram {
    // 1 .. 512 ids per cloud call.
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

/// Calls a backend makes to its cloud. Cheap to clone; each backend gets one.
#[derive(Clone, Debug)]
pub struct CloudCalls {
    calls: Family<CloudCallLabels, Counter>,
    batch_sizes: HistogramFamily<ProviderLabels>,
}

impl Default for CloudCalls {
    fn default() -> Self {
        CloudCalls {
            calls: Family::default(),
            batch_sizes: Family::new_with_constructor(batch_histogram),
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

    /// Records how many instance ids one batched cloud call carried.
    pub fn record_batch(&self, provider: &'static str, ids: usize) {
        self.batch_sizes
            .get_or_create(&ProviderLabels { provider })
            .observe(ids as f64);
    }

    /// Registers `cloud_api_calls` and `cloud_batch_size` in `registry` (under its prefix).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cloud_api_calls",
            "Calls to cloud APIs by provider, operation and result",
            self.calls.clone(),
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
