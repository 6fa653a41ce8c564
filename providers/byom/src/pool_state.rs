//! The allocation state cloud-api-adaptor keeps under key `allocation-state` of its pool
//! ConfigMap (Go `IPAllocationState`, written with `json.MarshalIndent(state, "", "  ")`), and
//! the pure rules this backend applies to it. Fields this crate does not know (newer CAA versions
//! add some) are kept as they are, so a write never loses what CAA wrote.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

use crate::machine_address::MachineAddress;

/// The ConfigMap data key holding the state.
pub const STATE_KEY: &str = "allocation-state";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PoolState {
    /// Allocation id (`<pod>-<sandbox id>`) → allocation.
    #[serde(rename = "allocatedIPs", default, deserialize_with = "null_as_default")]
    pub allocated: BTreeMap<String, Allocation>,
    /// Free machines.
    #[serde(rename = "availableIPs", default, deserialize_with = "null_as_default")]
    pub available: Vec<String>,
    /// `metav1.Time`: RFC 3339 in UTC with seconds, or `null`.
    #[serde(rename = "lastUpdated", default)]
    pub last_updated: Value,
    /// Incremented by every writer (CAA logs it; the ConfigMap's resourceVersion is the lock).
    #[serde(default)]
    pub version: i64,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Allocation {
    #[serde(rename = "allocationID", default)]
    pub allocation_id: String,
    #[serde(default)]
    pub ip: String,
    #[serde(rename = "nodeName", default)]
    pub node_name: String,
    #[serde(rename = "podName", default)]
    pub pod_name: String,
    #[serde(
        rename = "podNamespace",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub pod_namespace: Option<String>,
    #[serde(rename = "allocatedAt", default)]
    pub allocated_at: Value,
    #[serde(flatten)]
    pub other: Map<String, Value>,
}

fn null_as_default<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(deserializer)?.unwrap_or_default())
}

impl PoolState {
    pub fn parse(text: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(text)
    }

    /// The state as CAA writes it: JSON indented by two spaces.
    pub fn to_text(&self) -> Result<String, serde_json::Error> {
        serde_json::to_string_pretty(self)
    }

    /// The allocations of the machine at `address`, by allocation id.
    pub fn allocations_on(&self, address: &MachineAddress) -> BTreeMap<&str, &Allocation> {
        self.allocated
            .iter()
            .filter(|(_, allocation)| same_machine(&allocation.ip, address))
            .map(|(id, allocation)| (id.as_str(), allocation))
            .collect()
    }

    /// Returns the machine at `address` to the pool from the allocations `ids`: those of them
    /// that are still of this machine are removed, and the address is listed as available (once)
    /// unless another allocation still holds it; `version` and `lastUpdated` move on. Returns the
    /// allocation ids removed; none means nothing changed.
    pub fn release(
        &mut self,
        address: &MachineAddress,
        ids: &BTreeSet<String>,
        now: jiff::Timestamp,
    ) -> Vec<String> {
        let released: Vec<String> = self
            .allocations_on(address)
            .into_keys()
            .filter(|id| ids.contains(*id))
            .map(str::to_owned)
            .collect();
        if released.is_empty() {
            return released;
        }
        for id in &released {
            self.allocated.remove(id);
        }
        let still_held = !self.allocations_on(address).is_empty();
        if !still_held && !self.available.iter().any(|ip| same_machine(ip, address)) {
            self.available.push(address.to_string());
        }
        self.version += 1;
        self.last_updated = Value::String(metav1_time(now));
        released
    }

    /// The allocations of machines `is_ours` accepts, one per machine (the first by allocation
    /// id if the state lists a machine twice), keyed by the machine's canonical address.
    pub fn allocations_of(
        &self,
        is_ours: impl Fn(&MachineAddress) -> bool,
    ) -> BTreeMap<String, &Allocation> {
        let mut out = BTreeMap::new();
        for allocation in self.allocated.values() {
            let Ok(address) = allocation.ip.parse::<MachineAddress>() else {
                continue;
            };
            if is_ours(&address) {
                out.entry(address.to_string()).or_insert(allocation);
            }
        }
        out
    }
}

impl Allocation {
    /// When CAA allocated the machine, if it recorded a readable time.
    pub fn allocated_at(&self) -> Option<jiff::Timestamp> {
        self.allocated_at.as_str()?.parse().ok()
    }

    /// What the state records about the allocation, as tags: CAA's own field names.
    pub fn tags(&self) -> BTreeMap<String, String> {
        let mut tags = BTreeMap::new();
        for (key, value) in [
            ("allocationID", Some(&self.allocation_id)),
            ("nodeName", Some(&self.node_name)),
            ("podName", Some(&self.pod_name)),
            ("podNamespace", self.pod_namespace.as_ref()),
        ] {
            if let Some(value) = value.filter(|v| !v.is_empty()) {
                tags.insert(key.to_owned(), value.clone());
            }
        }
        tags
    }
}

/// Whether an address as written in the state is the machine at `address` (compared as
/// addresses, so `FD00::1` and `fd00::1` are the same machine; unreadable text never matches).
fn same_machine(text: &str, address: &MachineAddress) -> bool {
    text.parse::<MachineAddress>()
        .is_ok_and(|parsed| &parsed == address)
}

/// Go's `metav1.Time` JSON form: RFC 3339 in UTC, whole seconds.
pub fn metav1_time(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What CAA writes (field order and indentation of `json.MarshalIndent`), with a field of a
    /// newer CAA (`podNamespace`) and one this crate has never heard of.
    const CAA_STATE: &str = r#"{
  "allocatedIPs": {
    "web-1-6f1c": {
      "allocationID": "web-1-6f1c",
      "ip": "192.168.122.11",
      "nodeName": "worker-0",
      "podName": "web-1",
      "podNamespace": "shop",
      "allocatedAt": "2025-03-01T10:00:00Z",
      "futureField": 7
    },
    "db-0-9a2b": {
      "allocationID": "db-0-9a2b",
      "ip": "192.168.122.12",
      "nodeName": "worker-1",
      "podName": "db-0",
      "allocatedAt": "2025-03-01T11:30:00Z"
    }
  },
  "availableIPs": [
    "192.168.122.10"
  ],
  "lastUpdated": "2025-03-01T11:30:00Z",
  "version": 3
}"#;

    fn addr(text: &str) -> MachineAddress {
        text.parse().unwrap()
    }

    fn now() -> jiff::Timestamp {
        "2025-03-02T08:00:00.750Z".parse().unwrap()
    }

    fn ids(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|id| (*id).to_owned()).collect()
    }

    #[test]
    fn release_frees_the_machine_and_keeps_everything_else() {
        let mut state = PoolState::parse(CAA_STATE).unwrap();
        let released = state.release(&addr("192.168.122.11"), &ids(&["web-1-6f1c"]), now());
        assert_eq!(released, ["web-1-6f1c"]);
        assert_eq!(state.available, ["192.168.122.10", "192.168.122.11"]);
        assert_eq!(state.allocated.keys().collect::<Vec<_>>(), ["db-0-9a2b"]);
        assert_eq!(state.version, 4);
        assert_eq!(state.last_updated, Value::from("2025-03-02T08:00:00Z"));

        let text = state.to_text().unwrap();
        let back = PoolState::parse(&text).unwrap();
        assert_eq!(back, state);
        assert!(
            text.contains("\n  \"allocatedIPs\": {\n    \"db-0-9a2b\": {\n      \"allocationID\"")
        );
    }

    #[test]
    fn unknown_fields_survive_a_round_trip() {
        let mut state = PoolState::parse(CAA_STATE).unwrap();
        state.release(&addr("192.168.122.12"), &ids(&["db-0-9a2b"]), now());
        let text = state.to_text().unwrap();
        let json: Value = serde_json::from_str(&text).unwrap();
        let web = &json["allocatedIPs"]["web-1-6f1c"];
        assert_eq!(web["futureField"], 7);
        assert_eq!(web["podNamespace"], "shop");
        assert_eq!(web["allocatedAt"], "2025-03-01T10:00:00Z");
    }

    #[test]
    fn releasing_a_free_or_unknown_machine_changes_nothing() {
        let original = PoolState::parse(CAA_STATE).unwrap();
        for free in ["192.168.122.10", "192.168.122.99"] {
            let mut state = original.clone();
            let every = ids(&["web-1-6f1c", "db-0-9a2b"]);
            assert!(state.release(&addr(free), &every, now()).is_empty());
            assert_eq!(state, original);
        }
    }

    #[test]
    fn release_matches_addresses_not_spellings_and_lists_a_machine_once() {
        let mut state = PoolState::parse(
            r#"{"allocatedIPs":{"a":{"ip":"FD00::1"},"b":{"ip":"fd00:0::1"}},
                "availableIPs":["fd00::0:1"],"version":1}"#,
        )
        .unwrap();
        let released = state.release(&addr("fd00::1"), &ids(&["a", "b"]), now());
        assert_eq!(released, ["a", "b"]);
        assert!(state.allocated.is_empty());
        assert_eq!(state.available, ["fd00::0:1"]);
        // An empty map stays a map: CAA writes into it on its next allocation.
        assert!(state.to_text().unwrap().contains("\"allocatedIPs\": {}"));
    }

    #[test]
    fn release_removes_only_the_allocations_it_names_and_never_frees_a_held_machine() {
        // Machine .11 was released and CAA handed it to web-2 since: releasing web-1's
        // allocation again changes nothing, and neither does naming another machine's.
        let mut state = PoolState::parse(CAA_STATE).unwrap();
        state.release(&addr("192.168.122.11"), &ids(&["web-1-6f1c"]), now());
        state.allocated.insert(
            "web-2-77aa".to_owned(),
            Allocation {
                allocation_id: "web-2-77aa".to_owned(),
                ip: "192.168.122.11".to_owned(),
                ..state.allocated["db-0-9a2b"].clone()
            },
        );
        state.available.retain(|ip| ip != "192.168.122.11");
        let before = state.clone();
        assert!(
            state
                .release(
                    &addr("192.168.122.11"),
                    &ids(&["web-1-6f1c", "db-0-9a2b"]),
                    now()
                )
                .is_empty()
        );
        assert_eq!(state, before);

        // A machine listed under two allocations: releasing one leaves it held by the other.
        let mut twice = PoolState::parse(
            r#"{"allocatedIPs":{"a":{"ip":"10.0.0.1"},"b":{"ip":"10.0.0.1"}},
                "availableIPs":[],"version":1}"#,
        )
        .unwrap();
        assert_eq!(twice.release(&addr("10.0.0.1"), &ids(&["a"]), now()), ["a"]);
        assert!(twice.available.is_empty());
        assert_eq!(twice.release(&addr("10.0.0.1"), &ids(&["b"]), now()), ["b"]);
        assert_eq!(twice.available, ["10.0.0.1"]);
        assert_eq!(twice.allocations_on(&addr("10.0.0.1")).len(), 0);
    }

    #[test]
    fn null_collections_read_as_empty() {
        let state = PoolState::parse(
            r#"{"allocatedIPs":null,"availableIPs":null,"lastUpdated":null,"version":1}"#,
        )
        .unwrap();
        assert!(state.allocated.is_empty() && state.available.is_empty());
    }

    #[test]
    fn allocations_are_listed_per_machine_with_their_tags_and_time() {
        let state = PoolState::parse(CAA_STATE).unwrap();
        let all = state.allocations_of(|_| true);
        assert_eq!(
            all.keys().collect::<Vec<_>>(),
            ["192.168.122.11", "192.168.122.12"]
        );
        let web = all["192.168.122.11"];
        assert_eq!(
            web.tags(),
            BTreeMap::from([
                ("allocationID".to_owned(), "web-1-6f1c".to_owned()),
                ("nodeName".to_owned(), "worker-0".to_owned()),
                ("podName".to_owned(), "web-1".to_owned()),
                ("podNamespace".to_owned(), "shop".to_owned()),
            ])
        );
        assert_eq!(
            web.allocated_at(),
            Some("2025-03-01T10:00:00Z".parse().unwrap())
        );
        assert!(!all["192.168.122.12"].tags().contains_key("podNamespace"));

        let only_12 = state.allocations_of(|a| a == &addr("192.168.122.12"));
        assert_eq!(only_12.keys().collect::<Vec<_>>(), ["192.168.122.12"]);
    }
}
