//! Capacity from a region's quotas (`regions.get` → `quotas[]`): pure.

use peerpods_provider_core::{Capacity, Figure};

/// Region quota metric of all vCPUs (every machine family counts towards it).
pub const CPUS: &str = "CPUS";
/// Region quota metric of VM instances.
pub const INSTANCES: &str = "INSTANCES";

/// One entry of a region's `quotas[]`.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionQuota {
    pub metric: String,
    pub limit: Option<f64>,
    pub usage: Option<f64>,
}

/// Instances and vCPUs from the region's `INSTANCES` and `CPUS` quotas; a metric the region
/// does not report stays unknown. Compute Engine has no memory quota: memory is unknown.
pub fn capacity_from(quotas: &[RegionQuota]) -> Capacity {
    let figure = |metric: &str| {
        quotas
            .iter()
            .find(|q| q.metric == metric)
            .map(|q| Figure {
                limit: q.limit.and_then(count),
                in_use: q.usage.and_then(count),
            })
            .unwrap_or_default()
    };
    Capacity {
        instances: figure(INSTANCES),
        vcpus: figure(CPUS),
        memory_mib: Figure::default(),
    }
}

/// A quota number as a count; quotas are whole numbers sent as doubles.
fn count(value: f64) -> Option<u64> {
    (value.is_finite() && value >= 0.0).then(|| value.round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quota(metric: &str, limit: f64, usage: f64) -> RegionQuota {
        RegionQuota {
            metric: metric.into(),
            limit: Some(limit),
            usage: Some(usage),
        }
    }

    #[test]
    fn instances_and_vcpus_come_from_their_metrics() {
        let capacity = capacity_from(&[
            quota("N2D_CPUS", 500.0, 7.0),
            quota(CPUS, 24.0, 6.0),
            quota(INSTANCES, 100.0, 3.0),
        ]);
        assert_eq!(
            capacity.vcpus,
            Figure {
                limit: Some(24),
                in_use: Some(6)
            }
        );
        assert_eq!(
            capacity.instances,
            Figure {
                limit: Some(100),
                in_use: Some(3)
            }
        );
        assert_eq!(capacity.memory_mib, Figure::default());
    }

    #[test]
    fn missing_metrics_and_odd_numbers_are_unknown() {
        let capacity = capacity_from(&[RegionQuota {
            metric: CPUS.into(),
            limit: Some(f64::INFINITY),
            usage: None,
        }]);
        assert_eq!(capacity.vcpus, Figure::default());
        assert_eq!(capacity.instances, Figure::default());
    }
}
