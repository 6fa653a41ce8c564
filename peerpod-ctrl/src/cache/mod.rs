//! What peerpod-ctrl keeps of the PeerPods it watches, fed from its one watch: the reflector store (read by
//! reconciles and the orphan scan), the owner index, and which events need a reconcile.
//!
//! Memory is the point of doing this by hand instead of chaining kube's `reflect` and `predicate_filter`: the
//! predicate filter would keep a key and hash of every PeerPod next to the store, and every reconcile request
//! queued during the first list would carry the resourceVersion and UID strings of its PeerPod. Here the
//! trigger is decided against the version the store held, and the controller is handed only names and
//! namespaces; it reads the PeerPod itself from the store. With the leaner owner index and owner references
//! (see [`rules::keep_what_is_read`]), 10,000 owner-referenced PeerPods: 41.5 MiB → 31.6 MiB peak RSS
//! (`make bench`).

pub mod rules;

use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::watcher;

use crate::index::OwnerIndex;
use peerpods_api::peerpod::PeerPod;

/// The store and the index of one watch. The index needs the version an event replaces, so both are written
/// here, in one place, in that order.
pub struct Cache {
    writer: Writer<PeerPod>,
    store: Store<PeerPod>,
    index: OwnerIndex,
}

impl Default for Cache {
    fn default() -> Self {
        let (store, writer) = reflector::store();
        Cache {
            writer,
            store,
            index: OwnerIndex::default(),
        }
    }
}

impl Cache {
    /// The PeerPods as last seen, ready once the first list is complete. All clones share it.
    pub fn store(&self) -> Store<PeerPod> {
        self.store.clone()
    }

    /// PeerPods by controlling owner, kept with the store.
    pub fn index(&self) -> OwnerIndex {
        self.index.clone()
    }

    /// Applies one watch event to the index and the store. Returns what to reconcile, if the event changed
    /// something a reconcile decides on (see [`rules::needs_reconcile`]) and a reconcile of it can act (see
    /// [`rules::can_act`]): a PeerPod with only a name and a namespace, which is all the controller's queue keeps
    /// of it.
    pub fn apply(&mut self, event: &watcher::Event<PeerPod>) -> Option<PeerPod> {
        let seen = match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p) | watcher::Event::Delete(p) => {
                Some(p)
            }
            watcher::Event::Init | watcher::Event::InitDone => None,
        };
        // During a re-list the store still serves the objects of the previous list: an unchanged PeerPod is
        // not reconciled again.
        let cached = seen.and_then(|p| self.store.get(&key(p)));
        self.index.apply(event, cached.as_deref());
        self.writer.apply_watcher_event(event);
        match event {
            watcher::Event::Apply(p) | watcher::Event::InitApply(p)
                if rules::needs_reconcile(cached.as_deref(), p)
                    && rules::can_act(p, self.index.shares_owner(p)) =>
            {
                Some(reconcile_request(p))
            }
            _ => None,
        }
    }
}

/// The store's key of a PeerPod. Keys compare by namespace and name only, so the resourceVersion and UID that
/// `ObjectRef::from_obj` would copy are left out.
pub fn key(peerpod: &PeerPod) -> ObjectRef<PeerPod> {
    let key = ObjectRef::new(peerpod.metadata.name.as_deref().unwrap_or_default());
    match peerpod.metadata.namespace.as_deref() {
        Some(namespace) => key.within(namespace),
        None => key,
    }
}

/// The PeerPod as the controller's queue sees it: name and namespace.
fn reconcile_request(peerpod: &PeerPod) -> PeerPod {
    let mut request = PeerPod::new(
        peerpod.metadata.name.as_deref().unwrap_or_default(),
        Default::default(),
    );
    request.metadata.namespace = peerpod.metadata.namespace.clone();
    request
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
    use kube::ResourceExt;
    use peerpods_api::peerpod::{FINALIZER, PeerPodSpec, PeerPodStatus, RELEASE};
    use watcher::Event;

    fn peerpod(name: &str, owner: &str, version: &str) -> PeerPod {
        let mut p = PeerPod::new(
            name,
            PeerPodSpec {
                cloud_provider: "libvirt".into(),
                instance_id: format!("vm-{name}"),
            },
        );
        p.metadata.namespace = Some("ns".into());
        p.metadata.uid = Some(format!("uid-{name}"));
        p.metadata.resource_version = Some(version.into());
        p.metadata.finalizers = Some(vec![FINALIZER.into()]);
        p.metadata.owner_references = Some(vec![OwnerReference {
            uid: owner.into(),
            controller: Some(true),
            ..OwnerReference::default()
        }]);
        p
    }

    fn requested(cache: &mut Cache, events: Vec<Event<PeerPod>>) -> Vec<String> {
        events
            .iter()
            .filter_map(|e| cache.apply(e))
            .map(|p| p.metadata.name.unwrap_or_default())
            .collect()
    }

    /// A whole list (as the watcher delivers one, first or after a relist) of `peerpods`; returns the
    /// names it requests.
    fn listed(cache: &mut Cache, peerpods: impl IntoIterator<Item = PeerPod>) -> Vec<String> {
        let mut events = vec![Event::Init];
        events.extend(peerpods.into_iter().map(Event::InitApply));
        events.push(Event::InitDone);
        requested(cache, events)
    }

    fn names_of(refs: Vec<ObjectRef<PeerPod>>) -> Vec<String> {
        let mut names: Vec<_> = refs.into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    fn deleting(mut p: PeerPod) -> PeerPod {
        p.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::UNIX_EPOCH));
        p
    }

    #[test]
    fn the_first_list_fills_store_and_index_and_requests_by_name_only_what_a_reconcile_can_act_on()
    {
        let mut cache = Cache::default();
        let events = [
            Event::Init,
            Event::InitApply(peerpod("a", "pod-1", "1")),
            Event::InitApply(peerpod("b", "pod-2", "1")),
            // A second PeerPod of pod-1: its reconcile reaps the older one.
            Event::InitApply(peerpod("c", "pod-1", "1")),
            Event::InitApply(deleting(peerpod("d", "pod-3", "1"))),
        ];
        let mut requests: Vec<PeerPod> = events.iter().filter_map(|e| cache.apply(e)).collect();
        let names: Vec<_> = requests.iter().map(|p| p.name_any()).collect();
        assert_eq!(
            names,
            ["c", "d"],
            "live PeerPods alone with their Pod are not queued"
        );
        let request = requests.remove(0);
        assert_eq!(
            (
                request.metadata.name.as_deref(),
                request.metadata.namespace.as_deref()
            ),
            (Some("c"), Some("ns"))
        );
        assert!(
            request.metadata.uid.is_none()
                && request.metadata.resource_version.is_none()
                && request.spec.instance_id.is_empty(),
            "the queue keeps nothing but the key"
        );
        assert!(cache.store().is_empty(), "not before the list is complete");
        assert!(cache.apply(&Event::InitDone).is_none());
        let cached = cache
            .store()
            .get(&ObjectRef::new("a").within("ns"))
            .expect("cached");
        let expected = peerpod("a", "pod-1", "1");
        assert_eq!(
            (&cached.metadata, &cached.spec),
            (&expected.metadata, &expected.spec)
        );
        assert_eq!(names_of(cache.index().owned_by("pod-2")), vec!["b"]);
    }

    #[test]
    fn a_live_peerpod_alone_with_its_pod_is_queued_once_asked_for_a_release() {
        let mut cache = Cache::default();
        assert!(listed(&mut cache, [peerpod("a", "pod-1", "1")]).is_empty());
        let mut asked = peerpod("a", "pod-1", "2");
        asked.metadata.annotations = Some([(RELEASE.to_string(), "operator".to_string())].into());
        assert_eq!(requested(&mut cache, vec![Event::Apply(asked)]), ["a"]);
    }

    #[test]
    fn status_updates_are_cached_but_not_reconciled() {
        let mut cache = Cache::default();
        listed(&mut cache, [peerpod("a", "pod-1", "1")]);
        let mut updated = peerpod("a", "pod-1", "2");
        updated.status = Some(PeerPodStatus {
            cleand: true,
            ..Default::default()
        });
        assert!(requested(&mut cache, vec![Event::Apply(updated.clone())]).is_empty());
        let cached = cache.store().get(&key(&updated)).expect("cached");
        assert_eq!(cached.metadata.resource_version.as_deref(), Some("2"));

        assert_eq!(
            requested(
                &mut cache,
                vec![Event::Apply(deleting(peerpod("a", "pod-1", "3")))]
            ),
            ["a"]
        );
    }

    #[test]
    fn a_relist_reconciles_only_what_changed_while_the_watch_was_down() {
        let mut cache = Cache::default();
        listed(
            &mut cache,
            [
                peerpod("same", "pod-1", "1"),
                peerpod("deleted", "pod-2", "1"),
                peerpod("gone", "pod-3", "1"),
                peerpod("old", "pod-6", "1"),
            ],
        );
        let relisted = listed(
            &mut cache,
            [
                peerpod("same", "pod-1", "1"),
                deleting(peerpod("deleted", "pod-2", "5")),
                // Listed before its unchanged sibling: the previous list still tells it has one.
                peerpod("new", "pod-6", "6"),
                peerpod("old", "pod-6", "1"),
            ],
        );
        assert_eq!(relisted, ["deleted", "new"]);
        assert!(
            cache
                .store()
                .get(&ObjectRef::new("gone").within("ns"))
                .is_none()
        );
        assert!(cache.index().owned_by("pod-3").is_empty());
        assert_eq!(names_of(cache.index().owned_by("pod-1")), vec!["same"]);
    }

    #[test]
    fn an_owner_change_and_a_deletion_keep_the_index_in_step_with_the_store() {
        let mut cache = Cache::default();
        listed(
            &mut cache,
            [peerpod("a", "pod-1", "1"), peerpod("b", "pod-2", "1")],
        );
        assert!(
            requested(&mut cache, vec![Event::Apply(peerpod("a", "pod-3", "2"))]).is_empty(),
            "alone with its new owner"
        );
        assert_eq!(
            requested(&mut cache, vec![Event::Apply(peerpod("a", "pod-2", "3"))]),
            ["a"],
            "joins b"
        );
        assert!(cache.index().owned_by("pod-1").is_empty());
        assert!(cache.index().owned_by("pod-3").is_empty());
        assert_eq!(names_of(cache.index().owned_by("pod-2")), vec!["a", "b"]);
        // A Delete whose object still names an old owner removes what the index holds.
        assert!(requested(&mut cache, vec![Event::Delete(peerpod("a", "pod-1", "4"))]).is_empty());
        assert_eq!(names_of(cache.index().owned_by("pod-2")), vec!["b"]);
        assert_eq!(cache.index().owners(), 1);
    }
}
