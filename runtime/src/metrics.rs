//! Metrics every controller binary exports, whatever it controls.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use crate::health::Readiness;
use crate::leader::{LEADING, READINESS_COMPONENT};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ComponentLabels {
    component: &'static str,
}

/// `peerpods_leader{component}`: 1 while this replica does the controller's work, 0 while it stands by.
///
/// Read from the readiness leader election keeps at scrape time, so it cannot drift from what the replica
/// does. A replica without leader election has no such component and always works: it reports 1. Summed over
/// a controller's replicas the value is 1 when healthy, 0 when no replica leads.
#[derive(Clone, Debug)]
pub struct Leader {
    component: &'static str,
    readiness: Readiness,
}

impl Leader {
    pub fn new(component: &'static str, readiness: Readiness) -> Self {
        Leader {
            component,
            readiness,
        }
    }

    /// Whether this replica does the work now.
    pub fn leading(&self) -> bool {
        self.readiness
            .detail(READINESS_COMPONENT)
            .is_none_or(|detail| detail == LEADING)
    }
}

impl Collector for Leader {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = Family::<ComponentLabels, Gauge>::default();
        family
            .get_or_create(&ComponentLabels {
                component: self.component,
            })
            .set(i64::from(self.leading()));
        family.encode(encoder.encode_descriptor(
            "peerpods_leader",
            "1 while this replica does the controller's work (holds the Lease, or runs without leader election), 0 while it stands by",
            None,
            family.metric_type(),
        )?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::registry::Registry;

    fn scrape(leader: Leader) -> String {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(leader));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        text
    }

    #[test]
    fn a_replica_without_leader_election_leads() {
        let text = scrape(Leader::new("peerpod-ctrl", Readiness::default()));
        assert!(
            text.contains(r#"peerpods_leader{component="peerpod-ctrl"} 1"#),
            "{text}"
        );
    }

    #[test]
    fn a_standby_reports_zero_and_the_holder_one() {
        let readiness = Readiness::default();
        let leader = Leader::new("peer-pod-config-ctrl", readiness.clone());
        readiness.set(READINESS_COMPONENT, true, "standby");
        assert!(scrape(leader.clone()).contains(r#"component="peer-pod-config-ctrl"} 0"#));
        readiness.set(READINESS_COMPONENT, true, LEADING);
        assert!(scrape(leader).contains(r#"component="peer-pod-config-ctrl"} 1"#));
    }
}
