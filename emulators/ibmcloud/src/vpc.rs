//! The IBM Cloud VPC emulator: IAM's token endpoint, the VPC API endpoints the backend calls
//! (instances, their network interfaces' floating IPs, floating IPs), Global Tagging and Global
//! Search (`POST /v3/resources/search`, see [`crate::search`]).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use test_support::faults::{CallKind, FaultLayer};

use crate::common::{ACCOUNT_ID, answer, fixture, lock, no_content, uuid_like};
use crate::front_door::{
    Account, Cloud, Emulator, ErrorBodies, Instance, Lookup, Request, created_at, error_bodies,
};
use crate::search;

/// The VPC error schema's bodies (`errors[]` of `code`, `message`, `more_info`, ...).
const ERRORS: ErrorBodies = error_bodies!("vpc");
const NOT_FOUND: &str = include_str!("../fixtures/vpc_error_not_found.json");
const INSTANCE: &str = include_str!("../fixtures/vpc_instance.json");
const INSTANCE_COLLECTION: &str = include_str!("../fixtures/vpc_instance_collection.json");

/// The zone every emulated instance lives in.
pub const ZONE: &str = "us-south-1";

pub struct VpcInstance {
    name: String,
    crn: String,
    created_at: String,
    network_interface: String,
    boot_volume: String,
    vcpus: u64,
    memory_gib: u64,
    /// When it was created (Global Search shows it only `search_lag` later).
    created: Instant,
}

const FLOATING_IP: &str = include_str!("../fixtures/vpc_floating_ip.json");

struct FloatingIp {
    name: String,
    address: String,
    /// The network interface it is bound to, and that interface's instance.
    target: Option<(String, String)>,
}

impl Instance for VpcInstance {
    /// vCPUs and GiB, as in the profile's name (`bx2-2x8`).
    type Amount = u64;
    const DEFAULT_SIZE: (u64, u64) = (2, 8);

    fn id_of(seq: u64) -> String {
        format!("0717_{}", uuid_like(seq, 0xe21b_7391))
    }

    /// A primary network interface and a boot volume deleted with the instance.
    fn new(
        seq: u64,
        name: &str,
        (vcpus, memory_gib): (u64, u64),
        created: String,
    ) -> (String, Self, Vec<String>) {
        let id = Self::id_of(seq);
        let network_interface = format!("0717-{}", uuid_like(seq, 0xd54e_b633));
        let boot_volume = format!("r006-{}", uuid_like(seq, 0x1a6b_7274));
        let parts = vec![network_interface.clone(), boot_volume.clone()];
        let instance = VpcInstance {
            name: name.to_owned(),
            crn: format!("crn:v1:bluemix:public:is:{ZONE}:a/{ACCOUNT_ID}::instance:{id}"),
            created_at: created,
            network_interface,
            boot_volume,
            vcpus,
            memory_gib,
            created: Instant::now(),
        };
        (id, instance, parts)
    }

    fn crn(&self) -> &str {
        &self.crn
    }
}

/// What the VPC emulator holds beyond the instances (whose parts are network interfaces and a
/// boot volume): floating IPs and Global Search's view.
#[derive(Default)]
pub struct Vpc {
    base_url: String,
    floating_ips: BTreeMap<String, FloatingIp>,
    /// Instances of other regions: the regional VPC API never shows them, Global Search (which
    /// is global) does.
    other_regions: Vec<search::Document>,
    /// How long after its creation an instance stays missing from Global Search.
    search_lag: Duration,
    cursors: search::Cursors,
}

/// A running VPC emulator on 127.0.0.1.
pub type VpcEmulator = Emulator<Vpc>;

impl VpcEmulator {
    /// Starts the emulator on a free port.
    pub fn start() -> std::io::Result<Self> {
        let emulator = Emulator::serve(Vpc {
            search_lag: search::lag_from_env(),
            ..Vpc::default()
        })?;
        lock(&emulator.state).cloud.base_url = emulator.url();
        Ok(emulator)
    }

    /// IAM lets `profile_id` be assumed with the compute-resource token `cr_token`.
    pub fn trust_profile(&self, profile_id: &str, cr_token: &str) {
        lock(&self.state).knobs.trusted_profile =
            Some((profile_id.to_owned(), cr_token.to_owned()));
    }

    /// Global Search's eventual consistency: an instance created less than `lag` ago is missing
    /// from search results (default 0, or `PEERPODS_EMULATOR_SEARCH_LAG_SECS`).
    pub fn set_search_lag(&self, lag: Duration) {
        lock(&self.state).cloud.search_lag = lag;
    }

    /// An instance of another region's VPC (`zone`, e.g. `eu-de-1`) with `tags`: only Global
    /// Search sees it (at once, whatever the knobs; its `creation_date` follows the fault
    /// layer's rule, [`FaultLayer::creation_time`]). Returns its id.
    pub fn create_vm_in_zone(&self, name: &str, tags: &[(&str, &str)], zone: &str) -> String {
        let created = created_at(self.faults.creation_time());
        let mut state = lock(&self.state);
        let id = format!("07k7_{}", uuid_like(state.next_seq(), 0x9c41_02de));
        let crn = format!("crn:v1:bluemix:public:is:{zone}:a/{ACCOUNT_ID}::instance:{id}");
        let document = search::Document {
            crn,
            name: name.to_owned(),
            family: "is".into(),
            kind: "instance".into(),
            region: search::region_of_zone(zone),
            tags: tags.iter().map(|(k, v)| format!("{k}:{v}")).collect(),
            creation_date: Some(created),
        };
        state.cloud.other_regions.push(document);
        id
    }

    /// Creates an instance as [`CloudEmulator::create_vm`] does, with this profile.
    pub fn create_vm_with_profile(
        &self,
        name: &str,
        tags: &[(&str, &str)],
        vcpus: u64,
        memory_gib: u64,
    ) -> String {
        self.create_vm_sized(name, tags, vcpus, memory_gib)
    }

    /// Reserves a floating IP and binds it to the instance's primary network interface, as an
    /// operator does for public access (cloud-api-adaptor creates no floating IP). It is the
    /// operator's, not the instance's: deleting the instance only unbinds it. Returns its id.
    pub fn attach_floating_ip(&self, instance_id: &str) -> Option<String> {
        let mut state = lock(&self.state);
        let nic = state.instances.get(instance_id)?.network_interface.clone();
        let seq = state.next_seq();
        let id = format!("0717-{}", uuid_like(seq, 0x2ab0_a6e5));
        state.cloud.floating_ips.insert(
            id.clone(),
            FloatingIp {
                name: format!("fip-{seq}"),
                address: format!("192.0.2.{}", seq % 250 + 1),
                target: Some((nic, instance_id.to_owned())),
            },
        );
        Some(id)
    }

    /// Whether the floating IP is still reserved.
    pub fn floating_ip_exists(&self, id: &str) -> bool {
        lock(&self.state).cloud.floating_ips.contains_key(id)
    }

    /// The instance a floating IP is bound to, `None` when unbound (or not reserved).
    pub fn floating_ip_bound_to(&self, id: &str) -> Option<String> {
        lock(&self.state)
            .cloud
            .floating_ips
            .get(id)?
            .target
            .as_ref()
            .map(|(_, instance)| instance.clone())
    }

    /// The instance's status (`running`, `deleting`), `None` once gone.
    pub fn instance_status(&self, id: &str) -> Option<String> {
        let state = lock(&self.state);
        state
            .instances
            .contains_key(id)
            .then(|| status(state.is_deleting(id)).to_owned())
    }
}

/// An instance's `status`: `running`, or `deleting` once its deletion was accepted.
fn status(deleting: bool) -> &'static str {
    if deleting { "deleting" } else { "running" }
}

fn not_found(target: &str, message: &str) -> Response {
    let mut body = fixture(NOT_FOUND);
    body["errors"][0]["message"] = json!(message);
    body["errors"][0]["target"]["value"] = json!(target);
    answer(StatusCode::NOT_FOUND, &body)
}

fn bad_request(message: &str) -> Response {
    let mut body = fixture(NOT_FOUND);
    body["errors"][0]["code"] = json!("bad_request");
    body["errors"][0]["message"] = json!(message);
    body["status_code"] = json!(400);
    answer(StatusCode::BAD_REQUEST, &body)
}

impl Cloud for Vpc {
    const PROVIDER: &'static str = "ibmcloud";
    const ERRORS: ErrorBodies = ERRORS;
    type Instance = VpcInstance;

    fn endpoints(url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("IBMCLOUD_IAM_ENDPOINT", format!("{url}/identity/token")),
            ("IBMCLOUD_VPC_ENDPOINT", format!("{url}/v1")),
            ("IBMCLOUD_TAGGING_ENDPOINT", url.to_owned()),
            ("IBMCLOUD_SEARCH_ENDPOINT", url.to_owned()),
            ("IBMCLOUD_ZONE", ZONE.to_owned()),
        ]
    }

    /// `GET /v1/instances/0717_x` → `GET /v1/instances/{id}`.
    fn route_name(method: &Method, path: &[&str]) -> String {
        let generic: Vec<&str> = path
            .iter()
            .enumerate()
            .map(|(i, part)| match (i, path.first()) {
                (2, Some(&"v1")) => "{id}",
                (4, Some(&"v1")) => "{nic}",
                _ => part,
            })
            .collect();
        format!("{method} /{}", generic.join("/"))
    }

    /// Every VPC API request names a `version` date the API accepts and `generation=2`.
    fn refusal(request: &Request<'_>) -> Option<Response> {
        if request.path.first() == Some(&"v3") {
            return None;
        }
        let version_ok = request
            .query
            .get("version")
            .is_some_and(|v| version_accepted(v, jiff::Timestamp::now()));
        let generation_ok = request.query.get("generation").map(String::as_str) == Some("2");
        (!version_ok || !generation_ok).then(|| {
            bad_request(
                "The version query parameter must be a date (YYYY-MM-DD) between 2022-09-13 and today, and generation must be 2",
            )
        })
    }

    /// Floating IPs bound to the instance's interfaces are only unbound (they stay reserved),
    /// as the VPC API documents.
    fn instance_removed(&mut self, instance_id: &str) {
        for ip in self.floating_ips.values_mut() {
            if ip
                .target
                .as_ref()
                .is_some_and(|(_, owner)| owner == instance_id)
            {
                ip.target = None;
            }
        }
    }

    /// Global Search's indexing lag makes a new instance lag (in search results).
    fn lags_new_instances(&self) -> bool {
        !self.search_lag.is_zero()
    }

    fn serve(account: &mut Account<Vpc>, request: &Request<'_>, faults: &FaultLayer) -> Response {
        let (method, path, query) = (request.method, request.path, request.query);
        match (method, path) {
            (&Method::POST, ["v3", "resources", "search"]) => {
                search_resources(account, query, request.body, faults)
            }
            (&Method::GET, ["v1", "instances"]) => list_instances(account, query, faults),
            // An instance created moments ago may be unknown to a lookup or a deletion, each on
            // its own (the fault layer's visibility and flapping).
            (&Method::GET, ["v1", "instances", id]) if faults.hides(id, CallKind::Get) => {
                not_found(id, "Instance not found")
            }
            (&Method::DELETE, ["v1", "instances", id]) if faults.hides(id, CallKind::Delete) => {
                not_found(id, "Instance not found")
            }
            (&Method::GET, ["v1", "instances", id]) => get_instance(account, id),
            (&Method::DELETE, ["v1", "instances", id]) => {
                if account.accept_delete(id, false) {
                    no_content()
                } else {
                    not_found(id, "Instance not found")
                }
            }
            (
                &Method::GET,
                [
                    "v1",
                    "instances",
                    id,
                    "network_interfaces",
                    nic,
                    "floating_ips",
                ],
            ) => floating_ips_of(account, id, nic),
            (&Method::DELETE, ["v1", "floating_ips", id]) => {
                if account.cloud.floating_ips.remove(*id).is_some() {
                    no_content()
                } else {
                    not_found(id, "Floating IP not found")
                }
            }
            _ => not_found(request.uri.path(), "route not found"),
        }
    }
}

/// Whether the VPC API takes `version`: a real date, not before the oldest date of the API
/// behaviour the reference documents (2022-09-13) and not after today (UTC).
fn version_accepted(version: &str, now: jiff::Timestamp) -> bool {
    let Ok(date) = version.parse::<jiff::civil::Date>() else {
        return false;
    };
    let today = now.to_zoned(jiff::tz::TimeZone::UTC).date();
    version.len() == 10 && date >= jiff::civil::date(2022, 9, 13) && date <= today
}

fn instance_json(base: &str, id: &str, i: &VpcInstance, deleting: bool) -> Value {
    let mut v = fixture(INSTANCE);
    let nic_href = format!(
        "{base}/v1/instances/{id}/network_interfaces/{}",
        i.network_interface
    );
    v["id"] = json!(id);
    v["crn"] = json!(i.crn);
    v["href"] = json!(format!("{base}/v1/instances/{id}"));
    v["name"] = json!(i.name);
    v["status"] = json!(status(deleting));
    v["created_at"] = json!(i.created_at);
    v["memory"] = json!(i.memory_gib);
    v["vcpu"]["count"] = json!(i.vcpus);
    v["profile"]["name"] = json!(format!("bx2-{}x{}", i.vcpus, i.memory_gib));
    v["boot_volume_attachment"]["volume"]["id"] = json!(i.boot_volume);
    v["primary_network_interface"]["id"] = json!(i.network_interface);
    v["primary_network_interface"]["href"] = json!(nic_href);
    v["network_interfaces"][0]["id"] = json!(i.network_interface);
    v["network_interfaces"][0]["href"] = json!(nic_href);
    v["zone"]["name"] = json!(ZONE);
    v
}

fn list_instances(
    state: &Account<Vpc>,
    query: &BTreeMap<String, String>,
    faults: &FaultLayer,
) -> Response {
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(50)
        .clamp(1, 100);
    let base = &state.cloud.base_url;
    let start = query.get("start").cloned().unwrap_or_default();
    // An instance created moments ago may be missing from the list (the fault layer's
    // visibility): from its page and from the total.
    let listed: Vec<(&String, &VpcInstance)> = state
        .instances
        .iter()
        .filter(|(id, _)| !faults.hides(id, CallKind::List))
        .collect();
    let page: Vec<(&String, &VpcInstance)> = listed
        .iter()
        .filter(|(id, _)| **id >= start)
        .take(limit + 1)
        .copied()
        .collect();
    let mut body = fixture(INSTANCE_COLLECTION);
    body["limit"] = json!(limit);
    body["total_count"] = json!(listed.len());
    body["first"]["href"] = json!(format!("{base}/v1/instances?limit={limit}"));
    body["instances"] = page
        .iter()
        .take(limit)
        .map(|(id, i)| instance_json(base, id, i, state.is_deleting(id)))
        .collect();
    match page.get(limit) {
        Some((next, _)) => {
            body["next"]["href"] = json!(format!("{base}/v1/instances?start={next}&limit={limit}"));
        }
        None => {
            if let Some(object) = body.as_object_mut() {
                object.remove("next");
            }
        }
    }
    answer(StatusCode::OK, &body)
}

/// What Global Search indexes of this account: the region's instances (once `search_lag` has
/// passed since their creation) with their user tags, its floating IPs, and the instances of
/// other regions.
fn search_documents(state: &Account<Vpc>, faults: &FaultLayer) -> Vec<search::Document> {
    let region = search::region_of_zone(ZONE);
    let instances = state
        .instances
        .iter()
        .filter(|(_, i)| i.created.elapsed() >= state.cloud.search_lag)
        // The fault layer's visibility of lists holds for the search too.
        .filter(|(id, _)| !faults.hides(id, CallKind::List))
        .map(|(_, i)| search::Document {
            crn: i.crn.clone(),
            name: i.name.clone(),
            family: "is".into(),
            kind: "instance".into(),
            region: region.clone(),
            tags: state.tags.get(&i.crn).cloned().unwrap_or_default(),
            creation_date: Some(i.created_at.clone()),
        });
    let floating_ips = state
        .cloud
        .floating_ips
        .iter()
        .map(|(id, ip)| search::Document {
            crn: format!("crn:v1:bluemix:public:is:{ZONE}:a/{ACCOUNT_ID}::floating-ip:{id}"),
            name: ip.name.clone(),
            family: "is".into(),
            kind: "floating-ip".into(),
            region: region.clone(),
            tags: Vec::new(),
            creation_date: None,
        });
    instances
        .chain(floating_ips)
        .chain(state.cloud.other_regions.iter().cloned())
        .collect()
}

/// `POST /v3/resources/search`.
fn search_resources(
    state: &mut Account<Vpc>,
    query: &BTreeMap<String, String>,
    body: &[u8],
    faults: &FaultLayer,
) -> Response {
    let documents = search_documents(state, faults);
    match search::answer(&mut state.cloud.cursors, &documents, query, body) {
        Ok(page) => answer(StatusCode::OK, &page),
        Err(message) => bad_request(&message),
    }
}

fn get_instance(state: &mut Account<Vpc>, id: &str) -> Response {
    let base = state.cloud.base_url.clone();
    match state.lookup(id) {
        Lookup::Shown(instance, deleting) => answer(
            StatusCode::OK,
            &instance_json(&base, id, instance, deleting),
        ),
        Lookup::Gone => not_found(id, "Instance not found"),
    }
}

fn floating_ips_of(state: &Account<Vpc>, instance_id: &str, nic: &str) -> Response {
    let Some(instance) = state.instances.get(instance_id) else {
        return not_found(instance_id, "Instance not found");
    };
    if instance.network_interface != nic {
        return not_found(nic, "Network interface not found");
    }
    let base = &state.cloud.base_url;
    let ips: Vec<Value> = state
        .cloud
        .floating_ips
        .iter()
        .filter(|(_, ip)| ip.target.as_ref().is_some_and(|(n, _)| n == nic))
        .map(|(id, ip)| {
            let mut v = fixture(FLOATING_IP);
            v["id"] = json!(id);
            v["name"] = json!(ip.name);
            v["address"] = json!(ip.address);
            v["href"] = json!(format!("{base}/v1/floating_ips/{id}"));
            v["crn"] = json!(format!(
                "crn:v1:bluemix:public:is:{ZONE}:a/{ACCOUNT_ID}::floating-ip:{id}"
            ));
            v["target"]["id"] = json!(nic);
            v["target"]["href"] = json!(format!(
                "{base}/v1/instances/{instance_id}/network_interfaces/{nic}"
            ));
            v
        })
        .collect();
    answer(StatusCode::OK, &json!({ "floating_ips": ips }))
}

#[cfg(test)]
mod tests {
    use test_support::cloud::CloudEmulator;

    use super::*;

    #[test]
    fn fixtures_parse() {
        for text in [
            INSTANCE,
            INSTANCE_COLLECTION,
            FLOATING_IP,
            NOT_FOUND,
            ERRORS.unauthorized,
            ERRORS.too_many_requests,
            ERRORS.internal,
            crate::examples::VPC_LIST_INSTANCES,
            crate::examples::VPC_LIST_NIC_FLOATING_IPS,
        ] {
            assert!(serde_json::from_str::<Value>(text).is_ok());
        }
    }

    #[test]
    fn versions_are_dates_between_the_documented_oldest_and_today() {
        let now: jiff::Timestamp = "2026-03-01T12:00:00Z".parse().expect("now");
        assert!(version_accepted("2025-04-08", now));
        assert!(version_accepted("2026-03-01", now));
        assert!(!version_accepted("2026-03-02", now), "in the future");
        assert!(!version_accepted("2021-01-01", now), "before 2022-09-13");
        assert!(!version_accepted("2025-02-30", now), "not a date");
        assert!(!version_accepted("2025-4-8", now));
    }

    #[test]
    fn routes_are_named_without_ids() {
        assert_eq!(
            Vpc::route_name(&Method::DELETE, &["v1", "instances", "0717_x"]),
            "DELETE /v1/instances/{id}"
        );
        assert_eq!(
            Vpc::route_name(
                &Method::GET,
                &[
                    "v1",
                    "instances",
                    "0717_x",
                    "network_interfaces",
                    "n",
                    "floating_ips"
                ]
            ),
            "GET /v1/instances/{id}/network_interfaces/{nic}/floating_ips"
        );
    }

    #[test]
    fn an_instance_and_its_parts_exist_until_deleted() {
        let emulator = VpcEmulator::start().expect("emulator");
        let id = emulator.create_vm("podvm-a", &[("coco-pod-vm", "c1")]);
        let fip = emulator.attach_floating_ip(&id).expect("fip");
        assert!(emulator.vm_or_parts_exist(&id));
        {
            lock(&emulator.state).remove(&id);
        }
        // The operator's floating IP outlives the instance, unbound; it was never a part.
        assert!(emulator.floating_ip_exists(&fip));
        assert_eq!(emulator.floating_ip_bound_to(&fip), None);
        assert!(!emulator.vm_or_parts_exist(&id));
    }
}
