//! What the controller compares against instead of reading: the reflector caches of the objects it owns (the CAA
//! DaemonSet, the webhook Deployment, Service, serving-certificate Secret and webhook configuration) and of CAA's
//! ConfigMap, filled by the same watches that trigger reconciles, plus what it wrote itself and the watch has not
//! shown yet.
//!
//! **Why the writes are remembered.** A watch shows a write a few milliseconds after it was answered; a reconcile
//! starting in between (triggered by the very event of another write of the same reconcile) would compare against
//! the older cached object and write the same value again. So the object a write returned is kept, by kind and
//! name, and used instead of the cached one while the cache holds an older resourceVersion. resourceVersions are
//! compared as numbers, which they are for every etcd-backed API server; one that is not a number is trusted to be
//! the cache's. A remembered write is forgotten as soon as the cache is seen holding it (or a newer version), and
//! counts for a short while only ([`WRITTEN_TTL`]): after that the cache has seen it, or seen it deleted, and is
//! the truth again. It is kept as the typed object it is (not as JSON), so a spread over thousands of nodes costs
//! the nodes' trimmed size while the watch catches up, and nothing once it has.

use std::any::Any;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::Resource;
use kube::runtime::reflector::{ObjectRef, Store};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::nodes::Node;

/// How long a remembered write overrides an older cached object.
pub const WRITTEN_TTL: Duration = Duration::from_secs(10);

/// The caches of the owned objects and of CAA's ConfigMap.
#[derive(Clone)]
pub struct Owned {
    pub daemonsets: Store<DaemonSet>,
    pub deployments: Store<Deployment>,
    pub services: Store<Service>,
    pub secrets: Store<Secret>,
    pub webhooks: Store<MutatingWebhookConfiguration>,
    /// CAA's ConfigMap, watched by its default name [`CAA_CONFIG_MAP`] only (the RBAC grants no other).
    pub config_maps: Store<ConfigMap>,
    /// capacityMode dra: the DeviceClass (by name) and the pool's ResourceSlices (by the managed-by label).
    pub device_classes: Store<DeviceClass>,
    pub resource_slices: Store<ResourceSlice>,
    /// Every ResourceClaim (trimmed to its allocation): which slots of the pool are allocated.
    pub resource_claims: Store<ResourceClaim>,
}

/// Keeps of a watched object what this controller reads before it is cached: everything but
/// `metadata.managedFields`. Nothing here compares field managers (server-side apply does that on the server), and
/// they are a large part of a DaemonSet's or a PeerPodConfig's size. Nodes are trimmed further
/// ([`crate::nodes::keep_what_is_read`]).
pub fn keep_what_is_read<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
}

/// The name of CAA's ConfigMap that is watched; a PeerPodConfig naming another one has it read on each reconcile.
pub use peerpods_api::keys::CAA_CONFIG_MAP;

/// A kind whose cache [`Owned`] holds.
pub trait Cached:
    Resource<DynamicType = ()> + Clone + Default + DeserializeOwned + Serialize + Send + Sync + 'static
{
    fn store(owned: &Owned) -> &Store<Self>;
}

macro_rules! cached {
    ($kind:ty, $field:ident) => {
        impl Cached for $kind {
            fn store(owned: &Owned) -> &Store<Self> {
                &owned.$field
            }
        }
    };
}
cached!(DaemonSet, daemonsets);
cached!(Deployment, deployments);
cached!(Service, services);
cached!(Secret, secrets);
cached!(MutatingWebhookConfiguration, webhooks);
cached!(ConfigMap, config_maps);
cached!(DeviceClass, device_classes);
cached!(ResourceSlice, resource_slices);

impl Owned {
    /// Waits until every cache has completed its first list.
    pub async fn wait_until_ready(&self) -> bool {
        self.daemonsets.wait_until_ready().await.is_ok()
            && self.deployments.wait_until_ready().await.is_ok()
            && self.services.wait_until_ready().await.is_ok()
            && self.secrets.wait_until_ready().await.is_ok()
            && self.webhooks.wait_until_ready().await.is_ok()
            && self.config_maps.wait_until_ready().await.is_ok()
    }

    /// Waits until the DRA caches (DeviceClass, ResourceSlices, ResourceClaims) have completed their first list.
    /// Apart from [`Owned::wait_until_ready`]: a cluster that does not serve resource.k8s.io/v1 (before 1.34)
    /// never fills them, and node mode must work there.
    pub async fn wait_until_dra_ready(&self) -> bool {
        self.device_classes.wait_until_ready().await.is_ok()
            && self.resource_slices.wait_until_ready().await.is_ok()
            && self.resource_claims.wait_until_ready().await.is_ok()
    }
}

/// `name` in `namespace` (`None` for a cluster-scoped kind) from its cache.
pub fn cached<K: Cached>(owned: &Owned, namespace: Option<&str>, name: &str) -> Option<K> {
    let key = match namespace {
        Some(ns) => ObjectRef::new(name).within(ns),
        None => ObjectRef::new(name),
    };
    K::store(owned).get(&key).map(|k| (*k).clone())
}

/// The resourceVersion of an object as a number, when it is one.
pub fn resource_version(
    meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
) -> Option<u64> {
    meta.resource_version.as_deref()?.parse().ok()
}

struct Remembered {
    resource_version: u64,
    /// The object as written, of the kind named in its key.
    object: Arc<dyn Any + Send + Sync>,
    at: Instant,
}

/// The objects this controller wrote, by (kind, namespace, name), until the cache has caught up.
#[derive(Default)]
pub struct Written {
    objects: Mutex<HashMap<(String, String, String), Remembered>>,
}

impl Written {
    fn objects(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String, String), Remembered>> {
        // Plain values only; a poisoned lock still holds consistent ones.
        self.objects.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn key<K: Resource<DynamicType = ()>>(object: &K) -> (String, String, String) {
        (
            K::kind(&()).into_owned(),
            object.meta().namespace.clone().unwrap_or_default(),
            object.meta().name.clone().unwrap_or_default(),
        )
    }

    /// Remembers `live`, the object a write of ours returned.
    pub fn remember<K>(&self, live: &K)
    where
        K: Resource<DynamicType = ()> + Clone + Send + Sync + 'static,
    {
        self.keep(live.clone());
    }

    /// [`Written::remember`] of an object the caller no longer needs: kept as it is, without a copy.
    fn keep<K>(&self, live: K)
    where
        K: Resource<DynamicType = ()> + Send + Sync + 'static,
    {
        let Some(resource_version) = resource_version(live.meta()) else {
            return;
        };
        let mut objects = self.objects();
        objects.retain(|_, r| r.at.elapsed() < WRITTEN_TTL);
        objects.insert(
            Self::key(&live),
            Remembered {
                resource_version,
                object: Arc::new(live),
                at: Instant::now(),
            },
        );
    }

    /// Forgets a write of ours of `object`: the watch saw it deleted, so no write of ours stands for it any more.
    pub fn forget<K: Resource<DynamicType = ()>>(&self, object: &K) {
        self.objects().remove(&Self::key(object));
    }

    /// What to compare with: `cached`, unless a write of ours of `desired`'s object is newer than it. A write the
    /// cache has caught up with is forgotten here.
    pub fn newest<K>(&self, desired: &K, cached: Option<K>) -> Option<K>
    where
        K: Resource<DynamicType = ()> + Clone + 'static,
    {
        let mut objects = self.objects();
        let key = Self::key(desired);
        let Some(written) = objects.get(&key).filter(|r| r.at.elapsed() < WRITTEN_TTL) else {
            return cached;
        };
        let cache_behind = match &cached {
            None => true,
            Some(c) => resource_version(c.meta()).is_some_and(|v| v < written.resource_version),
        };
        if cache_behind {
            written.object.downcast_ref::<K>().cloned().or(cached)
        } else {
            objects.remove(&key);
            cached
        }
    }

    /// How many writes are remembered.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.objects().len()
    }
}

/// Node values this controller patched, until the node cache has caught up: a node as the plan should see it.
#[derive(Default)]
pub struct WrittenNodes {
    nodes: Written,
}

impl WrittenNodes {
    /// Remembers the node a patch of ours returned (taken, not copied: a spread remembers every node it patched).
    pub fn remember(&self, mut live: Node) {
        crate::nodes::keep_what_is_read(&mut live);
        self.nodes.keep(live);
    }

    /// `cached`, or the node as we last patched it when that is newer.
    pub fn newest(&self, cached: &Node) -> Node {
        self.nodes
            .newest(cached, Some(cached.clone()))
            .unwrap_or_else(|| cached.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(rv: &str, port: i32) -> Service {
        let mut s = Service::default();
        s.metadata.name = Some("svc".into());
        s.metadata.namespace = Some("ns".into());
        s.metadata.resource_version = Some(rv.into());
        s.spec = Some(k8s_openapi::api::core::v1::ServiceSpec {
            ports: Some(vec![k8s_openapi::api::core::v1::ServicePort {
                port,
                ..Default::default()
            }]),
            ..Default::default()
        });
        s
    }

    fn port(s: &Option<Service>) -> Option<i32> {
        Some(s.as_ref()?.spec.as_ref()?.ports.as_ref()?[0].port)
    }

    #[test]
    fn a_write_newer_than_the_cache_is_what_is_compared() {
        let written = Written::default();
        let desired = service("", 443);
        assert_eq!(
            port(&written.newest(&desired, Some(service("5", 80)))),
            Some(80)
        );
        written.remember(&service("7", 443));
        assert_eq!(
            port(&written.newest(&desired, Some(service("5", 80)))),
            Some(443),
            "the cache has not seen our write yet"
        );
        assert_eq!(
            port(&written.newest(&desired, None)),
            Some(443),
            "created, not yet in the cache"
        );
        assert_eq!(
            port(&written.newest(&desired, Some(service("9", 8443)))),
            Some(8443),
            "a later change by someone else wins"
        );
        assert_eq!(
            port(&written.newest(&desired, Some(service("7", 443)))),
            Some(443)
        );
        written.forget(&desired);
        assert_eq!(
            port(&written.newest(&desired, None)),
            None,
            "deleted since: the cache's word"
        );
    }

    #[test]
    fn a_write_is_forgotten_once_the_cache_holds_it() {
        let written = Written::default();
        let desired = service("", 443);
        written.remember(&service("7", 443));
        written.newest(&desired, Some(service("5", 80)));
        assert_eq!(written.len(), 1, "the cache is behind: kept");
        written.newest(&desired, Some(service("7", 443)));
        assert_eq!(written.len(), 0, "the cache caught up: forgotten");
    }

    fn node(rv: &str, value: Option<&str>, owner: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some("n1".into());
        node.metadata.resource_version = Some(rv.into());
        node.metadata.annotations =
            owner.map(|o| [(crate::nodes::CAA_OWNER_ANNOTATION.to_owned(), o.to_owned())].into());
        node.status = Some(crate::nodes::NodeStatus {
            capacity: value.map(|v| {
                [(
                    crate::objects::EXTENDED_RESOURCE.to_owned(),
                    k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.into()),
                )]
                .into()
            }),
        });
        node
    }

    #[test]
    fn a_plan_right_after_a_patch_does_not_write_the_value_again() {
        let desired = std::collections::BTreeMap::from([("n1".to_owned(), 3)]);
        let stale = node("10", Some("2"), Some(crate::nodes::CAA_OWNER));
        assert_eq!(
            crate::nodes::plan([&stale], &desired).len(),
            1,
            "the cache alone asks for the patch"
        );
        let written = WrittenNodes::default();
        written.remember(node("11", Some("3"), Some(crate::nodes::CAA_OWNER)));
        let seen = written.newest(&stale);
        assert!(
            crate::nodes::plan([&seen], &desired).is_empty(),
            "the patch just made is what the plan sees"
        );
        // Someone else changed the node after our patch: the cache is newer, and right.
        let changed = node("12", None, None);
        assert_eq!(written.newest(&changed), changed);
    }

    #[test]
    fn cached_objects_keep_everything_but_managed_fields() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
        let mut live = service("7", 443);
        live.metadata.labels = Some([("app".to_owned(), "webhook".to_owned())].into());
        live.metadata.annotations =
            Some([(crate::apply::APPLIED_HASH.to_owned(), "h".to_owned())].into());
        live.metadata.managed_fields = Some(vec![ManagedFieldsEntry {
            manager: Some(crate::name::FIELD_MANAGER.into()),
            ..Default::default()
        }]);
        let mut kept = live.clone();
        keep_what_is_read(&mut kept);
        assert_eq!(kept.metadata.managed_fields, None);
        live.metadata.managed_fields = None;
        assert_eq!(kept, live, "labels, annotations, spec and status stay");
    }

    #[test]
    fn a_resource_version_that_is_no_number_trusts_the_cache() {
        let written = Written::default();
        written.remember(&service("7", 443));
        assert_eq!(
            port(&written.newest(&service("", 1), Some(service("opaque", 80)))),
            Some(80)
        );
    }
}
