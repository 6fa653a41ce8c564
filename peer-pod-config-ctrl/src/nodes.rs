//! `kata.peerpods.io/vm` on nodes: decide which nodes need a patch (pure), then patch only those.
//!
//! The value lives in `status.capacity` and is written with a JSON patch on `nodes/<name>/status` at
//! `/status/capacity/kata.peerpods.io~1vm`, as a string, exactly as upstream did, so CAA, the scheduler and
//! existing tooling read it unchanged.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Node, NodeStatus};
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};

use crate::Error;
use crate::objects::EXTENDED_RESOURCE;

/// JSON pointer of the extended resource inside a Node (`/` in the name escaped as `~1`).
pub const CAPACITY_POINTER: &str = "/status/capacity/kata.peerpods.io~1vm";

/// How many node patches run at once: enough to rebalance a thousand nodes in seconds without flooding the API
/// server's priority-and-fairness queue.
pub const PATCH_CONCURRENCY: usize = 16;

/// What one node needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CapacityChange {
    /// Set the value; `create_map` when the node has no `status.capacity` at all yet.
    Set { value: u32, create_map: bool },
    /// Remove the resource.
    Remove,
}

/// Keeps of a Node only what this controller reads (name, labels, and the `kata.peerpods.io/vm` entry of
/// `status.capacity`, with whether the capacity map exists at all), before it is cached. A real node's status
/// (images, conditions, addresses, node info) is most of its size, and the cache holds every node.
pub fn keep_what_is_read(node: &mut Node) {
    node.metadata.managed_fields = None;
    node.metadata.annotations = None;
    node.spec = None;
    node.status = node.status.take().map(|status| NodeStatus {
        capacity: status.capacity.map(|capacity| {
            capacity
                .into_iter()
                .filter(|(resource, _)| resource == EXTENDED_RESOURCE)
                .collect()
        }),
        ..NodeStatus::default()
    });
}

/// Whether a node's labels satisfy a nodeSelector (every key present with exactly that value).
pub fn selects(selector: &BTreeMap<String, String>, node: &Node) -> bool {
    let labels = node.labels();
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// The advertised value on a node, as written there.
pub fn current(node: &Node) -> Option<String> {
    let capacity = node.status.as_ref()?.capacity.as_ref()?;
    capacity.get(EXTENDED_RESOURCE).map(|q| q.0.clone())
}

/// Changes that bring `nodes` to `desired` (node name → value). Nodes absent from `desired` lose the resource;
/// nodes already right are left alone, so a steady cluster needs no writes. Sorted by node name.
pub fn plan<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    desired: &BTreeMap<String, u32>,
) -> Vec<(String, CapacityChange)> {
    let mut changes: Vec<(String, CapacityChange)> = nodes
        .into_iter()
        .filter_map(|node| {
            let name = node.name_any();
            let now = current(node);
            match desired.get(&name) {
                Some(value) if now.as_deref() != Some(value.to_string().as_str()) => {
                    let create_map = node
                        .status
                        .as_ref()
                        .and_then(|s| s.capacity.as_ref())
                        .is_none();
                    Some((
                        name,
                        CapacityChange::Set {
                            value: *value,
                            create_map,
                        },
                    ))
                }
                None if now.is_some() => Some((name, CapacityChange::Remove)),
                _ => None,
            }
        })
        .collect();
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    changes
}

/// The JSON patch for one change.
pub fn json_patch(change: &CapacityChange) -> Result<json_patch::Patch, Error> {
    let ops = match change {
        CapacityChange::Set {
            value,
            create_map: false,
        } => {
            serde_json::json!([{"op": "add", "path": CAPACITY_POINTER, "value": value.to_string()}])
        }
        CapacityChange::Set {
            value,
            create_map: true,
        } => {
            serde_json::json!([{"op": "add", "path": "/status/capacity", "value": {EXTENDED_RESOURCE: value.to_string()}}])
        }
        // If the value vanished since the cache saw it, the API server rejects the patch (missing path) and the
        // next reconcile, with a fresher cache, plans nothing for this node.
        CapacityChange::Remove => serde_json::json!([{"op": "remove", "path": CAPACITY_POINTER}]),
    };
    serde_json::from_value(ops).map_err(|e| Error::Serialize(e.to_string()))
}

/// Apply `changes`, a bounded number at a time. Returns how many nodes were written.
pub async fn apply(api: &Api<Node>, changes: &[(String, CapacityChange)]) -> Result<usize, Error> {
    // Owned items and a cloned Api keep the futures 'static, which the controller's boxed future needs.
    let patches = changes.iter().cloned().map(|(node, change)| {
        let api = api.clone();
        async move {
            let patch = json_patch(&change)?;
            match api
                .patch_status(&node, &PatchParams::default(), &Patch::<()>::Json(patch))
                .await
            {
                Ok(_) => Ok::<_, Error>(1usize),
                // Deleted since the cache saw it: nothing to advertise on; the deletion event rebalances.
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(0),
                Err(source) => Err(Error::NodeCapacity { node, source }),
            }
        }
    });
    futures::stream::iter(patches)
        .buffer_unordered(PATCH_CONCURRENCY)
        .try_fold(0, |written, one| async move { Ok(written + one) })
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node(name: &str, labels: &[(&str, &str)], vm: Option<&str>) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.into());
        node.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| ((*k).into(), (*v).into()))
                .collect(),
        );
        node.status = Some(NodeStatus {
            capacity: Some(
                [("cpu".to_owned(), Quantity("4".into()))]
                    .into_iter()
                    .chain(vm.map(|v| (EXTENDED_RESOURCE.to_owned(), Quantity(v.into()))))
                    .collect(),
            ),
            ..NodeStatus::default()
        });
        node
    }

    #[test]
    fn selector_needs_every_label() {
        let selector = BTreeMap::from([
            ("a".to_owned(), "1".to_owned()),
            ("b".to_owned(), String::new()),
        ]);
        assert!(selects(
            &selector,
            &node("n", &[("a", "1"), ("b", ""), ("c", "x")], None)
        ));
        assert!(!selects(&selector, &node("n", &[("a", "1")], None)));
        assert!(!selects(
            &selector,
            &node("n", &[("a", "2"), ("b", "")], None)
        ));
        assert!(selects(&BTreeMap::new(), &node("n", &[], None)));
    }

    #[test]
    fn only_wrong_nodes_are_planned() {
        let nodes = [
            node("right", &[], Some("2")),
            node("wrong", &[], Some("3")),
            node("missing", &[], None),
            node("unselected", &[], Some("1")),
            node("untouched", &[], None),
        ];
        let mut bare = node("bare", &[], None);
        bare.status = None;
        let desired = BTreeMap::from([
            ("right".to_owned(), 2),
            ("wrong".to_owned(), 2),
            ("missing".to_owned(), 0),
            ("bare".to_owned(), 5),
        ]);
        let changes = plan(nodes.iter().chain([&bare]), &desired);
        assert_eq!(
            changes,
            vec![
                (
                    "bare".to_owned(),
                    CapacityChange::Set {
                        value: 5,
                        create_map: true
                    }
                ),
                (
                    "missing".to_owned(),
                    CapacityChange::Set {
                        value: 0,
                        create_map: false
                    }
                ),
                ("unselected".to_owned(), CapacityChange::Remove),
                (
                    "wrong".to_owned(),
                    CapacityChange::Set {
                        value: 2,
                        create_map: false
                    }
                ),
            ]
        );
    }

    #[test]
    fn patches_use_the_escaped_pointer_and_string_values() {
        let set = serde_json::to_value(
            json_patch(&CapacityChange::Set {
                value: 3,
                create_map: false,
            })
            .unwrap(),
        )
        .unwrap();
        assert_eq!(
            set,
            serde_json::json!([{"op": "add", "path": "/status/capacity/kata.peerpods.io~1vm", "value": "3"}])
        );
        let remove = serde_json::to_value(json_patch(&CapacityChange::Remove).unwrap()).unwrap();
        assert_eq!(
            remove,
            serde_json::json!([{"op": "remove", "path": "/status/capacity/kata.peerpods.io~1vm"}])
        );
    }

    #[test]
    fn the_cache_keeps_labels_and_our_capacity_only() {
        let mut full = node("n1", &[("node.kubernetes.io/worker", "")], Some("3"));
        let status = full.status.as_mut().unwrap();
        status.capacity.as_mut().unwrap().insert(
            "cpu".into(),
            k8s_openapi::apimachinery::pkg::api::resource::Quantity("8".into()),
        );
        status.images = Some(vec![Default::default(); 3]);
        full.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        full.spec = Some(Default::default());
        let mut kept = full.clone();
        keep_what_is_read(&mut kept);
        assert_eq!(kept.metadata.labels, full.metadata.labels);
        assert_eq!(current(&kept).as_deref(), Some("3"));
        let status = kept.status.unwrap();
        assert_eq!(status.capacity.unwrap().len(), 1);
        assert!(
            status.images.is_none() && kept.spec.is_none() && kept.metadata.annotations.is_none()
        );

        // A node without a capacity map keeps having none: the patch must create it.
        let mut bare = node("n2", &[], None);
        bare.status = Some(NodeStatus::default());
        keep_what_is_read(&mut bare);
        assert!(bare.status.unwrap().capacity.is_none());
    }
}
