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
    layer_fault, lock, provider_config, request_line, url_decode_form,
};

/// An IBM Cloud API behind the shared front door: its error bodies, its route names and what it
/// answers an authorized request.
pub trait Cloud: Send + Sized + 'static {
    /// The backend's name (`CLOUD_PROVIDER`).
    const PROVIDER: &'static str;
    /// The cloud's 429 body (throttling).
    const TOO_MANY_REQUESTS: &'static str;
    /// The cloud's 5xx body (an internal error).
    const INTERNAL: &'static str;
    /// The cloud's 401 body (a token IAM did not issue, or revoked).
    const UNAUTHORIZED: &'static str;

    fn knobs(&mut self) -> &mut Knobs;

    /// The backend's own configuration keys against the emulator at `url` (endpoints, zone,
    /// workspace); see [`provider_config`] for the rest.
    fn endpoints(url: &str) -> Vec<(&'static str, String)>;

    /// An instance as cloud-api-adaptor creates it, with `tags` as `key:value` user tags; its id.
    fn create_vm(emulator: &Emulator<Self>, name: &str, tags: &[(&str, &str)]) -> String;

    /// Whether the instance or any part it owns (and is deleted with it) still exists.
    fn vm_or_parts_exist(&self, instance_id: &str) -> bool;

    /// The request's route without ids (e.g. `DELETE /v1/instances/{id}`), for request counts
    /// and verbatim answers.
    fn route_name(method: &Method, path: &[&str]) -> String;

    /// The answer to a request that passed the front door.
    fn serve(&mut self, request: &Request<'_>, faults: &FaultLayer) -> Response;
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
pub struct Emulator<C> {
    pub(crate) state: Shared<C>,
    pub(crate) faults: Arc<FaultLayer>,
    server: Server,
}

impl<C: Cloud> Emulator<C> {
    /// Serves `cloud` on a free port with the fault layer from the environment.
    pub(crate) fn serve(mut cloud: C) -> std::io::Result<Self> {
        cloud.knobs().deleting_polls = DELETING_POLLS;
        let state: Shared<C> = Arc::new(Mutex::new(cloud));
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
}

impl<C: Cloud> IbmEmulator for Emulator<C> {
    fn with_knobs<R>(&self, change: impl FnOnce(&mut Knobs) -> R) -> R {
        change(lock(&self.state).knobs())
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
        C::create_vm(self, name, tags)
    }

    fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        lock(&self.state).vm_or_parts_exist(instance_id)
    }

    fn fault_layer(&self) -> &FaultLayer {
        &self.faults
    }
}

async fn handle<C: Cloud>(
    State((state, faults)): State<(Shared<C>, Arc<FaultLayer>)>,
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
            &fixture(C::TOO_MANY_REQUESTS),
            &fixture(C::INTERNAL),
        )
        .await
        {
            return fault;
        }
        if let Some(polls) = faults.operation_polls() {
            lock(&state).knobs().deleting_polls = polls;
        }
    }
    let mut state = lock(&state);
    if iam {
        return iam_token(state.knobs(), &body);
    }
    let query = url_decode_form(uri.query().unwrap_or_default().as_bytes());
    let route = C::route_name(&method, &path);
    if let Some(fault) = injected(
        state.knobs(),
        &route,
        request_line(&method, &uri),
        &fixture(C::TOO_MANY_REQUESTS),
        &fixture(C::INTERNAL),
    ) {
        return fault;
    }
    if !authorized(state.knobs(), &headers) {
        return answer(StatusCode::UNAUTHORIZED, &fixture(C::UNAUTHORIZED));
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
    state.serve(&request, &faults)
}
