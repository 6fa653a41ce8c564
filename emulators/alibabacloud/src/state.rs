//! What the emulated account holds: instances with their NICs, EIPs, account attributes, and
//! the test's knobs.

use std::collections::{BTreeMap, BTreeSet, HashSet, VecDeque};

use test_support::faults::FaultLayer;

/// `max-postpaid-instance-vcpu-count` until a test sets another value.
pub const DEFAULT_MAX_VCPUS: &str = "800";

pub struct Instance {
    pub name: String,
    pub status: String,
    pub created: String,
    pub tags: Vec<(String, String)>,
    pub vcpus: u64,
    pub memory_mib: u64,
    pub primary_nic: String,
    /// cloud-api-adaptor's add-on NIC (`DeleteOnRelease`), when it created one.
    pub addon_nic: Option<String>,
    pub eip: Option<String>,
    /// `Some(n)`: being released; listed `n` more times, then gone.
    pub releasing: Option<u32>,
}

pub struct Eip {
    pub ip: String,
    pub status: String,
    /// (resource id, resource type) it is bound to.
    pub bound_to: Option<(String, String)>,
    /// `DescribeEipAddresses` answers left before `Unassociating` becomes `Available`.
    pub settling: u32,
    /// `Description`: cloud-api-adaptor allocates its EIPs with [`CAA_EIP_DESCRIPTION`].
    pub description: String,
    /// Tags (`TagResources`), in the order they were added.
    pub tags: Vec<(String, String)>,
}

/// The description cloud-api-adaptor gives every EIP it allocates (`AllocateEipAddress`).
pub const CAA_EIP_DESCRIPTION: &str = "Peerpod External Network EIP";
/// The first two octets of the addresses of cloud-api-adaptor's EIPs, and of the operator's.
const CAA_EIP_RANGE: &str = "47.95";
const OPERATOR_EIP_RANGE: &str = "47.96";

/// The documented "try again later" answers of the ECS and VPC APIs (their error references),
/// each with its real status, `Code` and `Message`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EcsRefusal {
    /// 400 `Throttling`: "Request was denied due to request throttling."
    Throttling,
    /// 429 `Throttling.User` with `Retry-After`: "Request was denied due to user flow control."
    ThrottlingUser { retry_after_secs: u64 },
    /// 403 `IncorrectInstanceStatus`: "The current status of the resource does not support this
    /// operation."
    IncorrectInstanceStatus,
    /// 403 `OperationConflict`: "Request was denied due to conflict with a previous request,
    /// please try again later."
    OperationConflict,
    /// 403 `LastTokenProcessing`: "The last token request is processing."
    LastTokenProcessing,
}

impl EcsRefusal {
    /// Status, `Code`, `Message` and `Retry-After`.
    pub fn answer(self) -> (u16, &'static str, &'static str, Option<u64>) {
        match self {
            EcsRefusal::Throttling => (
                400,
                "Throttling",
                "Request was denied due to request throttling.",
                None,
            ),
            EcsRefusal::ThrottlingUser { retry_after_secs } => (
                429,
                "Throttling.User",
                "Request was denied due to user flow control.",
                Some(retry_after_secs),
            ),
            EcsRefusal::IncorrectInstanceStatus => (
                403,
                "IncorrectInstanceStatus",
                "The current status of the resource does not support this operation.",
                None,
            ),
            EcsRefusal::OperationConflict => (
                403,
                "OperationConflict",
                "Request was denied due to conflict with a previous request, please try again later.",
                None,
            ),
            EcsRefusal::LastTokenProcessing => (
                403,
                "LastTokenProcessing",
                "The last token request is processing.",
                None,
            ),
        }
    }
}

/// A temporary key STS issued (`AssumeRoleWithOIDC`): valid only with its token, until its
/// `Expiration`.
pub struct TemporaryKey {
    pub secret: String,
    pub security_token: String,
    /// The `Expiration` answered, to the second.
    pub expires: jiff::Timestamp,
}

pub struct State {
    pub instances: BTreeMap<String, Instance>,
    pub eips: BTreeMap<String, Eip>,
    pub nics: BTreeSet<String>,
    pub secret: String,
    pub throttle: (u32, u64),
    pub fail: (u32, u16),
    pub requests: Vec<String>,
    /// The decoded query parameters of each request, with its action, in order.
    pub params: Vec<(String, Vec<(String, String)>)>,
    /// Per action: the next that many requests of it fail with that status.
    pub fail_action: BTreeMap<String, (u32, u16)>,
    /// Bodies to answer verbatim, by action, each once and in order.
    pub verbatim: BTreeMap<String, VecDeque<String>>,
    /// Per action: the next that many requests of it are refused with that documented answer.
    pub refuse_action: BTreeMap<String, (u32, EcsRefusal)>,
    pub nonces: HashSet<String>,
    pub release_polls: u32,
    pub page_limit: usize,
    pub attributes: Vec<(String, String)>,
    /// The OIDC token STS accepts (what the test wrote into the token file).
    pub oidc_token: String,
    /// Temporary keys by id, as STS issued them.
    pub temporary: BTreeMap<String, TemporaryKey>,
    /// The order of issue of the temporary keys.
    pub issued: Vec<String>,
    /// How long a temporary key lasts, whatever `DurationSeconds` asks; `None`: as asked (3600
    /// by default).
    pub key_lifetime: Option<std::time::Duration>,
    /// The key id of each request authenticated, in order.
    pub signers: Vec<String>,
    /// Every NIC and EIP created with an instance, kept after the instance is gone.
    pub parts: BTreeMap<String, Vec<String>>,
    /// The fault layer in front of the API (see `test_support::faults`).
    pub faults: std::sync::Arc<FaultLayer>,
    counter: u64,
}

impl State {
    pub fn new(secret: &str) -> Self {
        State {
            instances: BTreeMap::new(),
            eips: BTreeMap::new(),
            nics: BTreeSet::new(),
            secret: secret.to_owned(),
            throttle: (0, 0),
            fail: (0, 500),
            fail_action: BTreeMap::new(),
            requests: Vec::new(),
            params: Vec::new(),
            verbatim: BTreeMap::new(),
            refuse_action: BTreeMap::new(),
            nonces: HashSet::new(),
            release_polls: 1,
            page_limit: 100,
            faults: std::sync::Arc::new(FaultLayer::from_env()),
            attributes: vec![(
                "max-postpaid-instance-vcpu-count".to_owned(),
                DEFAULT_MAX_VCPUS.to_owned(),
            )],
            parts: BTreeMap::new(),
            oidc_token: crate::account::OIDC_TOKEN.to_owned(),
            temporary: BTreeMap::new(),
            issued: Vec::new(),
            key_lifetime: None,
            signers: Vec::new(),
            counter: 0,
        }
    }

    /// Issues a temporary key lasting `lifetime` (to the second, as `Expiration` is written);
    /// returns its id.
    pub fn issue_temporary_key(&mut self, lifetime: std::time::Duration) -> String {
        let n = self.issued.len() + 1;
        let id = format!("STS.NUgYrLnoC37mZZCNnAbe{n:04}");
        let now = jiff::Timestamp::now();
        let expires = jiff::Timestamp::from_second(now.as_second())
            .unwrap_or(now)
            .checked_add(jiff::SignedDuration::from_secs(
                i64::try_from(lifetime.as_secs()).unwrap_or(i64::MAX / 2),
            ))
            .unwrap_or(now);
        self.temporary.insert(
            id.clone(),
            TemporaryKey {
                secret: format!("CVwjCkNzTMupZ8NbTCxCBRq3K16jtcWFTJAy{n:08}"),
                security_token: format!("CAIShwJ1q6Ft5B2yfSjIr5bSEsj4g7BihPWG{n:08}"),
                expires,
            },
        );
        self.issued.push(id.clone());
        id
    }

    /// Allocates one more EIP and binds it to the instance's add-on NIC (EIPs in multi-EIP
    /// mode on one secondary ENI); `None` without an add-on NIC.
    pub fn add_eip(&mut self, instance_id: &str) -> Option<String> {
        let nic = self.instances.get(instance_id)?.addon_nic.clone()?;
        let allocation = self.bind_new_eip(CAA_EIP_RANGE, nic, CAA_EIP_DESCRIPTION);
        self.parts
            .entry(instance_id.to_owned())
            .or_default()
            .push(allocation.clone());
        Some(allocation)
    }

    /// Allocates an EIP of the operator's (with `description`, not cloud-api-adaptor's) and binds
    /// it to the instance's add-on NIC; not one of the instance's parts. `None` without an
    /// add-on NIC.
    pub fn add_operator_eip(&mut self, instance_id: &str, description: &str) -> Option<String> {
        let nic = self.instances.get(instance_id)?.addon_nic.clone()?;
        Some(self.bind_new_eip(OPERATOR_EIP_RANGE, nic, description))
    }

    /// Allocates an EIP with an address in `range` (its first two octets) and binds it to `nic`.
    /// Returns its allocation id.
    fn bind_new_eip(&mut self, range: &str, nic: String, description: &str) -> String {
        let allocation = self.next_id("eip");
        let n = self.counter;
        self.eips.insert(
            allocation.clone(),
            Eip {
                ip: format!("{range}.{}.{}", (n / 256) % 256, n % 256),
                status: "InUse".into(),
                bound_to: Some((nic, "NetworkInterface".into())),
                settling: 0,
                description: description.to_owned(),
                tags: Vec::new(),
            },
        );
        allocation
    }

    /// An id in ECS's style: a region prefix and lowercase letters and digits.
    fn next_id(&mut self, prefix: &str) -> String {
        self.counter += 1;
        let mut n = self.counter.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut tail = String::new();
        for _ in 0..13 {
            let digit = u32::try_from(n % 36).unwrap_or(0);
            tail.push(char::from_digit(digit, 36).unwrap_or('0'));
            n /= 36;
        }
        format!("{prefix}-2ze{tail}{:04}", self.counter % 10_000)
    }

    pub fn create_instance(
        &mut self,
        name: &str,
        tags: &[(&str, &str)],
        with_eip: bool,
        vcpus: u64,
        memory_mib: u64,
    ) -> String {
        let id = self.next_id("i");
        // The fault layer's creation time: an hour ago, or now while a knob makes new instances
        // lag, or the knobs' `created_age` ago.
        let created = creation_time(self.faults.created(&id));
        let primary_nic = self.next_id("eni");
        self.nics.insert(primary_nic.clone());
        let (addon_nic, eip) = if with_eip {
            let nic = self.next_id("eni");
            self.nics.insert(nic.clone());
            let allocation = self.bind_new_eip(CAA_EIP_RANGE, nic.clone(), CAA_EIP_DESCRIPTION);
            (Some(nic), Some(allocation))
        } else {
            (None, None)
        };
        let mut parts = vec![primary_nic.clone()];
        parts.extend(addon_nic.iter().cloned());
        parts.extend(eip.iter().cloned());
        self.parts.insert(id.clone(), parts);
        self.instances.insert(
            id.clone(),
            Instance {
                name: name.to_owned(),
                status: "Running".into(),
                created,
                tags: tags
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                vcpus,
                memory_mib,
                primary_nic,
                addon_nic,
                eip,
                releasing: None,
            },
        );
        id
    }

    pub fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        self.instances.contains_key(instance_id)
            || self.parts.get(instance_id).is_some_and(|parts| {
                parts
                    .iter()
                    .any(|p| self.nics.contains(p) || self.eips.contains_key(p))
            })
    }

    /// The instance is released: it and its NICs (the add-on NIC has `DeleteOnRelease`) are
    /// gone. An EIP still bound to a NIC is left allocated and unbound, as a leak to detect.
    pub fn remove_instance(&mut self, instance_id: &str) {
        let Some(instance) = self.instances.remove(instance_id) else {
            return;
        };
        for nic in std::iter::once(instance.primary_nic).chain(instance.addon_nic) {
            self.nics.remove(&nic);
            for eip in self.eips.values_mut() {
                if eip.bound_to.as_ref().is_some_and(|(id, _)| *id == nic) {
                    eip.bound_to = None;
                    eip.status = "Available".into();
                }
            }
        }
    }
}

/// An instance's `CreationTime` as ECS writes it: UTC to the minute (`2017-12-10T04:04Z`), the
/// seconds cut off, so an instance may be up to a minute younger than it reads.
pub(crate) fn creation_time(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%MZ").to_string()
}
