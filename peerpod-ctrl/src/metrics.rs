//! Prometheus metrics of the PeerPod cleanup. Label values come from small fixed sets (error reasons, CAA's
//! provider names, results) so that no PeerPod content can grow the number of series.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Bounded provider label: a typo in a PeerPod must not create a new time series.
pub fn provider_label(provider: &str) -> String {
    match provider.parse::<peerpods_proto::ProviderName>() {
        Ok(known) => known.as_str().to_owned(),
        Err(_) => "other".to_owned(),
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeleteLabels {
    pub provider: String,
    /// `deleted`, `already_gone`, or an error reason.
    pub result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    pub provider: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// A provider label (`other` for a scan stopped before any provider was listed).
    pub provider: String,
    pub reason: String,
}

/// All metrics of peerpod-ctrl.
#[derive(Clone)]
pub struct Metrics {
    pub reconciles: Counter,
    pub reconcile_errors: Family<ReasonLabels, Counter>,
    pub instance_deletes: Family<DeleteLabels, Counter>,
    pub finalizer_release_seconds: Histogram,
    pub stale_peerpods_deleted: Counter,
    pub orphans_found: Family<ProviderLabels, Gauge>,
    pub orphans_deleted: Family<ProviderLabels, Counter>,
    pub orphan_scan_errors: Family<ReasonLabels, Counter>,
    pub orphan_deletions_refused: Family<RefusalLabels, Counter>,
    pub orphan_scans: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics {
            reconciles: Counter::default(),
            reconcile_errors: Family::default(),
            instance_deletes: Family::default(),
            // 0.1 s .. ~55 min: a healthy release takes well under a second, an outage up to the backoff cap.
            finalizer_release_seconds: Histogram::new(exponential_buckets(0.1, 2.0, 16)),
            stale_peerpods_deleted: Counter::default(),
            orphans_found: Family::default(),
            orphans_deleted: Family::default(),
            orphan_scan_errors: Family::default(),
            orphan_deletions_refused: Family::default(),
            orphan_scans: Counter::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them under the `peerpod_ctrl` prefix.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        let r = registry.sub_registry_with_prefix("peerpod_ctrl");
        r.register(
            "reconciles",
            "PeerPod reconciles started",
            m.reconciles.clone(),
        );
        r.register(
            "reconcile_errors",
            "PeerPod reconciles that failed, by reason",
            m.reconcile_errors.clone(),
        );
        r.register(
            "instance_deletes",
            "DeleteInstance calls for PeerPods being deleted, by provider and result",
            m.instance_deletes.clone(),
        );
        r.register(
            "finalizer_release_seconds",
            "Time from a PeerPod's deletionTimestamp to the release of its finalizer",
            m.finalizer_release_seconds.clone(),
        );
        r.register(
            "stale_peerpods_deleted",
            "PeerPods deleted because a newer PeerPod of the same Pod exists",
            m.stale_peerpods_deleted.clone(),
        );
        r.register(
            "orphan_instances",
            "VMs carrying this cluster's tag, older than the grace period, with no PeerPod (last scan)",
            m.orphans_found.clone(),
        );
        r.register(
            "orphan_instances_deleted",
            "Orphan VMs deleted (only with --orphan-policy=delete)",
            m.orphans_deleted.clone(),
        );
        r.register(
            "orphan_scan_errors",
            "Orphan scans of a provider that failed, by reason",
            m.orphan_scan_errors.clone(),
        );
        r.register(
            "orphan_deletions_refused",
            "Orphan scans of a provider that deleted nothing because a guard refused (PeerPod cache not synced, \
             more orphans than the cap), by reason",
            m.orphan_deletions_refused.clone(),
        );
        r.register(
            "orphan_scans",
            "Orphan scans completed over all providers (failed providers included)",
            m.orphan_scans.clone(),
        );
        m
    }

    pub fn reconcile_error(&self, reason: &str) {
        self.reconcile_errors
            .get_or_create(&ReasonLabels {
                reason: reason.to_string(),
            })
            .inc();
    }

    pub fn instance_delete(&self, provider: &str, result: &str) {
        self.instance_deletes
            .get_or_create(&DeleteLabels {
                provider: provider_label(provider),
                result: result.to_string(),
            })
            .inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_providers_share_one_label() {
        assert_eq!(provider_label("aws"), "aws");
        assert_eq!(provider_label("made-up-cloud"), "other");
    }

    #[test]
    fn metrics_are_exposed_with_prefix() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.instance_delete("libvirt", "deleted");
        m.reconcile_error("ProviderUnavailable");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains(
            r#"peerpod_ctrl_instance_deletes_total{provider="libvirt",result="deleted"} 1"#
        ));
        assert!(
            text.contains(r#"peerpod_ctrl_reconcile_errors_total{reason="ProviderUnavailable"} 1"#)
        );
        assert!(text.contains("peerpod_ctrl_finalizer_release_seconds_bucket"));
    }
}
