//! The parts of ARM resource bodies this backend reads (pure): a VM's parts, a network
//! interface's public IP addresses, VM lists and compute usages.

use std::collections::BTreeMap;

use peerpods_provider_core::{Capacity, Figure, Instance};
use serde::Deserialize;

/// A VM as `GET .../virtualMachines/{name}` and the list call return it (only what we read).
#[derive(Debug, Deserialize)]
pub struct Vm {
    pub id: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub properties: VmProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmProperties {
    pub provisioning_state: Option<String>,
    pub time_created: Option<String>,
    pub storage_profile: Option<StorageProfile>,
    pub network_profile: Option<NetworkProfile>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StorageProfile {
    pub os_disk: Option<OsDisk>,
    #[serde(default)]
    pub data_disks: Vec<OsDisk>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsDisk {
    pub managed_disk: Option<SubResource>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProfile {
    #[serde(default)]
    pub network_interfaces: Vec<SubResource>,
}

#[derive(Debug, Default, Deserialize)]
pub struct SubResource {
    pub id: Option<String>,
}

/// The resources created with a VM, read from its properties before it is deleted.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct VmParts {
    pub network_interfaces: Vec<String>,
    /// The OS disk and any data disks (managed disks only; unmanaged VHDs are not resources).
    pub disks: Vec<String>,
}

impl Vm {
    pub fn parts(&self) -> VmParts {
        let network_interfaces = self
            .properties
            .network_profile
            .iter()
            .flat_map(|n| &n.network_interfaces)
            .filter_map(|nic| nic.id.clone())
            .collect();
        let disks = self
            .properties
            .storage_profile
            .iter()
            .flat_map(|s| s.os_disk.iter().chain(&s.data_disks))
            .filter_map(|disk| disk.managed_disk.as_ref()?.id.clone())
            .collect();
        VmParts {
            network_interfaces,
            disks,
        }
    }

    /// ARM reports the VM as already being deleted.
    pub fn is_deleting(&self) -> bool {
        self.properties
            .provisioning_state
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("Deleting"))
    }

    /// Tags as strings (ARM tag values are strings; anything else is skipped).
    pub fn string_tags(&self) -> BTreeMap<String, String> {
        self.tags
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
            .collect()
    }

    pub fn into_instance(self) -> Option<Instance> {
        let tags = self.string_tags();
        let created = self
            .properties
            .time_created
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok());
        Some(Instance {
            id: self.id?,
            created,
            tags,
        })
    }
}

/// A network interface (only its IP configurations' public IP addresses).
#[derive(Debug, Default, Deserialize)]
pub struct NetworkInterface {
    #[serde(default)]
    pub properties: NetworkInterfaceProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterfaceProperties {
    #[serde(default)]
    pub ip_configurations: Vec<IpConfiguration>,
}

#[derive(Debug, Default, Deserialize)]
pub struct IpConfiguration {
    #[serde(default)]
    pub properties: IpConfigurationProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpConfigurationProperties {
    #[serde(rename = "publicIPAddress")]
    pub public_ip_address: Option<SubResource>,
}

impl NetworkInterface {
    pub fn public_ip_addresses(&self) -> Vec<String> {
        self.properties
            .ip_configurations
            .iter()
            .filter_map(|c| c.properties.public_ip_address.as_ref()?.id.clone())
            .collect()
    }
}

/// One page of an ARM list: `{"value": [...], "nextLink": "..."}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Page<T> {
    #[serde(default = "Vec::new")]
    pub value: Vec<T>,
    pub next_link: Option<String>,
}

/// One compute usage: `{"unit": "Count", "currentValue": 4, "limit": 10, "name": {"value": "cores"}}`.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub current_value: Option<i64>,
    pub limit: Option<i64>,
    pub name: UsageName,
}

#[derive(Debug, Deserialize)]
pub struct UsageName {
    pub value: Option<String>,
}

/// Capacity from the regional compute usages: `virtualMachines` for instances, `cores` (Total
/// Regional vCPUs) for vCPUs. ARM reports no memory quota, so memory stays unknown.
pub fn capacity_from(usages: &[Usage]) -> Capacity {
    let figure = |name: &str| {
        usages
            .iter()
            .find(|u| u.name.value.as_deref() == Some(name))
            .map(|u| Figure {
                // A negative limit would be an ARM bug; unknown rather than wrong.
                limit: u.limit.and_then(|l| u64::try_from(l).ok()),
                in_use: u.current_value.and_then(|v| u64::try_from(v).ok()),
            })
            .unwrap_or_default()
    };
    Capacity {
        instances: figure("virtualMachines"),
        vcpus: figure("cores"),
        memory_mib: Figure::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Shapes as in azure-rest-api-specs' VirtualMachine_Get (compute 2024-07-01) and
    // NetworkInterfaceGet (network 2024-05-01) examples.
    const VM: &str = r#"{
      "name": "myVM",
      "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/myVM",
      "tags": {"myTag1": "tagValue1", "n": 1},
      "properties": {
        "storageProfile": {
          "osDisk": {"name": "myOsDisk", "deleteOption": "Delete",
                     "managedDisk": {"storageAccountType": "Premium_LRS",
                                     "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/myOsDisk"}},
          "dataDisks": []
        },
        "networkProfile": {"networkInterfaces": [
          {"id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/myNIC",
           "properties": {"primary": true, "deleteOption": "Delete"}}
        ]},
        "provisioningState": "Succeeded",
        "timeCreated": "2021-06-27T01:02:38.3138469+00:00"
      }
    }"#;

    #[test]
    fn a_vm_names_its_network_interfaces_and_disks() {
        let vm: Vm = serde_json::from_str(VM).expect("vm");
        let parts = vm.parts();
        assert_eq!(
            parts.network_interfaces,
            vec![
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/myNIC"
            ]
        );
        assert_eq!(
            parts.disks,
            vec!["/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/myOsDisk"]
        );
        assert!(!vm.is_deleting());
        let instance = vm.into_instance().expect("id");
        assert_eq!(instance.tags.len(), 1, "non-string tag values are skipped");
        assert_eq!(
            instance.created,
            Some("2021-06-27T01:02:38.3138469Z".parse().expect("time"))
        );
    }

    #[test]
    fn a_vm_being_deleted_is_recognised() {
        let vm: Vm =
            serde_json::from_str(r#"{"id":"x","properties":{"provisioningState":"Deleting"}}"#)
                .expect("vm");
        assert!(vm.is_deleting());
        assert_eq!(vm.parts(), VmParts::default());
    }

    #[test]
    fn a_network_interface_names_its_public_ips() {
        let nic: NetworkInterface = serde_json::from_str(
            r#"{"name":"test-nic","properties":{"ipConfigurations":[
                {"name":"ipconfig1","properties":{"privateIPAddress":"172.20.2.4",
                  "publicIPAddress":{"id":"/subscriptions/subid/resourceGroups/rg1/providers/Microsoft.Network/publicIPAddresses/test-ip"}}},
                {"name":"ipconfig2","properties":{"privateIPAddress":"172.20.2.16"}}]}}"#,
        )
        .expect("nic");
        assert_eq!(
            nic.public_ip_addresses(),
            vec![
                "/subscriptions/subid/resourceGroups/rg1/providers/Microsoft.Network/publicIPAddresses/test-ip"
            ]
        );
    }

    #[test]
    fn capacity_reads_cores_and_virtual_machines_and_knows_memory_is_unknown() {
        let page: Page<Usage> = serde_json::from_str(
            r#"{"value":[
              {"unit":"Count","currentValue":17,"limit":19,"name":{"value":"cores","localizedValue":"Total Regional vCPUs"}},
              {"unit":"Count","currentValue":3,"limit":25000,"name":{"value":"virtualMachines","localizedValue":"Virtual Machines"}},
              {"unit":"Count","currentValue":0,"limit":2500,"name":{"value":"availabilitySets","localizedValue":"Availability Sets"}}
            ]}"#,
        )
        .expect("usages");
        let capacity = capacity_from(&page.value);
        assert_eq!(
            capacity.vcpus,
            Figure {
                limit: Some(19),
                in_use: Some(17)
            }
        );
        assert_eq!(
            capacity.instances,
            Figure {
                limit: Some(25000),
                in_use: Some(3)
            }
        );
        assert_eq!(capacity.memory_mib, Figure::default());
        assert_eq!(capacity_from(&[]), Capacity::default());
    }
}
