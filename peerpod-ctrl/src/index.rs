//! PeerPods grouped by the UID of their controlling owner (the Pod), kept up to date from the same watch
//! stream that feeds the controller's reflector store. kube's `Store` has no secondary indexes; scanning the
//! whole store on each event would cost O(PeerPods) per reconcile, which is what a cleanup storm cannot afford.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::crd::PeerPod;
use crate::decide::controlling_owner_uid;

/// An owner has one PeerPod, rarely a few (a sandbox restarted): a `Vec` holds one entry in one small
/// allocation where a `HashSet` allocates a table, and the owner UID is stored once, shared by both maps.
#[derive(Default)]
struct Maps {
    by_owner: HashMap<Arc<str>, Vec<ObjectRef<PeerPod>>>,
    owner_of: HashMap<ObjectRef<PeerPod>, Arc<str>>,
}

impl Maps {
    fn remove(&mut self, key: &ObjectRef<PeerPod>) {
        if let Some(owner) = self.owner_of.remove(key)
            && let Some(owned) = self.by_owner.get_mut(&owner)
        {
            owned.retain(|k| k != key);
            if owned.is_empty() {
                self.by_owner.remove(&owner);
            }
        }
    }

    fn upsert(&mut self, peerpod: &PeerPod) {
        let key = lean_key(peerpod);
        self.remove(&key);
        if let Some(owner) = controlling_owner_uid(peerpod) {
            let owner: Arc<str> = match self.by_owner.get_key_value(owner) {
                Some((shared, _)) => shared.clone(),
                None => Arc::from(owner),
            };
            self.by_owner
                .entry(owner.clone())
                .or_default()
                .push(key.clone());
            self.owner_of.insert(key, owner);
        }
    }
}

/// The PeerPod's key without the resourceVersion and UID `ObjectRef::from_obj` carries: keys compare by namespace
/// and name only, and with 10,000 PeerPods those two strings per key (held twice here) are megabytes.
fn lean_key(peerpod: &PeerPod) -> ObjectRef<PeerPod> {
    let key = ObjectRef::new(peerpod.metadata.name.as_deref().unwrap_or_default());
    match peerpod.metadata.namespace.as_deref() {
        Some(namespace) => key.within(namespace),
        None => key,
    }
}

#[derive(Default)]
struct State {
    live: Maps,
    /// Filled during a re-list and swapped in when it completes, like the reflector's own buffer, so that
    /// objects deleted while the watch was down disappear from the index too.
    relisting: Option<Maps>,
}

/// Index of PeerPods by controlling owner UID. Cheap to clone; all clones share one index.
#[derive(Clone, Default)]
pub struct OwnerIndex {
    state: Arc<RwLock<State>>,
}

impl OwnerIndex {
    /// Applies one watch event.
    pub fn apply(&self, event: &watcher::Event<PeerPod>) {
        // A poisoned lock only means another thread panicked mid-update of plain maps; the data is still
        // usable and the next re-list rebuilds it anyway.
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(p) => state.live.upsert(p),
            watcher::Event::Delete(p) => state.live.remove(&lean_key(p)),
            watcher::Event::Init => state.relisting = Some(Maps::default()),
            watcher::Event::InitApply(p) => {
                if let Some(maps) = state.relisting.as_mut() {
                    maps.upsert(p);
                }
            }
            watcher::Event::InitDone => {
                if let Some(maps) = state.relisting.take() {
                    state.live = maps;
                }
            }
        }
    }

    /// The PeerPods whose controlling owner has this UID.
    pub fn owned_by(&self, owner_uid: &str) -> Vec<ObjectRef<PeerPod>> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        state
            .live
            .by_owner
            .get(owner_uid)
            .map(|owned| owned.to_vec())
            .unwrap_or_default()
    }

    /// Number of owners with at least one PeerPod.
    pub fn owners(&self) -> usize {
        self.state
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .live
            .by_owner
            .len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::PeerPodSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;

    fn peerpod(name: &str, owner: Option<&str>) -> PeerPod {
        let mut p = PeerPod::new(name, PeerPodSpec::default());
        p.metadata.namespace = Some("ns".into());
        p.metadata.owner_references = owner.map(|uid| {
            vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: "pod".into(),
                uid: uid.into(),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]
        });
        p
    }

    fn names(refs: Vec<ObjectRef<PeerPod>>) -> Vec<String> {
        let mut names: Vec<_> = refs.into_iter().map(|r| r.name).collect();
        names.sort();
        names
    }

    #[test]
    fn groups_by_owner_and_forgets_deleted() {
        let index = OwnerIndex::default();
        index.apply(&watcher::Event::Apply(peerpod("a", Some("u1"))));
        index.apply(&watcher::Event::Apply(peerpod("b", Some("u1"))));
        index.apply(&watcher::Event::Apply(peerpod("c", Some("u2"))));
        index.apply(&watcher::Event::Apply(peerpod("ownerless", None)));
        assert_eq!(names(index.owned_by("u1")), vec!["a", "b"]);
        assert_eq!(index.owners(), 2);
        index.apply(&watcher::Event::Delete(peerpod("a", Some("u1"))));
        assert_eq!(names(index.owned_by("u1")), vec!["b"]);
        index.apply(&watcher::Event::Delete(peerpod("c", Some("u2"))));
        assert_eq!(index.owners(), 1);
    }

    #[test]
    fn owner_change_moves_the_object() {
        let index = OwnerIndex::default();
        index.apply(&watcher::Event::Apply(peerpod("a", Some("u1"))));
        index.apply(&watcher::Event::Apply(peerpod("a", Some("u2"))));
        assert!(index.owned_by("u1").is_empty());
        assert_eq!(names(index.owned_by("u2")), vec!["a"]);
    }

    #[test]
    fn relist_replaces_the_index_when_done() {
        let index = OwnerIndex::default();
        index.apply(&watcher::Event::Apply(peerpod("gone", Some("u1"))));
        index.apply(&watcher::Event::Init);
        index.apply(&watcher::Event::InitApply(peerpod("kept", Some("u1"))));
        // Until the re-list completes, the old view stays visible.
        assert_eq!(names(index.owned_by("u1")), vec!["gone"]);
        index.apply(&watcher::Event::InitDone);
        assert_eq!(names(index.owned_by("u1")), vec!["kept"]);
    }
}
