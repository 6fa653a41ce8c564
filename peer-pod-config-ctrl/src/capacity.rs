//! Free capacity from provider-service: how many more peer-pod VMs the cloud can hold.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use peerpods_provider_client::{Capacity, ProviderService};

use crate::Error;
use peerpods_api::peerpodconfig::CapacityFromProvider;

/// Number of VMs that still fit, from the figures the provider knows: free instances, free vCPUs divided by the
/// vCPUs of one VM, free memory divided by the memory of one VM; the smallest wins. None when no figure is
/// usable (the cloud cannot tell, or the VM size is not given).
pub fn free_instances(figures: &Capacity, source: &CapacityFromProvider) -> Option<u64> {
    let per =
        |free: Option<u64>, size: Option<u32>| Some(free? / u64::from(size.filter(|s| *s > 0)?));
    [
        figures.instances.free(),
        per(figures.vcpus.free(), source.vcpus_per_instance),
        per(figures.memory_mib.free(), source.memory_mib_per_instance),
    ]
    .into_iter()
    .flatten()
    .min()
}

/// Asks provider-service, at most once per refresh interval per provider.
pub struct ProviderCapacity {
    service: ProviderService,
    cache: Mutex<HashMap<String, (Instant, Capacity)>>,
}

impl ProviderCapacity {
    pub fn new(service: ProviderService) -> Self {
        Self {
            service,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The provider's figures, from the cache when younger than `max_age`.
    pub async fn figures(&self, provider: &str, max_age: Duration) -> Result<Capacity, Error> {
        if let Ok(cache) = self.cache.lock()
            && let Some((at, figures)) = cache.get(provider)
            && at.elapsed() < max_age
        {
            return Ok(*figures);
        }
        let figures =
            self.service
                .capacity(provider)
                .await
                .map_err(|error| Error::ProviderCapacity {
                    provider: provider.to_owned(),
                    message: error.to_string(),
                    source: Box::new(error),
                })?;
        if let Ok(mut cache) = self.cache.lock() {
            cache.insert(provider.to_owned(), (Instant::now(), figures));
        }
        Ok(figures)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_api::peerpodconfig::CloudProvider;
    use peerpods_provider_client::Figure;

    fn source(vcpus: Option<u32>, memory: Option<u32>) -> CapacityFromProvider {
        CapacityFromProvider {
            cloud_provider: CloudProvider::Libvirt,
            refresh_seconds: 60,
            vcpus_per_instance: vcpus,
            memory_mib_per_instance: memory,
        }
    }

    fn figure(limit: Option<u64>, in_use: Option<u64>) -> Figure {
        Figure { limit, in_use }
    }

    #[test]
    fn smallest_known_figure_wins() {
        let figures = Capacity {
            instances: figure(None, Some(1)),
            vcpus: figure(Some(16), Some(2)),
            memory_mib: figure(Some(8192), Some(2048)),
        };
        assert_eq!(
            free_instances(&figures, &source(Some(2), Some(2048))),
            Some(3)
        );
        assert_eq!(free_instances(&figures, &source(Some(2), None)), Some(7));
        assert_eq!(
            free_instances(&figures, &source(None, None)),
            None,
            "instances limit unknown, no VM size"
        );
    }

    #[test]
    fn quota_exceeded_means_zero_not_underflow() {
        let figures = Capacity {
            instances: figure(Some(5), Some(9)),
            ..Capacity::default()
        };
        assert_eq!(free_instances(&figures, &source(None, None)), Some(0));
    }
}
