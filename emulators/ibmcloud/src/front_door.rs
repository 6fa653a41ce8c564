//! What both emulators are, written once: a running [`Emulator`] of one [`Cloud`] (its server,
//! fault layer, knobs and the [`CloudEmulator`] face tests drive), and the front door every
//! request passes: the fault layer's answer (IAM spared), its operation polls, IAM's token
//! endpoint, the injected faults and the request count, then the bearer token. Each cloud
//! brings its own error bodies, configuration keys, instances and routes.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::Response;
use test_support::cloud::CloudEmulator;
use test_support::faults::FaultLayer;

use crate::common::{
    IbmEmulator, Knobs, Server, Shared, answer, authorized, fixture, iam_token, injected,
    layer_fault, lock, provider_config, request_line, tag_list, url_decode_form, verbatim,
};

/// An IBM Cloud API behind the shared front door: its error bodies, its configuration keys, its
/// instances and routes, and what it answers an authorized request. The value is what the cloud
/// holds beyond the [`Account`] both share.
pub trait Cloud: Send + Sized + 'static {
    /// The backend's name (`CLOUD_PROVIDER`).
    const PROVIDER: &'static str;
    /// The cloud's error bodies for the front door's refusals.
    const ERRORS: ErrorBodies;

    /// An instance as this cloud's API describes it.
    type Instance: Instance + Send;

    /// The backend's own configuration keys against the emulator at `url` (endpoints, zone,
    /// workspace); see [`provider_config`] for the rest.
    fn endpoints(url: &str) -> Vec<(&'static str, String)>;

    /// The request's route without ids (e.g. `DELETE /v1/instances/{id}`), for request counts
    /// and verbatim answers.
    fn route_name(method: &Method, path: &[&str]) -> String;

    /// The cloud's refusal of a request before any answer, verbatim ones included (the VPC API's
    /// `version` and `generation` parameters).
    fn refusal(_request: &Request<'_>) -> Option<Response> {
        None
    }

    /// What else goes when an instance is gone, beyond the parts it owns (which the account
    /// removes).
    fn instance_removed(&mut self, _instance_id: &str) {}

    /// Whether a knob of the cloud's own (outside the fault layer) makes a new instance lag
    /// (VPC: Global Search's indexing lag): then an instance is born new, as with the fault
    /// layer's lag knobs ([`FaultLayer::created_lagging`]).
    fn lags_new_instances(&self) -> bool {
        false
    }

    /// The answer to a request that passed the front door (Global Tagging's tag list and
    /// verbatim answers are the front door's).
    fn serve(account: &mut Account<Self>, request: &Request<'_>, faults: &FaultLayer) -> Response;
}

/// A cloud's error bodies (fixtures) for what the front door refuses.
pub struct ErrorBodies {
    /// 429 (throttling).
    pub too_many_requests: &'static str,
    /// 5xx (an internal error).
    pub internal: &'static str,
    /// 401 (a token IAM did not issue, or revoked).
    pub unauthorized: &'static str,
}

/// The cloud's error bodies from its fixtures `<cloud>_error_too_many_requests.json`,
/// `<cloud>_error_internal.json` and `<cloud>_error_unauthorized.json`.
macro_rules! error_bodies {
    ($cloud:literal) => {
        $crate::front_door::ErrorBodies {
            too_many_requests: include_str!(concat!(
                "../fixtures/",
                $cloud,
                "_error_too_many_requests.json"
            )),
            internal: include_str!(concat!("../fixtures/", $cloud, "_error_internal.json")),
            unauthorized: include_str!(concat!("../fixtures/", $cloud, "_error_unauthorized.json")),
        }
    };
}
pub(crate) use error_bodies;

/// An emulated instance.
pub trait Instance: Sized {
    /// How the API counts processors and memory (VPC: whole vCPUs and GiB; Power: fractional
    /// processors and GB).
    type Amount: Copy;
    /// The processors and memory of an instance as cloud-api-adaptor creates it.
    const DEFAULT_SIZE: (Self::Amount, Self::Amount);

    /// The id of the instance numbered `seq`.
    fn id_of(seq: u64) -> String;

    /// The instance `name` of `size` (processors, memory) numbered `seq`, created at `created`
    /// (as the API writes it, [`created_at`]): its id ([`Self::id_of`]), it, and the parts it
    /// owns (deleted with it).
    fn new(
        seq: u64,
        name: &str,
        size: (Self::Amount, Self::Amount),
        created: String,
    ) -> (String, Self, Vec<String>);

    /// Its CRN, which its user tags are attached to.
    fn crn(&self) -> &str;
}

/// What a cloud counts processors and memory in.
type Amount<C> = <<C as Cloud>::Instance as Instance>::Amount;

/// What an emulated account holds in either cloud: instances, the parts each owns (deleted with
/// it), the deletions accepted, user tags, the knobs, and the cloud's own holdings.
pub struct Account<C: Cloud> {
    pub knobs: Knobs,
    seq: u64,
    pub instances: BTreeMap<String, C::Instance>,
    /// Parts that exist (network interfaces and ports, boot volumes), by id, with their instance.
    parts: BTreeMap<String, String>,
    /// Instances whose deletion was accepted: how many more GETs still show them.
    deleting: BTreeMap<String, u32>,
    /// User tags by CRN (Global Tagging).
    pub tags: BTreeMap<String, Vec<String>>,
    pub cloud: C,
}

/// What a GET of an instance finds.
pub enum Lookup<'a, I> {
    /// It shows, `deleting` or not.
    Shown(&'a I, bool),
    /// It is unknown, or its deletion just finished (it and its parts are gone now).
    Gone,
}

impl<C: Cloud> Account<C> {
    fn new(cloud: C) -> Self {
        Account {
            knobs: Knobs {
                deleting_polls: DELETING_POLLS,
                ..Knobs::default()
            },
            seq: 0,
            instances: BTreeMap::new(),
            parts: BTreeMap::new(),
            deleting: BTreeMap::new(),
            tags: BTreeMap::new(),
            cloud,
        }
    }

    /// The next number for a deterministic id.
    pub fn next_seq(&mut self) -> u64 {
        self.seq += 1;
        self.seq
    }

    /// Whether the instance or any part it owns still exists.
    pub fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        self.instances.contains_key(instance_id) || self.parts.values().any(|i| i == instance_id)
    }

    /// Whether the instance's deletion was accepted and it still shows.
    pub fn is_deleting(&self, id: &str) -> bool {
        self.deleting.contains_key(id)
    }

    /// Accepts a deletion of the instance: it shows for the deleting polls, then is gone. A
    /// deletion already under way goes on (`restart`: starts over, as a new one).
    pub fn accept_delete(&mut self, id: &str, restart: bool) -> bool {
        if !self.instances.contains_key(id) {
            return false;
        }
        if restart || !self.deleting.contains_key(id) {
            self.deleting
                .insert(id.to_owned(), self.knobs.deleting_polls);
        }
        true
    }

    /// A GET of the instance: a deleting one shows for its remaining polls, then is removed.
    pub fn lookup(&mut self, id: &str) -> Lookup<'_, C::Instance> {
        let finished = match self.deleting.get_mut(id) {
            Some(0) => true,
            Some(polls) => {
                *polls -= 1;
                false
            }
            None => false,
        };
        if finished {
            self.remove(id);
        }
        match self.instances.get(id) {
            Some(instance) => Lookup::Shown(instance, self.deleting.contains_key(id)),
            None => Lookup::Gone,
        }
    }

    /// The instance is gone, and with it its tags and the parts it owns.
    pub fn remove(&mut self, id: &str) {
        if let Some(instance) = self.instances.remove(id) {
            self.tags.remove(instance.crn());
        }
        self.deleting.remove(id);
        self.parts.retain(|_, owner| owner != id);
        self.cloud.instance_removed(id);
    }
}

/// A request past the front door.
pub struct Request<'a> {
    pub method: &'a Method,
    pub uri: &'a Uri,
    pub headers: &'a HeaderMap,
    pub body: &'a Bytes,
    /// The path's segments (`/v1/instances/x` → `["v1", "instances", "x"]`).
    pub path: &'a [&'a str],
    pub query: &'a BTreeMap<String, String>,
    /// See [`Cloud::route_name`].
    pub route: &'a str,
}

/// How many GETs a deleted instance still shows, unless a test says otherwise.
const DELETING_POLLS: u32 = 2;

/// A running emulator of one IBM Cloud API on 127.0.0.1, on its own thread, stopped when
/// dropped.
pub struct Emulator<C: Cloud> {
    pub(crate) state: Shared<Account<C>>,
    pub(crate) faults: Arc<FaultLayer>,
    server: Server,
}

impl<C: Cloud> Emulator<C> {
    /// Serves `cloud` on a free port with the fault layer from the environment.
    pub(crate) fn serve(cloud: C) -> std::io::Result<Self> {
        let state: Shared<Account<C>> = Arc::new(Mutex::new(Account::new(cloud)));
        let faults = Arc::new(FaultLayer::from_env());
        let router = Router::new()
            .fallback(handle::<C>)
            .with_state((Arc::clone(&state), Arc::clone(&faults)));
        let server = Server::start(router)?;
        Ok(Emulator {
            state,
            faults,
            server,
        })
    }

    /// The emulator's base URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// Creates an instance as [`CloudEmulator::create_vm`] does, with these processors and this
    /// memory (VPC: the vCPUs and GiB of its profile; Power: processors and GB). Its id.
    pub fn create_vm_sized(
        &self,
        name: &str,
        tags: &[(&str, &str)],
        processors: Amount<C>,
        memory: Amount<C>,
    ) -> String {
        let mut account = lock(&self.state);
        let seq = account.next_seq();
        // Its creation time is the fault layer's: an hour ago, or now while a knob makes new
        // instances lag, or the knobs' `created_age` ago.
        let created = self
            .faults
            .created_lagging(&C::Instance::id_of(seq), account.cloud.lags_new_instances());
        let (id, instance, parts) =
            C::Instance::new(seq, name, (processors, memory), created_at(created));
        if !tags.is_empty() {
            account.tags.insert(
                instance.crn().to_owned(),
                tags.iter().map(|(k, v)| format!("{k}:{v}")).collect(),
            );
        }
        for part in parts {
            account.parts.insert(part, id.clone());
        }
        account.instances.insert(id.clone(), instance);
        id
    }

    /// Accepts a deletion of the instance, as if someone else had asked just now: it still shows
    /// for the deleting polls (VPC: as `deleting`), then is gone.
    pub fn start_deleting(&self, id: &str) {
        lock(&self.state).accept_delete(id, true);
    }

    /// Whether the instance's deletion was accepted and it still shows.
    pub fn is_deleting(&self, id: &str) -> bool {
        lock(&self.state).is_deleting(id)
    }
}

/// A creation time as both APIs write it (VPC `created_at`, Power `creationDate`): UTC with
/// milliseconds (`2025-03-31T12:24:40.000Z`).
pub(crate) fn created_at(at: jiff::Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%S%.3fZ").to_string()
}

impl<C: Cloud> IbmEmulator for Emulator<C> {
    fn with_knobs<R>(&self, change: impl FnOnce(&mut Knobs) -> R) -> R {
        change(&mut lock(&self.state).knobs)
    }
}

impl<C: Cloud> CloudEmulator for Emulator<C> {
    fn provider(&self) -> &'static str {
        C::PROVIDER
    }

    fn config(&self) -> Vec<(String, String)> {
        provider_config(C::PROVIDER, C::endpoints(&self.url()))
    }

    fn create_vm(&self, name: &str, tags: &[(&str, &str)]) -> String {
        let (processors, memory) = C::Instance::DEFAULT_SIZE;
        self.create_vm_sized(name, tags, processors, memory)
    }

    fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        lock(&self.state).vm_or_parts_exist(instance_id)
    }

    fn fault_layer(&self) -> &FaultLayer {
        &self.faults
    }
}

async fn handle<C: Cloud>(
    State((state, faults)): State<(Shared<Account<C>>, Arc<FaultLayer>)>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let path: Vec<&str> = uri.path().trim_matches('/').split('/').collect();
    let iam = method == Method::POST && path == ["identity", "token"];
    if !iam {
        if let Some(fault) = layer_fault(
            &faults,
            &fixture(C::ERRORS.too_many_requests),
            &fixture(C::ERRORS.internal),
        )
        .await
        {
            return fault;
        }
        if let Some(polls) = faults.operation_polls() {
            lock(&state).knobs.deleting_polls = polls;
        }
    }
    let mut account = lock(&state);
    if iam {
        return iam_token(&mut account.knobs, &body);
    }
    let query = url_decode_form(uri.query().unwrap_or_default().as_bytes());
    let route = C::route_name(&method, &path);
    if let Some(fault) = injected(
        &mut account.knobs,
        &route,
        request_line(&method, &uri),
        &fixture(C::ERRORS.too_many_requests),
        &fixture(C::ERRORS.internal),
    ) {
        return fault;
    }
    if !authorized(&account.knobs, &headers) {
        return answer(StatusCode::UNAUTHORIZED, &fixture(C::ERRORS.unauthorized));
    }
    let request = Request {
        method: &method,
        uri: &uri,
        headers: &headers,
        body: &body,
        path: &path,
        query: &query,
        route: &route,
    };
    if let Some(refusal) = C::refusal(&request) {
        return refusal;
    }
    if let Some(example) = verbatim(&mut account.knobs, &route) {
        return example;
    }
    if method == Method::GET && path == ["v3", "tags"] {
        return tag_list(&account.tags, &query);
    }
    C::serve(&mut account, &request, &faults)
}
