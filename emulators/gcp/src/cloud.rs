//! The emulated project (VMs, their boot disks, zone operations, the test's knobs) and the handler that
//! answers each call from it.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use test_support::faults::{CallKind, Fault, FaultLayer};

use crate::fixtures::{
    ERROR_INVALID_FILTER, ERROR_NOT_FOUND, ERROR_NOT_READY, ERROR_OPERATION_RATE_EXCEEDED,
    ERROR_RATE_LIMIT_EXCEEDED, ERROR_RATE_LIMITED, ERROR_UNAUTHENTICATED, ERROR_UNAVAILABLE,
    INSTANCE, INSTANCE_LIST, OPERATION, OPERATION_ERROR_NOT_READY, OPERATION_ERROR_RATE_EXCEEDED,
    REGION_RESOURCE,
};
use crate::project::{PROJECT, REGION, VCPUS_PER_VM, ZONE};
use crate::{filter, jwt};

/// How Compute Engine refuses a call for its rate with 403 (not 429), as its rate-quota
/// documentation says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RateRefusal {
    /// The project's per-minute rate quota is spent: 403, `errors[].reason` `rateLimitExceeded`
    /// (domain `usageLimits`), status `PERMISSION_DENIED`. Any call.
    RateLimitExceeded,
    /// Too frequent operations on one resource: 403 with an `ErrorInfo` detail of reason
    /// `RESOURCE_OPERATION_RATE_EXCEEDED` (domain `compute.googleapis.com`). Deletions only.
    ResourceOperationRateExceeded,
}

/// How an accepted deletion's operation can end without deleting: `DONE` with an `error`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OperationFailure {
    /// `RESOURCE_NOT_READY` (HTTP 400 in `httpErrorStatusCode`): another operation held the
    /// instance. The instance stays, `RUNNING` again.
    ResourceNotReady,
    /// `RESOURCE_OPERATION_RATE_EXCEEDED` (HTTP 403): too frequent operations on the instance.
    ResourceOperationRateExceeded,
}

pub(crate) struct Vm {
    pub(crate) id: u64,
    /// Its `creationTimestamp`.
    pub(crate) created: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) status: &'static str,
    /// Being deleted by someone else: gone after this many more `instances.get`.
    pub(crate) gone_after_gets: Option<u32>,
}

pub(crate) struct ZoneOperation {
    pub(crate) id: u64,
    pub(crate) instance: String,
    pub(crate) target_id: u64,
    pub(crate) polls_left: u32,
    pub(crate) done: bool,
    /// Ends DONE with this error instead of deleting.
    pub(crate) failure: Option<OperationFailure>,
}

/// The emulated project: VMs, their boot disks, operations, and the test's knobs.
pub(crate) struct Cloud {
    pub(crate) trusted: jwt::TrustedKey,
    pub(crate) vms: BTreeMap<String, Vm>,
    /// Boot disk name → the instance it was created with.
    pub(crate) disks: BTreeMap<String, String>,
    pub(crate) operations: HashMap<String, ZoneOperation>,
    /// `requestId` of a deletion → its operation.
    pub(crate) request_ids: HashMap<String, String>,
    pub(crate) next_id: u64,
    pub(crate) log: Vec<String>,
    pub(crate) throttle_next: u32,
    pub(crate) retry_after_secs: u64,
    pub(crate) fail_next: u32,
    pub(crate) fail_status: u16,
    pub(crate) refuse_rate_next: u32,
    pub(crate) rate_refusal: RateRefusal,
    pub(crate) fail_next_operations: u32,
    pub(crate) operation_failure: OperationFailure,
    pub(crate) reject_credentials: bool,
    pub(crate) operation_polls: u32,
    pub(crate) page_size: usize,
    pub(crate) quota_overrides: BTreeMap<String, (f64, f64)>,
}

impl Cloud {
    pub(crate) fn new(trusted: jwt::TrustedKey) -> Self {
        Cloud {
            trusted,
            vms: BTreeMap::new(),
            disks: BTreeMap::new(),
            operations: HashMap::new(),
            request_ids: HashMap::new(),
            next_id: 0,
            log: Vec::new(),
            throttle_next: 0,
            retry_after_secs: 1,
            fail_next: 0,
            fail_status: 503,
            refuse_rate_next: 0,
            rate_refusal: RateRefusal::RateLimitExceeded,
            fail_next_operations: 0,
            operation_failure: OperationFailure::ResourceNotReady,
            reject_credentials: false,
            operation_polls: 0,
            page_size: 500,
            quota_overrides: BTreeMap::new(),
        }
    }

    pub(crate) fn remove_vm(&mut self, name: &str) {
        self.vms.remove(name);
        // autoDelete: the boot disk goes with the instance.
        self.disks.retain(|_, owner| owner != name);
    }

    pub(crate) fn delete_instance(&mut self, name: &str, request_id: Option<&String>) -> Response {
        if let Some(operation) = request_id.and_then(|id| self.request_ids.get(id))
            && let Some(op) = self.operations.get(operation)
        {
            return ok(operation_json(operation, op));
        }
        let Some(vm) = self.vms.get_mut(name) else {
            return error_response(ERROR_NOT_FOUND, &instance_path(name));
        };
        if vm.status == "STOPPING" {
            return error_response(ERROR_NOT_READY, &instance_path(name));
        }
        vm.status = "STOPPING";
        let target_id = vm.id;
        self.next_id += 1;
        let id = 7_223_685_420_011_538_101 + self.next_id;
        let operation = format!("operation-{id}-delete-{name}");
        let failure = (self.fail_next_operations > 0).then(|| {
            self.fail_next_operations -= 1;
            self.operation_failure
        });
        let op = ZoneOperation {
            id,
            instance: name.to_owned(),
            target_id,
            polls_left: self.operation_polls,
            done: false,
            failure,
        };
        let body = operation_json(&operation, &op);
        if let Some(request_id) = request_id {
            self.request_ids
                .insert(request_id.clone(), operation.clone());
        }
        self.operations.insert(operation, op);
        ok(body)
    }

    pub(crate) fn get_operation(&mut self, name: &str) -> Response {
        let Some(op) = self.operations.get_mut(name) else {
            return error_response(
                ERROR_NOT_FOUND,
                &format!("projects/{PROJECT}/zones/{ZONE}/operations/{name}"),
            );
        };
        if !op.done {
            if op.polls_left == 0 {
                op.done = true;
            } else {
                op.polls_left -= 1;
            }
        }
        let (done, failed, instance) = (op.done, op.failure.is_some(), op.instance.clone());
        let body = self
            .operations
            .get(name)
            .map(|op| operation_json(name, op))
            .unwrap_or(Value::Null);
        if done && failed {
            // Nothing was deleted: the instance is as it was before the request.
            if let Some(vm) = self.vms.get_mut(&instance) {
                vm.status = "RUNNING";
            }
        } else if done {
            self.remove_vm(&instance);
        }
        ok(body)
    }

    pub(crate) fn get_instance(&mut self, name: &str) -> Response {
        // Compute Engine deletes on its own, whether or not anyone polls the operation: a look at
        // the instance advances its pending deletion as a poll of that operation does.
        let pending = self
            .operations
            .iter()
            .find(|(_, op)| op.instance == name && !op.done)
            .map(|(operation, _)| operation.clone());
        if let Some(operation) = pending {
            let _ = self.get_operation(&operation);
        }
        let gone = match self.vms.get_mut(name) {
            None => true,
            Some(vm) => match vm.gone_after_gets {
                Some(0) => true,
                Some(n) => {
                    vm.gone_after_gets = Some(n - 1);
                    false
                }
                None => false,
            },
        };
        if gone {
            self.remove_vm(name);
            return error_response(ERROR_NOT_FOUND, &instance_path(name));
        }
        match self.vms.get(name) {
            Some(vm) => ok(instance_json(name, vm)),
            None => error_response(ERROR_NOT_FOUND, &instance_path(name)),
        }
    }

    pub(crate) fn list_instances(
        &self,
        query: &HashMap<String, String>,
        faults: &FaultLayer,
    ) -> Response {
        let wanted = match query.get("filter").map(|f| filter::labels(f)) {
            None => Vec::new(),
            Some(Ok(labels)) => labels,
            Some(Err(())) => {
                let filter = query.get("filter").map_or("", String::as_str);
                return error_response_with(ERROR_INVALID_FILTER, "FILTER", filter);
            }
        };
        let matching: Vec<(&String, &Vm)> = self
            .vms
            .iter()
            .filter(|(_, vm)| wanted.iter().all(|(k, v)| vm.labels.get(k) == Some(v)))
            // A new instance may be missing from a list (the fault layer's visibility).
            .filter(|(name, _)| !faults.hides(name, CallKind::List))
            .collect();
        let max = query
            .get("maxResults")
            .and_then(|m| m.parse::<usize>().ok())
            .unwrap_or(500)
            .min(self.page_size)
            .max(1);
        let start = query
            .get("pageToken")
            .and_then(|t| t.strip_prefix("page-start-"))
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        let page: Vec<Value> = matching
            .iter()
            .skip(start)
            .take(max)
            .map(|(name, vm)| instance_json(name, vm))
            .collect();
        let mut body = fixture(INSTANCE_LIST, &[]);
        body["items"] = Value::Array(page);
        if start + max < matching.len() {
            body["nextPageToken"] = json!(format!("page-start-{}", start + max));
        }
        ok(body)
    }

    pub(crate) fn get_region(&self) -> Response {
        let mut body = fixture(REGION_RESOURCE, &[]);
        let vms = self.vms.len() as f64;
        if let Some(quotas) = body["quotas"].as_array_mut() {
            for quota in quotas {
                let metric = quota["metric"].as_str().unwrap_or_default().to_owned();
                match metric.as_str() {
                    "CPUS" => quota["usage"] = json!(vms * f64::from(VCPUS_PER_VM)),
                    "INSTANCES" => quota["usage"] = json!(vms),
                    _ => {}
                }
                if let Some((limit, usage)) = self.quota_overrides.get(&metric) {
                    quota["limit"] = json!(limit);
                    quota["usage"] = json!(usage);
                }
            }
        }
        ok(body)
    }
}

pub(crate) async fn handle(
    State((state, faults)): State<(Arc<Mutex<Cloud>>, Arc<FaultLayer>)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    // The fault layer first: Compute Engine throttles with 403 rateLimitExceeded (its
    // rate-quota documentation), fails with 503 backendError.
    let path = uri.path().trim_start_matches('/');
    match faults.before_request().await {
        Fault::Throttled => {
            let resource = path.strip_prefix("compute/v1/").unwrap_or(path);
            return error_response_with(ERROR_RATE_LIMIT_EXCEEDED, "INSTANCE_PATH", resource);
        }
        Fault::ServerError | Fault::Hang(_) => return server_error(503),
        Fault::None => {}
    }
    let mut cloud = state.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(polls) = faults.operation_polls() {
        cloud.operation_polls = polls;
    }
    cloud.log.push(format!("{method} {}", uri.path()));
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let authenticated = !cloud.reject_credentials
        && token.is_some_and(|token| cloud.trusted.verify(token, now).is_ok());
    if !authenticated {
        let mut response = error_response(ERROR_UNAUTHENTICATED, "");
        response.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static(
                "Bearer realm=\"https://accounts.google.com/\", error=\"invalid_token\"",
            ),
        );
        return response;
    }
    if cloud.throttle_next > 0 {
        cloud.throttle_next -= 1;
        let mut response = error_response(ERROR_RATE_LIMITED, "");
        if let Ok(value) = HeaderValue::from_str(&cloud.retry_after_secs.to_string()) {
            response.headers_mut().insert(header::RETRY_AFTER, value);
        }
        return response;
    }
    if cloud.fail_next > 0 {
        cloud.fail_next -= 1;
        return server_error(cloud.fail_status);
    }
    let path = uri.path().trim_start_matches('/');
    let segments: Vec<&str> = path.split('/').collect();
    let deletion = method == Method::DELETE;
    if cloud.refuse_rate_next > 0
        && (deletion || cloud.rate_refusal == RateRefusal::RateLimitExceeded)
    {
        cloud.refuse_rate_next -= 1;
        let resource = path.strip_prefix("compute/v1/").unwrap_or(path).to_owned();
        let fixture_text = match cloud.rate_refusal {
            RateRefusal::RateLimitExceeded => ERROR_RATE_LIMIT_EXCEEDED,
            RateRefusal::ResourceOperationRateExceeded => ERROR_OPERATION_RATE_EXCEEDED,
        };
        return error_response_with(fixture_text, "INSTANCE_PATH", &resource);
    }
    let zonal = |s: &[&str]| {
        s.len() >= 6
            && s[..3] == ["compute", "v1", "projects"]
            && s[3] == PROJECT
            && s[4] == "zones"
            && s[5] == ZONE
    };
    let (get, delete) = (method == Method::GET, method == Method::DELETE);
    match segments.as_slice() {
        // An instance created moments ago may be unknown to a lookup or a deletion, each on its
        // own (the fault layer's visibility and flapping).
        [_, _, _, _, _, _, "instances", name]
            if (get || delete)
                && zonal(&segments)
                && faults.hides(name, if get { CallKind::Get } else { CallKind::Delete }) =>
        {
            error_response(ERROR_NOT_FOUND, &instance_path(name))
        }
        [_, _, _, _, _, _, "instances", name] if delete && zonal(&segments) => {
            cloud.delete_instance(name, query.get("requestId"))
        }
        [_, _, _, _, _, _, "instances", name] if get && zonal(&segments) => {
            cloud.get_instance(name)
        }
        [_, _, _, _, _, _, "instances"] if get && zonal(&segments) => {
            cloud.list_instances(&query, &faults)
        }
        [_, _, _, _, _, _, "operations", name] if get && zonal(&segments) => {
            cloud.get_operation(name)
        }
        ["compute", "v1", "projects", project, "regions", region]
            if get && *project == PROJECT && *region == REGION =>
        {
            cloud.get_region()
        }
        _ => error_response(ERROR_NOT_FOUND, path),
    }
}

pub(crate) fn instance_path(name: &str) -> String {
    format!("projects/{PROJECT}/zones/{ZONE}/instances/{name}")
}

/// A fixture with its placeholders (`PROJECT`, `ZONE`, `REGION`, and `extra`) filled in.
pub(crate) fn fixture(text: &str, extra: &[(&str, &str)]) -> Value {
    let mut text = text
        .replace("PROJECT", PROJECT)
        .replace("REGION", REGION)
        .replace("ZONE", ZONE);
    for (placeholder, value) in extra {
        text = text.replace(placeholder, value);
    }
    serde_json::from_str(&text).unwrap_or(Value::Null)
}

/// Records instance `name` as created with the fault layer ([`FaultLayer::created`]) and returns
/// its `creationTimestamp` as Compute Engine writes it: RFC 3339 with milliseconds, in Pacific
/// time (`2026-11-22T09:58:12.345-08:00`; here always standard time, `-08:00`).
pub(crate) fn creation_timestamp(faults: &FaultLayer, name: &str) -> String {
    let at = faults.created(name);
    let pacific = at
        .checked_sub(std::time::Duration::from_secs(8 * 3600))
        .unwrap_or(at);
    pacific.strftime("%Y-%m-%dT%H:%M:%S%.3f-08:00").to_string()
}

pub(crate) fn instance_json(name: &str, vm: &Vm) -> Value {
    let mut body = fixture(INSTANCE, &[("INSTANCE", name)]);
    body["id"] = json!(vm.id.to_string());
    body["creationTimestamp"] = json!(vm.created);
    body["status"] = json!(vm.status);
    body["labels"] = json!(vm.labels);
    body
}

pub(crate) fn operation_json(name: &str, op: &ZoneOperation) -> Value {
    let mut body = fixture(
        OPERATION,
        &[("INSTANCE", &op.instance), ("OPERATION", name)],
    );
    body["id"] = json!(op.id.to_string());
    body["name"] = json!(name);
    body["targetId"] = json!(op.target_id.to_string());
    if op.done {
        body["status"] = json!("DONE");
        body["progress"] = json!(100);
        body["endTime"] = json!("2026-11-22T10:00:20.000-08:00");
        if let Some(failure) = op.failure {
            let text = match failure {
                OperationFailure::ResourceNotReady => OPERATION_ERROR_NOT_READY,
                OperationFailure::ResourceOperationRateExceeded => OPERATION_ERROR_RATE_EXCEEDED,
            };
            let fields = fixture(text, &[("INSTANCE_PATH", &instance_path(&op.instance))]);
            if let (Some(body), Some(fields)) = (body.as_object_mut(), fields.as_object()) {
                body.extend(fields.clone());
            }
        }
    }
    body
}

pub(crate) fn ok(body: Value) -> Response {
    (StatusCode::OK, axum::Json(body)).into_response()
}

pub(crate) fn error_response(fixture_text: &str, resource: &str) -> Response {
    error_response_with(fixture_text, "RESOURCE", resource)
}

/// An error fixture, answered with the status in its `error.code`.
pub(crate) fn error_response_with(fixture_text: &str, placeholder: &str, value: &str) -> Response {
    let body = fixture(fixture_text, &[(placeholder, value)]);
    let status = body["error"]["code"]
        .as_u64()
        .and_then(|c| u16::try_from(c).ok())
        .and_then(|c| StatusCode::from_u16(c).ok())
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, axum::Json(body)).into_response()
}

/// The 503 fixture, answered with another 5xx status when asked.
pub(crate) fn server_error(status: u16) -> Response {
    let mut body = fixture(ERROR_UNAVAILABLE, &[]);
    if status != 503 {
        body["error"]["code"] = json!(status);
        body["error"]["status"] = json!("INTERNAL");
        body["error"]["message"] =
            json!("Internal error. Please try again or contact Google Support.");
    }
    let status = StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    (status, axum::Json(body)).into_response()
}
