//! A scripted stand-in for the Kubernetes API, for the answers a real control plane does not give
//! on demand (429 with Retry-After, 5xx). It serves the two calls the backend makes, GET and PUT of
//! one ConfigMap, with the apiserver's semantics (resourceVersion precondition → 409) and its
//! `Status` error bodies (shapes of k8s.io/apimachinery/pkg/api/errors: NewNotFound, NewConflict,
//! NewTooManyRequests, NewServiceUnavailable, NewInternalError).

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};

#[derive(Default)]
struct Inner {
    configmap: Option<Value>,
    resource_version: u64,
    failures: VecDeque<(StatusCode, Option<u64>)>,
    update_failures: VecDeque<(StatusCode, Option<u64>)>,
    requests: usize,
}

#[derive(Clone, Default)]
pub struct FakeApiserver {
    inner: Arc<Mutex<Inner>>,
    addr: Option<SocketAddr>,
}

impl FakeApiserver {
    /// Serves on 127.0.0.1 (a free port) from the current tokio runtime, holding ConfigMap
    /// `ns/name` with `data` as its data.
    pub async fn start(ns: &str, name: &str, data: Value) -> FakeApiserver {
        let mut fake = FakeApiserver::default();
        {
            let mut inner = fake.inner.lock().expect("fake state");
            inner.resource_version = 1;
            inner.configmap = Some(json!({
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": ns, "resourceVersion": "1"},
                "data": data,
            }));
        }
        let app = Router::new()
            .route(
                "/api/v1/namespaces/{ns}/configmaps/{name}",
                get(get_configmap).put(put_configmap),
            )
            .with_state(fake.inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        fake.addr = Some(listener.local_addr().expect("address"));
        tokio::spawn(async move { axum::serve(listener, app).await });
        fake
    }

    /// A client configuration that reaches this server.
    pub fn kube_config(&self) -> kube::Config {
        let url = format!("http://{}", self.addr.expect("started"));
        kube::Config::new(url.parse().expect("URL"))
    }

    /// The next `count` requests fail with `status` (and `Retry-After: seconds` when given).
    pub fn fail_next(&self, count: usize, status: StatusCode, retry_after: Option<u64>) {
        let mut inner = self.inner.lock().expect("fake state");
        inner
            .failures
            .extend(std::iter::repeat_n((status, retry_after), count));
    }

    /// The next `count` updates (PUT) fail with `status`; reads pass.
    pub fn fail_next_updates(&self, count: usize, status: StatusCode) {
        let mut inner = self.inner.lock().expect("fake state");
        inner
            .update_failures
            .extend(std::iter::repeat_n((status, None), count));
    }

    pub fn requests(&self) -> usize {
        self.inner.lock().expect("fake state").requests
    }

    pub fn data(&self) -> Value {
        let inner = self.inner.lock().expect("fake state");
        inner
            .configmap
            .as_ref()
            .map(|c| c["data"].clone())
            .unwrap_or(Value::Null)
    }
}

fn status(code: StatusCode, reason: &str, message: String, details: Value) -> Response {
    let body = json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "details": details,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

/// The scripted failure for this request, if one is due.
fn scripted(inner: &mut Inner, name: &str, update: bool) -> Option<Response> {
    inner.requests += 1;
    let due = if update {
        inner.update_failures.pop_front()
    } else {
        None
    };
    let (code, retry_after) = due.or_else(|| inner.failures.pop_front())?;
    let mut response = match code {
        StatusCode::TOO_MANY_REQUESTS => status(
            code,
            "TooManyRequests",
            "Too many requests, please try again later.".into(),
            json!({"retryAfterSeconds": retry_after.unwrap_or(0)}),
        ),
        StatusCode::SERVICE_UNAVAILABLE => status(
            code,
            "ServiceUnavailable",
            "the server is currently unable to handle the request".into(),
            json!({}),
        ),
        _ => status(
            code,
            "InternalError",
            format!("Internal error occurred: etcd timeout reading configmaps {name}"),
            json!({"causes": [{"message": "etcd timeout"}]}),
        ),
    };
    if let Some(seconds) = retry_after {
        response
            .headers_mut()
            .insert("Retry-After", HeaderValue::from(seconds));
    }
    Some(response)
}

async fn get_configmap(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((_ns, name)): Path<(String, String)>,
) -> Response {
    let mut inner = inner.lock().expect("fake state");
    if let Some(failure) = scripted(&mut inner, &name, false) {
        return failure;
    }
    match &inner.configmap {
        Some(configmap) if configmap["metadata"]["name"] == name.as_str() => {
            axum::Json(configmap.clone()).into_response()
        }
        _ => not_found(&name),
    }
}

async fn put_configmap(
    State(inner): State<Arc<Mutex<Inner>>>,
    Path((_ns, name)): Path<(String, String)>,
    _headers: HeaderMap,
    axum::Json(mut body): axum::Json<Value>,
) -> Response {
    let mut inner = inner.lock().expect("fake state");
    if let Some(failure) = scripted(&mut inner, &name, true) {
        return failure;
    }
    let current = inner.resource_version.to_string();
    if inner.configmap.is_none() {
        return not_found(&name);
    }
    if body["metadata"]["resourceVersion"] != current.as_str() {
        return status(
            StatusCode::CONFLICT,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on configmaps \"{name}\": the object has been \
                 modified; please apply your changes to the latest version and try again"
            ),
            json!({"name": name, "kind": "configmaps"}),
        );
    }
    inner.resource_version += 1;
    body["metadata"]["resourceVersion"] = json!(inner.resource_version.to_string());
    inner.configmap = Some(body.clone());
    axum::Json(body).into_response()
}

fn not_found(name: &str) -> Response {
    status(
        StatusCode::NOT_FOUND,
        "NotFound",
        format!("configmaps \"{name}\" not found"),
        json!({"name": name, "kind": "configmaps"}),
    )
}
