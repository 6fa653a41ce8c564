//! Spreading a cluster-wide number of peer-pod VMs over the selected nodes.
//!
//! Every node gets `total / n`; the `total % n` extra units go to nodes in a fixed ranking, filled like a snake:
//! to the first ranks when `total / n` is even, to the last ranks when it is odd. The ranking is a stable hash of
//! the node name (ties broken by the name), so:
//! - the result depends only on the set of node names, never on the order they were listed in;
//! - a node joining or leaving moves as little as possible: only nodes whose value is forced to change by the new
//!   average, plus at most one more. (The snake matters when the average crosses an integer: the nodes that keep
//!   their old value are then the ones that had the *smaller* value before, which sit at the other end of the
//!   ranking. Filling from the same end every time would change up to twice as many nodes.)
//!   No rule that looks only at the set of names can always reach the exact minimum: with a total of 1 and nodes
//!   A and B, `{A}` and `{B}` each force their single node to 1, so `{A, B}` must disagree with one of them, and
//!   the transition from that side changes one node more than strictly needed.
//!   The property tests in this module check the "at most one more than the minimum" bound on random clusters.

use std::collections::{BTreeMap, BTreeSet};

/// Per-node values for a cluster-wide `total` over `nodes`. Values sum to `total` (when there is a node) and
/// differ by at most one. Duplicate names count once.
pub fn spread<'a>(total: u32, nodes: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, u32> {
    let mut ranked: Vec<&str> = nodes
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if ranked.is_empty() {
        return BTreeMap::new();
    }
    ranked.sort_by_key(|name| (rank_hash(name), *name));
    // `ranked` is non-empty and at most `usize::MAX` long; a u32 total over more than u32::MAX nodes gives every
    // node 0 or 1, which `try_from` keeps correct by saturating the count.
    let count = u32::try_from(ranked.len()).unwrap_or(u32::MAX);
    let base = total / count;
    let remainder = (total % count) as usize;
    let from_front = base.is_multiple_of(2);
    let len = ranked.len();
    ranked
        .into_iter()
        .enumerate()
        .map(|(rank, name)| {
            let extra = if from_front {
                rank < remainder
            } else {
                rank >= len - remainder
            };
            (name.to_owned(), base + u32::from(extra))
        })
        .collect()
}

/// Node label that sets one node's share by hand (a decimal count), overriding what spreading would give it.
/// A label, not an annotation, because the controller already watches and caches node labels: no extra read.
pub const VM_LIMIT_LABEL: &str = "kata.peerpods.io/vm-limit";

/// The per-node overrides of `nodes`: the [`VM_LIMIT_LABEL`] values that parse as a count. A value that does
/// not parse is ignored (the node is spread over like any other) and returned in the second list so the
/// caller can say so.
pub fn overrides<'a>(
    nodes: impl IntoIterator<Item = (&'a str, Option<&'a str>)>,
) -> (BTreeMap<String, u32>, Vec<String>) {
    let mut valid = BTreeMap::new();
    let mut invalid = Vec::new();
    for (name, value) in nodes {
        match value.map(|v| v.trim().parse::<u32>()) {
            Some(Ok(n)) => {
                valid.insert(name.to_owned(), n);
            }
            Some(Err(_)) => invalid.push(name.to_owned()),
            None => {}
        }
    }
    (valid, invalid)
}

/// [`spread`] with per-node overrides: a node in `overrides` gets its own value and the rest of `total` is
/// spread over the others. `total` stays the cluster-wide ceiling: overrides are granted in the ranking order
/// of [`spread`] while the total lasts, so overrides adding up to more than the total are cut (the last
/// ranked ones first) instead of advertising more than the limit or the provider allow. Overrides naming nodes
/// outside `nodes` are ignored.
pub fn spread_with_overrides<'a>(
    total: u32,
    nodes: impl IntoIterator<Item = &'a str>,
    overrides: &BTreeMap<String, u32>,
) -> BTreeMap<String, u32> {
    let mut ranked: Vec<&str> = nodes
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    ranked.sort_by_key(|name| (rank_hash(name), *name));
    let mut left = total;
    let mut out = BTreeMap::new();
    for name in ranked.iter().copied() {
        if let Some(wanted) = overrides.get(name) {
            let granted = (*wanted).min(left);
            left -= granted;
            out.insert(name.to_owned(), granted);
        }
    }
    out.extend(spread(
        left,
        ranked.into_iter().filter(|n| !overrides.contains_key(*n)),
    ));
    out
}

/// The same value on every node.
pub fn per_node<'a>(value: u32, nodes: impl IntoIterator<Item = &'a str>) -> BTreeMap<String, u32> {
    nodes
        .into_iter()
        .map(|name| (name.to_owned(), value))
        .collect()
}

fn rank_hash(name: &str) -> u64 {
    fnv1a(name.as_bytes())
}

/// FNV-1a, 64 bit. Hand-written (four lines) because the ranking must never change between releases or platforms,
/// which `std`'s hashers do not promise, and a crate for it would add nothing. Also the change detector of
/// [`crate::apply::stamp`] (not a security boundary).
pub(crate) fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn fixed(pairs: &[(&str, u32)]) -> BTreeMap<String, u32> {
        pairs.iter().map(|(n, v)| ((*n).to_owned(), *v)).collect()
    }

    #[test]
    fn an_override_takes_its_share_and_the_rest_is_spread_over_the_others() {
        let nodes = ["big", "a", "b", "c"];
        let out = spread_with_overrides(20, nodes, &fixed(&[("big", 8)]));
        assert_eq!(out["big"], 8);
        assert_eq!(out.values().sum::<u32>(), 20);
        let others: Vec<u32> = ["a", "b", "c"].iter().map(|n| out[*n]).collect();
        assert!(others.iter().all(|v| *v == 4), "{out:?}");
        // An override of 0 keeps a node out of peer pods entirely.
        let out = spread_with_overrides(9, nodes, &fixed(&[("big", 0)]));
        assert_eq!(out["big"], 0);
        assert_eq!(out.values().sum::<u32>(), 9);
    }

    #[test]
    fn overrides_never_advertise_more_than_the_total() {
        let out = spread_with_overrides(10, ["a", "b", "c"], &fixed(&[("a", 8), ("b", 8)]));
        assert_eq!(out.values().sum::<u32>(), 10);
        assert_eq!(out["c"], 0, "nothing is left for the others");
        assert!(
            out["a"] + out["b"] == 10 && out["a"].max(out["b"]) == 8,
            "{out:?}"
        );
    }

    #[test]
    fn overrides_for_unselected_nodes_are_ignored() {
        let out = spread_with_overrides(6, ["a", "b"], &fixed(&[("elsewhere", 5)]));
        assert_eq!(out, spread(6, ["a", "b"]));
    }

    #[test]
    fn only_counts_are_overrides() {
        let (valid, invalid) = overrides([
            ("a", Some("4")),
            ("b", Some("lots")),
            ("c", None),
            ("d", Some(" 0 ")),
        ]);
        assert_eq!(valid, fixed(&[("a", 4), ("d", 0)]));
        assert_eq!(invalid, ["b"]);
    }

    proptest! {
        #[test]
        fn overridden_spreads_sum_to_the_total_when_overrides_fit(
            total in 0u32..500,
            n in 1usize..30,
            picks in proptest::collection::btree_map(0usize..30, 0u32..20, 0..5),
        ) {
            let nodes = names("n", n);
            let wanted: BTreeMap<String, u32> = picks
                .into_iter()
                .filter(|(i, _)| *i < n)
                .map(|(i, v)| (nodes[i].clone(), v))
                .collect();
            let out = spread_with_overrides(total, nodes.iter().map(String::as_str), &wanted);
            prop_assert_eq!(out.len(), n);
            let granted: u32 = wanted.keys().map(|k| out[k]).sum();
            let asked: u32 = wanted.values().sum();
            prop_assert!(out.values().sum::<u32>() <= total);
            if asked <= total {
                for (k, v) in &wanted {
                    prop_assert_eq!(out[k], *v);
                }
                if wanted.len() < n {
                    prop_assert_eq!(out.values().sum::<u32>(), total);
                }
            } else {
                prop_assert_eq!(granted, total);
            }
            // The others differ by at most one, as plain spreading promises.
            let rest: Vec<u32> = out.iter().filter(|(k, _)| !wanted.contains_key(*k)).map(|(_, v)| *v).collect();
            if let (Some(lo), Some(hi)) = (rest.iter().min(), rest.iter().max()) {
                prop_assert!(hi - lo <= 1);
            }
        }
    }

    fn names(prefix: &str, n: usize) -> Vec<String> {
        (0..n).map(|i| format!("{prefix}-{i}")).collect()
    }

    fn spread_owned(total: u32, nodes: &[String]) -> BTreeMap<String, u32> {
        spread(total, nodes.iter().map(String::as_str))
    }

    /// Nodes present before and after whose value differs.
    fn changed(before: &BTreeMap<String, u32>, after: &BTreeMap<String, u32>) -> usize {
        before
            .iter()
            .filter(|(name, value)| after.get(*name).is_some_and(|v| v != *value))
            .count()
    }

    /// The fewest nodes (among those present before and after) that any balanced assignment of `total` over
    /// `after_nodes` must change, given the values `before`. Computed by trying every possible number of
    /// surviving nodes at the higher value.
    fn minimum_changes(
        before: &BTreeMap<String, u32>,
        total: u32,
        after_nodes: &BTreeSet<String>,
    ) -> usize {
        let n = after_nodes.len() as u32;
        let (low, extra) = (total / n, (total % n) as usize);
        let common: Vec<u32> = after_nodes
            .iter()
            .filter_map(|name| before.get(name).copied())
            .collect();
        let joined = after_nodes.len() - common.len();
        let at_high = common.iter().filter(|v| **v == low + 1).count();
        let at_low = common.iter().filter(|v| **v == low).count();
        (0..=common.len())
            // `k` surviving nodes get the higher value; joined nodes take the rest of the `extra` slots.
            .filter(|k| *k <= extra && extra - k <= joined)
            .map(|k| common.len() - (k.min(at_high) + (common.len() - k).min(at_low)))
            .min()
            .unwrap_or(0)
    }

    #[test]
    fn forty_nodes_share_one_hundred() {
        let result = spread_owned(100, &names("n", 40));
        assert_eq!(result.values().sum::<u32>(), 100);
        assert_eq!(result.values().filter(|v| **v == 3).count(), 20);
        assert_eq!(result.values().filter(|v| **v == 2).count(), 20);
    }

    #[test]
    fn no_nodes_no_values() {
        assert!(spread(10, []).is_empty());
    }

    #[test]
    fn fewer_units_than_nodes() {
        let result = spread_owned(3, &names("n", 10));
        assert_eq!(result.values().filter(|v| **v == 1).count(), 3);
        assert_eq!(result.values().filter(|v| **v == 0).count(), 7);
    }

    #[test]
    fn duplicates_count_once() {
        let result = spread(5, ["a", "a", "b"]);
        assert_eq!(result.len(), 2);
        assert_eq!(result.values().sum::<u32>(), 5);
    }

    #[test]
    fn ranking_is_pinned() {
        // Pins the hash so a change to the ranking (which would move capacity on every upgrade) fails loudly.
        assert_eq!(rank_hash(""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(rank_hash("a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn minimum_is_exact_on_the_textbook_case() {
        // Total 1 over {A}, then B joins: keeping A at 1 and giving B 0 changes nothing.
        let before = BTreeMap::from([("A".to_owned(), 1)]);
        let after = BTreeSet::from(["A".to_owned(), "B".to_owned()]);
        assert_eq!(minimum_changes(&before, 1, &after), 0);
        // 40 nodes at 2/3 (total 100) → 41 nodes: average 2.43, 18 at 3. Twenty were at 3, so at least two change.
        let before = spread_owned(100, &names("n", 40));
        let after: BTreeSet<String> = names("n", 41).into_iter().collect();
        assert_eq!(minimum_changes(&before, 100, &after), 2);
    }

    fn cluster() -> impl Strategy<Value = (u32, BTreeSet<String>)> {
        (
            0u32..500,
            prop::collection::btree_set("[a-z0-9-]{1,12}", 1..60),
        )
    }

    proptest! {
        #[test]
        fn sums_to_total_and_differs_by_at_most_one((total, nodes) in cluster()) {
            let result = spread(total, nodes.iter().map(String::as_str));
            prop_assert_eq!(result.len(), nodes.len());
            prop_assert_eq!(result.values().map(|v| u64::from(*v)).sum::<u64>(), u64::from(total));
            let (min, max) = (result.values().min().unwrap(), result.values().max().unwrap());
            prop_assert!(max - min <= 1);
        }

        #[test]
        fn independent_of_listing_order((total, nodes) in cluster(), seed in any::<u64>()) {
            let mut shuffled: Vec<&str> = nodes.iter().map(String::as_str).collect();
            // A deterministic shuffle driven by the generated seed.
            shuffled.sort_by_key(|name| rank_hash(name) ^ seed);
            shuffled.reverse();
            prop_assert_eq!(spread(total, shuffled), spread(total, nodes.iter().map(String::as_str)));
        }

        #[test]
        fn a_joining_node_changes_at_most_one_more_than_needed(
            (total, nodes) in cluster(), joiner in "[a-z0-9-]{1,12}"
        ) {
            prop_assume!(!nodes.contains(&joiner));
            let before = spread(total, nodes.iter().map(String::as_str));
            let mut after_nodes = nodes.clone();
            after_nodes.insert(joiner);
            let after = spread(total, after_nodes.iter().map(String::as_str));
            let minimum = minimum_changes(&before, total, &after_nodes);
            prop_assert!(changed(&before, &after) <= minimum + 1,
                "changed {} nodes, minimum {}", changed(&before, &after), minimum);
        }

        #[test]
        fn a_leaving_node_changes_at_most_one_more_than_needed(
            (total, nodes) in cluster(), pick in any::<prop::sample::Index>()
        ) {
            prop_assume!(nodes.len() >= 2);
            let leaver = pick.get(&nodes.iter().collect::<Vec<_>>()).to_string();
            let before = spread(total, nodes.iter().map(String::as_str));
            let mut after_nodes = nodes.clone();
            after_nodes.remove(&leaver);
            let after = spread(total, after_nodes.iter().map(String::as_str));
            let minimum = minimum_changes(&before, total, &after_nodes);
            prop_assert!(changed(&before, &after) <= minimum + 1,
                "changed {} nodes, minimum {}", changed(&before, &after), minimum);
        }
    }
}
