//! Callers bound to their node. cloud-api-adaptor runs on every node under one ServiceAccount, so
//! its ServiceAccount alone says nothing about which VMs are its business: a grant marked `@node`
//! (see [`crate::auth::Grant`]) binds the caller to the node its token is bound to (the TokenReview's
//! [`NODE_NAME_EXTRA`], set by the API server for the projected token of a Pod or a Node). Such a
//! caller may delete an instance only if every PeerPod naming it belongs to a Pod on that node, or
//! if no PeerPod names it (a VM whose PeerPod was never written or is gone). One compromised node then
//! reaches its own peer pods' VMs, not the cluster's.
//!
//! [`decide`] is the rule, apart from I/O; [`Placements`] looks up what it reads, per delete: the
//! PeerPods naming the instance (a LIST selected by the CRD's selectable field `spec.instanceID`,
//! a consistent read) and each one's Pod (a GET). Per delete rather than a watch: a node-bound delete
//! is rare (one per peer pod's end) while a cache of every Pod's node would stream every Pod change of
//! the cluster to every replica; and a read per question leaves no stale cache to reason about. A
//! lookup that fails refuses the delete (UNAVAILABLE): it never allows one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};

use crate::error::Error;

/// The TokenReview user extra that names the node a token is bound to.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The longest a node-bound delete waits for its lookups before it is refused as unavailable.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(10);

/// The node a TokenReview's user extra names: its one non-empty [`NODE_NAME_EXTRA`] value. Several
/// values name no node (the API server sets one).
pub fn node_of(extra: Option<&BTreeMap<String, Vec<String>>>) -> Option<String> {
    match extra?.get(NODE_NAME_EXTRA)?.as_slice() {
        [node] if !node.trim().is_empty() => Some(node.clone()),
        _ => None,
    }
}

/// What [`decide`] reads of one PeerPod that names an instance.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Naming {
    /// `namespace/name`, for the refusal's message.
    pub peerpod: String,
    /// Its `spec.instanceID`.
    pub instance_id: String,
    /// The Pod that controls it (its controller owner reference of kind Pod, in its namespace), as
    /// cloud-api-adaptor writes it.
    pub owner: Option<PodOwner>,
}

/// A PeerPod's controlling Pod, as its owner reference names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodOwner {
    pub name: String,
    pub uid: String,
}

/// What [`decide`] reads of a Pod found by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    pub uid: String,
    /// `spec.nodeName`: set once scheduled, never changed after.
    pub node: Option<String>,
}

/// Why a node-bound caller may delete an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allowed {
    /// No PeerPod names it: nobody's peer pod runs on it.
    NamedByNone,
    /// Every PeerPod naming it belongs to a Pod on the caller's node.
    OnCallersNode,
}

/// Why a node-bound caller may not delete an instance: the first PeerPod naming it that is not
/// provably its node's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Its Pod runs on another node.
    OnOtherNode {
        peerpod: String,
        pod: String,
        node: String,
    },
    /// Its Pod is not scheduled to any node.
    NotScheduled { peerpod: String, pod: String },
    /// Its Pod is gone (or replaced by another of that name): which node it ran on is not known
    /// here, so its VM is left to peerpod-ctrl's cleanup of the PeerPod.
    PodGone { peerpod: String, pod: String },
    /// It has no controlling Pod, so no node.
    NoPod { peerpod: String },
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::OnOtherNode { peerpod, pod, node } => {
                write!(
                    f,
                    "PeerPod {peerpod} names it, and its Pod {pod} runs on node {node}"
                )
            }
            Refusal::NotScheduled { peerpod, pod } => write!(
                f,
                "PeerPod {peerpod} names it, and its Pod {pod} is not scheduled to a node"
            ),
            Refusal::PodGone { peerpod, pod } => write!(
                f,
                "PeerPod {peerpod} names it, and its Pod {pod} is gone: its node is unknown (peerpod-ctrl deletes the VM with the PeerPod)"
            ),
            Refusal::NoPod { peerpod } => write!(
                f,
                "PeerPod {peerpod} names it and is owned by no Pod, so by no node"
            ),
        }
    }
}

/// Whether a caller bound to `node` may delete `instance_id`, given the PeerPods that name it and
/// each one's Pod as found (`None`: not found). PeerPods naming another instance are not
/// considered (the lookup selects by instance; this does not trust it to).
pub fn decide(
    node: &str,
    instance_id: &str,
    namings: &[(Naming, Option<Placement>)],
) -> Result<Allowed, Refusal> {
    let mut allowed = Allowed::NamedByNone;
    for (naming, placement) in namings.iter().filter(|(n, _)| n.instance_id == instance_id) {
        let peerpod = naming.peerpod.clone();
        let Some(owner) = &naming.owner else {
            return Err(Refusal::NoPod { peerpod });
        };
        let pod = owner.name.clone();
        let placement = match placement {
            Some(p) if p.uid == owner.uid => p,
            _ => return Err(Refusal::PodGone { peerpod, pod }),
        };
        match placement.node.as_deref() {
            Some(on) if on == node => allowed = Allowed::OnCallersNode,
            Some(other) => {
                return Err(Refusal::OnOtherNode {
                    peerpod,
                    pod,
                    node: other.to_owned(),
                });
            }
            None => return Err(Refusal::NotScheduled { peerpod, pod }),
        }
    }
    Ok(allowed)
}

/// Escapes a field selector value (`\`, `,` and `=` are its syntax).
fn escape_field_value(value: &str) -> String {
    let mut escaped = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '\\' | ',' | '=') {
            escaped.push('\\');
        }
        escaped.push(c);
    }
    escaped
}

/// What [`decide`] reads of a PeerPod as listed.
fn naming_of(peerpod: &DynamicObject) -> Naming {
    let namespace = peerpod.metadata.namespace.clone().unwrap_or_default();
    let name = peerpod.metadata.name.clone().unwrap_or_default();
    let instance_id = peerpod
        .data
        .get("spec")
        .and_then(|spec| spec.get("instanceID"))
        .and_then(|id| id.as_str())
        .unwrap_or_default()
        .to_owned();
    let owner = peerpod
        .metadata
        .owner_references
        .iter()
        .flatten()
        .find(|o| o.controller == Some(true) && o.kind == "Pod" && o.api_version == "v1")
        .map(|o| PodOwner {
            name: o.name.clone(),
            uid: o.uid.clone(),
        });
    Naming {
        peerpod: format!("{namespace}/{name}"),
        instance_id,
        owner,
    }
}

/// Looks up where the PeerPods naming an instance run (see the module doc).
pub struct Placements {
    client: kube::Client,
    peerpods: ApiResource,
}

impl Placements {
    pub fn new(client: kube::Client) -> Self {
        Placements {
            client,
            peerpods: Self::resource(),
        }
    }

    /// The PeerPod resource, as cloud-api-adaptor writes it (read untyped: only the instance and the
    /// owner are needed, and the CRD's types are peerpod-ctrl's).
    fn resource() -> ApiResource {
        let gvk = GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPod");
        ApiResource::from_gvk_with_plural(&gvk, "peerpods")
    }

    /// The PeerPods naming `instance_id`, each with its Pod as found.
    async fn namings(&self, instance_id: &str) -> Result<Vec<(Naming, Option<Placement>)>, Error> {
        let unavailable = |message: &str, e: kube::Error| Error::PlacementUnavailable {
            instance_id: instance_id.to_owned(),
            message: message.to_owned(),
            source: Some(Arc::new(e)),
        };
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &self.peerpods);
        let selector = format!("spec.instanceID={}", escape_field_value(instance_id));
        let listed = api
            .list(&ListParams::default().fields(&selector))
            .await
            .map_err(|e| unavailable("listing the PeerPods that name it", e))?;
        let mut namings = Vec::with_capacity(listed.items.len());
        for peerpod in &listed.items {
            let naming = naming_of(peerpod);
            let placement = match (&naming.owner, peerpod.metadata.namespace.as_deref()) {
                (Some(owner), Some(namespace)) => {
                    let pods: Api<Pod> = Api::namespaced(self.client.clone(), namespace);
                    pods.get_opt(&owner.name)
                        .await
                        .map_err(|e| unavailable("reading the Pod of a PeerPod that names it", e))?
                        .map(|pod| Placement {
                            uid: pod.metadata.uid.unwrap_or_default(),
                            node: pod.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()),
                        })
                }
                _ => None,
            };
            namings.push((naming, placement));
        }
        Ok(namings)
    }
}

/// A caller bound to its node, as authentication found it: put into the request's extensions, so
/// DeleteInstance asks [`NodeBound::may_delete`] once it knows the instance.
#[derive(Clone)]
pub struct NodeBound {
    /// `namespace/name`, for messages.
    pub caller: String,
    pub node: String,
    pub placements: Arc<Placements>,
}

impl NodeBound {
    /// Whether this caller may delete `instance_id`: PERMISSION_DENIED (reason NotOnCallersNode)
    /// when a PeerPod naming it is not on the caller's node, UNAVAILABLE when that cannot be told.
    pub async fn may_delete(&self, instance_id: &str) -> Result<Allowed, Error> {
        let namings = tokio::time::timeout(LOOKUP_TIMEOUT, self.placements.namings(instance_id))
            .await
            .map_err(|_| Error::PlacementUnavailable {
                instance_id: instance_id.to_owned(),
                message: format!(
                    "the Kubernetes API did not answer within {} s",
                    LOOKUP_TIMEOUT.as_secs()
                ),
                source: None,
            })??;
        decide(&self.node, instance_id, &namings).map_err(|why| Error::NotOnCallersNode {
            caller: self.caller.clone(),
            node: self.node.clone(),
            instance_id: instance_id.to_owned(),
            why: why.to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VM: &str = "i-0123456789abcdef0";

    fn naming(peerpod: &str, pod: Option<(&str, &str)>) -> Naming {
        Naming {
            peerpod: format!("ns/{peerpod}"),
            instance_id: VM.to_owned(),
            owner: pod.map(|(name, uid)| PodOwner {
                name: name.to_owned(),
                uid: uid.to_owned(),
            }),
        }
    }

    fn on(uid: &str, node: Option<&str>) -> Option<Placement> {
        Some(Placement {
            uid: uid.to_owned(),
            node: node.map(str::to_owned),
        })
    }

    #[test]
    fn an_instance_no_peerpod_names_is_anyones() {
        assert_eq!(decide("a", VM, &[]), Ok(Allowed::NamedByNone));
        // A PeerPod of another instance (a selector the server did not apply) does not count.
        let mut other = naming("p", Some(("pod", "u1")));
        other.instance_id = "i-other".into();
        assert_eq!(
            decide("a", VM, &[(other, on("u1", Some("b")))]),
            Ok(Allowed::NamedByNone)
        );
    }

    #[test]
    fn only_the_node_of_every_naming_pod_may_delete() {
        let here = (naming("p1", Some(("pod1", "u1"))), on("u1", Some("a")));
        assert_eq!(
            decide("a", VM, std::slice::from_ref(&here)),
            Ok(Allowed::OnCallersNode)
        );
        assert_eq!(
            decide("b", VM, std::slice::from_ref(&here)),
            Err(Refusal::OnOtherNode {
                peerpod: "ns/p1".into(),
                pod: "pod1".into(),
                node: "a".into()
            })
        );
        // Two PeerPods name it (an old one not reaped yet): both must be the caller's node's.
        let there = (naming("p2", Some(("pod2", "u2"))), on("u2", Some("b")));
        assert!(matches!(
            decide("a", VM, &[here.clone(), there.clone()]),
            Err(Refusal::OnOtherNode { .. })
        ));
        assert!(matches!(
            decide("a", VM, &[there, here]),
            Err(Refusal::OnOtherNode { .. })
        ));
    }

    #[test]
    fn an_unknown_node_is_never_the_callers() {
        let gone = decide("a", VM, &[(naming("p", Some(("pod", "u1"))), None)]);
        assert!(matches!(gone, Err(Refusal::PodGone { .. })), "{gone:?}");
        // A Pod of the same name that is not the owner (deleted and created again).
        let replaced = decide(
            "a",
            VM,
            &[(naming("p", Some(("pod", "u1"))), on("u2", Some("a")))],
        );
        assert!(
            matches!(replaced, Err(Refusal::PodGone { .. })),
            "{replaced:?}"
        );
        let unscheduled = decide(
            "a",
            VM,
            &[(naming("p", Some(("pod", "u1"))), on("u1", None))],
        );
        assert!(
            matches!(unscheduled, Err(Refusal::NotScheduled { .. })),
            "{unscheduled:?}"
        );
        let ownerless = decide("a", VM, &[(naming("p", None), None)]);
        assert_eq!(
            ownerless,
            Err(Refusal::NoPod {
                peerpod: "ns/p".into()
            })
        );
    }

    #[test]
    fn the_node_is_the_one_value_of_the_extra() {
        let extra = |values: &[&str]| {
            BTreeMap::from([(
                NODE_NAME_EXTRA.to_owned(),
                values.iter().map(|v| (*v).to_owned()).collect(),
            )])
        };
        assert_eq!(node_of(Some(&extra(&["node-a"]))), Some("node-a".into()));
        assert_eq!(node_of(Some(&extra(&[]))), None);
        assert_eq!(node_of(Some(&extra(&[""]))), None);
        assert_eq!(node_of(Some(&extra(&["a", "b"]))), None);
        assert_eq!(node_of(Some(&BTreeMap::new())), None);
        assert_eq!(node_of(None), None);
    }

    #[test]
    fn field_selector_values_are_escaped() {
        assert_eq!(escape_field_value("i-1"), "i-1");
        assert_eq!(escape_field_value(r"a,b=c\d"), r"a\,b\=c\\d");
    }

    #[test]
    fn the_controlling_pod_is_the_owner() {
        use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
        let mut peerpod = DynamicObject::new("p-resource-abcde", &Placements::resource());
        peerpod.metadata.namespace = Some("ns".into());
        peerpod.data = serde_json::json!({"spec": {"cloudProvider": "aws", "instanceID": VM}});
        let reference = |kind: &str, controller: bool| OwnerReference {
            api_version: "v1".into(),
            kind: kind.into(),
            name: format!("{kind}-x"),
            uid: "u1".into(),
            controller: Some(controller),
            ..OwnerReference::default()
        };
        peerpod.metadata.owner_references = Some(vec![
            reference("ReplicaSet", true),
            reference("Pod", false),
            reference("Pod", true),
        ]);
        let naming = naming_of(&peerpod);
        assert_eq!(naming.peerpod, "ns/p-resource-abcde");
        assert_eq!(naming.instance_id, VM);
        assert_eq!(
            naming.owner,
            Some(PodOwner {
                name: "Pod-x".into(),
                uid: "u1".into()
            })
        );
        peerpod.metadata.owner_references = Some(vec![reference("Pod", false)]);
        assert_eq!(naming_of(&peerpod).owner, None);
    }
}
