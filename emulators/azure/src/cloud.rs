//! The emulated cloud: a resource group of VMs with their network interfaces, public IP
//! addresses and managed disks, Microsoft Entra ID's token endpoint, and ARM's answers to exactly
//! the calls the Azure backend makes. Bodies are built from the fixtures (see the README).

use std::collections::{BTreeMap, HashMap, HashSet};

use serde_json::{Value, json};
use test_support::faults::{CallKind, FaultLayer};

pub const SUBSCRIPTION_ID: &str = "6a1e3b9c-2f4d-4e8a-9b1c-0d2e3f4a5b6c";
pub const RESOURCE_GROUP: &str = "peerpods-rg";
pub const REGION: &str = "eastus";
pub const TENANT_ID: &str = "3f0c2a8e-5b7d-4c1a-9e6f-8d2b4a6c0e1f";
pub const CLIENT_ID: &str = "0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0";
pub const CLIENT_SECRET: &str = "emulator-client-secret~Q7w.x9Zr";
/// The Kubernetes service account token a workload-identity test writes to its token file.
pub const FEDERATED_TOKEN: &str = "eyJhbGciOiJSUzI1NiJ9.emulator-service-account-token.c2ln";
/// The VM size cloud-api-adaptor uses by default, with its vCPU count.
const VM_SIZE: &str = "Standard_DC2as_v5";
const VCPUS_PER_VM: u64 = 2;

const COMPUTE_API: &str = "2024-07-01";

const VM_FIXTURE: &str = include_str!("../fixtures/virtual-machine.json");
const NIC_FIXTURE: &str = include_str!("../fixtures/network-interface.json");
const USAGE_FIXTURE: &str = include_str!("../fixtures/usage.json");
const DATA_DISK_FIXTURE: &str = include_str!("../fixtures/data-disk.json");
const PUBLIC_IP_FIXTURE: &str = include_str!("../fixtures/public-ip-address.json");
const DISK_FIXTURE: &str = include_str!("../fixtures/disk.json");
const OPERATION_FIXTURE: &str = include_str!("../fixtures/operation-status.json");
const ERROR_FIXTURE: &str = include_str!("../fixtures/arm-error.json");
const TOKEN_FIXTURE: &str = include_str!("../fixtures/token.json");
const TOKEN_ERROR_FIXTURE: &str = include_str!("../fixtures/token-error.json");

/// How a VM is created.
#[derive(Clone, Copy, Debug)]
pub struct VmOptions {
    /// A public IP address on its network interface (cloud-api-adaptor's `USE_PUBLIC_IP`).
    pub public_ip: bool,
    /// Its parts carry `deleteOption: Delete` (as cloud-api-adaptor creates them), so ARM deletes
    /// them with the VM; with `false` (`Detach`) they stay unless deleted explicitly.
    pub parts_deleted_with_vm: bool,
}

impl Default for VmOptions {
    fn default() -> Self {
        VmOptions {
            public_ip: false,
            parts_deleted_with_vm: true,
        }
    }
}

/// The names of a VM's parts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmParts {
    pub network_interface: String,
    pub disk: String,
    pub public_ip: Option<String>,
}

#[derive(Clone, Debug)]
struct VmRecord {
    name: String,
    tags: Vec<(String, String)>,
    created: String,
    parts: VmParts,
    delete_option: &'static str,
    /// Managed disks attached as data disks: name and `deleteOption`.
    data_disks: Vec<(String, String)>,
    /// While ARM deletes the VM: how many more looks (operation polls or `GET`s of the VM) it
    /// stays in `Deleting`.
    deletion: Option<u32>,
}

#[derive(Clone, Debug)]
struct NicRecord {
    name: String,
    public_ip: Option<String>,
    /// Key of the VM using it.
    vm: Option<String>,
    /// After its VM's deletion: the VM's name, and how many more deletions ARM refuses with
    /// `NicReservedForAnotherVm`.
    reserved: Option<(String, u32)>,
}

#[derive(Clone, Debug)]
struct PublicIpRecord {
    name: String,
    delete_option: &'static str,
}

#[derive(Debug)]
struct OperationRecord {
    /// Key of the VM whose deletion this is.
    vm: String,
}

/// Behaviour the tests arrange.
#[derive(Debug)]
pub struct Knobs {
    pub throttle_next: u32,
    pub throttle_retry_after: u64,
    pub fail_next: u32,
    pub fail_status: u16,
    pub reject_credentials: bool,
    pub polls_before_done: u32,
    pub poll_retry_after: u64,
    pub page_size: usize,
    pub vm_limit: u64,
    pub core_limit: u64,
    /// Deletions of an interface ARM refuses after its VM is gone (`NicReservedForAnotherVm`).
    pub nic_reservation: u32,
    /// The next requests of `refuse_method` answered with this refusal, and how many.
    pub refuse_next: u32,
    pub refuse_method: &'static str,
    pub refusal: Option<ArmRefusal>,
}

/// ARM's documented "busy" and throttling answers, each with its real status, code, message
/// and headers (ARM's "Throttling Resource Manager requests" and Compute's "Troubleshooting API
/// throttling errors"; the conflict codes of Compute and Network).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArmRefusal {
    /// 429 `SubscriptionRequestsThrottled` (ARM's own subscription limit) with `Retry-After`.
    SubscriptionThrottled { retry_after_secs: u64 },
    /// 429 `OperationNotAllowed` with a `TooManyRequests` detail (Compute's throttling) and
    /// `Retry-After`.
    ComputeThrottled { retry_after_secs: u64 },
    /// 409 `Conflict`: another operation is in progress on the resource.
    Conflict,
    /// 409 `AnotherOperationInProgress` (Network).
    AnotherOperationInProgress,
    /// 409 `OperationPreempted` (Compute: a more recent operation took over).
    OperationPreempted,
    /// 409 `OperationNotAllowed`: the VM is marked for deletion.
    MarkedForDeletion,
    /// 500 `RetryableError` (Compute).
    RetryableError,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            throttle_next: 0,
            throttle_retry_after: 0,
            fail_next: 0,
            fail_status: 500,
            reject_credentials: false,
            polls_before_done: 1,
            poll_retry_after: 0,
            page_size: 50,
            vm_limit: 25,
            core_limit: 20,
            nic_reservation: 0,
            refuse_next: 0,
            refuse_method: "DELETE",
            refusal: None,
        }
    }
}

/// An HTTP answer of the emulated cloud.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: Vec<(&'static str, String)>,
    pub body: Option<Value>,
}

impl Reply {
    fn json(status: u16, body: Value) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: Some(body),
        }
    }

    fn empty(status: u16) -> Self {
        Reply {
            status,
            headers: Vec::new(),
            body: None,
        }
    }

    /// ARM's throttling answer: 429 `TooManyRequests` with `Retry-After`.
    pub fn throttled(retry_after_secs: u64) -> Self {
        let mut reply = Reply::arm_error(
            429,
            "TooManyRequests",
            "The request is being throttled as the limit has been reached for operation type - Read_ObservationWindow_00:03:00.",
        );
        reply
            .headers
            .push(("retry-after", retry_after_secs.to_string()));
        reply
    }

    /// The answer of `refusal`.
    pub fn refusal(refusal: ArmRefusal) -> Self {
        let with_wait = |mut reply: Reply, secs: u64| {
            reply.headers.push(("retry-after", secs.to_string()));
            reply
        };
        match refusal {
            ArmRefusal::SubscriptionThrottled { retry_after_secs } => with_wait(
                Reply::arm_error(
                    429,
                    "SubscriptionRequestsThrottled",
                    &format!(
                        "Number of 'delete' requests for subscription '{SUBSCRIPTION_ID}' actor '{CLIENT_ID}' exceeded. Please try again after '{retry_after_secs}' seconds after the first request. The throttling window is set to '3600' seconds."
                    ),
                ),
                retry_after_secs,
            ),
            ArmRefusal::ComputeThrottled { retry_after_secs } => {
                let mut reply = Reply::arm_error(
                    429,
                    "OperationNotAllowed",
                    "The server rejected the request because too many requests have been received for this subscription.",
                );
                if let Some(body) = reply.body.as_mut() {
                    body["error"]["details"] = json!([{
                        "code": "TooManyRequests",
                        "target": "DeleteVMSubscriptionMaximum",
                        "message": "{\"operationGroup\":\"DeleteVMSubscriptionMaximum\",\"startTime\":\"2026-01-01T00:00:00+00:00\",\"endTime\":\"2026-01-01T00:30:00+00:00\",\"allowedRequestCount\":1500,\"measuredRequestCount\":1502}"
                    }]);
                }
                with_wait(reply, retry_after_secs)
            }
            ArmRefusal::Conflict => Reply::arm_error(
                409,
                "Conflict",
                "The operation cannot be performed because another operation is in progress on the resource. Retry after that operation completes.",
            ),
            ArmRefusal::AnotherOperationInProgress => Reply::arm_error(
                409,
                "AnotherOperationInProgress",
                "Another operation on this or dependent resource is in progress. To retrieve status of the operation use uri: https://management.azure.com/subscriptions/00000000-0000-0000-0000-000000000000/providers/Microsoft.Network/locations/eastus/operations/00000000-0000-0000-0000-000000000001?api-version=2024-05-01.",
            ),
            ArmRefusal::OperationPreempted => Reply::arm_error(
                409,
                "OperationPreempted",
                "Operation execution has been preempted by a more recent operation.",
            ),
            ArmRefusal::MarkedForDeletion => Reply::arm_error(
                409,
                "OperationNotAllowed",
                "Operation 'delete' is not allowed on VM since the VM is marked for deletion. You can only retry the Delete operation (or wait for an ongoing one to complete).",
            ),
            ArmRefusal::RetryableError => {
                Reply::arm_error(500, "RetryableError", "A retryable error occurred.")
            }
        }
    }

    /// ARM's answer to a request its backend failed (`status`: a 5xx).
    pub fn server_error(status: u16) -> Self {
        Reply::arm_error(
            status,
            "InternalServerError",
            "Encountered internal server error. Diagnostic information: timestamp '20260101T000000Z', subscription id '', tracking id '', request correlation id ''.",
        )
    }

    /// ARM's 404 for a VM (also one created moments ago that ARM does not show yet).
    pub fn vm_not_found(name: &str) -> Self {
        Reply::arm_error(
            404,
            "ResourceNotFound",
            &format!(
                "The Resource 'Microsoft.Compute/virtualMachines/{name}' under resource group '{RESOURCE_GROUP}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
            ),
        )
    }

    fn arm_error(status: u16, code: &str, message: &str) -> Self {
        let mut body: Value = fixture(ERROR_FIXTURE);
        body["error"]["code"] = json!(code);
        body["error"]["message"] = json!(message);
        Reply::json(status, body)
    }
}

fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

/// One request as the emulator saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub method: String,
    pub path: String,
}

/// The whole emulated cloud.
#[derive(Debug, Default)]
pub struct Cloud {
    pub base: String,
    vms: BTreeMap<String, VmRecord>,
    nics: BTreeMap<String, NicRecord>,
    public_ips: BTreeMap<String, PublicIpRecord>,
    disks: BTreeMap<String, String>,
    /// Tags of each network interface, public IP address and disk, by [`part_key`]: a VM's parts
    /// get the tags it is created with, a disk made by [`Cloud::create_disk`] its own.
    part_tags: HashMap<String, Vec<(String, String)>>,
    /// Parts each VM was created with, kept after deletion for `vm_or_parts_exist`.
    created: HashMap<String, VmParts>,
    operations: HashMap<String, OperationRecord>,
    tokens: HashSet<String>,
    serial: u64,
    pub knobs: Knobs,
    pub arm_requests: Vec<Seen>,
    pub token_requests: u64,
}

/// A VM's `timeCreated` as ARM writes it: UTC, seven fractional digits, `+00:00`
/// (`2021-06-27T01:02:38.3138469+00:00`).
fn time_created(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.7f+00:00").to_string()
}

fn key(name: &str) -> String {
    name.to_ascii_lowercase()
}

/// The key of part `name` of ARM's `collection` (`networkInterfaces`, `publicIPAddresses`,
/// `disks`) in [`Cloud::part_tags`].
fn part_key(collection: &str, name: &str) -> String {
    format!("{collection}/{}", key(name))
}

impl Cloud {
    pub fn new(base: String) -> Self {
        Cloud {
            base,
            ..Cloud::default()
        }
    }

    fn rg_path(&self) -> String {
        format!("/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{RESOURCE_GROUP}/providers")
    }

    pub fn vm_id(&self, name: &str) -> String {
        format!(
            "{}/Microsoft.Compute/virtualMachines/{name}",
            self.rg_path()
        )
    }

    fn nic_id(&self, name: &str) -> String {
        format!(
            "{}/Microsoft.Network/networkInterfaces/{name}",
            self.rg_path()
        )
    }

    fn public_ip_id(&self, name: &str) -> String {
        format!(
            "{}/Microsoft.Network/publicIPAddresses/{name}",
            self.rg_path()
        )
    }

    fn disk_id(&self, name: &str) -> String {
        format!("{}/Microsoft.Compute/disks/{name}", self.rg_path())
    }

    /// Creates a VM as cloud-api-adaptor does: network interface `<name>-net`, OS disk
    /// `<name>-disk`, optionally a public IP address named like the interface (the name of
    /// cloud-api-adaptor's public IP address configuration). `created` is its `timeCreated`.
    pub fn create_vm(
        &mut self,
        name: &str,
        tags: &[(&str, &str)],
        options: VmOptions,
        created: jiff::Timestamp,
    ) -> String {
        let parts = VmParts {
            network_interface: format!("{name}-net"),
            disk: format!("{name}-disk"),
            public_ip: options.public_ip.then(|| format!("{name}-net")),
        };
        let delete_option = if options.parts_deleted_with_vm {
            "Delete"
        } else {
            "Detach"
        };
        let created = time_created(created);
        if let Some(ip) = &parts.public_ip {
            self.public_ips.insert(
                key(ip),
                PublicIpRecord {
                    name: ip.clone(),
                    delete_option,
                },
            );
        }
        self.nics.insert(
            key(&parts.network_interface),
            NicRecord {
                name: parts.network_interface.clone(),
                public_ip: parts.public_ip.clone(),
                vm: Some(key(name)),
                reserved: None,
            },
        );
        self.disks.insert(key(&parts.disk), parts.disk.clone());
        let tags: Vec<(String, String)> = tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        for (collection, part) in [
            ("networkInterfaces", Some(&parts.network_interface)),
            ("disks", Some(&parts.disk)),
            ("publicIPAddresses", parts.public_ip.as_ref()),
        ] {
            if let Some(part) = part {
                self.part_tags
                    .insert(part_key(collection, part), tags.clone());
            }
        }
        self.created.insert(key(name), parts.clone());
        self.vms.insert(
            key(name),
            VmRecord {
                name: name.to_owned(),
                tags: tags
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
                created,
                parts,
                delete_option,
                data_disks: Vec::new(),
                deletion: None,
            },
        );
        self.vm_id(name)
    }

    /// Attaches managed disk `disk` (created if absent) to VM `vm` as a data disk with
    /// `delete_option` (`Detach` as the Azure Disk CSI driver attaches a persistent volume).
    pub fn attach_data_disk(&mut self, vm: &str, disk: &str, delete_option: &str) -> bool {
        let Some(record) = self.vms.get_mut(&key(vm)) else {
            return false;
        };
        record
            .data_disks
            .push((disk.to_owned(), delete_option.to_owned()));
        self.disks.insert(key(disk), disk.to_owned());
        true
    }

    /// Creates managed disk `name`, attached to nothing, with `tags`.
    pub fn create_disk(&mut self, name: &str, tags: &[(&str, &str)]) {
        self.disks.insert(key(name), name.to_owned());
        self.part_tags.insert(
            part_key("disks", name),
            tags.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        );
    }

    /// The tags of part `name` of `collection`, as ARM's `tags` object.
    fn tags_of(&self, collection: &str, name: &str) -> Value {
        Value::Object(
            self.part_tags
                .get(&part_key(collection, name))
                .into_iter()
                .flatten()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect(),
        )
    }

    /// Marks a VM as being deleted by someone else (provisioningState `Deleting`); the deletion
    /// takes as many looks as an operation takes polls.
    pub fn start_deleting(&mut self, name: &str) -> bool {
        let polls = self.knobs.polls_before_done;
        match self.vms.get_mut(&key(name)) {
            Some(vm) => {
                vm.deletion.get_or_insert(polls);
                true
            }
            None => false,
        }
    }

    /// One look at a VM being deleted: ARM's deletion advances; `true` once it is gone.
    fn observe_deletion(&mut self, vm_key: &str) -> bool {
        let Some(vm) = self.vms.get_mut(vm_key) else {
            return true;
        };
        match vm.deletion {
            None => false,
            Some(0) => {
                self.finish_vm_deletion(vm_key);
                true
            }
            Some(left) => {
                vm.deletion = Some(left - 1);
                false
            }
        }
    }

    pub fn vm_exists(&self, name: &str) -> bool {
        self.vms.contains_key(&key(name))
    }

    pub fn network_interface_exists(&self, name: &str) -> bool {
        self.nics.contains_key(&key(name))
    }

    pub fn public_ip_exists(&self, name: &str) -> bool {
        self.public_ips.contains_key(&key(name))
    }

    pub fn disk_exists(&self, name: &str) -> bool {
        self.disks.contains_key(&key(name))
    }

    pub fn parts_of(&self, name: &str) -> Option<VmParts> {
        self.created.get(&key(name)).cloned()
    }

    pub fn vm_or_parts_exist(&self, name: &str) -> bool {
        self.vm_exists(name)
            || self.parts_of(name).is_some_and(|parts| {
                self.network_interface_exists(&parts.network_interface)
                    || self.disk_exists(&parts.disk)
                    || parts.public_ip.is_some_and(|ip| self.public_ip_exists(&ip))
            })
    }

    /// Answers one request. `query` is the raw query string, `authorization` the header;
    /// `faults` says which calls do not see a new VM yet.
    pub fn handle(
        &mut self,
        method: &str,
        path: &str,
        query: &str,
        authorization: Option<&str>,
        body: &[u8],
        faults: &FaultLayer,
    ) -> Reply {
        let segments: Vec<String> = path
            .trim_start_matches('/')
            .split('/')
            .map(str::to_ascii_lowercase)
            .collect();
        let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
        if let [tenant, "oauth2", "v2.0", "token"] = segments.as_slice() {
            self.token_requests += 1;
            return if method == "POST" {
                self.token(tenant, body)
            } else {
                Reply::empty(405)
            };
        }
        self.arm_requests.push(Seen {
            method: method.to_owned(),
            path: path.to_owned(),
        });
        if self.knobs.throttle_next > 0 {
            self.knobs.throttle_next -= 1;
            return Reply::throttled(self.knobs.throttle_retry_after);
        }
        if self.knobs.fail_next > 0 {
            self.knobs.fail_next -= 1;
            return Reply::server_error(self.knobs.fail_status);
        }
        if let (n @ 1.., Some(refusal)) = (self.knobs.refuse_next, self.knobs.refusal)
            && method.eq_ignore_ascii_case(self.knobs.refuse_method)
        {
            self.knobs.refuse_next = n - 1;
            return Reply::refusal(refusal);
        }
        let token = authorization.and_then(|a| a.strip_prefix("Bearer "));
        if !token.is_some_and(|t| self.tokens.contains(t)) {
            return Reply::arm_error(
                401,
                "InvalidAuthenticationToken",
                "The access token is invalid.",
            );
        }
        if !query.split('&').any(|p| p.starts_with("api-version=")) {
            return Reply::arm_error(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            );
        }
        self.arm(method, &segments, query, faults)
    }

    fn token(&mut self, tenant: &str, body: &[u8]) -> Reply {
        let form = form_fields(body);
        let field = |name: &str| form.get(name).map(String::as_str);
        let credentials_ok = tenant == TENANT_ID
            && field("client_id") == Some(CLIENT_ID)
            && (field("client_secret") == Some(CLIENT_SECRET)
                || field("client_assertion") == Some(FEDERATED_TOKEN))
            && !self.knobs.reject_credentials;
        if !credentials_ok {
            return Reply::json(401, fixture(TOKEN_ERROR_FIXTURE));
        }
        if !field("scope").is_some_and(|s| s.ends_with("/.default")) {
            let mut body = fixture(TOKEN_ERROR_FIXTURE);
            body["error"] = json!("invalid_scope");
            body["error_description"] = json!(
                "AADSTS70011: The provided value for the input parameter 'scope' is not valid."
            );
            body["error_codes"] = json!([70011]);
            return Reply::json(400, body);
        }
        self.serial += 1;
        let mut body = fixture(TOKEN_FIXTURE);
        let token = format!("emulator-access-token-{}", self.serial);
        body["access_token"] = json!(token);
        self.tokens.insert(token);
        Reply::json(200, body)
    }

    fn arm(&mut self, method: &str, segments: &[&str], query: &str, faults: &FaultLayer) -> Reply {
        let sub = SUBSCRIPTION_ID.to_ascii_lowercase();
        let rg = RESOURCE_GROUP.to_ascii_lowercase();
        match segments {
            ["subscriptions", s, ..] if *s != sub => Reply::arm_error(
                404,
                "SubscriptionNotFound",
                &format!("The subscription '{s}' could not be found."),
            ),
            ["subscriptions", _, "resourcegroups", g, ..] if *g != rg => Reply::arm_error(
                404,
                "ResourceGroupNotFound",
                &format!("Resource group '{g}' could not be found."),
            ),
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachines",
            ] if method == "GET" => self.list_vms(query, faults),
            // A VM created moments ago may be unknown to a lookup or a deletion, each on its own
            // (the fault layer's visibility and flapping).
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachines",
                name,
            ] if (method == "GET" && faults.hides(name, CallKind::Get))
                || (method == "DELETE" && faults.hides(name, CallKind::Delete)) =>
            {
                Reply::vm_not_found(name)
            }
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "virtualmachines",
                name,
            ] => match method {
                "GET" => self.get_vm(name),
                "DELETE" => self.delete_vm(name),
                _ => Reply::empty(405),
            },
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "networkinterfaces",
                name,
            ] => match method {
                "GET" => self.get_nic(name),
                "DELETE" => self.delete_nic(name),
                _ => Reply::empty(405),
            },
            // A VM's parts: looked up and deleted (other verbs are not served, as before).
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.network",
                "publicipaddresses",
                name,
            ] if method == "GET" || method == "DELETE" => {
                if method == "GET" {
                    self.get_public_ip(name)
                } else {
                    self.delete_public_ip(name)
                }
            }
            [
                "subscriptions",
                _,
                "resourcegroups",
                _,
                "providers",
                "microsoft.compute",
                "disks",
                name,
            ] if method == "GET" || method == "DELETE" => {
                if method == "GET" {
                    self.get_disk(name)
                } else {
                    self.delete_disk(name)
                }
            }
            [
                "subscriptions",
                _,
                "providers",
                "microsoft.compute",
                "locations",
                _,
                "usages",
            ] if method == "GET" => self.usages(),
            [
                "subscriptions",
                _,
                "providers",
                "microsoft.compute",
                "locations",
                _,
                "operations",
                id,
            ] if method == "GET" => self.poll(id, query.split('&').any(|p| p == "monitor=true")),
            _ => Reply::arm_error(
                404,
                "InvalidResourceType",
                "The resource type could not be found in the namespace for api version.",
            ),
        }
    }

    fn vm_body(&self, vm: &VmRecord) -> Value {
        let mut body = fixture(VM_FIXTURE);
        body["name"] = json!(vm.name);
        body["id"] = json!(self.vm_id(&vm.name));
        body["location"] = json!(REGION);
        body["tags"] = Value::Object(vm.tags.iter().map(|(k, v)| (k.clone(), json!(v))).collect());
        let properties = &mut body["properties"];
        properties["hardwareProfile"]["vmSize"] = json!(VM_SIZE);
        properties["osProfile"]["computerName"] = json!(vm.name);
        let os_disk = &mut properties["storageProfile"]["osDisk"];
        os_disk["osType"] = json!("Linux");
        os_disk["name"] = json!(vm.parts.disk);
        os_disk["managedDisk"]["id"] = json!(self.disk_id(&vm.parts.disk));
        os_disk["deleteOption"] = json!(vm.delete_option);
        let data_disks: Vec<Value> = vm
            .data_disks
            .iter()
            .enumerate()
            .map(|(lun, (disk, delete_option))| {
                let mut entry = fixture(DATA_DISK_FIXTURE);
                entry["lun"] = json!(lun);
                entry["name"] = json!(disk);
                entry["managedDisk"]["id"] = json!(self.disk_id(disk));
                entry["deleteOption"] = json!(delete_option);
                entry
            })
            .collect();
        properties["storageProfile"]["dataDisks"] = json!(data_disks);
        properties["networkProfile"]["networkInterfaces"] = json!([{
            "id": self.nic_id(&vm.parts.network_interface),
            "properties": {"primary": true, "deleteOption": vm.delete_option}
        }]);
        properties["provisioningState"] = json!(if vm.deletion.is_some() {
            "Deleting"
        } else {
            "Succeeded"
        });
        properties["timeCreated"] = json!(vm.created);
        body
    }

    fn not_found(&self, kind: &str, name: &str) -> Reply {
        Reply::arm_error(
            404,
            "ResourceNotFound",
            &format!(
                "The Resource '{kind}/{name}' under resource group '{RESOURCE_GROUP}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
            ),
        )
    }

    fn get_vm(&mut self, name: &str) -> Reply {
        if self.observe_deletion(&key(name)) {
            return self.not_found("Microsoft.Compute/virtualMachines", name);
        }
        match self.vms.get(&key(name)) {
            Some(vm) => Reply::json(200, self.vm_body(vm)),
            None => self.not_found("Microsoft.Compute/virtualMachines", name),
        }
    }

    fn list_vms(&self, query: &str, faults: &FaultLayer) -> Reply {
        let skip: usize = query
            .split('&')
            .find_map(|p| {
                p.strip_prefix("$skiptoken=")
                    .or_else(|| p.strip_prefix("%24skiptoken="))
            })
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let size = self.knobs.page_size.max(1);
        // A VM created moments ago may be missing from the list (the fault layer's visibility).
        let listed: Vec<&VmRecord> = self
            .vms
            .values()
            .filter(|vm| !faults.hides(&key(&vm.name), CallKind::List))
            .collect();
        let page: Vec<Value> = listed
            .iter()
            .skip(skip)
            .take(size)
            .map(|vm| self.vm_body(vm))
            .collect();
        let mut body = json!({ "value": page });
        if skip + size < listed.len() {
            body["nextLink"] = json!(format!(
                "{}/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines?api-version={COMPUTE_API}&%24skiptoken={}",
                self.base,
                skip + size
            ));
        }
        Reply::json(200, body)
    }

    fn delete_vm(&mut self, name: &str) -> Reply {
        let polls = self.knobs.polls_before_done;
        let Some(vm) = self.vms.get_mut(&key(name)) else {
            // ARM answers the deletion of an absent resource with 204.
            return Reply::empty(204);
        };
        // Asked again while deleting, ARM accepts again; the deletion does not restart.
        vm.deletion.get_or_insert(polls);
        self.serial += 1;
        let id = format!("3b1f7c6e-0000-4000-8000-{:012x}", self.serial);
        self.operations
            .insert(id.clone(), OperationRecord { vm: key(name) });
        let operation = format!(
            "{}/subscriptions/{SUBSCRIPTION_ID}/providers/Microsoft.Compute/locations/{REGION}/operations/{id}",
            self.base
        );
        let mut reply = Reply::empty(202);
        reply.headers.push((
            "azure-asyncoperation",
            format!("{operation}?p=emulator&api-version={COMPUTE_API}"),
        ));
        reply.headers.push((
            "location",
            format!("{operation}?p=emulator&monitor=true&api-version={COMPUTE_API}"),
        ));
        reply
            .headers
            .push(("retry-after", self.knobs.poll_retry_after.to_string()));
        reply
    }

    fn poll(&mut self, id: &str, monitor: bool) -> Reply {
        let Some(operation) = self.operations.get(id) else {
            return Reply::arm_error(
                404,
                "NotFound",
                &format!("The operation '{id}' could not be found."),
            );
        };
        let vm = operation.vm.clone();
        let mut body = fixture(OPERATION_FIXTURE);
        body["name"] = json!(id);
        if !self.observe_deletion(&vm) {
            if monitor {
                let mut reply = Reply::empty(202);
                reply
                    .headers
                    .push(("retry-after", self.knobs.poll_retry_after.to_string()));
                return reply;
            }
            body["status"] = json!("InProgress");
            let mut reply = Reply::json(200, body);
            reply
                .headers
                .push(("retry-after", self.knobs.poll_retry_after.to_string()));
            return reply;
        }
        if monitor {
            return Reply::empty(200);
        }
        body["status"] = json!("Succeeded");
        body["endTime"] = body["startTime"].clone();
        Reply::json(200, body)
    }

    /// The end of a VM's deletion: parts marked `Delete` go with it, others are detached.
    fn finish_vm_deletion(&mut self, vm_key: &str) {
        let Some(vm) = self.vms.remove(vm_key) else {
            return;
        };
        let nic = key(&vm.parts.network_interface);
        if vm.delete_option == "Delete" {
            if let Some(record) = self.nics.remove(&nic)
                && let Some(ip) = record.public_ip
                && self
                    .public_ips
                    .get(&key(&ip))
                    .is_some_and(|ip| ip.delete_option == "Delete")
            {
                self.public_ips.remove(&key(&ip));
            }
            self.disks.remove(&key(&vm.parts.disk));
        } else if let Some(record) = self.nics.get_mut(&nic) {
            record.vm = None;
            if self.knobs.nic_reservation > 0 {
                record.reserved = Some((vm.name.clone(), self.knobs.nic_reservation));
            }
        }
        for (disk, delete_option) in &vm.data_disks {
            if delete_option.eq_ignore_ascii_case("Delete") {
                self.disks.remove(&key(disk));
            }
        }
    }

    fn get_public_ip(&self, name: &str) -> Reply {
        let Some(ip) = self.public_ips.get(&key(name)) else {
            return self.not_found("Microsoft.Network/publicIPAddresses", name);
        };
        let mut body = fixture(PUBLIC_IP_FIXTURE);
        body["name"] = json!(ip.name);
        body["id"] = json!(self.public_ip_id(&ip.name));
        body["location"] = json!(REGION);
        body["tags"] = self.tags_of("publicIPAddresses", name);
        body["properties"]["deleteOption"] = json!(ip.delete_option);
        let holder = self
            .nics
            .values()
            .find(|nic| nic.public_ip.as_deref().map(key) == Some(key(name)));
        match holder {
            Some(nic) => {
                body["properties"]["ipConfiguration"] = json!({
                    "id": format!("{}/ipConfigurations/ipconfig1", self.nic_id(&nic.name))
                });
            }
            None => {
                if let Some(properties) = body["properties"].as_object_mut() {
                    properties.remove("ipConfiguration");
                }
            }
        }
        Reply::json(200, body)
    }

    /// The VM a disk is attached to (as OS or data disk), if any.
    fn disk_holder(&self, name: &str) -> Option<&VmRecord> {
        self.vms.values().find(|vm| {
            key(&vm.parts.disk) == key(name)
                || vm.data_disks.iter().any(|(d, _)| key(d) == key(name))
        })
    }

    fn get_disk(&self, name: &str) -> Reply {
        let Some(disk) = self.disks.get(&key(name)) else {
            return self.not_found("Microsoft.Compute/disks", name);
        };
        let mut body = fixture(DISK_FIXTURE);
        body["name"] = json!(disk);
        body["id"] = json!(self.disk_id(disk));
        body["location"] = json!(REGION);
        body["tags"] = self.tags_of("disks", name);
        match self.disk_holder(name) {
            Some(vm) => {
                body["managedBy"] = json!(self.vm_id(&vm.name));
                body["properties"]["diskState"] = json!("Attached");
            }
            None => {
                if let Some(object) = body.as_object_mut() {
                    object.remove("managedBy");
                }
                body["properties"]["diskState"] = json!("Unattached");
            }
        }
        Reply::json(200, body)
    }

    fn get_nic(&self, name: &str) -> Reply {
        let Some(nic) = self.nics.get(&key(name)) else {
            return self.not_found("Microsoft.Network/networkInterfaces", name);
        };
        let mut body = fixture(NIC_FIXTURE);
        body["name"] = json!(nic.name);
        body["id"] = json!(self.nic_id(&nic.name));
        body["location"] = json!(REGION);
        body["tags"] = self.tags_of("networkInterfaces", name);
        let config = &mut body["properties"]["ipConfigurations"][0];
        config["id"] = json!(format!(
            "{}/ipConfigurations/ipconfig1",
            self.nic_id(&nic.name)
        ));
        match &nic.public_ip {
            Some(ip) => {
                config["properties"]["publicIPAddress"] = json!({"id": self.public_ip_id(ip)});
            }
            None => {
                if let Some(properties) = config["properties"].as_object_mut() {
                    properties.remove("publicIPAddress");
                }
            }
        }
        match nic.vm.as_ref().and_then(|vm| self.vms.get(vm)) {
            Some(vm) => body["properties"]["virtualMachine"] = json!({"id": self.vm_id(&vm.name)}),
            None => {
                if let Some(properties) = body["properties"].as_object_mut() {
                    properties.remove("virtualMachine");
                }
            }
        }
        Reply::json(200, body)
    }

    fn delete_nic(&mut self, name: &str) -> Reply {
        let Some(nic) = self.nics.get(&key(name)) else {
            return Reply::empty(204);
        };
        if let Some(vm) = nic.vm.as_ref().and_then(|vm| self.vms.get(vm)) {
            return Reply::arm_error(
                400,
                "NicInUse",
                &format!(
                    "Network Interface {} is used by existing resource {}. In order to delete the network interface, it must be dissociated from the resource. To learn more, see aka.ms/deletenic.",
                    self.nic_id(&nic.name),
                    self.vm_id(&vm.name)
                ),
            );
        }
        if let Some(nic) = self.nics.get_mut(&key(name))
            && let Some((vm, left)) = nic.reserved.as_mut()
            && *left > 0
        {
            *left -= 1;
            let vm = vm.clone();
            return Reply::arm_error(
                400,
                "NicReservedForAnotherVm",
                &format!(
                    "Nic(s) in request is reserved for another Virtual Machine for 180 seconds. Please provide another nic(s) or retry after 180 seconds. Reserved VM: {}",
                    self.vm_id(&vm)
                ),
            );
        }
        self.nics.remove(&key(name));
        Reply::empty(200)
    }

    fn delete_public_ip(&mut self, name: &str) -> Reply {
        if !self.public_ips.contains_key(&key(name)) {
            return Reply::empty(204);
        }
        if let Some(nic) = self
            .nics
            .values()
            .find(|nic| nic.public_ip.as_deref().map(key) == Some(key(name)))
        {
            return Reply::arm_error(
                400,
                "PublicIPAddressInUse",
                &format!(
                    "Public IP address {} can not be deleted since it is still allocated to resource {}/ipConfigurations/ipconfig1.",
                    self.public_ip_id(name),
                    self.nic_id(&nic.name)
                ),
            );
        }
        self.public_ips.remove(&key(name));
        Reply::empty(200)
    }

    fn delete_disk(&mut self, name: &str) -> Reply {
        if !self.disks.contains_key(&key(name)) {
            return Reply::empty(204);
        }
        if let Some(vm) = self.disk_holder(name) {
            return Reply::arm_error(
                409,
                "OperationNotAllowed",
                &format!("Disk {name} is attached to VM {}.", self.vm_id(&vm.name)),
            );
        }
        self.disks.remove(&key(name));
        Reply::empty(200)
    }

    fn usages(&self) -> Reply {
        let count = self.vms.len() as u64;
        let usage = |value: &str, localized: &str, current: u64, limit: u64| {
            let mut usage = fixture(USAGE_FIXTURE);
            usage["currentValue"] = json!(current);
            usage["limit"] = json!(limit);
            usage["name"]["value"] = json!(value);
            usage["name"]["localizedValue"] = json!(localized);
            usage
        };
        Reply::json(
            200,
            json!({ "value": [
                usage("availabilitySets", "Availability Sets", 0, 2500),
                usage("cores", "Total Regional vCPUs", count * VCPUS_PER_VM, self.knobs.core_limit),
                usage("virtualMachines", "Virtual Machines", count, self.knobs.vm_limit),
            ]}),
        )
    }
}

/// Fields of an `application/x-www-form-urlencoded` body.
fn form_fields(body: &[u8]) -> HashMap<String, String> {
    form_urlencoded::parse(body).into_owned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn form_bodies_are_decoded() {
        let fields = form_fields(b"client_id=a%2Fb&scope=https%3A%2F%2Fx%2F.default&x=a+b");
        assert_eq!(fields.get("client_id").map(String::as_str), Some("a/b"));
        assert_eq!(
            fields.get("scope").map(String::as_str),
            Some("https://x/.default")
        );
        assert_eq!(fields.get("x").map(String::as_str), Some("a b"));
    }

    #[test]
    fn fixtures_parse() {
        for text in [
            VM_FIXTURE,
            NIC_FIXTURE,
            DATA_DISK_FIXTURE,
            PUBLIC_IP_FIXTURE,
            DISK_FIXTURE,
            USAGE_FIXTURE,
            OPERATION_FIXTURE,
            ERROR_FIXTURE,
            TOKEN_FIXTURE,
            TOKEN_ERROR_FIXTURE,
        ] {
            assert!(serde_json::from_str::<Value>(text).is_ok());
        }
    }

    #[test]
    fn time_created_is_written_as_arm_writes_it() {
        let at: jiff::Timestamp = "2021-06-27T01:02:38.3138469Z".parse().expect("time");
        assert_eq!(time_created(at), "2021-06-27T01:02:38.3138469+00:00");
        let fixture: Value = serde_json::from_str(VM_FIXTURE).expect("fixture");
        assert_eq!(
            fixture["properties"]["timeCreated"].as_str(),
            Some(time_created(at).as_str())
        );
    }

    #[test]
    fn parts_marked_delete_go_with_the_vm_and_detached_ones_stay() {
        let mut cloud = Cloud::new("https://127.0.0.1:1".into());
        cloud.create_vm(
            "a",
            &[],
            VmOptions {
                public_ip: true,
                parts_deleted_with_vm: true,
            },
            jiff::Timestamp::now(),
        );
        cloud.create_vm(
            "b",
            &[],
            VmOptions {
                public_ip: true,
                parts_deleted_with_vm: false,
            },
            jiff::Timestamp::now(),
        );
        cloud.finish_vm_deletion("a");
        cloud.finish_vm_deletion("b");
        assert!(!cloud.vm_or_parts_exist("a"));
        assert!(cloud.vm_or_parts_exist("b"));
        assert!(!cloud.vm_exists("b"));
        assert!(cloud.network_interface_exists("b-net"));
        assert!(cloud.public_ip_exists("b-net"));
        assert!(cloud.disk_exists("b-disk"));
    }
}
