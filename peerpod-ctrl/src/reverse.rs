//! Reverse collection: a live PeerPod (not being deleted) whose VM the cloud no longer has. Someone deleted
//! the VM behind cloud-api-adaptor's back, or the cloud lost it; the pod is broken and nobody would notice.
//!
//! Every `interval`, for each provider that live PeerPods name, one `ListInstances` with an empty selector
//! (every instance the provider sees, not only this cluster's tag: a VM created without the tag still
//! counts as present). A PeerPod whose VM is absent is remembered; when it is still absent at a later scan
//! at least `grace` after it was first found absent, the absence is confirmed: the PeerPod gets the condition
//! `InstancePresent=False` (reason `InstanceNotFound`, `status.state: InstanceMissing`), a Warning Event and
//! the `peerpod_ctrl_reverse_orphans` gauge counts it. The grace period absorbs a cloud's eventual
//! consistency (EC2 answers NotFound for seconds after RunInstances) and a PeerPod created after the list.
//! A provider whose list fails proves nothing: its PeerPods keep what they had.
//!
//! Nothing is deleted: the PeerPod belongs to its Pod and to cloud-api-adaptor. If the VM shows up again the
//! condition turns `True` (reason `InstanceFound`) and the state back to `Live`.
//!
//! Status is written by server-side apply under [`FIELD_MANAGER`], carrying the cached `resourceVersion`, so
//! a write that would land on a PeerPod changed meanwhile (for example one just being deleted, whose cleanup
//! condition the reconciler writes) fails with a conflict and is skipped until the next scan.
//!
//! The same listing links a PeerPod without an instance id (cloud-api-adaptor's libvirt provider could write
//! one when a domain of the same name existed, upstream #3248) to its VM by cloud-api-adaptor's names
//! ([`crate::adopt::matched_instance`]): where exactly one VM of its provider carries the name of its Pod's
//! VM, `status.matchedInstance` shows that VM's id (Event `InstanceMatchedByName`); where none or several
//! do, nothing is shown. It is written under a field manager of its own ([`ADOPTION_FIELD_MANAGER`]) and
//! only shown: the cleanup still holds such a PeerPod as invalid, and no VM is deleted on its name alone.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::Api;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use peerpods_runtime::events::Events;
use peerpods_runtime::status::apply_status;
use tracing::{info, warn};

use crate::metrics::{Metrics, ProviderLabels, provider_label};
use crate::periodic::Every;
use crate::provider::Provider;
use peerpods_api::peerpod::{
    CONDITION_INSTANCE_PRESENT, EventReason, InstancePresentReason, PeerPod, PeerPodState,
};

/// The field manager of reverse collection's status writes. Not the reconciler's ([`crate::cleanup::FIELD_MANAGER`]):
/// an apply removes the fields its manager owned and no longer sends, so one manager for both writers would
/// have each write drop the other's condition (and `cleand`).
pub const FIELD_MANAGER: &str = "peerpod-ctrl-reverse-collection";
/// The field manager of `status.matchedInstance`: its apply carries that field alone, so clearing it is an
/// apply without it.
pub const ADOPTION_FIELD_MANAGER: &str = "peerpod-ctrl-adoption";

/// Settings of the reverse scan.
#[derive(Debug, Clone)]
pub struct ReverseSettings {
    /// Time between scans; zero turns reverse collection off.
    pub interval: Duration,
    /// How long a VM must stay absent before it is reported.
    pub grace: Duration,
}

/// A PeerPod, as far as reverse collection cares.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Subject {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// When each live PeerPod whose VM a scan did not find was first found absent, by the PeerPod's UID (unique
/// across namespaces and across a namesake created later). The UID alone, boxed: when a cloud loses many VMs
/// this holds an entry per PeerPod, and a namespace and a name beside each would triple it.
pub type AbsentSince = HashMap<Box<str>, jiff::Timestamp>;

/// What one scan concluded about one live PeerPod whose provider answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Listed: present.
    Present,
    /// Absent, but not yet for the grace period: wait.
    Unconfirmed,
    /// Absent at two scans at least the grace period apart.
    Missing { since: jiff::Timestamp },
}

/// Judges one PeerPod, by its UID, from the listing of its provider. `absent_since` remembers first absences
/// across scans and is updated: cleared when the VM is listed, set when it is first absent.
pub fn judge(
    uid: &str,
    listed: bool,
    absent_since: &mut AbsentSince,
    now: jiff::Timestamp,
    grace: Duration,
) -> Verdict {
    if listed {
        absent_since.remove(uid);
        return Verdict::Present;
    }
    let since = match absent_since.get(uid) {
        Some(since) => *since,
        None => {
            absent_since.insert(uid.into(), now);
            now
        }
    };
    let absent_for = now.duration_since(since);
    // The first scan that sees the absence never confirms it, even with a zero grace: "gone" needs a later
    // lookup that agrees.
    if since < now
        && absent_for >= jiff::SignedDuration::try_from(grace).unwrap_or(jiff::SignedDuration::MAX)
    {
        Verdict::Missing { since }
    } else {
        Verdict::Unconfirmed
    }
}

/// The live PeerPods worth checking: not being deleted, naming a provider and an instance.
fn live(peerpods: &[Arc<PeerPod>]) -> BTreeMap<String, Vec<Arc<PeerPod>>> {
    by_provider(peerpods, |p| {
        p.metadata.deletion_timestamp.is_none()
            && !p.spec.cloud_provider.is_empty()
            && !p.spec.instance_id.is_empty()
    })
}

/// PeerPods without an instance id but naming a provider, live or being deleted: the ones to link by name.
fn without_id(peerpods: &[Arc<PeerPod>]) -> BTreeMap<String, Vec<Arc<PeerPod>>> {
    by_provider(peerpods, |p| {
        !p.spec.cloud_provider.trim().is_empty() && p.spec.instance_id.trim().is_empty()
    })
}

/// The PeerPods that `keep` keeps, by the provider they name.
fn by_provider(
    peerpods: &[Arc<PeerPod>],
    keep: impl Fn(&PeerPod) -> bool,
) -> BTreeMap<String, Vec<Arc<PeerPod>>> {
    let mut by_provider: BTreeMap<String, Vec<Arc<PeerPod>>> = BTreeMap::new();
    for p in peerpods.iter().filter(|p| keep(p)) {
        by_provider
            .entry(p.spec.cloud_provider.clone())
            .or_default()
            .push(p.clone());
    }
    by_provider
}

fn subject(p: &PeerPod) -> Subject {
    Subject {
        namespace: p.namespace().unwrap_or_default(),
        name: p.name_any(),
        uid: p.uid().unwrap_or_default(),
    }
}

/// The reverse scanner of one leadership term.
pub struct ReverseScanner {
    pub client: kube::Client,
    pub provider: Provider,
    pub events: Events,
    pub metrics: Metrics,
    pub settings: ReverseSettings,
    absent_since: AbsentSince,
    /// Providers whose gauge this scanner has set, so one that drops out is set back to 0.
    gauged: std::collections::BTreeSet<String>,
}

/// One scan's findings, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReverseReport {
    /// PeerPods whose VM is confirmed missing.
    pub missing: Vec<Subject>,
    /// Providers whose listing failed.
    pub failed: Vec<String>,
}

impl ReverseScanner {
    pub fn new(
        client: kube::Client,
        provider: Provider,
        events: Events,
        metrics: Metrics,
        settings: ReverseSettings,
    ) -> Self {
        ReverseScanner {
            client,
            provider,
            events,
            metrics,
            settings,
            absent_since: HashMap::new(),
            gauged: std::collections::BTreeSet::new(),
        }
    }

    /// Scans every `interval` once the PeerPod cache is complete, until dropped.
    pub async fn run(mut self, store: tokio::sync::watch::Receiver<Option<Store<PeerPod>>>) {
        if self.settings.interval.is_zero() {
            info!("--reverse-scan-interval 0: reverse collection disabled");
            return;
        }
        let Some(mut every) = Every::start(self.settings.interval, store).await else {
            return;
        };
        loop {
            let report = self.scan(every.tick().await).await;
            if !report.missing.is_empty() {
                info!(
                    missing = report.missing.len(),
                    "reverse scan done: live PeerPods whose VM is gone"
                );
            }
        }
    }

    /// One pass over every provider live PeerPods name.
    pub async fn scan(&mut self, store: &Store<PeerPod>) -> ReverseReport {
        let mut report = ReverseReport::default();
        let state = store.state();
        let mut by_provider = live(&state);
        let mut unlinked = without_id(&state);
        // PeerPods deleted (or being deleted) are no longer this scan's business. Their UIDs are borrowed from
        // the cache's PeerPods, not copied.
        let alive: HashSet<&str> = by_provider
            .values()
            .flatten()
            .filter_map(|p| p.metadata.uid.as_deref())
            .collect();
        self.absent_since.retain(|uid, _| alive.contains(&**uid));
        drop(alive);
        let mut missing_per_provider: BTreeMap<String, i64> = BTreeMap::new();
        let providers: std::collections::BTreeSet<String> =
            by_provider.keys().chain(unlinked.keys()).cloned().collect();
        for provider in providers {
            let peerpods = by_provider.remove(&provider).unwrap_or_default();
            let instances = match self.provider.instances(&provider, &BTreeMap::new()).await {
                Ok(instances) => instances,
                Err(error) => {
                    warn!(provider, reason = error.reason(), %error, "reverse scan: cannot list instances");
                    report.failed.push(provider);
                    continue;
                }
            };
            for p in unlinked.remove(&provider).unwrap_or_default() {
                let matched = crate::adopt::matched_instance(
                    &p.name_any(),
                    instances
                        .iter()
                        .map(|i| (i.instance_id.as_str(), i.name.as_str())),
                );
                self.link(&p, matched).await;
            }
            // One identity per instance: the cloud's canonical id, as every other comparison.
            let listed = instances
                .iter()
                .map(|i| crate::instance::instance_key(&provider, &i.instance_id))
                .collect::<HashSet<(String, String)>>();
            let now = jiff::Timestamp::now();
            let mut missing = 0;
            for p in peerpods {
                let verdict = judge(
                    p.metadata.uid.as_deref().unwrap_or_default(),
                    listed.contains(&crate::instance::instance_key(
                        &provider,
                        &p.spec.instance_id,
                    )),
                    &mut self.absent_since,
                    now,
                    self.settings.grace,
                );
                match verdict {
                    Verdict::Missing { since } => {
                        missing += 1;
                        self.report_missing(&p, since).await;
                        report.missing.push(subject(&p));
                    }
                    Verdict::Present => self.report_found(&p).await,
                    Verdict::Unconfirmed => {}
                }
            }
            *missing_per_provider.entry(provider).or_default() += missing;
        }
        // A provider no live PeerPod names any more has none missing: its gauge goes to 0, not stale. One
        // whose listing failed keeps its last value.
        for provider in std::mem::take(&mut self.gauged) {
            if !missing_per_provider.contains_key(&provider) && !report.failed.contains(&provider) {
                missing_per_provider.insert(provider, 0);
            }
        }
        self.gauged = missing_per_provider
            .keys()
            .cloned()
            .chain(report.failed.iter().cloned())
            .collect();
        for (provider, missing) in missing_per_provider {
            self.metrics
                .reverse_orphans
                .get_or_create(&ProviderLabels {
                    provider: provider_label(&provider),
                })
                .set(missing);
        }
        report
    }

    async fn report_missing(&self, peerpod: &PeerPod, since: jiff::Timestamp) {
        if instance_condition(peerpod).is_some_and(|c| c.status == "False") {
            return;
        }
        let message = format!(
            "{} instance {} is not listed by the cloud since {since} although this PeerPod is not being \
             deleted; nothing was deleted: the Pod has no VM behind it",
            peerpod.spec.cloud_provider, peerpod.spec.instance_id
        );
        warn!(
            namespace = %peerpod.namespace().unwrap_or_default(),
            name = %peerpod.name_any(),
            provider = %peerpod.spec.cloud_provider,
            instance_id = %peerpod.spec.instance_id,
            "live PeerPod whose VM is gone"
        );
        if self
            .write(
                peerpod,
                false,
                InstancePresentReason::InstanceNotFound.as_str(),
                &message,
            )
            .await
        {
            self.publish(
                peerpod,
                EventType::Warning,
                InstancePresentReason::InstanceNotFound.as_str(),
                message,
            );
        }
    }

    async fn report_found(&self, peerpod: &PeerPod) {
        // Only a PeerPod reported missing is written to: a healthy one costs no write at all.
        if instance_condition(peerpod).is_none_or(|c| c.status != "False") {
            return;
        }
        let message = format!(
            "{} instance {} is listed by the cloud again",
            peerpod.spec.cloud_provider, peerpod.spec.instance_id
        );
        if self
            .write(
                peerpod,
                true,
                InstancePresentReason::InstanceFound.as_str(),
                &message,
            )
            .await
        {
            self.publish(
                peerpod,
                EventType::Normal,
                InstancePresentReason::InstanceFound.as_str(),
                message,
            );
        }
    }

    /// Writes the condition, the state and the reason; false when nothing was written (conflict, gone).
    async fn write(&self, peerpod: &PeerPod, present: bool, reason: &str, message: &str) -> bool {
        let now = Time(jiff::Timestamp::now());
        let state = if present {
            PeerPodState::Live
        } else {
            PeerPodState::InstanceMissing
        };
        // Only InstancePresent among the conditions: they are a map keyed by type, so the API server keeps the
        // others as the live object has them. No `cleand`: it is the reconciler's.
        let status = serde_json::json!({
            "conditions": [Condition {
                type_: CONDITION_INSTANCE_PRESENT.to_string(),
                status: if present { "True" } else { "False" }.to_string(),
                reason: reason.to_string(),
                message: message.to_string(),
                observed_generation: peerpod.metadata.generation,
                last_transition_time: now.clone(),
            }],
            "state": state,
            "reason": reason,
            "lastAttemptTime": now,
        });
        let api: Api<PeerPod> = Api::namespaced(
            self.client.clone(),
            &peerpod.namespace().unwrap_or_default(),
        );
        // Forced (see `apply_status`): state, reason and lastAttemptTime are shared with the reconciler's field
        // manager; the resourceVersion precondition, not a conflict on them, keeps this write off a PeerPod the
        // reconciler wrote since the scan's copy.
        match apply_status(
            &api,
            &peerpod.name_any(),
            FIELD_MANAGER,
            &status,
            peerpod.resource_version().as_deref(),
        )
        .await
        {
            Ok(_) => true,
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => false,
            Err(error) => {
                warn!(%error, name = %peerpod.name_any(), "reverse scan: cannot write status");
                false
            }
        }
    }

    /// Shows `matched` as the PeerPod's `status.matchedInstance` (or nothing when `None`); no write when the
    /// status already says so.
    async fn link(&self, peerpod: &PeerPod, matched: Option<&str>) {
        let shown = peerpod
            .status
            .as_ref()
            .and_then(|s| s.matched_instance.as_deref());
        if shown == matched {
            return;
        }
        let status = match matched {
            Some(id) => serde_json::json!({ "matchedInstance": id }),
            None => serde_json::json!({}),
        };
        let api: Api<PeerPod> = Api::namespaced(
            self.client.clone(),
            &peerpod.namespace().unwrap_or_default(),
        );
        let written = apply_status(
            &api,
            &peerpod.name_any(),
            ADOPTION_FIELD_MANAGER,
            &status,
            peerpod.resource_version().as_deref(),
        )
        .await;
        match written {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.is_conflict() || status.is_not_found() => {
                return;
            }
            Err(error) => {
                warn!(%error, name = %peerpod.name_any(), "reverse scan: cannot write the matched instance");
                return;
            }
        }
        let Some(id) = matched else { return };
        let message = format!(
            "this PeerPod has no instance ID; {} instance {id} is the one VM whose name is cloud-api-adaptor's for \
             its Pod: shown in status.matchedInstance, never deleted on the name alone",
            peerpod.spec.cloud_provider
        );
        info!(
            namespace = %peerpod.namespace().unwrap_or_default(),
            name = %peerpod.name_any(),
            provider = %peerpod.spec.cloud_provider,
            instance_id = id,
            "PeerPod without an instance ID matched to its VM by name"
        );
        self.publish(
            peerpod,
            EventType::Normal,
            EventReason::InstanceMatchedByName.as_str(),
            message,
        );
    }

    fn publish(&self, peerpod: &PeerPod, type_: EventType, reason: &str, note: String) {
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: "ListInstances".to_string(),
            secondary: None,
        };
        self.events.publish(event, peerpod.object_ref(&()));
    }
}

fn instance_condition(peerpod: &PeerPod) -> Option<&Condition> {
    peerpod
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == CONDITION_INSTANCE_PRESENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(name: &str) -> String {
        format!("uid-{name}")
    }

    fn at(seconds: i64) -> jiff::Timestamp {
        jiff::Timestamp::from_second(1_700_000_000 + seconds).expect("valid")
    }

    #[test]
    fn an_absence_is_confirmed_only_by_a_later_scan_past_the_grace() {
        let mut seen = HashMap::new();
        let grace = Duration::from_secs(60);
        let a = who("a");
        assert_eq!(
            judge(&a, false, &mut seen, at(0), grace),
            Verdict::Unconfirmed
        );
        assert_eq!(
            judge(&a, false, &mut seen, at(59), grace),
            Verdict::Unconfirmed
        );
        assert_eq!(
            judge(&a, false, &mut seen, at(60), grace),
            Verdict::Missing { since: at(0) }
        );
    }

    #[test]
    fn a_zero_grace_still_needs_two_scans() {
        let mut seen = HashMap::new();
        let a = who("a");
        assert_eq!(
            judge(&a, false, &mut seen, at(0), Duration::ZERO),
            Verdict::Unconfirmed
        );
        assert_eq!(
            judge(&a, false, &mut seen, at(1), Duration::ZERO),
            Verdict::Missing { since: at(0) }
        );
    }

    #[test]
    fn a_listed_vm_resets_the_clock() {
        let mut seen = HashMap::new();
        let grace = Duration::from_secs(60);
        let a = who("a");
        judge(&a, false, &mut seen, at(0), grace);
        assert_eq!(judge(&a, true, &mut seen, at(30), grace), Verdict::Present);
        assert_eq!(
            judge(&a, false, &mut seen, at(70), grace),
            Verdict::Unconfirmed
        );
        assert_eq!(
            judge(&a, false, &mut seen, at(130), grace),
            Verdict::Missing { since: at(70) }
        );
    }

    #[test]
    fn only_live_peerpods_with_an_instance_are_checked() {
        let mut live_one = PeerPod::new("a", Default::default());
        live_one.spec.cloud_provider = "libvirt".into();
        live_one.spec.instance_id = "vm-1".into();
        let mut deleting = live_one.clone();
        deleting.metadata.name = Some("b".into());
        deleting.metadata.deletion_timestamp = Some(Time(at(0)));
        let mut nameless = live_one.clone();
        nameless.metadata.name = Some("c".into());
        nameless.spec.instance_id = String::new();
        let checked = live(&[Arc::new(live_one), Arc::new(deleting), Arc::new(nameless)]);
        let names: Vec<String> = checked.values().flatten().map(|p| p.name_any()).collect();
        assert_eq!(names, ["a"]);
    }
}
