//! One instance, one identity: the provider and the cloud's canonical form of the id
//! ([`ProviderName::canonical_instance_id`]), used wherever two mentions of an instance are compared.

use std::fmt;

use crate::ProviderName;

/// An instance of one cloud, its id in the cloud's canonical form. Two keys are equal exactly
/// when they name the same instance, whatever case or whitespace the names were written in.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InstanceKey {
    provider: ProviderName,
    id: String,
}

impl InstanceKey {
    /// The key of `instance_id` on `provider`.
    pub fn new(provider: ProviderName, instance_id: &str) -> Self {
        InstanceKey {
            provider,
            id: provider.canonical_instance_id(instance_id),
        }
    }

    /// The key of `instance_id` on the provider named `provider` (a `cloud_provider` value), or
    /// `None` for a name that is not one of cloud-api-adaptor's.
    pub fn parse(provider: &str, instance_id: &str) -> Option<Self> {
        provider
            .trim()
            .parse::<ProviderName>()
            .ok()
            .map(|provider| Self::new(provider, instance_id))
    }

    pub fn provider(&self) -> ProviderName {
        self.provider
    }

    /// The id in its canonical form.
    pub fn id(&self) -> &str {
        &self.id
    }
}

impl fmt::Display for InstanceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} instance {}", self.provider, self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_instance_has_one_key_however_it_is_written() {
        let a = InstanceKey::new(
            ProviderName::Azure,
            "/subscriptions/s/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/vm",
        );
        let b = InstanceKey::parse(
            " azure",
            "/subscriptions/S/resourcegroups/rg/providers/microsoft.compute/virtualmachines/VM ",
        )
        .expect("a provider");
        assert_eq!(a, b);
        assert_eq!(a.provider(), ProviderName::Azure);
        assert!(a.id().starts_with("/subscriptions/s/resourcegroups/rg/"));
        // The same id on another cloud is another instance; case matters where the cloud says so.
        assert_ne!(
            InstanceKey::new(ProviderName::Aws, "i-1"),
            InstanceKey::new(ProviderName::Alibabacloud, "i-1")
        );
        assert_ne!(
            InstanceKey::new(ProviderName::Aws, "i-A"),
            InstanceKey::new(ProviderName::Aws, "i-a")
        );
        assert_eq!(InstanceKey::parse("nimbus", "i-1"), None);
        assert_eq!(
            InstanceKey::new(ProviderName::Aws, "i-1").to_string(),
            "aws instance i-1"
        );
    }
}
