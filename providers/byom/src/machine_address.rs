//! The address of a pool machine: what cloud-api-adaptor stores as the instance id of a byom
//! PeerPod (`PeerPod.spec.instanceID`) and in its pool ConfigMap. CAA parses it with Go's
//! `netip.ParseAddr` and writes `Addr.String()`; this type accepts the same texts (IPv4 in dotted
//! decimal without leading zeros, IPv6 with an optional `%zone`) and prints the same canonical form.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MachineAddress {
    ip: IpAddr,
    zone: Option<String>,
}

impl MachineAddress {
    pub fn is_ipv4(&self) -> bool {
        self.ip.is_ipv4()
    }

    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// The next address of the same family, `None` after the last one (Go's `Addr.Next`).
    pub fn successor(&self) -> Option<MachineAddress> {
        let ip = match self.ip {
            IpAddr::V4(v4) => IpAddr::from(u32::from(v4).checked_add(1)?.to_be_bytes()),
            IpAddr::V6(v6) => IpAddr::from(u128::from(v6).checked_add(1)?.to_be_bytes()),
        };
        Some(MachineAddress {
            ip,
            zone: self.zone.clone(),
        })
    }
}

impl FromStr for MachineAddress {
    type Err = &'static str;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if text.is_empty() {
            return Err("it is empty");
        }
        let (address, zone) = match text.split_once('%') {
            Some((address, zone)) => (address, Some(zone)),
            None => (text, None),
        };
        // Rust's parser, like Go's netip, rejects IPv4 fields with leading zeros.
        let ip: IpAddr = address
            .parse()
            .map_err(|_| "it is neither an IPv4 nor an IPv6 address")?;
        let zone = match zone {
            None => None,
            Some(_) if ip.is_ipv4() => return Err("an IPv4 address cannot carry a zone"),
            Some("") => return Err("the zone after '%' is empty"),
            Some(zone) => Some(zone.to_owned()),
        };
        Ok(MachineAddress { ip, zone })
    }
}

impl fmt::Display for MachineAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.zone {
            Some(zone) => write!(f, "{}%{zone}", self.ip),
            None => write!(f, "{}", self.ip),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canonical(text: &str) -> String {
        text.parse::<MachineAddress>().unwrap().to_string()
    }

    #[test]
    fn prints_what_go_netip_prints() {
        assert_eq!(canonical("192.168.122.10"), "192.168.122.10");
        assert_eq!(canonical("FD00:0:0::0:1"), "fd00::1");
        assert_eq!(canonical("2001:db8:0:0:1:0:0:1"), "2001:db8::1:0:0:1");
        assert_eq!(canonical("::ffff:10.0.0.1"), "::ffff:10.0.0.1");
        assert_eq!(canonical("fe80::1%eth0"), "fe80::1%eth0");
    }

    #[test]
    fn rejects_what_go_netip_rejects() {
        for text in [
            "",
            "10.0.0",
            "10.0.0.256",
            "010.0.0.1",
            "10.0.0.1%eth0",
            "fe80::1%",
            "10.0.0.1/24",
            " 10.0.0.1",
            "i-0123456789abcdef0",
            "vm-1",
        ] {
            assert!(text.parse::<MachineAddress>().is_err(), "{text:?}");
        }
    }

    #[test]
    fn successor_counts_up_and_stops_at_the_end() {
        let next = |t: &str| {
            t.parse::<MachineAddress>()
                .unwrap()
                .successor()
                .map(|a| a.to_string())
        };
        assert_eq!(next("10.0.0.255").as_deref(), Some("10.0.1.0"));
        assert_eq!(next("fd00::ffff").as_deref(), Some("fd00::1:0"));
        assert_eq!(next("255.255.255.255"), None);
        assert_eq!(next("ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff"), None);
    }
}
