//! `kata.peerpods.io/vm` on nodes: decide which nodes need a patch (pure), then patch only those.
//!
//! The value lives in `status.capacity` as a string, as upstream wrote it, so CAA, the scheduler and existing
//! tooling read it unchanged. With it the controller owns the node's `kata.peerpods.io/caa-owner` annotation:
//! cloud-api-adaptor's shutdown removes `kata.peerpods.io/vm` from its node unless that annotation names another
//! owner, so without it every CAA restart or rolling update would strip the capacity this controller advertises.
//! Value and annotation are written together, in one merge patch on `nodes/<name>/status` (the status
//! subresource keeps metadata changes), so a node never carries one without the other, and the patch touches only
//! these two keys of the capacity map and the annotations.

use std::collections::BTreeMap;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde::Deserialize;

use crate::Error;
use crate::objects::EXTENDED_RESOURCE;

/// JSON pointer of the extended resource inside a Node (`/` in the name escaped as `~1`).
pub const CAPACITY_POINTER: &str = "/status/capacity/kata.peerpods.io~1vm";

/// The node annotation cloud-api-adaptor reads on shutdown: it leaves the capacity alone when this names an owner
/// other than its own pod UID.
pub const CAA_OWNER_ANNOTATION: &str = "kata.peerpods.io/caa-owner";

/// This controller's value of [`CAA_OWNER_ANNOTATION`]. Never a pod UID (those are RFC 4122 UUIDs), so no CAA pod
/// ever takes it for its own.
pub const CAA_OWNER: &str = crate::name::FIELD_MANAGER;

/// How many node patches run at once: enough to rebalance a thousand nodes in seconds without flooding the API
/// server's priority-and-fairness queue.
pub const PATCH_CONCURRENCY: usize = 16;

/// A Node as this controller reads it: its metadata and its status's capacity map, parsed straight from what the
/// API server sends (watch events, list pages, patch answers). The rest of a Node (spec, images, conditions,
/// addresses, node info: about 10 KiB of JSON on a real node) is skipped while parsing, so the cache of every node,
/// a node arriving in the watch and a patch's answer never hold it. A kind of its own rather than k8s-openapi's
/// `Node` trimmed after parsing: that type's empty fields alone take about 1.5 KiB per node, and the cache, the
/// remembered patches and a spread's working copies each hold every selected node.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct Node {
    pub metadata: ObjectMeta,
    #[serde(default)]
    pub status: Option<NodeStatus>,
}

/// Of a Node's status, the capacity map (the resources a node advertises, [`EXTENDED_RESOURCE`] among them).
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
pub struct NodeStatus {
    #[serde(default)]
    pub capacity: Option<BTreeMap<String, Quantity>>,
}

/// The API's Node, read as [`Node`]: its kind, version and path are k8s-openapi's, so kube's clients, watches and
/// caches serve it as they serve that type.
type ApiNode = k8s_openapi::api::core::v1::Node;

impl k8s_openapi::Resource for Node {
    const API_VERSION: &'static str = <ApiNode as k8s_openapi::Resource>::API_VERSION;
    const GROUP: &'static str = <ApiNode as k8s_openapi::Resource>::GROUP;
    const KIND: &'static str = <ApiNode as k8s_openapi::Resource>::KIND;
    const VERSION: &'static str = <ApiNode as k8s_openapi::Resource>::VERSION;
    const URL_PATH_SEGMENT: &'static str = <ApiNode as k8s_openapi::Resource>::URL_PATH_SEGMENT;
    type Scope = <ApiNode as k8s_openapi::Resource>::Scope;
}

impl k8s_openapi::Metadata for Node {
    type Ty = ObjectMeta;

    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What one node needs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CapacityChange {
    /// Set the value and claim the owner annotation.
    Set { value: u32 },
    /// Remove the resource and give up the owner annotation.
    Remove,
}

/// Keeps of a [`Node`] only what this controller reads (name, labels, the owner annotation and the
/// `kata.peerpods.io/vm` entry of `status.capacity`), before it is cached or kept from a patch's answer: of what
/// parsing kept, the other annotations and capacities, and the managed fields.
pub fn keep_what_is_read(node: &mut Node) {
    // Managed fields go as on every cached kind (caches.rs); written out here because the caches import this
    // module, not the other way round.
    node.metadata.managed_fields = None;
    node.metadata.annotations = node
        .metadata
        .annotations
        .take()
        .map(|annotations| {
            annotations
                .into_iter()
                .filter(|(key, _)| key == CAA_OWNER_ANNOTATION)
                .collect::<BTreeMap<_, _>>()
        })
        .filter(|kept| !kept.is_empty());
    node.status = node.status.take().map(|status| NodeStatus {
        capacity: status.capacity.map(|capacity| {
            capacity
                .into_iter()
                .filter(|(resource, _)| resource == EXTENDED_RESOURCE)
                .collect()
        }),
    });
}

/// Whether a node's labels satisfy a nodeSelector (every key present with exactly that value).
pub fn selects(selector: &BTreeMap<String, String>, node: &Node) -> bool {
    let labels = node.labels();
    selector
        .iter()
        .all(|(key, value)| labels.get(key) == Some(value))
}

/// The advertised value on a node, as written there (the API server canonicalises it: `"200000"` reads `"200k"`).
pub fn current(node: &Node) -> Option<String> {
    let capacity = node.status.as_ref()?.capacity.as_ref()?;
    capacity.get(EXTENDED_RESOURCE).map(|q| q.0.clone())
}

/// The advertised value on a node as a count, when it is a whole number that fits.
pub fn advertised(node: &Node) -> Option<u32> {
    current(node).and_then(|q| quantity_count(&q))
}

/// The owner the node's [`CAA_OWNER_ANNOTATION`] names.
pub fn owner(node: &Node) -> Option<&str> {
    node.metadata
        .annotations
        .as_ref()?
        .get(CAA_OWNER_ANNOTATION)
        .map(String::as_str)
}

/// A Kubernetes quantity (`"3"`, `"200k"`, `"2e3"`, `"1Ki"`, `"1500m"`) as a whole count, `None` when it is not a
/// whole non-negative number below 2^32. The API server stores quantities in canonical form, so comparing the
/// strings would see `"200k"` and `"200000"` as different.
pub fn quantity_count(text: &str) -> Option<u32> {
    let text = text.trim();
    let digits_end = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits_end);
    let number = number.strip_prefix('+').unwrap_or(number);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty()
        || !whole
            .bytes()
            .chain(fraction.bytes())
            .all(|b| b.is_ascii_digit())
        || whole.len() + fraction.len() > 30
    {
        return None;
    }
    let mantissa: i128 = format!("{whole}{fraction}").parse().ok()?;
    let fraction_digits = i32::try_from(fraction.len()).ok()?;
    let (decimal_exponent, binary_exponent): (i32, u32) = match suffix {
        "" => (0, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        exponent => (
            exponent
                .strip_prefix(['e', 'E'])?
                .parse::<i32>()
                .ok()
                .filter(|e| e.abs() <= 30)?,
            0,
        ),
    };
    let exponent = decimal_exponent - fraction_digits;
    let scaled = if exponent >= 0 {
        mantissa.checked_mul(10_i128.checked_pow(exponent.unsigned_abs())?)?
    } else {
        let divisor = 10_i128.checked_pow(exponent.unsigned_abs())?;
        if mantissa % divisor != 0 {
            return None;
        }
        mantissa / divisor
    };
    let count = scaled.checked_mul(1_i128.checked_shl(binary_exponent)?)?;
    u32::try_from(count).ok()
}

/// Changes that bring `nodes` to `desired` (node name → value). Nodes absent from `desired` lose the resource and
/// the owner annotation, unless the annotation names another owner (a CAA that advertises for itself there);
/// nodes already right, value and annotation, are left alone, so a steady cluster needs no writes. Sorted by node
/// name.
pub fn plan<'a>(
    nodes: impl IntoIterator<Item = &'a Node>,
    desired: &BTreeMap<String, u32>,
) -> Vec<(String, CapacityChange)> {
    let mut changes: Vec<(String, CapacityChange)> = nodes
        .into_iter()
        .filter_map(|node| {
            let name = node.name_any();
            let owner = owner(node);
            match desired.get(&name) {
                Some(value) if advertised(node) != Some(*value) || owner != Some(CAA_OWNER) => {
                    Some((name, CapacityChange::Set { value: *value }))
                }
                Some(_) => None,
                None if owner == Some(CAA_OWNER) => Some((name, CapacityChange::Remove)),
                None if owner.is_none() && current(node).is_some() => {
                    Some((name, CapacityChange::Remove))
                }
                None => None,
            }
        })
        .collect();
    changes.sort_by(|a, b| a.0.cmp(&b.0));
    changes
}

/// The merge patch for one change (`null` removes a key; a missing map is created).
pub fn patch_body(change: &CapacityChange) -> serde_json::Value {
    let (value, owner) = match change {
        CapacityChange::Set { value } => (
            serde_json::Value::String(value.to_string()),
            serde_json::Value::String(CAA_OWNER.into()),
        ),
        CapacityChange::Remove => (serde_json::Value::Null, serde_json::Value::Null),
    };
    serde_json::json!({
        "metadata": {"annotations": {CAA_OWNER_ANNOTATION: owner}},
        "status": {"capacity": {EXTENDED_RESOURCE: value}},
    })
}

/// A client-side bound on the rate of node patches: a rebalance of thousands of nodes (a limit change, a node
/// pool joining) spreads over seconds instead of landing on the API server at once, where kubelets' own status
/// updates compete for the same priority level. Up to `burst` patches go at once, then `per_second`.
#[derive(Debug)]
pub struct PatchRate {
    interval: std::time::Duration,
    burst: u32,
    /// When the next patch may go, if the bucket were empty.
    next: std::sync::Mutex<tokio::time::Instant>,
}

/// Node patches per second after the burst (`--node-patches-per-second`): 1,000 nodes in about 10 s, 5,000 in
/// about 50 s.
pub const PATCHES_PER_SECOND: u32 = 100;
/// Node patches that may go at once (`--node-patch-burst`).
pub const PATCH_BURST: u32 = 50;

/// How fast node patches go: `burst` at once, then `per_second`. Zero counts as one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pace {
    pub per_second: u32,
    pub burst: u32,
}

impl Default for Pace {
    fn default() -> Self {
        Pace {
            per_second: PATCHES_PER_SECOND,
            burst: PATCH_BURST,
        }
    }
}

impl Default for PatchRate {
    fn default() -> Self {
        PatchRate::from(Pace::default())
    }
}

impl From<Pace> for PatchRate {
    fn from(pace: Pace) -> Self {
        PatchRate::new(pace.per_second, pace.burst)
    }
}

impl PatchRate {
    pub fn new(per_second: u32, burst: u32) -> Self {
        PatchRate {
            interval: std::time::Duration::from_secs(1) / per_second.max(1),
            burst: burst.max(1),
            next: std::sync::Mutex::new(tokio::time::Instant::now()),
        }
    }

    /// Waits for this patch's turn.
    pub async fn acquire(&self) {
        let slot = self.reserve(tokio::time::Instant::now());
        tokio::time::sleep_until(slot).await;
    }

    /// Reserves the next turn as of `now`: when the patch may go (at `now` or before it: at once).
    fn reserve(&self, now: tokio::time::Instant) -> tokio::time::Instant {
        // Only an instant lives here; a poisoned lock still holds a usable one.
        let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
        // An idle limiter has saved up at most `burst` patches.
        let earliest = now
            .checked_sub(self.interval * (self.burst - 1))
            .unwrap_or(now);
        let slot = (*next).max(earliest);
        *next = slot + self.interval;
        slot
    }
}

/// Apply `changes`, a bounded number at a time and at most at `rate`. Returns the nodes as the patches left them,
/// each kept only as far as it is read ([`keep_what_is_read`]; a node deleted meanwhile is skipped). `done`
/// counts the changes made so far (a skipped node counts as made), for the status to show how far a slow
/// rebalance is.
pub async fn apply(
    api: &Api<Node>,
    changes: &[(String, CapacityChange)],
    rate: &std::sync::Arc<PatchRate>,
    done: &tokio::sync::watch::Sender<usize>,
) -> Result<Vec<Node>, Error> {
    // Owned items and a cloned Api keep the futures 'static, which the controller's boxed future needs.
    let patches = changes.iter().cloned().map(|(node, change)| {
        let api = api.clone();
        let rate = rate.clone();
        async move {
            rate.acquire().await;
            let body = patch_body(&change);
            match api
                .patch_status(&node, &PatchParams::default(), &Patch::Merge(&body))
                .await
            {
                // The answer is the whole Node (its images, its managed fields): only what is read is kept,
                // as it arrives, so a rebalance of a thousand nodes never holds a thousand whole Nodes.
                Ok(mut live) => {
                    keep_what_is_read(&mut live);
                    Ok::<_, Error>(Some(live))
                }
                // Deleted since the cache saw it: nothing to advertise on; the deletion event rebalances.
                Err(kube::Error::Api(status)) if status.code == 404 => Ok(None),
                Err(source) => Err(Error::NodeCapacity { node, source }),
            }
        }
    });
    futures::stream::iter(patches)
        .buffer_unordered(PATCH_CONCURRENCY)
        .inspect_ok(|_| done.send_modify(|n| *n += 1))
        .try_filter_map(|live| async move { Ok(live) })
        .try_collect()
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

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
        });
        node
    }

    #[test]
    fn patches_go_at_the_rate_after_the_burst() {
        let rate = PatchRate::new(10, 5);
        // Long idle: the whole burst is saved up.
        let now = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
        let slots: Vec<_> = (0..15).map(|_| rate.reserve(now)).collect();
        assert!(
            slots[..5].iter().all(|s| *s <= now),
            "the burst goes at once"
        );
        assert_eq!(
            slots[14].duration_since(now),
            std::time::Duration::from_secs(1),
            "ten more at ten per second"
        );
        assert!(slots.windows(2).all(|w| w[1] > w[0]));
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

    fn owned(mut node: Node, owner: &str) -> Node {
        node.metadata.annotations =
            Some([(CAA_OWNER_ANNOTATION.to_owned(), owner.to_owned())].into());
        node
    }

    #[test]
    fn only_wrong_nodes_are_planned() {
        let nodes = [
            owned(node("right", &[], Some("2")), CAA_OWNER),
            owned(node("wrong", &[], Some("3")), CAA_OWNER),
            node("missing", &[], None),
            // Right value, but the annotation is missing or names a CAA pod: CAA's shutdown would strip it.
            node("unclaimed", &[], Some("2")),
            owned(
                node("claimed-by-caa", &[], Some("2")),
                "7d0e4c1a-1b2c-4d5e-8f90-0123456789ab",
            ),
            owned(node("unselected", &[], Some("1")), CAA_OWNER),
            node("unselected-legacy", &[], Some("1")),
            owned(node("unselected-annotation-only", &[], None), CAA_OWNER),
            owned(
                node("advertised-by-caa", &[], Some("10")),
                "7d0e4c1a-1b2c-4d5e-8f90-0123456789ab",
            ),
            node("untouched", &[], None),
        ];
        let mut bare = node("bare", &[], None);
        bare.status = None;
        let desired = BTreeMap::from([
            ("right".to_owned(), 2),
            ("wrong".to_owned(), 2),
            ("missing".to_owned(), 0),
            ("unclaimed".to_owned(), 2),
            ("claimed-by-caa".to_owned(), 2),
            ("bare".to_owned(), 5),
        ]);
        let changes = plan(nodes.iter().chain([&bare]), &desired);
        let set = |value| CapacityChange::Set { value };
        assert_eq!(
            changes,
            vec![
                ("bare".to_owned(), set(5)),
                ("claimed-by-caa".to_owned(), set(2)),
                ("missing".to_owned(), set(0)),
                ("unclaimed".to_owned(), set(2)),
                ("unselected".to_owned(), CapacityChange::Remove),
                (
                    "unselected-annotation-only".to_owned(),
                    CapacityChange::Remove
                ),
                ("unselected-legacy".to_owned(), CapacityChange::Remove),
                ("wrong".to_owned(), set(2)),
            ]
        );
    }

    #[test]
    fn canonical_quantities_equal_the_count_they_stand_for() {
        // The API server stores "200000" as "200k": that node is right and needs no patch.
        let nodes = [owned(node("n", &[], Some("200k")), CAA_OWNER)];
        assert_eq!(
            plan(&nodes, &BTreeMap::from([("n".to_owned(), 200_000)])),
            vec![]
        );
        assert_eq!(
            plan(&nodes, &BTreeMap::from([("n".to_owned(), 2_000)])),
            vec![("n".to_owned(), CapacityChange::Set { value: 2_000 })]
        );
        for (text, count) in [
            ("3", Some(3)),
            ("200k", Some(200_000)),
            ("1M", Some(1_000_000)),
            ("2e3", Some(2_000)),
            ("2E3", Some(2_000)),
            ("1Ki", Some(1_024)),
            ("1.5k", Some(1_500)),
            ("3000m", Some(3)),
            ("+7", Some(7)),
            ("0", Some(0)),
            ("1500m", None),
            ("-1", None),
            ("5G", None),
            ("", None),
            ("k", None),
            ("1x", None),
            ("1e400", None),
        ] {
            assert_eq!(quantity_count(text), count, "{text:?}");
        }
    }

    #[test]
    fn one_merge_patch_writes_value_and_owner_together() {
        assert_eq!(
            patch_body(&CapacityChange::Set { value: 3 }),
            serde_json::json!({
                "metadata": {"annotations": {"kata.peerpods.io/caa-owner": "peer-pod-config-ctrl"}},
                "status": {"capacity": {"kata.peerpods.io/vm": "3"}},
            })
        );
        assert_eq!(
            patch_body(&CapacityChange::Remove),
            serde_json::json!({
                "metadata": {"annotations": {"kata.peerpods.io/caa-owner": null}},
                "status": {"capacity": {"kata.peerpods.io/vm": null}},
            })
        );
    }

    #[test]
    fn a_node_is_read_as_its_metadata_and_capacity() {
        // A whole Node as the API server sends it: spec, images, conditions and the rest are not read.
        let mut whole = ApiNode::default();
        whole.metadata.name = Some("n1".into());
        whole.metadata.resource_version = Some("42".into());
        whole.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("aws:///i-1".into()),
            ..Default::default()
        });
        whole.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            capacity: Some([(EXTENDED_RESOURCE.to_owned(), Quantity("3".into()))].into()),
            images: Some(vec![Default::default(); 3]),
            ..Default::default()
        });
        let mut json = serde_json::to_value(&whole).unwrap();
        json["apiVersion"] = "v1".into();
        json["kind"] = "Node".into();
        let read: Node = serde_json::from_value(json).unwrap();
        assert_eq!(read.metadata, whole.metadata);
        assert_eq!(current(&read).as_deref(), Some("3"));
        assert_eq!(
            kube::core::ApiResource::erase::<Node>(&()),
            kube::core::ApiResource::erase::<ApiNode>(&()),
            "served as the API's Node"
        );
    }

    #[test]
    fn the_cache_keeps_labels_and_our_capacity_only() {
        let mut full = node("n1", &[("node.kubernetes.io/worker", "")], Some("3"));
        let status = full.status.as_mut().unwrap();
        status
            .capacity
            .as_mut()
            .unwrap()
            .insert("cpu".into(), Quantity("8".into()));
        full.metadata.annotations = Some([("a".to_string(), "b".to_string())].into());
        full.metadata.managed_fields = Some(vec![Default::default()]);
        let mut kept = full.clone();
        keep_what_is_read(&mut kept);
        assert_eq!(kept.metadata.labels, full.metadata.labels);
        assert_eq!(current(&kept).as_deref(), Some("3"));
        assert!(
            kept.metadata.annotations.is_none(),
            "other annotations dropped"
        );
        let status = kept.status.unwrap();
        assert_eq!(status.capacity.unwrap().len(), 1);
        assert!(kept.metadata.managed_fields.is_none());

        // The owner annotation is kept: the plan reads it.
        let mut claimed = owned(full.clone(), CAA_OWNER);
        claimed
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert("a".into(), "b".into());
        keep_what_is_read(&mut claimed);
        assert_eq!(owner(&claimed), Some(CAA_OWNER));
        assert_eq!(claimed.metadata.annotations.unwrap().len(), 1);

        // A node without a capacity map keeps having none.
        let mut bare = node("n2", &[], None);
        bare.status = Some(NodeStatus::default());
        keep_what_is_read(&mut bare);
        assert!(bare.status.unwrap().capacity.is_none());
    }
}
