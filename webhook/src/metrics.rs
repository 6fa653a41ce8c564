//! Prometheus metrics of the webhook, served on the health port's `/metrics`. Labels are bounded: an outcome,
//! never a pod or namespace name (those go to the log).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use peerpods_runtime::tls::{CapLabels, ConnectionCap, OpenConnections};

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
    /// Admissions shed, by the cap that was full: their peer's share (`per_peer`) or the budget (`total`).
    pub shed: Family<CapLabels, Counter>,
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
        registry
            .sub_registry_with_prefix("peerpods_webhook")
            .register(
                "admissions_shed",
                "Admission requests shed (HTTP 429) because their peer address (cap=per_peer, a quarter of the budget) or the webhook (cap=total) decides as many as it may at once",
                metrics.shed.clone(),
            );
        metrics
    }

    /// Registers the HTTPS port's connection gauge and refusals, counted by `open`.
    pub fn register_connections(registry: &mut Registry, open: &OpenConnections) {
        let registry = registry.sub_registry_with_prefix("peerpods_webhook");
        registry.register(
            "connections",
            "Connections to the webhook port established now",
            open.gauge.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections to the webhook port closed at once because their peer address (cap=per_peer) or the webhook (cap=total) holds as many as it may",
            open.refused.clone(),
        );
    }

    pub fn count_shed(&self, cap: ConnectionCap) {
        self.shed
            .get_or_create(&CapLabels { cap: cap.as_str() })
            .inc();
    }

    pub fn count(&self, outcome: Outcome) {
        self.reviews
            .get_or_create(&OutcomeLabels {
                outcome: outcome.as_str(),
            })
            .inc();
    }
}
