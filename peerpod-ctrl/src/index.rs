//! PeerPods grouped by the UID of their controlling owner (the Pod), kept up to date from the same watch
//! stream that feeds the controller's reflector store. kube's `Store` has no secondary indexes; scanning the
//! whole store on each event would cost O(PeerPods) per reconcile, which is what a cleanup storm cannot afford.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::stale::rules::controlling_owner_uid;
use peerpods_api::peerpod::PeerPod;

/// One PeerPod of an owner: its namespace and name, the part of an `ObjectRef` that identifies it. An
/// `ObjectRef` is 96 bytes with room for a resourceVersion and UID the index never needs; with 10,000 PeerPods
/// every byte per entry is 10 kB.
#[derive(Debug, PartialEq, Eq)]
struct Member {
    namespace: Option<Box<str>>,
    name: Box<str>,
}

impl Member {
    fn of(peerpod: &PeerPod) -> Member {
        Member {
            namespace: peerpod.metadata.namespace.as_deref().map(Box::from),
            name: peerpod.metadata.name.as_deref().unwrap_or_default().into(),
        }
    }

    /// Whether this member is `peerpod`, compared in place (no key is built).
    fn is(&self, peerpod: &PeerPod) -> bool {
        *self.name == *peerpod.metadata.name.as_deref().unwrap_or_default()
            && self.namespace.as_deref() == peerpod.metadata.namespace.as_deref()
    }

    fn key(&self) -> ObjectRef<PeerPod> {
        let key = ObjectRef::new(&self.name);
        match &self.namespace {
            Some(namespace) => key.within(namespace),
            None => key,
        }
    }
}

/// An owner has one PeerPod, rarely a few (a sandbox restarted). The previous owner of a PeerPod is read from
/// the cached object an event replaces, so no reverse map is kept.
#[derive(Default)]
struct Maps {
    by_owner: HashMap<Box<str>, Vec<Member>>,
}

impl Maps {
    fn insert(&mut self, owner: &str, member: Member) {
        match self.by_owner.get_mut(owner) {
            Some(members) if members.contains(&member) => {}
            Some(members) => members.push(member),
            // `vec![]` allocates exactly one slot; a push onto an empty Vec would reserve four.
            None => {
                self.by_owner.insert(owner.into(), vec![member]);
            }
        }
    }

    fn remove(&mut self, owner: &str, member: &Member) {
        if let Some(members) = self.by_owner.get_mut(owner) {
            members.retain(|m| m != member);
            if members.is_empty() {
                self.by_owner.remove(owner);
            }
        }
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
    /// Applies one watch event. `cached` is the event's object as the cache held it before this event: an
    /// update or deletion removes the PeerPod from the owner it had then, which may differ from the one it has
    /// now.
    pub fn apply(&self, event: &watcher::Event<PeerPod>, cached: Option<&PeerPod>) {
        // A poisoned lock only means another thread panicked mid-update of plain maps; the data is still
        // usable and the next re-list rebuilds it anyway.
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        match event {
            watcher::Event::Apply(p) => {
                let member = Member::of(p);
                if let Some(previous) = cached.and_then(controlling_owner_uid) {
                    state.live.remove(previous, &member);
                }
                if let Some(owner) = controlling_owner_uid(p) {
                    state.live.insert(owner, member);
                }
            }
            watcher::Event::Delete(p) => {
                let member = Member::of(p);
                for owner in [
                    cached.and_then(controlling_owner_uid),
                    controlling_owner_uid(p),
                ]
                .into_iter()
                .flatten()
                {
                    state.live.remove(owner, &member);
                }
            }
            watcher::Event::Init => state.relisting = Some(Maps::default()),
            watcher::Event::InitApply(p) => {
                if let (Some(maps), Some(owner)) =
                    (state.relisting.as_mut(), controlling_owner_uid(p))
                {
                    maps.insert(owner, Member::of(p));
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
            .map(|members| members.iter().map(Member::key).collect())
            .unwrap_or_default()
    }

    /// Whether another PeerPod has the controlling owner `peerpod` has, in the index as it stands or in the
    /// list being taken: during a re-list the PeerPods of the previous list still count, so a PeerPod that
    /// arrives before its unchanged sibling is still seen as one of a group.
    pub fn shares_owner(&self, peerpod: &PeerPod) -> bool {
        let Some(owner) = controlling_owner_uid(peerpod) else {
            return false;
        };
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        [Some(&state.live), state.relisting.as_ref()]
            .into_iter()
            .flatten()
            .filter_map(|maps| maps.by_owner.get(owner))
            .flatten()
            .any(|other| !other.is(peerpod))
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
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
    use peerpods_api::peerpod::PeerPodSpec;

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
        index.apply(&watcher::Event::Apply(peerpod("a", Some("u1"))), None);
        index.apply(&watcher::Event::Apply(peerpod("b", Some("u1"))), None);
        index.apply(&watcher::Event::Apply(peerpod("c", Some("u2"))), None);
        index.apply(&watcher::Event::Apply(peerpod("ownerless", None)), None);
        assert_eq!(names(index.owned_by("u1")), vec!["a", "b"]);
        assert_eq!(index.owners(), 2);
        let a = peerpod("a", Some("u1"));
        index.apply(&watcher::Event::Delete(a.clone()), Some(&a));
        assert_eq!(names(index.owned_by("u1")), vec!["b"]);
        assert_eq!(
            index.owned_by("u1")[0].namespace.as_deref(),
            Some("ns"),
            "keys carry the namespace"
        );
        index.apply(&watcher::Event::Delete(peerpod("c", Some("u2"))), None);
        assert_eq!(index.owners(), 1);
    }

    #[test]
    fn owner_change_moves_the_object() {
        let index = OwnerIndex::default();
        let before = peerpod("a", Some("u1"));
        index.apply(&watcher::Event::Apply(before.clone()), None);
        index.apply(
            &watcher::Event::Apply(peerpod("a", Some("u2"))),
            Some(&before),
        );
        assert!(index.owned_by("u1").is_empty());
        assert_eq!(names(index.owned_by("u2")), vec!["a"]);
        assert_eq!(index.owners(), 1);
    }

    #[test]
    fn a_repeated_update_is_indexed_once() {
        let index = OwnerIndex::default();
        let a = peerpod("a", Some("u1"));
        index.apply(&watcher::Event::Apply(a.clone()), None);
        index.apply(&watcher::Event::Apply(a.clone()), Some(&a));
        // Even without the cached version, the entry is not duplicated.
        index.apply(&watcher::Event::Apply(a), None);
        assert_eq!(names(index.owned_by("u1")), vec!["a"]);
    }

    #[test]
    fn a_deleted_object_leaves_the_owner_it_had_in_the_cache() {
        let index = OwnerIndex::default();
        let cached = peerpod("a", Some("u1"));
        index.apply(&watcher::Event::Apply(cached.clone()), None);
        // The Delete carries a newer owner than the one indexed (an update was not seen).
        index.apply(
            &watcher::Event::Delete(peerpod("a", Some("u2"))),
            Some(&cached),
        );
        assert_eq!(index.owners(), 0);
    }

    #[test]
    fn relist_replaces_the_index_when_done() {
        let index = OwnerIndex::default();
        index.apply(&watcher::Event::Apply(peerpod("gone", Some("u1"))), None);
        index.apply(&watcher::Event::Init, None);
        index.apply(
            &watcher::Event::InitApply(peerpod("kept", Some("u1"))),
            None,
        );
        // Until the re-list completes, the old view stays visible.
        assert_eq!(names(index.owned_by("u1")), vec!["gone"]);
        index.apply(&watcher::Event::InitDone, None);
        assert_eq!(names(index.owned_by("u1")), vec!["kept"]);
    }

    #[test]
    fn a_peerpod_shares_its_owner_with_others_of_the_index_or_of_the_list_being_taken() {
        let index = OwnerIndex::default();
        let a = peerpod("a", Some("u1"));
        let b = peerpod("b", Some("u1"));
        index.apply(&watcher::Event::Apply(a.clone()), None);
        assert!(!index.shares_owner(&a), "alone with its owner");
        assert!(index.shares_owner(&b), "a is there");
        assert!(!index.shares_owner(&peerpod("c", Some("u2"))));
        assert!(!index.shares_owner(&peerpod("ownerless", None)));
        // A re-list: the previous list still counts while the new one is taken, and so does the new one.
        index.apply(&watcher::Event::Init, None);
        assert!(index.shares_owner(&b));
        index.apply(&watcher::Event::InitApply(b.clone()), None);
        index.apply(&watcher::Event::InitDone, None);
        assert!(!index.shares_owner(&b), "a was not listed again");
        index.apply(&watcher::Event::Init, None);
        index.apply(&watcher::Event::InitApply(peerpod("d", Some("u3"))), None);
        assert!(index.shares_owner(&peerpod("e", Some("u3"))));
    }
}
