//! Prometheus metrics of the controller. Labels are bounded: a reconcile result, an error reason or an object
//! kind, never an object name (names go to logs and Events).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabels {
    /// `ok` or an error `reason()`.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabels {
    pub kind: String,
}

/// Every metric this controller exports. Cheap to clone; clones share values.
#[derive(Clone, Debug)]
pub struct Metrics {
    pub reconciles: Family<ResultLabels, Counter>,
    pub reconcile_duration: Histogram,
    pub object_writes: Family<KindLabels, Counter>,
    pub node_writes: Counter,
    pub status_writes: Counter,
    pub effective_limit: Gauge,
    pub selected_nodes: Gauge,
    /// capacityMode dra: devices in the pool, allocated and free (all 0 in node mode).
    pub pool_size: Gauge,
    pub pool_allocated: Gauge,
    pub pool_free: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self {
            reconciles: Family::default(),
            reconcile_duration: Histogram::new([
                0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            ]),
            object_writes: Family::default(),
            node_writes: Counter::default(),
            status_writes: Counter::default(),
            effective_limit: Gauge::default(),
            selected_nodes: Gauge::default(),
            pool_size: Gauge::default(),
            pool_allocated: Gauge::default(),
            pool_free: Gauge::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them under the `peerpodconfig` prefix (as peerpod-ctrl's
    /// `Metrics::register` does under its own).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = Metrics::default();
        metrics.register_in(registry);
        metrics
    }

    fn register_in(&self, registry: &mut Registry) {
        let r = registry.sub_registry_with_prefix("peerpodconfig");
        r.register(
            "reconciles",
            "Reconciles of PeerPodConfigs by result",
            self.reconciles.clone(),
        );
        r.register(
            "reconcile_duration_seconds",
            "Time one reconcile took",
            self.reconcile_duration.clone(),
        );
        r.register(
            "object_writes",
            "Server-side applies of owned objects, by kind",
            self.object_writes.clone(),
        );
        r.register(
            "node_capacity_writes",
            "Patches of kata.peerpods.io/vm on nodes",
            self.node_writes.clone(),
        );
        r.register(
            "status_writes",
            "Writes of PeerPodConfig status",
            self.status_writes.clone(),
        );
        r.register(
            "effective_limit",
            "kata.peerpods.io/vm advertised over all nodes",
            self.effective_limit.clone(),
        );
        r.register(
            "selected_nodes",
            "Nodes matching the nodeSelector",
            self.selected_nodes.clone(),
        );
        r.register(
            "pool_size",
            "capacityMode dra: kata.peerpods.io/vm devices published in the cluster-wide pool (0 in node mode)",
            self.pool_size.clone(),
        );
        r.register(
            "pool_allocated",
            "capacityMode dra: devices of the pool allocated to ResourceClaims",
            self.pool_allocated.clone(),
        );
        r.register(
            "pool_free",
            "capacityMode dra: devices of the pool not allocated",
            self.pool_free.clone(),
        );
    }

    /// All writes so far (owned objects, node capacity, status): a steady cluster keeps this constant.
    pub fn writes(&self) -> u64 {
        // Family has no iterator over its values; the kinds written are a fixed, known set.
        let objects: u64 = crate::apply::KINDS
            .iter()
            .map(|kind| {
                self.object_writes
                    .get_or_create(&KindLabels {
                        kind: (*kind).into(),
                    })
                    .get()
            })
            .sum();
        objects + self.node_writes.get() + self.status_writes.get()
    }
}
