//! The values of `cloud_provider`: cloud-api-adaptor's `CLOUD_PROVIDER` names, in one place for
//! provider-service, the controllers' metrics and the PeerPodConfig CRD, with each cloud's facts.
//! Every fact is an exhaustive match, so a new cloud is one variant and the compiler names each
//! fact it needs.

use std::fmt;
use std::str::FromStr;

/// Declares [`ProviderName`] and [`ProviderName::ALL`] from one list, so that a variant cannot be
/// missing from `ALL` (which parsing and every per-cloud listing walk); the compiler then names each
/// fact below that the new variant needs.
macro_rules! provider_names {
    ($($(#[$attr:meta])* $variant:ident),+ $(,)?) => {
        /// A cloud cloud-api-adaptor can run peer-pod VMs on. Ordered by name (as ListProviders lists them).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[cfg_attr(
            feature = "serde",
            derive(serde::Serialize, serde::Deserialize),
            serde(rename_all = "kebab-case")
        )]
        #[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
        pub enum ProviderName {
            $($(#[$attr])* $variant),+
        }

        impl ProviderName {
            /// Every name, in the order cloud-api-adaptor's documentation lists them.
            pub const ALL: [ProviderName; [$(ProviderName::$variant),+].len()] =
                [$(ProviderName::$variant),+];
        }
    };
}

provider_names! {
    Aws,
    Azure,
    Gcp,
    Ibmcloud,
    IbmcloudPowervs,
    Libvirt,
    Alibabacloud,
    Byom,
}

impl ProviderName {
    /// The cloud's canonical form of an instance id, so that one instance has one identity in
    /// every comparison (decisions, reverse collection, de-duplication, the consistency window).
    /// Surrounding whitespace never belongs to an id. Where the cloud itself compares ids
    /// without regard to case, the canonical form is lower case:
    /// - Azure: an ARM resource id (`/subscriptions/…/virtualMachines/<name>`) is
    ///   case-insensitive, and ARM answers it in varying case.
    /// - libvirt and IBM Power Virtual Server: a UUID, which is a number however it is spelled.
    /// - AWS and Alibaba Cloud (`i-…`), GCP (an instance name, lower case by rule), IBM Cloud VPC
    ///   (`0717_…`) and byom (an IP address) are compared exactly as the cloud spells them.
    pub fn canonical_instance_id(self, instance_id: &str) -> String {
        let id = instance_id.trim();
        match self {
            ProviderName::Azure | ProviderName::Libvirt | ProviderName::IbmcloudPowervs => {
                id.to_ascii_lowercase()
            }
            ProviderName::Aws
            | ProviderName::Gcp
            | ProviderName::Ibmcloud
            | ProviderName::Alibabacloud
            | ProviderName::Byom => id.to_owned(),
        }
    }

    /// Whether the cloud's instances carry tags (labels), so that deletes can be restricted to this
    /// cluster's (`CLUSTER_TAG`) and a configuration leaving them unrestricted is refused. libvirt
    /// (metadata only peer-pods writes) and byom (a pool of fixed machines) have no owner.
    pub const fn has_tags(self) -> bool {
        match self {
            ProviderName::Aws
            | ProviderName::Azure
            | ProviderName::Gcp
            | ProviderName::Ibmcloud
            | ProviderName::IbmcloudPowervs
            | ProviderName::Alibabacloud => true,
            ProviderName::Libvirt | ProviderName::Byom => false,
        }
    }

    /// What cloud-api-adaptor's DaemonSet mounts for this cloud beyond what every cloud gets, as
    /// cloud-api-adaptor's chart renders it.
    pub const fn caa_wiring(self) -> CaaWiring {
        const NONE: CaaWiring = CaaWiring {
            ssh_keys: false,
            token: None,
        };
        match self {
            // CAA reaches the hypervisor (libvirt) or the pool's machines (byom) over SSH.
            ProviderName::Libvirt | ProviderName::Byom => CaaWiring {
                ssh_keys: true,
                token: None,
            },
            // Always, where the chart needs alibabacloud.rrsa.enable: a token only Alibaba's STS
            // accepts, and enabling RRSA then needs no change to the DaemonSet.
            ProviderName::Alibabacloud => CaaWiring {
                ssh_keys: false,
                token: Some(CaaToken {
                    volume: "rrsa-oidc-token",
                    audience: "sts.aliyuncs.com",
                    file: "token",
                    mount_path: "/var/run/secrets/ack.alibabacloud.com/rrsa-tokens",
                    read_only: true,
                    mode: Some(0o644),
                    after_host_paths: false,
                }),
            },
            // IBM Cloud's IAM trusted profile logs in with a projected token.
            ProviderName::Ibmcloud => CaaWiring {
                ssh_keys: false,
                token: Some(CaaToken {
                    volume: "vault-token",
                    audience: "iam",
                    file: "vault-token",
                    mount_path: "/var/run/secrets/tokens",
                    read_only: false,
                    mode: None,
                    after_host_paths: true,
                }),
            },
            ProviderName::Aws
            | ProviderName::Azure
            | ProviderName::Gcp
            | ProviderName::IbmcloudPowervs => NONE,
        }
    }

    /// The name as cloud-api-adaptor's chart spells it in its per-cloud file names
    /// (`providers/<name>.yaml`, and so in a ConfigMap written from them): the wire name without
    /// its hyphen.
    pub const fn chart_file_name(self) -> &'static str {
        match self {
            ProviderName::IbmcloudPowervs => "ibmcloudpowervs",
            ProviderName::Aws
            | ProviderName::Azure
            | ProviderName::Gcp
            | ProviderName::Ibmcloud
            | ProviderName::Libvirt
            | ProviderName::Alibabacloud
            | ProviderName::Byom => self.as_str(),
        }
    }

    /// Reads a cloud's name as cloud-api-adaptor's ConfigMap may hold it: the wire name, or the
    /// chart's file-name spelling ([`ProviderName::chart_file_name`]). Exact and case-sensitive.
    pub fn from_config_map(s: &str) -> Option<Self> {
        ProviderName::ALL
            .into_iter()
            .find(|p| p.as_str() == s || p.chart_file_name() == s)
    }

    /// The wire name, as cloud-api-adaptor spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            ProviderName::Aws => "aws",
            ProviderName::Azure => "azure",
            ProviderName::Gcp => "gcp",
            ProviderName::Ibmcloud => "ibmcloud",
            ProviderName::IbmcloudPowervs => "ibmcloud-powervs",
            ProviderName::Libvirt => "libvirt",
            ProviderName::Alibabacloud => "alibabacloud",
            ProviderName::Byom => "byom",
        }
    }
}

/// The per-cloud part of cloud-api-adaptor's DaemonSet ([`ProviderName::caa_wiring`]): plain data,
/// which peer-pod-config-ctrl renders into volumes and mounts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaaWiring {
    /// The Secret of SSH keys (`ssh-key-secret`) is mounted at `/root/.ssh/`.
    pub ssh_keys: bool,
    /// A ServiceAccount token projected for the cloud's own token service.
    pub token: Option<CaaToken>,
}

/// A projected ServiceAccount token cloud-api-adaptor hands to its cloud.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaaToken {
    /// The volume's (and the mount's) name.
    pub volume: &'static str,
    /// The audience the cloud's token service accepts.
    pub audience: &'static str,
    /// The token's file name inside the volume.
    pub file: &'static str,
    pub mount_path: &'static str,
    pub read_only: bool,
    /// The files' mode, when the chart sets one.
    pub mode: Option<i32>,
    /// Where the chart lists it: after the host paths every cloud gets, or before them.
    pub after_host_paths: bool,
}

impl Ord for ProviderName {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl PartialOrd for ProviderName {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl fmt::Display for ProviderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not one of cloud-api-adaptor's `CLOUD_PROVIDER` values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownProviderName(pub String);

impl fmt::Display for UnknownProviderName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unknown provider {:?}", self.0)
    }
}

impl std::error::Error for UnknownProviderName {}

impl FromStr for ProviderName {
    type Err = UnknownProviderName;

    /// Exact, case-sensitive match: cloud-api-adaptor compares names the same way.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ProviderName::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| UnknownProviderName(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_parses_back_to_itself() {
        for p in ProviderName::ALL {
            assert_eq!(p.as_str().parse::<ProviderName>(), Ok(p));
        }
        assert_eq!(ProviderName::ALL.len(), 8);
    }

    #[test]
    fn names_order_alphabetically() {
        let mut sorted = ProviderName::ALL;
        sorted.sort();
        let names: Vec<&str> = sorted.iter().map(|p| p.as_str()).collect();
        let mut expected = names.clone();
        expected.sort_unstable();
        assert_eq!(names, expected);
        assert_eq!(names[0], "alibabacloud");
    }

    #[test]
    fn ids_compare_as_their_cloud_compares_them() {
        let azure = "/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/virtualMachines/PodVM-a";
        assert_eq!(
            ProviderName::Azure.canonical_instance_id(azure),
            azure.to_ascii_lowercase()
        );
        let uuid = " 1B4E28BA-2FA1-11D2-883F-0016D3CCA427 ";
        for cloud in [ProviderName::Libvirt, ProviderName::IbmcloudPowervs] {
            assert_eq!(
                cloud.canonical_instance_id(uuid),
                "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
            );
        }
        for (cloud, id) in [
            (ProviderName::Aws, "i-0ABC"),
            (ProviderName::Alibabacloud, "i-Bp1X"),
            (ProviderName::Gcp, "PodVm-x"),
            (ProviderName::Ibmcloud, "0717_Ab"),
            (ProviderName::Byom, "fe80::A"),
        ] {
            assert_eq!(cloud.canonical_instance_id(&format!(" {id}\n")), id);
        }
    }

    #[test]
    fn a_config_map_may_spell_a_cloud_as_the_chart_names_its_file() {
        for p in ProviderName::ALL {
            assert_eq!(ProviderName::from_config_map(p.as_str()), Some(p));
            assert_eq!(ProviderName::from_config_map(p.chart_file_name()), Some(p));
            assert!(!p.chart_file_name().contains('-'), "{p}");
        }
        assert_eq!(
            ProviderName::from_config_map("ibmcloudpowervs"),
            Some(ProviderName::IbmcloudPowervs)
        );
        for other in ["", "IBMCloud", "ibmcloud_powervs", "aws "] {
            assert_eq!(ProviderName::from_config_map(other), None, "{other:?}");
        }
    }

    #[test]
    fn other_spellings_are_unknown() {
        for s in ["", "AWS", "ibmcloud_powervs", "azure ", "nimbus"] {
            assert_eq!(
                s.parse::<ProviderName>(),
                Err(UnknownProviderName(s.to_owned()))
            );
        }
    }
}
