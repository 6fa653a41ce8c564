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

/// Names of the backends compiled into this binary.
pub const BUILT_IN: &[&str] = &[
    #[cfg(feature = "alibabacloud")]
    "alibabacloud",
    #[cfg(feature = "aws")]
    "aws",
    #[cfg(feature = "azure")]
    "azure",
    #[cfg(feature = "byom")]
    "byom",
    #[cfg(feature = "gcp")]
    "gcp",
    #[cfg(feature = "ibmcloud")]
    "ibmcloud",
    #[cfg(feature = "ibmcloud-powervs")]
    "ibmcloud-powervs",
    #[cfg(feature = "libvirt")]
    "libvirt",
];

/// The backend for `name` from `config`, or `None` when this binary was built without it.
pub async fn build(
    name: ProviderName,
    config: &ProviderConfig,
    cloud_calls: &CloudCalls,
) -> Result<Option<Arc<dyn Provider>>, Error> {
    // Unused when no backend is built in.
    let _ = (config, cloud_calls);
    let backend: Option<Arc<dyn Provider>> = match name {
        #[cfg(feature = "alibabacloud")]
        ProviderName::Alibabacloud => Some(Arc::new(
            peerpods_provider_alibabacloud::AlibabaCloudProvider::from_config(
                config,
                cloud_calls.clone(),
            )?,
        )),
        #[cfg(feature = "aws")]
        ProviderName::Aws => Some(Arc::new(
            peerpods_provider_aws::AwsProvider::from_config(config, cloud_calls.clone()).await?,
        )),
        #[cfg(feature = "azure")]
        ProviderName::Azure => Some(Arc::new(
            peerpods_provider_azure::AzureProvider::from_config(config, cloud_calls.clone())?,
        )),
        #[cfg(feature = "byom")]
        ProviderName::Byom => Some(Arc::new(peerpods_provider_byom::ByomProvider::from_config(
            config,
            cloud_calls.clone(),
        )?)),
        #[cfg(feature = "gcp")]
        ProviderName::Gcp => Some(Arc::new(
            peerpods_provider_gcp::GcpProvider::from_config(config, cloud_calls.clone()).await?,
        )),
        #[cfg(feature = "ibmcloud")]
        ProviderName::Ibmcloud => Some(Arc::new(
            peerpods_provider_ibmcloud::IbmCloudVpcProvider::from_config(
                config,
                cloud_calls.clone(),
            )?,
        )),
        #[cfg(feature = "ibmcloud-powervs")]
        ProviderName::IbmcloudPowervs => Some(Arc::new(
            peerpods_provider_ibmcloud::PowerVsProvider::from_config(config, cloud_calls.clone())?,
        )),
        #[cfg(feature = "libvirt")]
        ProviderName::Libvirt => Some(Arc::new(
            peerpods_provider_libvirt::LibvirtProvider::from_config(config, cloud_calls.clone())?,
        )),
        #[allow(unreachable_patterns)]
        _ => None,
    };
    Ok(backend.map(guarded))
}

/// A backend as the service uses it: behind its own call budget (deletes apart from reads, so
/// capacity polling cannot take the slots cleanups need; each delete bounded by [`DELETE_BOUND`]
/// from when it holds its slot) and with capacity and health answers cached, one cloud call in
/// flight.
pub fn guarded(backend: Arc<dyn Provider>) -> Arc<dyn Provider> {
    guarded_with(backend, CallBudget::default(), DELETE_BOUND)
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
