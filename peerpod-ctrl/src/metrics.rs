//! Prometheus metrics of the PeerPod cleanup. Label values come from small fixed sets (error reasons, CAA's
//! provider names, results) so that no PeerPod content can grow the number of series.

use std::collections::BTreeMap;
use std::sync::{Arc, RwLock};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use peerpods_api::peerpod::{FINALIZER, PeerPod};

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
    /// Untracked VMs whose cloud-api-adaptor name belongs to a live Pod (last scan), by provider: never deleted.
    pub adoptable_found: Family<ProviderLabels, Gauge>,
    pub orphans_deleted: Family<ProviderLabels, Counter>,
    pub orphan_scan_errors: Family<ReasonLabels, Counter>,
    pub orphan_deletions_refused: Family<RefusalLabels, Counter>,
    pub orphan_scans: Counter,
    /// Live PeerPods whose VM the cloud reports gone (last check), by provider.
    pub reverse_orphans: Family<ProviderLabels, Gauge>,
    /// Events dropped because the queue of Events to write was full (peerpods_runtime::events).
    pub events_dropped: Counter,
    /// PeerPods held by the finalizer while being deleted, counted at scrape time.
    pub terminating: Terminating,
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
            adoptable_found: Family::default(),
            orphans_deleted: Family::default(),
            orphan_scan_errors: Family::default(),
            orphan_deletions_refused: Family::default(),
            orphan_scans: Counter::default(),
            reverse_orphans: Family::default(),
            events_dropped: Counter::default(),
            terminating: Terminating::default(),
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
            "VMs carrying this cluster's tag, older than the grace period, with no PeerPod and no live Pod of \
             their cloud-api-adaptor name (last scan)",
            m.orphans_found.clone(),
        );
        r.register(
            "adoptable_instances",
            "VMs carrying this cluster's tag, older than the grace period, with no PeerPod, whose cloud-api-adaptor \
             name (podvm-<pod>-<sandbox>) belongs to a live Pod (last scan): reported, never deleted",
            m.adoptable_found.clone(),
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
        r.register(
            "reverse_orphans",
            "Live PeerPods (not being deleted) whose VM the cloud reports gone, past the grace period (last check)",
            m.reverse_orphans.clone(),
        );
        r.register(
            "events_dropped",
            "Events not written because the queue of Events to write was full (the API server behind); the \
             conditions, metrics and logs carry the same outcomes",
            m.events_dropped.clone(),
        );
        r.register_collector(Box::new(m.terminating.clone()));
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

/// Upper bounds (seconds) and labels of the age buckets of [`Terminating`]; disjoint, the last one open.
const AGE_BUCKETS: [(i64, &str); 5] = [
    (60, "under_1m"),
    (600, "1m_to_10m"),
    (3600, "10m_to_1h"),
    (6 * 3600, "1h_to_6h"),
    (i64::MAX, "over_6h"),
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct AgeLabels {
    pub provider: String,
    /// Time since the deletionTimestamp, one of [`AGE_BUCKETS`].
    pub age: &'static str,
}

/// What [`Terminating`] exports, computed from the PeerPods as last seen.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct TerminatingCounts {
    /// PeerPods counted, being deleted or not.
    pub cached: usize,
    /// PeerPods being deleted and still carrying the finalizer, by provider and age bucket. Every bucket of
    /// every provider any PeerPod names is present (zero when empty), so a cleared backlog reads as 0, not
    /// as a vanished series.
    pub by_age: BTreeMap<AgeLabels, i64>,
    /// Seconds since the deletionTimestamp of the oldest such PeerPod, by provider (0: none).
    pub oldest_seconds: BTreeMap<String, i64>,
    /// The earliest `status.waitingSince` of such PeerPods, as Unix seconds, by provider (0: none waits): since
    /// when the longest-waiting cleanup has been held or failing.
    pub waiting_since: BTreeMap<String, i64>,
}

/// Counts the PeerPods held by our finalizer while being deleted, as of `now`.
pub fn terminating_counts<'a>(
    peerpods: impl IntoIterator<Item = &'a PeerPod>,
    now: jiff::Timestamp,
) -> TerminatingCounts {
    let mut counts = TerminatingCounts::default();
    for peerpod in peerpods {
        counts.cached += 1;
        let provider = provider_label(&peerpod.spec.cloud_provider);
        if !counts.oldest_seconds.contains_key(&provider) {
            counts.oldest_seconds.insert(provider.clone(), 0);
            counts.waiting_since.insert(provider.clone(), 0);
            for (_, age) in AGE_BUCKETS {
                counts.by_age.insert(
                    AgeLabels {
                        provider: provider.clone(),
                        age,
                    },
                    0,
                );
            }
        }
        let Some(deleted) = &peerpod.metadata.deletion_timestamp else {
            continue;
        };
        if !peerpod.finalizers().iter().any(|f| f == FINALIZER) {
            continue;
        }
        // A deletionTimestamp ahead of this clock (skew between the API server and us) counts as just now.
        let seconds = now.duration_since(deleted.0).as_secs().max(0);
        let age = AGE_BUCKETS
            .iter()
            .find(|(bound, _)| seconds < *bound)
            .map_or("over_6h", |(_, label)| *label);
        *counts
            .by_age
            .entry(AgeLabels {
                provider: provider.clone(),
                age,
            })
            .or_default() += 1;
        if let Some(since) = peerpod
            .status
            .as_ref()
            .and_then(|s| s.waiting_since.as_ref())
        {
            let since = since.0.as_second();
            let earliest = counts.waiting_since.entry(provider.clone()).or_default();
            if *earliest == 0 || since < *earliest {
                *earliest = since;
            }
        }
        let oldest = counts.oldest_seconds.entry(provider).or_default();
        *oldest = (*oldest).max(seconds);
    }
    counts
}

/// The PeerPods stuck (or just passing) in deletion, read from the controller's PeerPod store on each
/// scrape rather than kept up to date by the reconciler: the age grows while nothing happens, which is
/// exactly when no reconcile would run. Exports nothing while this replica holds no store (a standby).
#[derive(Clone, Default)]
pub struct Terminating {
    store: Arc<RwLock<Option<Store<PeerPod>>>>,
}

impl std::fmt::Debug for Terminating {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Terminating").finish_non_exhaustive()
    }
}

impl Terminating {
    /// Reads `store` from now on (a new leadership term), or nothing (`None`: the term ended).
    pub fn watch(&self, store: Option<Store<PeerPod>>) {
        if let Ok(mut current) = self.store.write() {
            *current = store;
        }
    }

    /// Reads each store `stores` announces until the future is dropped (the leadership term ends), then
    /// none: a replica that lost the Lease must not go on reporting a backlog it no longer watches.
    pub async fn follow(&self, mut stores: tokio::sync::watch::Receiver<Option<Store<PeerPod>>>) {
        struct Forget<'a>(&'a Terminating);
        impl Drop for Forget<'_> {
            fn drop(&mut self) {
                self.0.watch(None);
            }
        }
        let _forget = Forget(self);
        loop {
            self.watch(stores.borrow_and_update().clone());
            if stores.changed().await.is_err() {
                // The controller is gone with its store; the term is ending.
                return std::future::pending().await;
            }
        }
    }

    fn counts(&self) -> Option<TerminatingCounts> {
        let store = self.store.read().ok()?.clone()?;
        let peerpods = store.state();
        Some(terminating_counts(
            peerpods.iter().map(AsRef::as_ref),
            jiff::Timestamp::now(),
        ))
    }
}

impl Collector for Terminating {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(counts) = self.counts() else {
            return Ok(());
        };
        let cached = Gauge::<i64>::default();
        cached.set(i64::try_from(counts.cached).unwrap_or(i64::MAX));
        cached.encode(encoder.encode_descriptor(
            "cached_peerpods",
            "PeerPods in the leader's cache (all namespaces), every one the watch has delivered and not seen deleted",
            None,
            cached.metric_type(),
        )?)?;
        // A family without samples is valid text, but some parsers (and readers) trip on a bare HELP/TYPE
        // pair: with nothing terminating, the scrape carries neither gauge.
        if counts.by_age.is_empty() && counts.oldest_seconds.is_empty() {
            return Ok(());
        }
        let by_age = Family::<AgeLabels, Gauge>::default();
        for (labels, n) in &counts.by_age {
            by_age.get_or_create(labels).set(*n);
        }
        by_age.encode(encoder.encode_descriptor(
            "terminating_peerpods",
            "PeerPods being deleted that still carry peer.pod/finalizer, by provider and time since deletion",
            None,
            by_age.metric_type(),
        )?)?;
        let oldest = Family::<ProviderLabels, Gauge>::default();
        for (provider, seconds) in &counts.oldest_seconds {
            oldest
                .get_or_create(&ProviderLabels {
                    provider: provider.clone(),
                })
                .set(*seconds);
        }
        oldest.encode(encoder.encode_descriptor(
            "terminating_oldest_seconds",
            "Seconds since the deletionTimestamp of the oldest PeerPod still held by peer.pod/finalizer, by provider (0: none)",
            None,
            oldest.metric_type(),
        )?)?;
        let waiting = Family::<ProviderLabels, Gauge>::default();
        for (provider, since) in &counts.waiting_since {
            waiting
                .get_or_create(&ProviderLabels {
                    provider: provider.clone(),
                })
                .set(*since);
        }
        waiting.encode(encoder.encode_descriptor(
            "terminating_waiting_since_timestamp_seconds",
            "The earliest status.waitingSince (Unix seconds) of the PeerPods still held by peer.pod/finalizer: since when the longest-waiting cleanup has been held or failing, by provider (0: none waits)",
            None,
            waiting.metric_type(),
        )?)?;
        Ok(())
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
        m.reverse_orphans
            .get_or_create(&ProviderLabels {
                provider: "libvirt".into(),
            })
            .set(2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains(
            r#"peerpod_ctrl_instance_deletes_total{provider="libvirt",result="deleted"} 1"#
        ));
        assert!(
            text.contains(r#"peerpod_ctrl_reconcile_errors_total{reason="ProviderUnavailable"} 1"#)
        );
        assert!(text.contains("peerpod_ctrl_finalizer_release_seconds_bucket"));
        assert!(
            text.contains(r#"peerpod_ctrl_reverse_orphans{provider="libvirt"} 2"#),
            "{text}"
        );
    }

    fn peerpod(name: &str, provider: &str, deleted: Option<i64>, finalizer: bool) -> PeerPod {
        let mut p = PeerPod::new(
            name,
            peerpods_api::peerpod::PeerPodSpec {
                cloud_provider: provider.into(),
                instance_id: format!("vm-{name}"),
            },
        );
        p.metadata.deletion_timestamp = deleted.map(|s| {
            k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                jiff::Timestamp::from_second(s).expect("valid time"),
            )
        });
        if finalizer {
            p.metadata.finalizers = Some(vec![FINALIZER.into()]);
        }
        p
    }

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(seconds).expect("valid time")
    }

    #[test]
    fn terminating_peerpods_are_counted_by_provider_and_age() {
        let now = 100_000;
        let pods = [
            peerpod("live", "aws", None, true),
            peerpod("fresh", "aws", Some(now - 5), true),
            peerpod("stuck", "aws", Some(now - 7200), true),
            peerpod("released", "aws", Some(now - 9000), false),
            peerpod("libvirt-live", "libvirt", None, true),
        ];
        let counts = terminating_counts(&pods, at(now));
        assert_eq!(counts.cached, 5, "every PeerPod, being deleted or not");
        let get = |provider: &str, age: &'static str| {
            counts.by_age[&AgeLabels {
                provider: provider.into(),
                age,
            }]
        };
        assert_eq!(get("aws", "under_1m"), 1);
        assert_eq!(get("aws", "1h_to_6h"), 1);
        assert_eq!(get("aws", "over_6h"), 0, "released PeerPods are not held");
        assert_eq!(counts.oldest_seconds["aws"], 7200);
        // A provider with only live PeerPods reads as zero in every bucket.
        assert_eq!(get("libvirt", "under_1m"), 0);
        assert_eq!(counts.oldest_seconds["libvirt"], 0);
        assert_eq!(counts.by_age.len(), 2 * AGE_BUCKETS.len());
    }

    #[test]
    fn the_earliest_waiting_since_of_the_held_peerpods_is_exported() {
        let now = 100_000;
        let waiting = |name: &str, deleted: Option<i64>, finalizer: bool, since: i64| {
            let mut p = peerpod(name, "aws", deleted, finalizer);
            p.status = Some(peerpods_api::peerpod::PeerPodStatus {
                waiting_since: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(
                    since,
                ))),
                ..Default::default()
            });
            p
        };
        let pods = [
            waiting("later", Some(now - 60), true, now - 50),
            waiting("earlier", Some(now - 600), true, now - 500),
            peerpod("not-waiting", "aws", Some(now - 900), true),
            // Released: no longer waiting, whatever its status still says.
            waiting("released", Some(now - 9000), false, now - 8000),
            peerpod("libvirt-live", "libvirt", None, true),
        ];
        let counts = terminating_counts(&pods, at(now));
        assert_eq!(counts.waiting_since["aws"], now - 500);
        assert_eq!(counts.waiting_since["libvirt"], 0, "none waits");
    }

    #[test]
    fn a_deletion_timestamp_ahead_of_the_clock_counts_as_now() {
        let pods = [peerpod("skewed", "gcp", Some(1_000), true)];
        let counts = terminating_counts(&pods, at(900));
        assert_eq!(counts.oldest_seconds["gcp"], 0);
        assert_eq!(
            counts.by_age[&AgeLabels {
                provider: "gcp".into(),
                age: "under_1m"
            }],
            1
        );
    }

    #[test]
    fn the_terminating_gauges_are_read_from_the_store_at_scrape_time() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let encode = |registry: &Registry| {
            let mut text = String::new();
            prometheus_client::encoding::text::encode(&mut text, registry).expect("encodes");
            text
        };
        assert!(
            !encode(&registry).contains("terminating_peerpods"),
            "a replica without a store exports nothing"
        );
        let (store, mut writer) = kube::runtime::reflector::store::<PeerPod>();
        let mut stuck = peerpod("stuck", "libvirt", Some(0), true);
        stuck.metadata.namespace = Some("ns".into());
        writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(stuck));
        m.terminating.watch(Some(store));
        let text = encode(&registry);
        assert!(text.contains("peerpod_ctrl_cached_peerpods 1\n"), "{text}");
        assert!(
            text.contains(
                r#"peerpod_ctrl_terminating_peerpods{provider="libvirt",age="over_6h"} 1"#
            ),
            "{text}"
        );
        assert!(
            text.contains(r#"peerpod_ctrl_terminating_oldest_seconds{provider="libvirt"}"#),
            "{text}"
        );
        m.terminating.watch(None);
        let text = encode(&registry);
        assert!(!text.contains("terminating_peerpods") && !text.contains("cached_peerpods"));
    }

    #[test]
    fn an_empty_store_exports_a_scrape_every_reader_parses() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        let (store, _writer) = kube::runtime::reflector::store::<PeerPod>();
        m.terminating.watch(Some(store));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        test_support::metrics::Scrape::parse(&text).expect("the scrape parses");
        assert!(!text.contains("terminating_peerpods"), "{text}");
        assert!(text.contains("peerpod_ctrl_cached_peerpods 0\n"), "{text}");
    }
}
