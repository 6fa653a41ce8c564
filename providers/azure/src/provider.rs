//! [`AzureProvider`]: the [`Provider`] implementation over Azure Resource Manager, built from the
//! `AZURE_*` settings.

use async_trait::async_trait;
use azure_core::http::Method;
use peerpods_provider_core::deletion::window_from_config;
use peerpods_provider_core::{
    Capacity, CloudCalls, DeleteOutcome, Deleter, Error, Health, Instance, OwnerTag, Pace,
    Provider, ProviderConfig, ProviderName, TagSelector, Window,
};

use crate::arm::{Arm, COMPUTE_API};
use crate::deletion::{NOT_FOUND_WINDOW, NOT_FOUND_WINDOW_SETTING, VmPorts};
use crate::instance_id::{self, VmId};
use crate::resources::{self, Page, Usage, Vm};
use crate::settings::AzureSettings;

/// At most this many pages are read from one list (1,000 VMs or usages per page).
const MAX_PAGES: usize = 100;

/// The Azure backend.
#[derive(Debug)]
pub struct AzureProvider {
    arm: Arm,
    subscription_id: String,
    resource_group: String,
    region: String,
    /// The deletion engine's driver: the cluster tag's guard, the not-found window
    /// (`AZURE_NOT_FOUND_WINDOW_SECS`) keyed by each VM's full resource id, and the pace of
    /// its waits (`AZURE_POLL_INTERVAL_MS`).
    deleter: Deleter,
}

impl AzureProvider {
    /// Builds the provider from the `AZURE_*` keys of `config`, counting its ARM calls in
    /// `calls`. Contacts nothing: tokens are requested on the first call.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let settings = AzureSettings::from_config(config)
            .map_err(|problem| Error::config(problem.key.to_owned(), problem.reason))?;
        let window = window_from_config(config, NOT_FOUND_WINDOW_SETTING, NOT_FOUND_WINDOW)?;
        Self::with_window(settings, calls, window)
    }

    /// Builds the provider from parsed settings, with the default not-found window.
    pub fn new(settings: AzureSettings, calls: CloudCalls) -> Result<Self, Error> {
        Self::with_window(settings, calls, Window(NOT_FOUND_WINDOW))
    }

    fn with_window(
        settings: AzureSettings,
        calls: CloudCalls,
        window: Window,
    ) -> Result<Self, Error> {
        let deleter = Deleter::new(
            ProviderName::Azure,
            OwnerTag::requiring(settings.owner_tag.clone()).guard(),
            window,
            NOT_FOUND_WINDOW_SETTING,
            Pace::every(settings.poll_interval),
        );
        Ok(AzureProvider {
            arm: Arm::new(&settings, calls)?,
            deleter,
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
        let outcome = self
            .deleter
            .delete(&VmPorts::new(&self.arm, vm), instance_id)
            .await;
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

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_emulator_azure::{AzureEmulator, RESOURCE_GROUP, SUBSCRIPTION_ID};
    use test_support::cloud::CloudEmulator;

    /// The deleter of one provider keys its memo of each VM by the VM's full resource id: two
    /// VMs of one name in different resource groups or subscriptions are judged apart. The
    /// provider itself refuses ids outside its resource group, so the ports are driven here
    /// directly, against the emulator (which knows no other group or subscription: 404).
    #[tokio::test(flavor = "multi_thread")]
    async fn vms_of_one_name_in_other_groups_or_subscriptions_are_judged_apart() {
        let emulator = AzureEmulator::start();
        let provider = AzureProvider::from_config(
            &ProviderConfig::from_pairs(emulator.config()),
            CloudCalls::default(),
        )
        .expect("provider");
        let ours = emulator.create_vm("podvm-same", &[]);
        let elsewhere = [
            ours.replace(RESOURCE_GROUP, "other-rg"),
            ours.replace(SUBSCRIPTION_ID, "00000000-1111-2222-3333-444444444444"),
        ];
        let delete = |id: String| {
            let provider = &provider;
            async move {
                let vm = instance_id::parse(&id).expect("an Azure VM id");
                provider
                    .deleter
                    .delete(&VmPorts::new(&provider.arm, vm), &id)
                    .await
                    .expect("an answer")
            }
        };
        let not_yet_visible = |outcome: DeleteOutcome| matches!(outcome, DeleteOutcome::NotYetVisible { setting, .. } if setting == NOT_FOUND_WINDOW_SETTING);

        for id in &elsewhere {
            assert!(not_yet_visible(delete(id.clone()).await), "{id}");
        }
        assert_eq!(delete(ours.clone()).await, DeleteOutcome::Deleted);
        // Our VM, known from its lookup, has its own 404 believed; theirs, never shown, do not.
        for id in &elsewhere {
            assert!(not_yet_visible(delete(id.clone()).await), "{id}");
        }
        assert_eq!(delete(ours).await, DeleteOutcome::AlreadyGone);
    }
}
