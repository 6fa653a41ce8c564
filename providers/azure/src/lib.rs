//! The Azure backend: Azure Resource Manager through the official `azure_core` pipeline and
//! `azure_identity` credentials.
//!
//! - [`AzureProvider`]: the [`Provider`] implementation; the only public entry.
//! - `settings`: configuration keys (cloud-api-adaptor's names) → [`AzureSettings`].
//! - `instance_id`: syntax of the VM's ARM resource id (cloud-api-adaptor's instance id).
//! - `answer` + `resources`: pure reading of ARM's answers (errors, async operations, VMs,
//!   network interfaces, usages).
//! - `arm`: every ARM call, authenticated, retried, counted; `transport`: the HTTP client.
//! - `deletion`: a VM and its parts, waiting for ARM's asynchronous operations.

mod answer;
mod arm;
mod deletion;
mod instance_id;
mod resources;
mod settings;
mod transport;

use async_trait::async_trait;
use azure_core::http::Method;
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Error, Health, Instance, Provider, ProviderConfig,
    ProviderName, TagSelector,
};

pub use settings::{AzureSettings, Credentials};

use arm::{Arm, COMPUTE_API};
use deletion::{Policy, Waiting};
use instance_id::VmId;
use resources::{Page, Usage, Vm};

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "azure";

/// At most this many pages are read from one list (1,000 VMs or usages per page).
const MAX_PAGES: usize = 100;

/// The Azure backend.
#[derive(Debug)]
pub struct AzureProvider {
    arm: Arm,
    subscription_id: String,
    resource_group: String,
    region: String,
    deletion: Policy,
}

impl AzureProvider {
    /// Builds the provider from the `AZURE_*` keys of `config`, counting its ARM calls in
    /// `calls`. Contacts nothing: tokens are requested on the first call.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let settings = AzureSettings::from_config(config)
            .map_err(|problem| Error::config(problem.key.to_owned(), problem.reason))?;
        let mut provider = Self::new(settings, calls)?;
        provider.deletion.not_found = deletion::not_found_window(Some(config))?;
        Ok(provider)
    }

    /// Builds the provider from parsed settings.
    pub fn new(settings: AzureSettings, calls: CloudCalls) -> Result<Self, Error> {
        Ok(AzureProvider {
            arm: Arm::new(&settings, calls)?,
            deletion: Policy {
                waiting: Waiting {
                    poll_interval: settings.poll_interval,
                    timeout: settings.delete_timeout,
                },
                owner_tag: peerpods_provider_core::OwnerTag::requiring(settings.owner_tag),
                not_found: deletion::not_found_window(None)?,
            },
            subscription_id: settings.subscription_id,
            resource_group: settings.resource_group,
            region: settings.region,
        })
    }

    /// The VM `instance_id` names, if it is one of this provider's resource group.
    fn vm_id(&self, instance_id: &str) -> Result<VmId, Error> {
        let vm = instance_id::parse(instance_id).map_err(|problem| {
            Error::invalid(
                "instance_id",
                format!("not an Azure VM resource id: {problem}"),
            )
        })?;
        if !vm.subscription.eq_ignore_ascii_case(&self.subscription_id)
            || !vm.resource_group.eq_ignore_ascii_case(&self.resource_group)
        {
            return Err(Error::invalid(
                "instance_id",
                format!(
                    "the VM is in resource group {} of subscription {}; this provider manages resource group {} of subscription {}",
                    vm.resource_group, vm.subscription, self.resource_group, self.subscription_id
                ),
            ));
        }
        Ok(vm)
    }

    /// Every item of an ARM list, following `nextLink`.
    async fn list_all<T: serde::de::DeserializeOwned>(
        &self,
        operation: &'static str,
        first: String,
        what: &str,
    ) -> Result<Vec<T>, Error> {
        let mut items = Vec::new();
        let mut next = Some(first);
        let mut pages = 0;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > MAX_PAGES {
                return Err(Error::internal(format!(
                    "{what}: more than {MAX_PAGES} pages"
                )));
            }
            let answer = self.arm.call(operation, Method::Get, &url, what).await?;
            if !answer.is_success() {
                return Err(self.arm.failure(&answer, what));
            }
            let page: Page<T> = self.arm.json(&answer, what)?;
            items.extend(page.value);
            next = page.next_link.filter(|link| !link.is_empty());
        }
        Ok(items)
    }

    fn usages_url(&self) -> String {
        self.arm.url(
            &format!(
                "/subscriptions/{}/providers/Microsoft.Compute/locations/{}/usages",
                self.subscription_id, self.region
            ),
            COMPUTE_API,
        )
    }
}

#[async_trait]
impl Provider for AzureProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Azure
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        self.vm_id(instance_id).map(|_| ())
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let vm = self.vm_id(instance_id)?;
        let outcome = deletion::delete_vm(&self.arm, &vm, &self.deletion).await;
        match &outcome {
            Ok(outcome) => tracing::info!(
                instance_id,
                outcome = outcome.as_str(),
                "Azure VM deletion answered"
            ),
            Err(error) => {
                tracing::warn!(instance_id, reason = error.reason(), %error, "Azure VM deletion failed")
            }
        }
        outcome
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        let what = format!("reading compute usages of region {}", self.region);
        let usages: Vec<Usage> = self
            .list_all("ListUsages", self.usages_url(), &what)
            .await?;
        Ok(resources::capacity_from(&usages))
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let what = format!("listing VMs of resource group {}", self.resource_group);
        let url = self.arm.url(
            &format!(
                "/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines",
                self.subscription_id, self.resource_group
            ),
            COMPUTE_API,
        );
        let vms: Vec<Vm> = self.list_all("ListVirtualMachines", url, &what).await?;
        let mut instances: Vec<Instance> = vms
            .into_iter()
            .filter_map(Vm::into_instance)
            .filter(|instance| instance.matches(selector))
            .collect();
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(instances)
    }

    async fn health(&self) -> Health {
        let what = format!("reading compute usages of region {}", self.region);
        let answer = self
            .arm
            .call("ListUsages", Method::Get, &self.usages_url(), &what)
            .await;
        match answer {
            Ok(answer) if answer.is_success() => Health {
                healthy: true,
                message: format!(
                    "Azure Resource Manager answers for subscription {} in region {}",
                    self.subscription_id, self.region
                ),
            },
            Ok(answer) => Health {
                healthy: false,
                message: self.arm.failure(&answer, &what).to_string(),
            },
            Err(error) => Health {
                healthy: false,
                message: error.to_string(),
            },
        }
    }
}
