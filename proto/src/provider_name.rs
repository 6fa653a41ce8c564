//! The values of `cloud_provider`: cloud-api-adaptor's `CLOUD_PROVIDER` names, in one place for
//! provider-service, the controllers' metrics and the PeerPodConfig CRD.

use std::fmt;
use std::str::FromStr;

/// A cloud cloud-api-adaptor can run peer-pod VMs on. Ordered by name (as ListProviders lists them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize, serde::Deserialize),
    serde(rename_all = "kebab-case")
)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
pub enum ProviderName {
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
    /// Every name, in the order cloud-api-adaptor's documentation lists them.
    pub const ALL: [ProviderName; 8] = [
        ProviderName::Aws,
        ProviderName::Azure,
        ProviderName::Gcp,
        ProviderName::Ibmcloud,
        ProviderName::IbmcloudPowervs,
        ProviderName::Libvirt,
        ProviderName::Alibabacloud,
        ProviderName::Byom,
    ];

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
    fn other_spellings_are_unknown() {
        for s in ["", "AWS", "ibmcloud_powervs", "azure ", "nimbus"] {
            assert_eq!(
                s.parse::<ProviderName>(),
                Err(UnknownProviderName(s.to_owned()))
            );
        }
    }
}
