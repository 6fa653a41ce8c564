//! Configuration: the keys cloud-api-adaptor's byom provider reads from `peer-pods-cm`, parsed the
//! same way, so both see the same pool and the same ConfigMap.

use std::collections::BTreeSet;

use peerpods_provider_core::ProviderConfig;
use peerpods_provider_core::config::{SettingsRefusal, typed};

use crate::machine_address::MachineAddress;

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "byom";

/// CAA's default name of the pool state ConfigMap (`POOL_CONFIGMAP_NAME`).
pub const DEFAULT_CONFIGMAP_NAME: &str = "byom-ip-pool-state";
/// CAA's fallback namespace when neither `POOL_NAMESPACE` nor the pod's namespace is known.
pub const DEFAULT_NAMESPACE: &str = "confidential-containers-system";
/// CAA's default cap on the addresses one `start-end` range of `VM_POOL_IPS` expands to.
pub const DEFAULT_MAX_RANGE_IPS: usize = 100;

/// Where the pool lives and which machines belong to it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ByomSettings {
    /// The machines of the pool (`VM_POOL_IPS`, ranges expanded, duplicates removed), in
    /// configuration order.
    pub pool: Vec<MachineAddress>,
    /// Namespace of the pool state ConfigMap.
    pub namespace: String,
    /// Name of the pool state ConfigMap.
    pub configmap_name: String,
}

/// A key whose value cannot be used, and why (never a credential's value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigProblem {
    pub key: &'static str,
    pub reason: String,
}

impl SettingsRefusal for ConfigProblem {
    fn refused(key: &'static str, reason: String) -> Self {
        problem(key, reason)
    }
}

fn problem(key: &'static str, reason: impl Into<String>) -> ConfigProblem {
    ConfigProblem {
        key,
        reason: reason.into(),
    }
}

impl ByomSettings {
    /// Reads the settings from `config` (unset or empty keys are `None`; numbers through its typed getters).
    /// `pod_namespace` is the namespace of the running pod, when known: CAA's default for
    /// `POOL_NAMESPACE` (it reads the ServiceAccount namespace file, then `POD_NAMESPACE`).
    pub fn from_config(
        config: &ProviderConfig,
        pod_namespace: Option<String>,
    ) -> Result<Self, ConfigProblem> {
        let lookup = |key: &str| config.get(key).map(str::to_owned);
        let max_range = typed("MAX_RANGE_IPS", config.positive("MAX_RANGE_IPS"))?
            .unwrap_or(DEFAULT_MAX_RANGE_IPS);
        let pool_ips = lookup("VM_POOL_IPS").ok_or_else(|| {
            problem(
                "VM_POOL_IPS",
                "is required: the addresses of the pool's machines",
            )
        })?;
        let pool =
            parse_pool(&pool_ips, max_range).map_err(|reason| problem("VM_POOL_IPS", reason))?;
        if pool.is_empty() {
            return Err(problem("VM_POOL_IPS", "lists no address"));
        }
        let namespace = lookup("POOL_NAMESPACE")
            .or(pod_namespace)
            .or_else(|| lookup("POD_NAMESPACE"))
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        if !is_dns_label(&namespace) {
            return Err(problem(
                "POOL_NAMESPACE",
                "is not a namespace name (a DNS label: at most 63 of a-z, 0-9 and '-')",
            ));
        }
        let configmap_name =
            lookup("POOL_CONFIGMAP_NAME").unwrap_or_else(|| DEFAULT_CONFIGMAP_NAME.to_owned());
        if !is_dns_subdomain(&configmap_name) {
            return Err(problem(
                "POOL_CONFIGMAP_NAME",
                "is not a ConfigMap name (a DNS subdomain: at most 253 of a-z, 0-9, '-' and '.')",
            ));
        }
        Ok(Self {
            pool,
            namespace,
            configmap_name,
        })
    }

    /// Whether `address` is one of the pool's machines.
    pub fn owns(&self, address: &MachineAddress) -> bool {
        self.pool.contains(address)
    }
}

/// `VM_POOL_IPS` as CAA reads it: comma-separated addresses and `start-end` ranges (start below
/// end, at most `max_range` addresses each, the rest ignored), blanks skipped, duplicates removed
/// keeping the first. Messages name the entry's position, not its text.
pub fn parse_pool(value: &str, max_range: usize) -> Result<Vec<MachineAddress>, String> {
    let mut all = Vec::new();
    for (position, entry) in value.split(',').map(str::trim).enumerate() {
        let position = position + 1;
        if entry.is_empty() {
            continue;
        }
        if let Some((start, end)) = entry.split_once('-') {
            let (Ok(start), Ok(end)) = (start.parse::<MachineAddress>(), end.parse()) else {
                return Err(format!("entry {position} is not a valid address range"));
            };
            all.extend(expand_range(start, end, max_range).map_err(|reason| {
                format!("entry {position} is not a valid address range: {reason}")
            })?);
        } else {
            let address = entry
                .parse::<MachineAddress>()
                .map_err(|reason| format!("entry {position} is not an IP address: {reason}"))?;
            all.push(address);
        }
    }
    let mut seen = BTreeSet::new();
    all.retain(|address| seen.insert(address.clone()));
    Ok(all)
}

fn expand_range(
    start: MachineAddress,
    end: MachineAddress,
    max_range: usize,
) -> Result<Vec<MachineAddress>, &'static str> {
    if start.zone().is_some() || end.zone().is_some() {
        return Err("ranges cannot carry zones");
    }
    if start.is_ipv4() != end.is_ipv4() {
        return Err("start and end are of different address families");
    }
    if start >= end {
        return Err("the start must be below the end");
    }
    let mut out = Vec::new();
    let mut next = Some(start);
    while let Some(address) = next {
        if out.len() == max_range {
            break;
        }
        let reached_end = address == end;
        next = address.successor();
        out.push(address);
        if reached_end {
            break;
        }
    }
    Ok(out)
}

fn is_dns_label(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-')
}

fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(
        pairs: &[(&str, &str)],
        pod_ns: Option<&str>,
    ) -> Result<ByomSettings, ConfigProblem> {
        ByomSettings::from_config(
            &ProviderConfig::from_pairs(pairs.iter().copied()),
            pod_ns.map(str::to_owned),
        )
    }

    fn texts(pool: &[MachineAddress]) -> Vec<String> {
        pool.iter().map(ToString::to_string).collect()
    }

    #[test]
    fn defaults_follow_cloud_api_adaptor() {
        let s = settings(&[("VM_POOL_IPS", "10.0.0.1")], None).unwrap();
        assert_eq!(s.namespace, DEFAULT_NAMESPACE);
        assert_eq!(s.configmap_name, DEFAULT_CONFIGMAP_NAME);
        let s = settings(&[("VM_POOL_IPS", "10.0.0.1")], Some("peer-pods")).unwrap();
        assert_eq!(s.namespace, "peer-pods");
        let s = settings(
            &[("VM_POOL_IPS", "10.0.0.1"), ("POD_NAMESPACE", "from-env")],
            None,
        )
        .unwrap();
        assert_eq!(s.namespace, "from-env");
        let s = settings(
            &[
                ("VM_POOL_IPS", "10.0.0.1"),
                ("POOL_NAMESPACE", "pools"),
                ("POOL_CONFIGMAP_NAME", "my-pool"),
            ],
            Some("peer-pods"),
        )
        .unwrap();
        assert_eq!(
            (s.namespace.as_str(), s.configmap_name.as_str()),
            ("pools", "my-pool")
        );
    }

    #[test]
    fn pool_expands_ranges_skips_blanks_and_removes_duplicates() {
        let pool = parse_pool(" 10.0.0.1, ,10.0.0.3-10.0.0.5,10.0.0.4, fd00::1 ", 100).unwrap();
        assert_eq!(
            texts(&pool),
            ["10.0.0.1", "10.0.0.3", "10.0.0.4", "10.0.0.5", "fd00::1"]
        );
    }

    #[test]
    fn ranges_stop_at_the_cap_and_at_the_end_of_the_address_space() {
        let pool = parse_pool("10.0.0.250-10.0.1.10", 3).unwrap();
        assert_eq!(texts(&pool), ["10.0.0.250", "10.0.0.251", "10.0.0.252"]);
        let pool = parse_pool("10.0.0.255-10.0.1.1", 100).unwrap();
        assert_eq!(texts(&pool), ["10.0.0.255", "10.0.1.0", "10.0.1.1"]);
        let pool = parse_pool("255.255.255.254-255.255.255.255", 100).unwrap();
        assert_eq!(texts(&pool), ["255.255.255.254", "255.255.255.255"]);
    }

    #[test]
    fn bad_pools_name_the_key_and_the_entry_but_not_the_value() {
        for (value, expected) in [
            ("10.0.0.1,not-an-ip", "entry 2"),
            ("10.0.0.5-10.0.0.1", "start must be below the end"),
            ("10.0.0.1-10.0.0.1", "start must be below the end"),
            ("10.0.0.1-fd00::1", "different address families"),
            ("010.0.0.1", "entry 1"),
        ] {
            let e = settings(&[("VM_POOL_IPS", value)], None).unwrap_err();
            assert_eq!(e.key, "VM_POOL_IPS", "{value}");
            assert!(e.reason.contains(expected), "{value}: {}", e.reason);
            assert!(!e.reason.contains(value), "{value}: {}", e.reason);
        }
        assert_eq!(settings(&[], None).unwrap_err().key, "VM_POOL_IPS");
        assert_eq!(
            settings(&[("VM_POOL_IPS", " , ")], None).unwrap_err().key,
            "VM_POOL_IPS"
        );
    }

    #[test]
    fn bad_names_and_limits_name_their_key() {
        let base = ("VM_POOL_IPS", "10.0.0.1");
        let e = settings(&[base, ("POOL_NAMESPACE", "Not_A_Namespace")], None).unwrap_err();
        assert_eq!(e.key, "POOL_NAMESPACE");
        let e = settings(&[base, ("POOL_CONFIGMAP_NAME", "a/b")], None).unwrap_err();
        assert_eq!(e.key, "POOL_CONFIGMAP_NAME");
        let e = settings(&[base, ("MAX_RANGE_IPS", "0")], None).unwrap_err();
        assert_eq!(e.key, "MAX_RANGE_IPS");
        assert_eq!(
            e.reason,
            r#"expected a whole number greater than zero, got "0""#
        );
        let s = settings(
            &[("VM_POOL_IPS", "10.0.0.1-10.0.0.9"), ("MAX_RANGE_IPS", "2")],
            None,
        )
        .unwrap();
        assert_eq!(texts(&s.pool), ["10.0.0.1", "10.0.0.2"]);
    }

    #[test]
    fn ownership_compares_addresses_not_spellings() {
        let s = settings(&[("VM_POOL_IPS", "fd00::1,10.0.0.1")], None).unwrap();
        assert!(s.owns(&"fd00:0::1".parse().unwrap()));
        assert!(s.owns(&"10.0.0.1".parse().unwrap()));
        assert!(!s.owns(&"10.0.0.2".parse().unwrap()));
    }
}
