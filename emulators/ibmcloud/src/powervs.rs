//! The IBM Power Virtual Server emulator: IAM's token endpoint, the Power Cloud API endpoints
//! the backend calls (one workspace, its `pvm-instances`) and Global Tagging.

use std::collections::BTreeMap;

use axum::http::{Method, StatusCode};
use axum::response::Response;
use serde_json::{Value, json};
use test_support::faults::{CallKind, FaultLayer};

use crate::common::{ACCOUNT_ID, answer, fixture, lock, uuid_like};
use crate::front_door::{
    Account, Cloud, Emulator, ErrorBodies, Instance, Lookup, Request, error_bodies,
};

/// The Power `Error` model's bodies (`code`, `description`, `error`, `message`).
const ERRORS: ErrorBodies = error_bodies!("power");
const UNAUTHORIZED: &str = ERRORS.unauthorized;
const NOT_FOUND: &str = include_str!("../fixtures/power_error_not_found.json");
const PVM_INSTANCE: &str = include_str!("../fixtures/power_pvm_instance.json");
const PVM_INSTANCES: &str = include_str!("../fixtures/power_pvm_instances.json");
const WORKSPACE: &str = include_str!("../fixtures/power_workspace.json");

/// The workspace (cloud instance) id the emulator serves.
pub const WORKSPACE_ID: &str = "7e0ba4c4-4d5e-4b3b-9c5e-0d1e2f3a4b5c";
/// Its zone.
pub const ZONE: &str = "dal10";

pub struct PvmInstance {
    name: String,
    crn: String,
    created: String,
    processors: f64,
    memory_gb: f64,
    boot_volume: String,
    network_port: String,
    /// The next DELETE answers 410 Gone (see [`PowerVsEmulator::answer_gone`]).
    gone: bool,
}

impl Instance for PvmInstance {
    /// Processors (shared ones in fractions) and GB.
    type Amount = f64;
    /// 0.5 shared processors, 2 GB.
    const DEFAULT_SIZE: (f64, f64) = (0.5, 2.0);

    /// A boot volume and a port on the configured network, both deleted with the instance.
    /// cloud-api-adaptor tags PowerVS instances with nothing; tags given to
    /// [`Emulator::create_vm_sized`] become user tags, for tests of tag selectors.
    fn id_of(seq: u64) -> String {
        uuid_like(seq, 0x2f9d_7c66)
    }

    fn new(
        seq: u64,
        name: &str,
        (processors, memory_gb): (f64, f64),
        created: String,
    ) -> (String, Self, Vec<String>) {
        let id = Self::id_of(seq);
        let boot_volume = uuid_like(seq, 0xc8b7_a6f5);
        let network_port = uuid_like(seq, 0x4f6f_2c4e);
        let parts = vec![boot_volume.clone(), network_port.clone()];
        let instance = PvmInstance {
            name: name.to_owned(),
            crn: format!(
                "crn:v1:bluemix:public:power-iaas:{ZONE}:a/{ACCOUNT_ID}:{WORKSPACE_ID}:pvm-instance:{id}"
            ),
            created,
            processors,
            memory_gb,
            boot_volume,
            network_port,
            gone: false,
        };
        (id, instance, parts)
    }

    fn crn(&self) -> &str {
        &self.crn
    }
}

/// What the Power Virtual Server emulator holds beyond one workspace's instances (whose parts
/// are a boot volume and a network port): the workspace's limits.
pub struct Power {
    /// Workspace limits: instances, processors, memory (GB); `None` leaves them out.
    limits: Option<(f64, f64, f64)>,
}

/// A running Power Virtual Server emulator on 127.0.0.1.
pub type PowerVsEmulator = Emulator<Power>;

impl PowerVsEmulator {
    /// Starts the emulator on a free port.
    pub fn start() -> std::io::Result<Self> {
        Emulator::serve(Power {
            limits: Some((50.0, 100.0, 800.0)),
        })
    }

    /// The workspace's limits (instances, processors, memory in GB); `None` removes them.
    pub fn set_limits(&self, limits: Option<(f64, f64, f64)>) {
        lock(&self.state).cloud.limits = limits;
    }

    /// The instance is gone: GETs answer 404, lists leave it out, and the next DELETE of it
    /// answers 410 Gone (a status the Power Cloud API reference lists for that operation) and
    /// releases its parts.
    pub fn answer_gone(&self, id: &str) {
        let mut state = lock(&self.state);
        if let Some(instance) = state.instances.get_mut(id) {
            instance.gone = true;
        }
    }
}

fn error(status: StatusCode, text: &str, description: Option<&str>) -> Response {
    let mut body = fixture(text);
    if let Some(description) = description {
        body["description"] = json!(description);
        body["message"] = json!(description);
    }
    answer(status, &body)
}

impl Cloud for Power {
    const PROVIDER: &'static str = "ibmcloud-powervs";
    const ERRORS: ErrorBodies = ERRORS;
    type Instance = PvmInstance;

    /// `GET .../pvm-instances/2f9d...` → `GET pvm-instances/{id}`.
    fn route_name(method: &Method, path: &[&str]) -> String {
        match path {
            ["pcloud", "v1", "cloud-instances", _] => format!("{method} cloud-instances/{{id}}"),
            ["pcloud", "v1", "cloud-instances", _, "pvm-instances"] => {
                format!("{method} pvm-instances")
            }
            ["pcloud", "v1", "cloud-instances", _, "pvm-instances", _] => {
                format!("{method} pvm-instances/{{id}}")
            }
            _ => format!("{method} /{}", path.join("/")),
        }
    }

    fn endpoints(url: &str) -> Vec<(&'static str, String)> {
        vec![
            ("IBMCLOUD_IAM_ENDPOINT", url.to_owned()),
            ("IBMCLOUD_POWER_API_ENDPOINT", url.to_owned()),
            ("IBMCLOUD_TAGGING_ENDPOINT", url.to_owned()),
            ("POWERVS_SERVICE_INSTANCE_ID", WORKSPACE_ID.to_owned()),
            ("POWERVS_ZONE", ZONE.to_owned()),
        ]
    }

    fn serve(account: &mut Account<Power>, request: &Request<'_>, faults: &FaultLayer) -> Response {
        let (method, path) = (request.method, request.path);
        if path.first() == Some(&"v3") {
            return error(StatusCode::NOT_FOUND, NOT_FOUND, Some("route not found"));
        }
        if !request
            .headers
            .get("crn")
            .and_then(|v| v.to_str().ok())
            .is_some_and(names_this_workspace)
        {
            return error(
                StatusCode::UNAUTHORIZED,
                UNAUTHORIZED,
                Some("the CRN header is missing or does not name this workspace"),
            );
        }
        match (method, path) {
            (_, ["pcloud", "v1", "cloud-instances", workspace, ..])
                if *workspace != WORKSPACE_ID =>
            {
                error(
                    StatusCode::NOT_FOUND,
                    NOT_FOUND,
                    Some("cloud instance does not exist"),
                )
            }
            (&Method::GET, ["pcloud", "v1", "cloud-instances", _]) => workspace(account),
            (&Method::GET, ["pcloud", "v1", "cloud-instances", _, "pvm-instances"]) => {
                let mut body = fixture(PVM_INSTANCES);
                body["pvmInstances"] = visible(&account.instances)
                    // A new instance may be missing from the list (the fault layer's visibility).
                    .filter(|(id, _)| !faults.hides(id, CallKind::List))
                    .map(|(id, i)| reference_json(id, i))
                    .collect();
                answer(StatusCode::OK, &body)
            }
            // An instance created moments ago may be unknown to a lookup or a deletion, each on
            // its own (the fault layer's visibility and flapping).
            (&Method::GET, ["pcloud", "v1", "cloud-instances", _, "pvm-instances", id])
                if faults.hides(id, CallKind::Get) =>
            {
                not_found(id)
            }
            (&Method::DELETE, ["pcloud", "v1", "cloud-instances", _, "pvm-instances", id])
                if faults.hides(id, CallKind::Delete) =>
            {
                not_found(id)
            }
            (&Method::GET, ["pcloud", "v1", "cloud-instances", _, "pvm-instances", id]) => {
                get_instance(account, id)
            }
            (&Method::DELETE, ["pcloud", "v1", "cloud-instances", _, "pvm-instances", id]) => {
                delete_instance(account, id)
            }
            _ => error(StatusCode::NOT_FOUND, NOT_FOUND, Some("route not found")),
        }
    }
}

fn delete_instance(state: &mut Account<Power>, id: &str) -> Response {
    if state.instances.get(id).is_some_and(|i| i.gone) {
        state.remove(id);
        return error(
            StatusCode::GONE,
            NOT_FOUND,
            Some(&format!("pvm-instance has been deleted. ID: {id}")),
        );
    }
    if state.accept_delete(id, false) {
        answer(StatusCode::OK, &json!({}))
    } else {
        not_found(id)
    }
}

/// The `CRN` header the Power API wants: the workspace's CRN, built as IBM's Power Go client
/// builds it (`crn:v1:<bluemix|staging>:public:power-iaas:<zone>:a/<account>:<workspace>::`;
/// the client picks `staging` for any host that is not IBM's production one).
fn names_this_workspace(crn: &str) -> bool {
    ["bluemix", "staging"].iter().any(|environment| {
        crn == format!(
            "crn:v1:{environment}:public:power-iaas:{ZONE}:a/{ACCOUNT_ID}:{WORKSPACE_ID}::"
        )
    })
}

/// Instances the API still shows (not [`PowerVsEmulator::answer_gone`] ones).
fn visible(
    instances: &BTreeMap<String, PvmInstance>,
) -> impl Iterator<Item = (&String, &PvmInstance)> {
    instances.iter().filter(|(_, i)| !i.gone)
}

fn not_found(id: &str) -> Response {
    let text = format!("pvm-instance does not exist. ID: {id}");
    error(StatusCode::NOT_FOUND, NOT_FOUND, Some(&text))
}

/// A `PVMInstance` (what `GET .../pvm-instances/{id}` answers).
fn instance_json(id: &str, i: &PvmInstance) -> Value {
    let mut v = fixture(PVM_INSTANCE);
    v["pvmInstanceID"] = json!(id);
    v["serverName"] = json!(i.name);
    v["crn"] = json!(i.crn);
    v["creationDate"] = json!(i.created);
    v["processors"] = json!(i.processors);
    v["memory"] = json!(i.memory_gb);
    v["volumeIDs"] = json!([i.boot_volume]);
    v["networks"][0]["networkInterfaceID"] = json!(i.network_port);
    v["href"] = json!(format!(
        "/pcloud/v1/cloud-instances/{WORKSPACE_ID}/pvm-instances/{id}"
    ));
    v
}

/// A `PVMInstanceReference` (the items of `PVMInstances` and of a workspace's `pvmInstances`):
/// a `PVMInstance` without `networkIDs` and `volumeIDs`.
fn reference_json(id: &str, i: &PvmInstance) -> Value {
    let mut v = instance_json(id, i);
    if let Some(object) = v.as_object_mut() {
        object.remove("networkIDs");
        object.remove("volumeIDs");
    }
    v
}

fn get_instance(state: &mut Account<Power>, id: &str) -> Response {
    if state.instances.get(id).is_some_and(|i| i.gone) {
        return not_found(id);
    }
    match state.lookup(id) {
        Lookup::Shown(instance, deleting) => {
            let mut body = instance_json(id, instance);
            // What the Power API shows of an instance whose deletion runs (terraform-provider-ibm
            // waits on it: `PIInstanceDeleting`).
            if deleting {
                body["status"] = json!("DELETING");
            }
            answer(StatusCode::OK, &body)
        }
        Lookup::Gone => not_found(id),
    }
}

fn workspace(state: &Account<Power>) -> Response {
    let mut body = fixture(WORKSPACE);
    body["cloudInstanceID"] = json!(WORKSPACE_ID);
    body["tenantID"] = json!(ACCOUNT_ID);
    body["region"] = json!(ZONE);
    match state.cloud.limits {
        Some((instances, processors, memory)) => {
            body["limits"]["instances"] = json!(instances);
            body["limits"]["processors"] = json!(processors);
            body["limits"]["memory"] = json!(memory);
        }
        None => {
            if let Some(object) = body.as_object_mut() {
                object.remove("limits");
            }
        }
    }
    let instances: Vec<(&String, &PvmInstance)> = visible(&state.instances).collect();
    body["usage"]["instances"] = json!(instances.len());
    body["usage"]["processors"] = json!(instances.iter().map(|(_, i)| i.processors).sum::<f64>());
    body["usage"]["procUnits"] = body["usage"]["processors"].clone();
    body["usage"]["memory"] = json!(instances.iter().map(|(_, i)| i.memory_gb).sum::<f64>());
    body["pvmInstances"] = instances
        .iter()
        .map(|(id, i)| reference_json(id, i))
        .collect();
    answer(StatusCode::OK, &body)
}

#[cfg(test)]
mod tests {
    use test_support::cloud::CloudEmulator;

    use super::*;
    use crate::common::IbmEmulator;

    #[test]
    fn fixtures_parse() {
        for text in [
            PVM_INSTANCE,
            PVM_INSTANCES,
            WORKSPACE,
            NOT_FOUND,
            ERRORS.unauthorized,
            ERRORS.too_many_requests,
            ERRORS.internal,
        ] {
            assert!(serde_json::from_str::<Value>(text).is_ok());
        }
    }

    #[test]
    fn the_crn_header_names_this_workspace_in_either_environment() {
        let crn = |environment: &str, zone: &str, workspace: &str| {
            format!("crn:v1:{environment}:public:power-iaas:{zone}:a/{ACCOUNT_ID}:{workspace}::")
        };
        assert!(names_this_workspace(&crn("bluemix", ZONE, WORKSPACE_ID)));
        assert!(names_this_workspace(&crn("staging", ZONE, WORKSPACE_ID)));
        assert!(!names_this_workspace(&crn(
            "bluemix",
            "lon04",
            WORKSPACE_ID
        )));
        assert!(!names_this_workspace(&crn("bluemix", ZONE, "other")));
        assert!(!names_this_workspace(&crn("public", ZONE, WORKSPACE_ID)));
    }

    #[test]
    fn list_items_are_references_and_gets_are_full_instances() {
        let emulator = PowerVsEmulator::start().expect("emulator");
        let id = emulator.create_vm("podvm-a", &[]);
        let state = lock(&emulator.state);
        let instance = state.instances.get(&id).expect("instance");
        let full = instance_json(&id, instance);
        let reference = reference_json(&id, instance);
        // Required by `PVMInstance` and `PVMInstanceReference` (power-go-client models).
        for key in [
            "diskSize",
            "imageID",
            "memory",
            "osType",
            "procType",
            "processors",
            "pvmInstanceID",
            "serverName",
            "status",
        ] {
            assert!(
                full.get(key).is_some() && reference.get(key).is_some(),
                "{key}"
            );
        }
        assert!(full.get("networkIDs").is_some() && full.get("volumeIDs").is_some());
        assert!(reference.get("networkIDs").is_none() && reference.get("volumeIDs").is_none());
        assert!(reference.get("href").is_some());
        assert_eq!(full["minproc"], json!(0.25), "lower-case resize bounds");
    }

    #[test]
    fn parts_exist_until_the_instance_is_gone() {
        let emulator = PowerVsEmulator::start().expect("emulator");
        let id = emulator.create_vm("podvm-a", &[]);
        assert!(emulator.vm_or_parts_exist(&id));
        emulator.set_deleting_polls(0);
        emulator.start_deleting(&id);
        {
            let mut state = lock(&emulator.state);
            let _ = get_instance(&mut state, &id);
        }
        assert!(!emulator.vm_or_parts_exist(&id));
    }
}
