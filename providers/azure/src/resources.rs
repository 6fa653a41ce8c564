//! The parts of ARM resource bodies this backend reads (pure): a VM's parts and how each is tied
//! to it, a network interface's public IP addresses, the tags and state of a part, VM lists and
//! compute usages.

use std::collections::BTreeMap;

use peerpods_provider_core::deletion::{PartKind, Tie};
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
    pub os_disk: Option<Disk>,
    #[serde(default)]
    pub data_disks: Vec<Disk>,
}

/// `storageProfile.osDisk` or one `storageProfile.dataDisks[]` entry.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Disk {
    pub managed_disk: Option<SubResource>,
    /// `Delete` or `Detach`: what ARM does with the disk when the VM is deleted.
    pub delete_option: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProfile {
    #[serde(default)]
    pub network_interfaces: Vec<NetworkInterfaceReference>,
}

/// `networkProfile.networkInterfaces[]`: `{"id": ..., "properties": {"deleteOption": ...}}`.
#[derive(Debug, Default, Deserialize)]
pub struct NetworkInterfaceReference {
    pub id: Option<String>,
    #[serde(default)]
    pub properties: DeleteOptionProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteOptionProperties {
    pub delete_option: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub struct SubResource {
    pub id: Option<String>,
}

/// Whether a `deleteOption` value says the part goes with the VM (ARM compares it
/// case-insensitively).
pub fn goes_with_vm(delete_option: Option<&str>) -> bool {
    delete_option.is_some_and(|o| o.eq_ignore_ascii_case("Delete"))
}

/// The name of an ARM resource id (its last segment).
pub fn resource_name(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

/// The names cloud-api-adaptor gives the parts it creates for VM `vm`
/// (`src/cloud-providers/azure/provider.go`): network interfaces `<vm>-net` and, with a second
/// interface, `<vm>-ext`; the public IP address configuration of an interface is named like the
/// interface; the OS disk is `<vm>-disk`. CAA creates no data disk.
#[derive(Debug, PartialEq, Eq)]
pub struct CaaNames {
    pub network_interfaces: [String; 2],
    pub public_ips: [String; 2],
    pub os_disk: String,
}

impl CaaNames {
    pub fn of(vm: &str) -> Self {
        let net = format!("{vm}-net");
        let ext = format!("{vm}-ext");
        CaaNames {
            network_interfaces: [net.clone(), ext.clone()],
            public_ips: [net, ext],
            os_disk: format!("{vm}-disk"),
        }
    }

    pub fn is_network_interface(&self, id: &str) -> bool {
        let name = resource_name(id);
        self.network_interfaces
            .iter()
            .any(|n| n.eq_ignore_ascii_case(name))
    }

    pub fn is_public_ip(&self, id: &str) -> bool {
        let name = resource_name(id);
        self.public_ips.iter().any(|n| n.eq_ignore_ascii_case(name))
    }

    pub fn is_os_disk(&self, id: &str) -> bool {
        self.os_disk.eq_ignore_ascii_case(resource_name(id))
    }
}

/// A part attached to a VM, as the VM's body names it: its kind, its ARM id and how it is tied to
/// the VM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attached {
    pub kind: PartKind,
    pub id: String,
    pub tie: Tie,
}

/// How a part is tied to VM: ARM deletes it with the VM (`deleteOption: Delete`), or
/// cloud-api-adaptor created it for the VM (`named_by_caa`), or neither (never deleted).
pub fn tie(delete_option: Option<&str>, named_by_caa: bool) -> Tie {
    if goes_with_vm(delete_option) {
        Tie::GoesWithVm
    } else if named_by_caa {
        Tie::CreatedForVm
    } else {
        Tie::NotTheVms
    }
}

impl Vm {
    /// The parts attached to the VM whose cloud-api-adaptor names are `caa`, read from its
    /// properties: interfaces, then the OS disk, then data disks (managed disks only: unmanaged
    /// VHDs are not resources). A data disk is the VM's only when ARM deletes it with the VM:
    /// CAA creates none, and a persistent volume's disk is attached with `Detach` precisely so
    /// that it outlives the VM.
    pub fn attached(&self, caa: &CaaNames) -> Vec<Attached> {
        let mut parts = Vec::new();
        for nic in self
            .properties
            .network_profile
            .iter()
            .flat_map(|n| &n.network_interfaces)
        {
            let Some(id) = nic.id.clone() else { continue };
            parts.push(Attached {
                kind: PartKind::NetworkInterface,
                tie: tie(
                    nic.properties.delete_option.as_deref(),
                    caa.is_network_interface(&id),
                ),
                id,
            });
        }
        let storage = self.properties.storage_profile.as_ref();
        if let Some(os_disk) = storage.and_then(|s| s.os_disk.as_ref())
            && let Some(id) = os_disk.managed_disk.as_ref().and_then(|d| d.id.clone())
        {
            parts.push(Attached {
                kind: PartKind::Disk,
                tie: tie(os_disk.delete_option.as_deref(), caa.is_os_disk(&id)),
                id,
            });
        }
        for disk in storage.iter().flat_map(|s| &s.data_disks) {
            let Some(id) = disk.managed_disk.as_ref().and_then(|d| d.id.clone()) else {
                continue;
            };
            parts.push(Attached {
                kind: PartKind::Disk,
                tie: tie(disk.delete_option.as_deref(), false),
                id,
            });
        }
        parts
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
        string_tags(&self.tags)
    }

    /// When ARM says the VM was created (`properties.timeCreated`).
    pub fn created(&self) -> Option<jiff::Timestamp> {
        self.properties
            .time_created
            .as_deref()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
    }

    pub fn into_instance(self) -> Option<Instance> {
        let tags = self.string_tags();
        let created = self.created();
        let id = self.id?;
        Some(Instance {
            // The VM's name is the last segment of its ARM id.
            name: id.rsplit('/').next().unwrap_or_default().to_owned(),
            id,
            created,
            tags,
        })
    }
}

/// Tags as strings (ARM tag values are strings; anything else is skipped).
fn string_tags(tags: &BTreeMap<String, serde_json::Value>) -> BTreeMap<String, String> {
    tags.iter()
        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
        .collect()
}

/// A network interface (its tags, its IP configurations' public IP addresses and the VM using
/// it).
#[derive(Debug, Default, Deserialize)]
pub struct NetworkInterface {
    #[serde(default)]
    pub tags: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub properties: NetworkInterfaceProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkInterfaceProperties {
    #[serde(default)]
    pub ip_configurations: Vec<IpConfiguration>,
    pub virtual_machine: Option<SubResource>,
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
    pub public_ip_address: Option<PublicIpAddress>,
}

/// A public IP address, as a network interface names it or as `GET` returns it.
#[derive(Debug, Default, Deserialize)]
pub struct PublicIpAddress {
    pub id: Option<String>,
    #[serde(default)]
    pub tags: BTreeMap<String, serde_json::Value>,
    #[serde(default)]
    pub properties: PublicIpAddressProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpAddressProperties {
    pub delete_option: Option<String>,
    /// The IP configuration of the network interface holding the address, if any.
    pub ip_configuration: Option<SubResource>,
}

impl PublicIpAddress {
    pub fn string_tags(&self) -> BTreeMap<String, String> {
        string_tags(&self.tags)
    }

    /// The name of the network interface holding the address, if any (its IP configuration's
    /// id is `<interface id>/ipConfigurations/<name>`).
    pub fn holder(&self) -> Option<&str> {
        let id = self.properties.ip_configuration.as_ref()?.id.as_deref()?;
        let (interface, _) = id.rsplit_once("/ipConfigurations/")?;
        Some(resource_name(interface))
    }
}

/// A public IP address of an interface, and whether ARM deletes it with the VM when the
/// interface's answer says so (`None`: the answer does not say).
#[derive(Debug, PartialEq, Eq)]
pub struct PublicIpOfInterface {
    pub id: String,
    pub goes_with_vm: Option<bool>,
}

impl NetworkInterface {
    pub fn string_tags(&self) -> BTreeMap<String, String> {
        string_tags(&self.tags)
    }

    pub fn public_ip_addresses(&self) -> Vec<PublicIpOfInterface> {
        self.properties
            .ip_configurations
            .iter()
            .filter_map(|c| {
                let ip = c.properties.public_ip_address.as_ref()?;
                Some(PublicIpOfInterface {
                    id: ip.id.clone()?,
                    goes_with_vm: ip
                        .properties
                        .delete_option
                        .as_deref()
                        .map(|o| goes_with_vm(Some(o))),
                })
            })
            .collect()
    }

    /// The VM using this interface, if any.
    pub fn virtual_machine(&self) -> Option<&str> {
        self.properties.virtual_machine.as_ref()?.id.as_deref()
    }
}

/// Any ARM resource's tags and provisioning state (to apply the guard to it and see that ARM is
/// already deleting it), and for a managed disk the VM it is attached to.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisionedResource {
    #[serde(default)]
    pub tags: BTreeMap<String, serde_json::Value>,
    /// A managed disk's VM.
    pub managed_by: Option<String>,
    #[serde(default)]
    pub properties: ProvisioningProperties,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProvisioningProperties {
    pub provisioning_state: Option<String>,
}

impl ProvisionedResource {
    pub fn string_tags(&self) -> BTreeMap<String, String> {
        string_tags(&self.tags)
    }

    pub fn is_deleting(&self) -> bool {
        self.properties
            .provisioning_state
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("Deleting"))
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
        assert_eq!(
            vm.attached(&CaaNames::of("myVM")),
            vec![
                Attached {
                    kind: PartKind::NetworkInterface,
                    id: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/myNIC".into(),
                    tie: Tie::GoesWithVm,
                },
                Attached {
                    kind: PartKind::Disk,
                    id: "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/myOsDisk".into(),
                    tie: Tie::GoesWithVm,
                },
            ]
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
        assert_eq!(vm.attached(&CaaNames::of("x")), Vec::new());
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
            vec![PublicIpOfInterface {
                id: "/subscriptions/subid/resourceGroups/rg1/providers/Microsoft.Network/publicIPAddresses/test-ip".into(),
                goes_with_vm: None,
            }]
        );
        assert_eq!(nic.virtual_machine(), None);
    }

    // A VM as cloud-api-adaptor creates it (interface and OS disk with deleteOption: Delete),
    // with a persistent volume's disk attached by the CSI driver as a data disk with
    // deleteOption: Detach, an operator's interface attached with Detach, and a data disk
    // marked to go with the VM. Data disk shape as in VirtualMachine_Get (compute 2024-07-01).
    const CAA_VM: &str = r#"{
      "name": "podvm-web-1a2b3c4d",
      "properties": {
        "storageProfile": {
          "osDisk": {"name": "podvm-web-1a2b3c4d-disk", "createOption": "FromImage", "deleteOption": "Delete",
                     "managedDisk": {"id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/podvm-web-1a2b3c4d-disk"}},
          "dataDisks": [
            {"lun": 0, "name": "pvc-0b6f", "createOption": "Attach", "caching": "None", "toBeDetached": false,
             "deleteOption": "Detach",
             "managedDisk": {"storageAccountType": "Premium_LRS", "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/pvc-0b6f"}},
            {"lun": 1, "name": "scratch", "createOption": "Empty", "deleteOption": "Delete",
             "managedDisk": {"id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/scratch"}},
            {"lun": 2, "name": "legacy", "createOption": "Attach",
             "managedDisk": {"id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/disks/legacy"}}
          ]
        },
        "networkProfile": {"networkInterfaces": [
          {"id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/podvm-web-1a2b3c4d-net",
           "properties": {"primary": true, "deleteOption": "Delete"}},
          {"id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/operator-nic",
           "properties": {"primary": false, "deleteOption": "Detach"}}
        ]}
      }
    }"#;

    /// The name of each part attached to `vm` (named `name`) and its tie, in the VM's order.
    fn ties(vm: &Vm, name: &str) -> Vec<(String, Tie)> {
        vm.attached(&CaaNames::of(name))
            .into_iter()
            .map(|part| (resource_name(&part.id).to_owned(), part.tie))
            .collect()
    }

    fn named(expected: &[(&str, Tie)]) -> Vec<(String, Tie)> {
        expected
            .iter()
            .map(|(name, tie)| ((*name).to_owned(), *tie))
            .collect()
    }

    #[test]
    fn only_parts_marked_delete_or_named_by_caa_belong_to_the_vm() {
        let vm: Vm = serde_json::from_str(CAA_VM).expect("vm");
        assert_eq!(
            ties(&vm, "podvm-web-1a2b3c4d"),
            named(&[
                ("podvm-web-1a2b3c4d-net", Tie::GoesWithVm),
                ("operator-nic", Tie::NotTheVms),
                ("podvm-web-1a2b3c4d-disk", Tie::GoesWithVm),
                ("pvc-0b6f", Tie::NotTheVms),
                ("scratch", Tie::GoesWithVm),
                ("legacy", Tie::NotTheVms),
            ])
        );
    }

    #[test]
    fn parts_caa_named_are_the_vms_even_when_arm_keeps_them() {
        let detached = CAA_VM.replace("\"Delete\"", "\"Detach\"");
        let vm: Vm = serde_json::from_str(&detached).expect("vm");
        assert_eq!(
            ties(&vm, "PODVM-web-1a2b3c4d"),
            named(&[
                ("podvm-web-1a2b3c4d-net", Tie::CreatedForVm),
                ("operator-nic", Tie::NotTheVms),
                ("podvm-web-1a2b3c4d-disk", Tie::CreatedForVm),
                ("pvc-0b6f", Tie::NotTheVms),
                ("scratch", Tie::NotTheVms),
                ("legacy", Tie::NotTheVms),
            ])
        );
        let caa = CaaNames::of("v");
        assert!(caa.is_public_ip("/x/publicIPAddresses/V-EXT"));
        assert!(!caa.is_public_ip("/x/publicIPAddresses/v-ip"));
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
