//! The desired node capacity of a PeerPodConfig (pure): from the limit, the nodes its selector picks and the free
//! capacity the provider reports, which value each node should advertise and which nodes need a patch to get
//! there. The reconciler acts on the plan ([`crate::reconcile`]); everything here has a plain unit test.

use std::collections::BTreeMap;
use std::time::Duration;

use kube::ResourceExt;
use peerpods_protocol::decide::DeveloperMode;

use crate::nodes::{self, CapacityChange, Node};
use crate::spread;
use crate::status::{Capacity, NodeCeiling};
use peerpods_api::peerpodconfig::{Limit, PeerPodConfig};

/// Resync period without changes: reads only, so it costs no writes, and it repairs anything a missed watch
/// event left behind.
pub const RESYNC: Duration = Duration::from_secs(300);

/// Node capacity as it should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CapacityPlan {
    /// What the limit asks for over the selected nodes.
    pub requested: u64,
    /// What the provider reports as free, when asked and known.
    pub provider_free: Option<u64>,
    /// What is advertised: the requested total, capped by the provider's free capacity and by the node ceiling.
    pub effective: u64,
    /// Every selected node takes at most [`NodeCeiling::PER_NODE`] VMs, and why (see [`node_ceiling`]).
    pub ceiling: Option<NodeCeiling>,
    /// Nodes the selector picks.
    pub selected_nodes: usize,
    /// Node name → value, for the selected nodes.
    pub desired: BTreeMap<String, u32>,
    /// Patches that bring the nodes to `desired` (nodes outside it lose the resource), by node name.
    pub changes: Vec<(String, CapacityChange)>,
    /// Selected nodes whose `kata.peerpods.io/vm-limit` label is not a count (spread over like the others).
    pub invalid_overrides: Vec<String>,
}

/// The ceiling cloud-api-adaptor's developer mode puts on every selected node: in developer mode CAA keeps failed
/// pods' VMs for debugging and its own per-node limit defaults to one, so whatever the limit asks, a node takes at
/// most one VM (and the DRA pool at most one device per selected node). A mode that cannot be told counts as on:
/// one per node is the conservative figure.
pub fn node_ceiling(mode: DeveloperMode) -> Option<NodeCeiling> {
    match mode {
        DeveloperMode::Off => None,
        DeveloperMode::On => Some(NodeCeiling::DeveloperMode),
        DeveloperMode::Unknown => Some(NodeCeiling::DeveloperModeUnknown),
    }
}

/// Plans node capacity for `limit` over the nodes `selector` picks among `all_nodes`, capped by `provider_free`
/// and by the [`node_ceiling`] of CAA's `developer_mode`. A per-node limit stays per node unless the provider caps
/// it; then the capped total is spread.
pub fn capacity<'a>(
    limit: Limit,
    selector: &BTreeMap<String, String>,
    all_nodes: impl IntoIterator<Item = &'a Node>,
    provider_free: Option<u64>,
    developer_mode: DeveloperMode,
) -> CapacityPlan {
    let all_nodes: Vec<&Node> = all_nodes.into_iter().collect();
    let selected: Vec<String> = all_nodes
        .iter()
        .filter(|n| nodes::selects(selector, n))
        .map(|n| n.name_any())
        .collect();
    // A node's own `kata.peerpods.io/vm-limit` label overrides its share (CAA users asked for different
    // limits on different nodes): with a total, the rest is spread over the others; per node, it replaces the
    // per-node value on that node.
    let (fixed, invalid_overrides) = spread::overrides(
        all_nodes
            .iter()
            .filter(|n| nodes::selects(selector, n))
            .map(|n| {
                (
                    n.metadata.name.as_deref().unwrap_or_default(),
                    n.labels().get(spread::VM_LIMIT_LABEL).map(String::as_str),
                )
            }),
    );
    let requested = match limit {
        Limit::Total(total) => u64::from(total),
        Limit::PerNode(each) => selected
            .iter()
            .map(|name| u64::from(fixed.get(name).copied().unwrap_or(each)))
            .fold(0u64, u64::saturating_add),
    };
    // Under the ceiling, a node's share (its label, the per-node limit, or one for a total) is at most the
    // ceiling, and what the selected nodes take together is `allowed`; without it, what the limit asks.
    let ceiling = node_ceiling(developer_mode);
    let cap = |value: u32| ceiling.map_or(value, |_| value.min(NodeCeiling::PER_NODE));
    let fixed: BTreeMap<String, u32> = fixed.into_iter().map(|(n, v)| (n, cap(v))).collect();
    let share = match limit {
        Limit::PerNode(each) => cap(each),
        Limit::Total(_) => NodeCeiling::PER_NODE,
    };
    let allowed = match ceiling {
        None => requested,
        Some(_) => selected
            .iter()
            .map(|name| u64::from(fixed.get(name).copied().unwrap_or(share)))
            .fold(0u64, u64::saturating_add),
    };
    let within = requested.min(allowed);
    let effective = provider_free.map_or(within, |free| free.min(within));
    let names = selected.iter().map(String::as_str);
    let desired = match limit {
        Limit::PerNode(each) if effective == allowed => spread::per_node(cap(each), names)
            .into_iter()
            .map(|(name, value)| {
                let value = fixed.get(&name).copied().unwrap_or(value);
                (name, value)
            })
            .collect(),
        _ => spread::spread_with_overrides(
            u32::try_from(effective).unwrap_or(u32::MAX),
            names,
            &fixed,
        ),
    };
    let changes = nodes::plan(all_nodes.iter().copied(), &desired);
    CapacityPlan {
        requested,
        provider_free,
        effective,
        ceiling,
        selected_nodes: selected.len(),
        desired,
        changes,
        invalid_overrides,
    }
}

impl CapacityPlan {
    /// The figures the status reports.
    pub fn status(&self) -> Capacity {
        Capacity {
            requested: self.requested,
            provider_free: self.provider_free,
            effective: self.effective,
            selected_nodes: u32::try_from(self.selected_nodes).unwrap_or(u32::MAX),
            per_node_min: self.desired.values().min().copied(),
            per_node_max: self.desired.values().max().copied(),
            pool: None,
            ceiling: self.ceiling,
        }
    }
}

/// Patches that remove the resource from every node carrying it (the PeerPodConfig is being deleted).
pub fn removal<'a>(all_nodes: impl IntoIterator<Item = &'a Node>) -> Vec<(String, CapacityChange)> {
    nodes::plan(all_nodes, &BTreeMap::new())
}

/// When to look again after a successful reconcile: as often as provider figures are refreshed when the total
/// depends on them, else at the resync period.
pub fn next_check(config: &PeerPodConfig) -> Duration {
    match &config.spec.capacity_from_provider {
        Some(source) => Duration::from_secs(u64::from(source.refresh_seconds)),
        None => RESYNC,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nodes::NodeStatus;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use kube::api::ObjectMeta;

    use crate::objects::EXTENDED_RESOURCE;

    fn node(name: &str, worker: bool, advertised: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(
                    [(
                        "worker".to_owned(),
                        if worker { "yes" } else { "no" }.to_owned(),
                    )]
                    .into(),
                ),
                // What this controller wrote comes with its owner annotation.
                annotations: advertised.map(|_| {
                    [(
                        crate::nodes::CAA_OWNER_ANNOTATION.to_owned(),
                        crate::nodes::CAA_OWNER.to_owned(),
                    )]
                    .into()
                }),
                ..ObjectMeta::default()
            },
            status: advertised.map(|v| NodeStatus {
                capacity: Some([(EXTENDED_RESOURCE.to_owned(), Quantity(v.into()))].into()),
            }),
        }
    }

    fn workers() -> BTreeMap<String, String> {
        [("worker".to_owned(), "yes".to_owned())].into()
    }

    #[test]
    fn a_total_is_spread_over_the_selected_nodes_only() {
        let nodes = [
            node("a", true, None),
            node("b", true, Some("5")),
            node("c", false, Some("3")),
        ];
        let plan = capacity(
            Limit::Total(9),
            &workers(),
            &nodes,
            None,
            DeveloperMode::Off,
        );
        assert_eq!(
            (plan.requested, plan.effective, plan.selected_nodes),
            (9, 9, 2)
        );
        assert_eq!(plan.desired, [("a".into(), 5), ("b".into(), 4)].into());
        assert_eq!(
            plan.changes,
            vec![
                ("a".into(), CapacityChange::Set { value: 5 }),
                ("b".into(), CapacityChange::Set { value: 4 }),
                ("c".into(), CapacityChange::Remove),
            ]
        );
        let status = plan.status();
        assert_eq!(
            (
                status.per_node_min,
                status.per_node_max,
                status.selected_nodes
            ),
            (Some(4), Some(5), 2)
        );
    }

    #[test]
    fn nodes_already_right_need_no_change() {
        let nodes = [node("a", true, Some("2")), node("b", true, Some("2"))];
        let plan = capacity(
            Limit::PerNode(2),
            &workers(),
            &nodes,
            None,
            DeveloperMode::Off,
        );
        assert_eq!(plan.requested, 4);
        assert!(plan.changes.is_empty(), "{:?}", plan.changes);
    }

    #[test]
    fn the_provider_caps_the_total_and_a_per_node_limit_is_then_spread() {
        let nodes = [
            node("a", true, None),
            node("b", true, None),
            node("c", true, None),
        ];
        let plan = capacity(
            Limit::PerNode(4),
            &workers(),
            &nodes,
            Some(5),
            DeveloperMode::Off,
        );
        assert_eq!((plan.requested, plan.effective), (12, 5));
        assert_eq!(plan.desired.values().sum::<u32>(), 5);
        assert_eq!(plan.status().provider_free, Some(5));
        let plenty = capacity(
            Limit::PerNode(4),
            &workers(),
            &nodes,
            Some(100),
            DeveloperMode::Off,
        );
        assert_eq!(plenty.effective, 12);
        assert!(plenty.desired.values().all(|v| *v == 4));
    }

    fn with_vm_limit(mut node: Node, value: &str) -> Node {
        node.metadata
            .labels
            .get_or_insert_with(Default::default)
            .insert(spread::VM_LIMIT_LABEL.to_owned(), value.to_owned());
        node
    }

    #[test]
    fn a_node_label_overrides_its_share_of_a_total() {
        let nodes = [
            with_vm_limit(node("big", true, None), "6"),
            node("a", true, None),
            node("b", true, None),
            with_vm_limit(node("unselected", false, None), "50"),
        ];
        let plan = capacity(
            Limit::Total(10),
            &workers(),
            &nodes,
            None,
            DeveloperMode::Off,
        );
        assert_eq!(
            plan.desired,
            [("a".into(), 2), ("b".into(), 2), ("big".into(), 6)].into()
        );
        assert_eq!((plan.requested, plan.effective), (10, 10));
        assert!(plan.invalid_overrides.is_empty());
    }

    #[test]
    fn a_node_label_replaces_a_per_node_limit_on_that_node() {
        let nodes = [
            with_vm_limit(node("small", true, None), "1"),
            node("a", true, None),
            with_vm_limit(node("typo", true, None), "ten"),
        ];
        let plan = capacity(
            Limit::PerNode(4),
            &workers(),
            &nodes,
            None,
            DeveloperMode::Off,
        );
        assert_eq!(
            plan.desired,
            [("a".into(), 4), ("small".into(), 1), ("typo".into(), 4)].into()
        );
        assert_eq!(plan.requested, 9);
        assert_eq!(plan.invalid_overrides, ["typo"]);
    }

    #[test]
    fn no_selected_node_means_nothing_advertised() {
        let nodes = [node("c", false, Some("3"))];
        let plan = capacity(
            Limit::PerNode(4),
            &workers(),
            &nodes,
            None,
            DeveloperMode::Off,
        );
        assert_eq!((plan.requested, plan.selected_nodes), (0, 0));
        assert_eq!(plan.changes, vec![("c".into(), CapacityChange::Remove)]);
        assert_eq!(plan.status().per_node_max, None);
    }

    #[test]
    fn developer_mode_or_not_knowing_it_caps_every_selected_node_at_one() {
        let nodes = [
            node("a", true, Some("4")),
            node("b", true, Some("4")),
            node("c", true, None),
            node("d", false, Some("1")),
        ];
        for mode in [DeveloperMode::On, DeveloperMode::Unknown] {
            let plan = capacity(Limit::PerNode(4), &workers(), &nodes, None, mode);
            assert_eq!(
                (plan.requested, plan.effective, plan.ceiling),
                (12, 3, node_ceiling(mode)),
                "{mode:?}"
            );
            assert_eq!(
                plan.desired,
                [("a".into(), 1), ("b".into(), 1), ("c".into(), 1)].into()
            );
            assert_eq!(
                plan.changes,
                vec![
                    ("a".into(), CapacityChange::Set { value: 1 }),
                    ("b".into(), CapacityChange::Set { value: 1 }),
                    ("c".into(), CapacityChange::Set { value: 1 }),
                    ("d".into(), CapacityChange::Remove),
                ]
            );
            let status = plan.status();
            assert_eq!(
                (status.effective, status.per_node_max, status.ceiling),
                (3, Some(1), node_ceiling(mode))
            );
        }
        // Off: the limit alone, as before.
        let off = capacity(
            Limit::PerNode(4),
            &workers(),
            &nodes,
            None,
            DeveloperMode::Off,
        );
        assert_eq!((off.effective, off.ceiling), (12, None));
        assert!(off.desired.values().all(|v| *v == 4));
    }

    #[test]
    fn under_the_ceiling_a_total_the_provider_and_node_labels_still_cap_below_one_each() {
        let nodes = [
            node("a", true, None),
            node("b", true, None),
            node("c", true, None),
        ];
        let on = DeveloperMode::On;
        // A total above the node count: one per node, which is also what the DRA pool is sized by.
        let big = capacity(Limit::Total(10), &workers(), &nodes, None, on);
        assert_eq!((big.requested, big.effective), (10, 3));
        assert!(big.desired.values().all(|v| *v == 1), "{:?}", big.desired);
        // A total below it, or the provider's free capacity: spread, never above one.
        let small = capacity(Limit::Total(2), &workers(), &nodes, None, on);
        assert_eq!(small.effective, 2);
        assert_eq!(small.desired.values().copied().max(), Some(1));
        let quota = capacity(Limit::PerNode(4), &workers(), &nodes, Some(2), on);
        assert_eq!(
            (quota.effective, quota.desired.values().sum::<u32>()),
            (2, 2)
        );
        assert_eq!(quota.desired.values().copied().max(), Some(1));
        // A node label asking for more gets one; a label of 0 keeps its node empty and its slot out of the total.
        let labelled = [
            with_vm_limit(node("big", true, None), "6"),
            with_vm_limit(node("none", true, None), "0"),
            node("a", true, None),
        ];
        let plan = capacity(Limit::Total(10), &workers(), &labelled, None, on);
        assert_eq!(plan.effective, 2);
        assert_eq!(
            plan.desired,
            [("a".into(), 1), ("big".into(), 1), ("none".into(), 0)].into()
        );
        let per_node = capacity(Limit::PerNode(3), &workers(), &labelled, None, on);
        assert_eq!((per_node.requested, per_node.effective), (9, 2));
        assert_eq!(per_node.desired, plan.desired);
        // A per-node limit of 0 stays 0.
        let zero = capacity(Limit::PerNode(0), &workers(), &nodes, None, on);
        assert_eq!(zero.effective, 0);
        assert_eq!(node_ceiling(DeveloperMode::Off), None);
        assert_eq!(
            node_ceiling(DeveloperMode::On),
            Some(NodeCeiling::DeveloperMode)
        );
        assert_eq!(
            node_ceiling(DeveloperMode::Unknown),
            Some(NodeCeiling::DeveloperModeUnknown)
        );
    }

    #[test]
    fn removal_touches_only_nodes_that_advertise() {
        let nodes = [node("a", true, Some("1")), node("b", true, None)];
        assert_eq!(removal(&nodes), vec![("a".into(), CapacityChange::Remove)]);
    }

    #[test]
    fn provider_figures_set_the_next_check() {
        let mut config = PeerPodConfig::new(
            "c",
            serde_json::from_value(serde_json::json!({"limit": 1})).expect("spec"),
        );
        assert_eq!(next_check(&config), RESYNC);
        config.spec = serde_json::from_value(serde_json::json!({
            "limit": 1,
            "capacityFromProvider": {"cloudProvider": "libvirt", "refreshSeconds": 30}
        }))
        .expect("spec");
        assert_eq!(next_check(&config), Duration::from_secs(30));
    }
}
