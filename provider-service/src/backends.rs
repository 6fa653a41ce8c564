//! The one place that maps a configured provider name to its backend. Each cloud is its own crate
//! (`providers/<cloud>`) behind the cargo feature of the same name, all on by default, so an image
//! can be built with only the clouds it needs (and without libvirt's C library):
//! `cargo build -p provider-service --no-default-features --features aws`.
//!
//! A backend reads only its own keys from the configuration, must not connect to the cloud while
//! being built (a reload builds backends to validate a new configuration) and counts its calls in
//! the shared [`CloudCalls`]. Each backend is used through [`guarded`]: a call budget and a cache.

use std::sync::Arc;
use std::time::Duration;

use peerpods_provider_core::{
    Budgeted, CallBudget, CloudCalls, Error, Provider, ProviderConfig, ProviderName,
};

use crate::cache::{CacheTimes, Cached};
use crate::deletes::DELETE_BOUND;

/// Builds a backend when its cargo feature is on; without it the backend's crate is not compiled
/// in at all, and the cloud answers `None`.
macro_rules! backend {
    ($feature:tt, $build:expr) => {{
        #[cfg(feature = $feature)]
        let backend: Option<Arc<dyn Provider>> = Some(Arc::new($build));
        #[cfg(not(feature = $feature))]
        let backend: Option<Arc<dyn Provider>> = None;
        backend
    }};
}

/// Whether this binary was built with `name`'s backend (its cargo feature is on).
pub const fn is_built_in(name: ProviderName) -> bool {
    match name {
        ProviderName::Alibabacloud => cfg!(feature = "alibabacloud"),
        ProviderName::Aws => cfg!(feature = "aws"),
        ProviderName::Azure => cfg!(feature = "azure"),
        ProviderName::Byom => cfg!(feature = "byom"),
        ProviderName::Gcp => cfg!(feature = "gcp"),
        ProviderName::Ibmcloud => cfg!(feature = "ibmcloud"),
        ProviderName::IbmcloudPowervs => cfg!(feature = "ibmcloud-powervs"),
        ProviderName::Libvirt => cfg!(feature = "libvirt"),
    }
}

/// Names of the backends compiled into this binary, ordered by name.
pub fn built_in() -> Vec<ProviderName> {
    let mut names: Vec<ProviderName> = ProviderName::ALL
        .into_iter()
        .filter(|name| is_built_in(*name))
        .collect();
    names.sort();
    names
}

/// The backend for `name` from `config`, or `None` when this binary was built without it.
pub async fn build(
    name: ProviderName,
    config: &ProviderConfig,
    cloud_calls: &CloudCalls,
) -> Result<Option<Arc<dyn Provider>>, Error> {
    // Unused when no backend is built in.
    let _ = (config, cloud_calls);
    // One line per cloud, no catch-all: a new ProviderName variant does not compile until it has one.
    let backend = match name {
        ProviderName::Alibabacloud => backend!(
            "alibabacloud",
            peerpods_provider_alibabacloud::AlibabaCloudProvider::from_config(
                config,
                cloud_calls.clone()
            )?
        ),
        ProviderName::Aws => backend!(
            "aws",
            peerpods_provider_aws::AwsProvider::from_config(config, cloud_calls.clone()).await?
        ),
        ProviderName::Azure => backend!(
            "azure",
            peerpods_provider_azure::AzureProvider::from_config(config, cloud_calls.clone())?
        ),
        ProviderName::Byom => backend!(
            "byom",
            peerpods_provider_byom::ByomProvider::from_config(config, cloud_calls.clone())?
        ),
        ProviderName::Gcp => backend!(
            "gcp",
            peerpods_provider_gcp::GcpProvider::from_config(config, cloud_calls.clone()).await?
        ),
        ProviderName::Ibmcloud => backend!(
            "ibmcloud",
            peerpods_provider_ibmcloud::IbmCloudVpcProvider::from_config(
                config,
                cloud_calls.clone()
            )?
        ),
        ProviderName::IbmcloudPowervs => backend!(
            "ibmcloud-powervs",
            peerpods_provider_ibmcloud::PowerVsProvider::from_config(config, cloud_calls.clone())?
        ),
        ProviderName::Libvirt => backend!(
            "libvirt",
            peerpods_provider_libvirt::LibvirtProvider::from_config(config, cloud_calls.clone())?
        ),
    };
    Ok(backend.map(guarded))
}

/// A backend as the service uses it: behind its own call budget (deletes apart from reads, so
/// capacity polling cannot take the slots cleanups need; each delete bounded by [`DELETE_BOUND`]
/// from when it holds its slot) and with capacity and health answers cached, one cloud call in
/// flight.
pub fn guarded(backend: Arc<dyn Provider>) -> Arc<dyn Provider> {
    let budget = backend.call_budget();
    guarded_with(backend, budget, DELETE_BOUND)
}

/// [`guarded`] with another budget and delete bound (tests).
pub fn guarded_with(
    backend: Arc<dyn Provider>,
    budget: CallBudget,
    delete_bound: Duration,
) -> Arc<dyn Provider> {
    let budgeted: Arc<dyn Provider> =
        Arc::new(Budgeted::new(backend, budget).with_delete_bound(delete_bound));
    Arc::new(Cached::new(budgeted, CacheTimes::default()))
}
