//! A VM's identity: wherever a PeerPod's instance and provider-service's listing meet (the cleanup, the orphan
//! scan, reverse collection), the same VM compares equal the same way.

use peerpods_protocol::InstanceKey;

/// Key identifying a VM across PeerPods and `ListInstances`: provider plus the id in the cloud's canonical
/// form ([`InstanceKey`]: one comparison rule per cloud, the same everywhere an instance is compared). An
/// unknown provider's ids compare as written (trimmed).
pub fn instance_key(provider: &str, instance_id: &str) -> (String, String) {
    match InstanceKey::parse(provider, instance_id) {
        Some(key) => (key.provider().as_str().to_owned(), key.id().to_owned()),
        None => (provider.trim().to_owned(), instance_id.trim().to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_instance_has_one_key_in_every_comparison() {
        // ARM answers an Azure id in another case than CAA wrote it: still the same VM (reverse collection
        // must not flag the live PeerPod as missing, nor an orphan scan its VM).
        assert_eq!(
            instance_key(
                "azure",
                "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/VM"
            ),
            instance_key(
                " azure ",
                "/subscriptions/s/resourcegroups/rg/providers/microsoft.compute/virtualmachines/vm"
            )
        );
        // EC2 ids are exact.
        assert_ne!(instance_key("aws", "i-0ABC"), instance_key("aws", "i-0abc"));
        // Unknown providers compare as written.
        assert_eq!(
            instance_key(" nimbus", " X "),
            ("nimbus".to_string(), "X".to_string())
        );
    }
}
