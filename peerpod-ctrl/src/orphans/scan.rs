//! The orphan scan's acts: every `interval`, `ListInstances` with this cluster's tag for each provider, the Pods
//! an untracked VM's name may belong to, and, with the `delete` policy and within the guards of [`super::rules`],
//! `DeleteInstance`; each finding reported as a log line, a metric and an Event on the Namespace.

use std::collections::BTreeMap;

use futures::FutureExt;
use k8s_openapi::api::core::v1::{ObjectReference, Pod};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::Store;
use peerpods_runtime::events::Events;
use tracing::{info, warn};

use super::rules::{self, DeletionRefused, Vm};
use super::{Adoptable, FirstSeen, OrphanPolicy, OrphanSettings, ScanReport};
use crate::Error;
use crate::adopt::{self, PodIndex, PodRef};
use crate::developer_mode::Mode;
use crate::instance::instance_key;
use crate::metrics::{Metrics, ProviderLabels, ReasonLabels, RefusalLabels, provider_label};
use crate::periodic::Every;
use crate::provider::{About, DeleteAnswer, Provider};
use peerpods_api::peerpod::PeerPod;
use peerpods_api::peerpod::{EventReason, INSTANCE_API_VERSION};
use peerpods_proto::RequesterReason;

/// The orphan scanner of one leadership term.
pub struct Scanner {
    /// Reads the Pods (metadata only) an untracked VM's name may belong to.
    pub client: kube::Client,
    pub provider: Provider,
    pub events: Events,
    pub metrics: Metrics,
    pub settings: OrphanSettings,
    pub first_seen: FirstSeen,
    /// cloud-api-adaptor's developer mode: on or unknown, no orphan is deleted (it may be a kept VM).
    pub developer_mode: Mode,
}

impl Scanner {
    /// Scans every `interval` once the PeerPod cache is complete, until dropped.
    pub async fn run(mut self, store: tokio::sync::watch::Receiver<Option<Store<PeerPod>>>) {
        if self.settings.cluster_tag.is_none() {
            info!("no --cluster-tag: orphan VM scan disabled");
            return;
        }
        let Some(mut every) = Every::start(self.settings.interval, store).await else {
            return;
        };
        loop {
            let report = self.scan(every.tick().await).await;
            if !report.orphans.is_empty() {
                info!(
                    orphans = report.orphans.len(),
                    deleted = report.deleted.len(),
                    "orphan scan done"
                );
            }
        }
    }

    /// One pass over all providers.
    pub async fn scan(&mut self, store: &Store<PeerPod>) -> ScanReport {
        let mut report = ScanReport::default();
        let Some((key, value)) = self.settings.cluster_tag.clone() else {
            return report;
        };
        // Until the first list is complete every VM looks orphaned: not even a report is worth making.
        if !synced(store) {
            self.refused("*", &DeletionRefused::CacheNotSynced).await;
            report
                .refused
                .push(("*".to_string(), DeletionRefused::CacheNotSynced));
            return report;
        }
        let selector = BTreeMap::from([(key, value)]);
        let providers = match self.provider.providers().await {
            Ok(p) => p,
            Err(error) => {
                self.scan_failed("*", &error);
                return report;
            }
        };
        for name in providers {
            if let Err(error) = self
                .scan_provider(&name, &selector, store, &mut report)
                .await
            {
                self.scan_failed(&name, &error);
            }
        }
        self.metrics.orphan_scans.inc();
        report
    }

    /// A guard stopped the deletions of a scan: log, metric and an Event on the Namespace.
    async fn refused(&self, provider: &str, why: &DeletionRefused) {
        warn!(
            provider,
            reason = why.reason(),
            "orphan VMs not deleted: {why}"
        );
        self.metrics
            .orphan_deletions_refused
            .get_or_create(&RefusalLabels {
                provider: provider_label(provider),
                reason: why.reason().to_string(),
            })
            .inc();
        self.publish_event(
            None,
            EventType::Warning,
            why.reason(),
            "DeleteInstance",
            format!("{provider}: {why}"),
        );
    }

    fn scan_failed(&self, provider: &str, error: &Error) {
        warn!(provider, reason = error.reason(), %error, "orphan scan failed");
        self.metrics
            .orphan_scan_errors
            .get_or_create(&ReasonLabels {
                reason: error.reason().to_string(),
            })
            .inc();
    }

    async fn scan_provider(
        &mut self,
        provider: &str,
        selector: &BTreeMap<String, String>,
        store: &Store<PeerPod>,
        report: &mut ScanReport,
    ) -> Result<(), Error> {
        let listed = self.provider.instances(provider, selector).await?;
        let now = jiff::Timestamp::now();
        let vms: Vec<Vm> = listed
            .into_iter()
            .map(|i| {
                let since = i.created.unwrap_or_else(|| {
                    *self
                        .first_seen
                        .0
                        .entry(instance_key(provider, &i.instance_id))
                        .or_insert(now)
                });
                Vm {
                    provider: provider.to_string(),
                    name: i.name,
                    do_not_delete: rules::tags_do_not_delete(&i.tags),
                    instance_id: i.instance_id,
                    since,
                }
            })
            .collect();
        // Forget VMs that disappeared so the map does not grow forever. Through a set of the listed keys: a scan
        // stays linear in VMs + PeerPods (a search of the list per remembered VM was quadratic in the VMs).
        let listed: std::collections::HashSet<(String, String)> = vms
            .iter()
            .map(|v| instance_key(provider, &v.instance_id))
            .collect();
        self.first_seen
            .0
            .retain(|key, _| key.0 != provider || listed.contains(key));
        // The cache is read after listing, so a PeerPod created meanwhile is seen.
        let tracked = rules::tracked_instances(store.state().iter().map(|p| p.as_ref()));
        let untracked: Vec<Vm> = rules::orphans(&vms, &tracked, now, self.settings.grace)
            .into_iter()
            .cloned()
            .collect();
        let (adoptable, orphans) = self.adoptable(untracked).await?;
        self.report_adoptable(provider, &adoptable).await;
        report.adoptable.extend(adoptable);
        self.metrics
            .orphans_found
            .get_or_create(&ProviderLabels {
                provider: provider_label(provider),
            })
            .set(orphans.len() as i64);
        for vm in &orphans {
            warn!(provider, instance_id = %vm.instance_id, since = %vm.since, "orphan VM: no PeerPod refers to it");
            let note = format!(
                "{provider} instance {} carries this cluster's tag, exists since {} and no PeerPod refers to it",
                vm.instance_id, vm.since
            );
            self.publish(
                vm,
                EventType::Warning,
                EventReason::OrphanInstanceFound.as_str(),
                "ScanInstances",
                note,
            );
        }
        report.orphans.extend(orphans.iter().cloned());
        if self.settings.policy != OrphanPolicy::Delete {
            return Ok(());
        }
        let (protected, doomed): (Vec<Vm>, Vec<Vm>) =
            orphans.into_iter().partition(|vm| vm.do_not_delete);
        for vm in &protected {
            info!(provider, instance_id = %vm.instance_id, "orphan VM tagged do-not-delete; not deleting it");
        }
        if let Err(why) = rules::orphan_deletions_allowed(
            synced(store),
            self.developer_mode.current(),
            doomed.len(),
            vms.len(),
            self.settings.cap,
        ) {
            self.refused(provider, &why).await;
            report.refused.push((provider.to_string(), why));
            return Ok(());
        }
        for vm in doomed {
            // Re-check right before deleting: a PeerPod may have appeared since the scan started.
            let tracked = rules::tracked_instances(store.state().iter().map(|p| p.as_ref()));
            if tracked.contains(&instance_key(provider, &vm.instance_id)) {
                continue;
            }
            let about = About {
                namespace: &self.settings.event_namespace,
                name: &vm.instance_id,
                reason: RequesterReason::OrphanInstance,
            };
            let outcome = match self
                .provider
                .delete_instance(provider, &vm.instance_id, about)
                .await
            {
                Ok(DeleteAnswer::Gone(outcome)) => outcome,
                // provider-service deletes it on its own time; the next scan asks again (and confirms).
                Ok(DeleteAnswer::InProgress { .. }) => {
                    info!(provider, instance_id = %vm.instance_id, "orphan VM delete in progress; the next scan confirms it");
                    continue;
                }
                // Tagged do-not-delete after it was listed: a hold, not a failed scan.
                Err(error @ Error::InstanceProtected { .. }) => {
                    info!(provider, instance_id = %vm.instance_id, %error, "orphan VM protected; not deleted");
                    self.publish(
                        &vm,
                        EventType::Normal,
                        error.reason(),
                        "DeleteInstance",
                        error.to_string(),
                    );
                    continue;
                }
                Err(error) => return Err(error),
            };
            self.metrics
                .orphans_deleted
                .get_or_create(&ProviderLabels {
                    provider: provider_label(provider),
                })
                .inc();
            info!(provider, instance_id = %vm.instance_id, result = outcome.label(), "orphan VM deleted");
            let note = format!("Deleted orphan {provider} instance {}", vm.instance_id);
            self.publish(
                &vm,
                EventType::Normal,
                EventReason::OrphanInstanceDeleted.as_str(),
                "DeleteInstance",
                note,
            );
            report.deleted.push(vm);
        }
        Ok(())
    }

    /// Splits untracked VMs into adoptable ones (cloud-api-adaptor's name of a live Pod's VM) and orphans. The
    /// Pods are listed only when some VM carries such a name at all.
    async fn adoptable(&self, untracked: Vec<Vm>) -> Result<(Vec<Adoptable>, Vec<Vm>), Error> {
        if !untracked
            .iter()
            .any(|vm| adopt::parse_vm_name(&vm.name).is_some())
        {
            return Ok((Vec::new(), untracked));
        }
        let pods = self.live_pods().await?;
        let mut adoptable = Vec::new();
        let mut orphans = Vec::new();
        for vm in untracked {
            match pods.owners_of(&vm.name) {
                [] => orphans.push(vm),
                owners => adoptable.push(Adoptable {
                    pods: owners.to_vec(),
                    vm,
                }),
            }
        }
        Ok((adoptable, orphans))
    }

    /// Every Pod of the cluster, by metadata only (a Pod being deleted counts: its VM goes with its sandbox),
    /// a page at a time.
    async fn live_pods(&self) -> Result<PodIndex, Error> {
        let api: Api<Pod> = Api::all(self.client.clone());
        let mut params = ListParams::default().limit(500);
        let mut pods = Vec::new();
        loop {
            let page = api.list_metadata(&params).await?;
            pods.extend(page.items.iter().map(|p| PodRef {
                namespace: p.namespace().unwrap_or_default(),
                name: p.name_any(),
            }));
            match page.metadata.continue_.filter(|token| !token.is_empty()) {
                Some(token) => params = params.continue_token(&token),
                None => break,
            }
        }
        Ok(PodIndex::new(pods))
    }

    async fn report_adoptable(&self, provider: &str, adoptable: &[Adoptable]) {
        self.metrics
            .adoptable_found
            .get_or_create(&ProviderLabels {
                provider: provider_label(provider),
            })
            .set(adoptable.len() as i64);
        for found in adoptable {
            let vm = &found.vm;
            let pods = found
                .pods
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            warn!(
                provider,
                instance_id = %vm.instance_id,
                name = %vm.name,
                pods,
                "adoptable VM: no PeerPod refers to it, but its name is cloud-api-adaptor's for a live Pod; not deleted"
            );
            let note = format!(
                "{provider} instance {} ({}) carries this cluster's tag and no PeerPod refers to it, but its name is \
                 cloud-api-adaptor's for the VM of Pod {pods}: adoptable, never deleted while the Pod exists",
                vm.instance_id, vm.name
            );
            self.publish(
                vm,
                EventType::Warning,
                EventReason::AdoptableInstanceFound.as_str(),
                "ScanInstances",
                note,
            );
        }
    }

    /// An Event about `vm` on the Namespace. The VM is the Event's related object (`<provider>/<instance id>`,
    /// kind `Instance`): the recorder keys its series by it, so every orphan VM gets an Event of its own
    /// (and a repeat finding of the same VM counts up in its series instead of adding an Event).
    fn publish(&self, vm: &Vm, type_: EventType, reason: &str, action: &str, note: String) {
        let instance = ObjectReference {
            api_version: Some(INSTANCE_API_VERSION.into()),
            kind: Some("Instance".into()),
            name: Some(format!("{}/{}", vm.provider, vm.instance_id)),
            ..ObjectReference::default()
        };
        self.publish_event(Some(instance), type_, reason, action, note);
    }

    /// An Event on the Namespace, about `related` if given.
    fn publish_event(
        &self,
        related: Option<ObjectReference>,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        // The reference carries the namespace too: the recorder creates the Event in the namespace of the
        // object it is about and, for a cluster-scoped object without one, in `default`, where nobody
        // looking at the controller would find it.
        let reference = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("Namespace".into()),
            name: Some(self.settings.event_namespace.clone()),
            namespace: Some(self.settings.event_namespace.clone()),
            ..ObjectReference::default()
        };
        let event = Event {
            type_,
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: related,
        };
        self.events.publish(event, reference);
    }
}

/// Whether the PeerPod cache has completed its first list (without waiting for it).
fn synced(store: &Store<PeerPod>) -> bool {
    store
        .wait_until_ready()
        .now_or_never()
        .is_some_and(|ready| ready.is_ok())
}
