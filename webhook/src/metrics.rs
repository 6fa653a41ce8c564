//! Prometheus metrics of the webhook, served on the health port's `/metrics`. Labels are bounded: an outcome,
//! never a pod or namespace name (those go to the log).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::admission::Outcome;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// `mutated`, `unchanged`, `invalid`, `failed` or `shed`.
    pub outcome: &'static str,
}

/// Every metric the webhook exports. Cheap to clone; clones share values.
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    pub reviews: Family<OutcomeLabels, Counter>,
}

impl Metrics {
    /// Creates the metrics and registers them under the `peerpods_webhook` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Metrics::default();
        registry
            .sub_registry_with_prefix("peerpods_webhook")
            .register(
                "admission_reviews",
                "Admission reviews answered, by outcome",
                metrics.reviews.clone(),
            );
        metrics
    }

    pub fn count(&self, outcome: Outcome) {
        self.reviews
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }
}
