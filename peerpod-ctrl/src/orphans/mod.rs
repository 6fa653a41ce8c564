//! Orphan VMs: VMs carrying this cluster's tag that no PeerPod refers to, typically because
//! cloud-api-adaptor crashed between creating the VM and creating its PeerPod.
//!
//! Findings are reported as a metric, a log line and an Event on the controller's Namespace object: orphans
//! have no PeerPod to attach an Event to, and the Namespace is the one cluster-visible object that always
//! exists whether or not leader election (a Lease) or a Deployment is in use. The Events are created in
//! that namespace (`kubectl get events -n <ns> --field-selector reason=OrphanInstanceFound`). Deletion happens only with the `delete` policy, and then only within guards: nothing is
//! deleted before the PeerPod cache has completed its first list; a scan of a provider that finds more orphans
//! than [`OrphanCap`] allows (absolute and percent of the VMs listed) deletes none of them and says why (Event
//! `OrphanDeleteCapExceeded`, log, `peerpod_ctrl_orphan_deletions_refused_total`); a VM tagged
//! `peerpods.io/do-not-delete` is reported, never deleted, and provider-service refusing one for that reason
//! skips it without failing the scan.
//!
//! Adoption before reaping: an untracked VM whose name is cloud-api-adaptor's name for a VM of a Pod that
//! exists in this cluster ([`crate::adopt`]) is no orphan: its Pod may still be running on it (a PeerPod
//! that was never written, or written without the instance id). It is reported as adoptable (log, Event
//! `AdoptableInstanceFound` naming the VM and the Pod, `peerpod_ctrl_adoptable_instances`) and never
//! deleted, whatever the policy. The Pods are read (metadata only) only when an untracked VM carries such a
//! name; when they cannot be read, the scan of that provider fails and deletes nothing.
//!
//! - [`rules`]: which VMs are orphans, which are protected, whether a scan may delete them (pure).
//! - `scan`: the scanner (`ListInstances`, the Pods an untracked VM's name may belong to, `DeleteInstance`),
//!   its Events, metrics and log lines.

pub mod rules;
mod scan;

use std::collections::HashMap;
use std::time::Duration;

use crate::Error;
use crate::adopt::PodRef;

pub use rules::{DeletionRefused, OrphanCap, Vm};
pub use scan::Scanner;

/// What to do with an orphan VM.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OrphanPolicy {
    /// Report only (metric, log, Event).
    #[default]
    Report,
    /// Report and delete.
    Delete,
}

/// Settings of the orphan scan.
#[derive(Debug, Clone)]
pub struct OrphanSettings {
    pub interval: Duration,
    pub grace: Duration,
    pub policy: OrphanPolicy,
    /// The tag (key, value) this cluster's VMs carry. Without one, no scan runs: a VM we cannot attribute
    /// to this cluster must never be touched.
    pub cluster_tag: Option<(String, String)>,
    /// Namespace whose Namespace object receives orphan Events.
    pub event_namespace: String,
    /// How many orphans one scan of one provider may delete (the `delete` policy only).
    pub cap: OrphanCap,
}

/// Parses `key=value`.
pub fn parse_tag(text: &str) -> Result<(String, String), Error> {
    match text.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(Error::config(format!(
            "cluster tag {text:?} is not KEY=VALUE"
        ))),
    }
}

/// Remembers when a VM without a creation time was first seen, so its age can still be judged.
#[derive(Default)]
pub struct FirstSeen(pub(crate) HashMap<(String, String), jiff::Timestamp>);

/// An untracked VM that is no orphan: cloud-api-adaptor's name ties it to live Pods.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adoptable {
    pub vm: Vm,
    /// The Pods its name is cloud-api-adaptor's name for (one, unless namesakes live in several namespaces).
    pub pods: Vec<PodRef>,
}

/// One scan result, for logs and tests.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ScanReport {
    /// Untracked VMs past the grace period that no live Pod's name claims.
    pub orphans: Vec<Vm>,
    /// Untracked VMs past the grace period that a live Pod's name claims: reported, never deleted.
    pub adoptable: Vec<Adoptable>,
    pub deleted: Vec<Vm>,
    /// Providers whose orphans were not deleted, and why.
    pub refused: Vec<(String, DeletionRefused)>,
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn cluster_tag_is_key_equals_value() {
        assert_eq!(
            parse_tag("peerpods.io/cluster=prod").expect("valid"),
            ("peerpods.io/cluster".to_string(), "prod".to_string())
        );
        assert_eq!(
            parse_tag("k=").expect("valid"),
            ("k".to_string(), String::new())
        );
        assert!(parse_tag("novalue").is_err());
        assert!(parse_tag("=v").is_err());
    }
}
