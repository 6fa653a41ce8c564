//! A fault layer between a test's Kubernetes client and the real API server of the local control
//! plane. It answers the scripted requests with what an API server answers under load or in an
//! outage, which a healthy control plane does not give on demand, and forwards every other request
//! to the real API server: every success, 404 and 409 (the resourceVersion precondition) is the
//! API server's own.
//!
//! The answers are the API server's own too:
//! - `Status` bodies shaped by k8s.io/apimachinery/pkg/api/errors (`NewTooManyRequests`,
//!   `NewServiceUnavailable`, `NewInternalError`, `NewTimeoutError`), with `Retry-After` set from
//!   `details.retryAfterSeconds` as the apiserver's response writer sets it;
//! - the flow-control filters' 429 (max-in-flight and API Priority and Fairness,
//!   k8s.io/apiserver/pkg/server/filters), which is plain text with only a `Retry-After` header.
//!
//! Nothing here is specific to the byom backend: it fits any test that gives a `kube::Client` to the
//! code under test.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use kube::client::Body;
use kube::{Client, Resource};
use serde_json::json;

/// What the API server answers instead of (or after) serving a request.
#[derive(Clone, Debug, PartialEq)]
pub enum Answer {
    /// The flow-control filters' 429: body `Too many requests, please try again later.` as plain
    /// text, the wait only in the `Retry-After` header.
    FlowControlThrottled { retry_after_seconds: u32 },
    /// `NewTooManyRequests(cause, retryAfterSeconds)`: a `Status` with reason `TooManyRequests`
    /// and the wait in `details.retryAfterSeconds` and in `Retry-After` (the watch cache answers
    /// this while it (re)initializes, with cause `storage is (re)initializing`).
    TooManyRequests {
        cause: String,
        retry_after_seconds: u32,
    },
    /// `NewServiceUnavailable(reason)`: 503, reason `ServiceUnavailable`.
    ServiceUnavailable,
    /// `NewInternalError(err)`: 500, reason `InternalError`, here with etcd's request timeout as
    /// the cause.
    InternalError,
    /// The request timeout filter's `NewTimeoutError(..., 0)`: 504, reason `Timeout`.
    Timeout,
}

impl Answer {
    /// The storage layer's throttling answer with a wait of `seconds`.
    pub fn too_many_requests(seconds: u32) -> Self {
        Answer::TooManyRequests {
            cause: "storage is (re)initializing".into(),
            retry_after_seconds: seconds,
        }
    }

    /// The HTTP response the API server writes for this answer.
    fn response(&self) -> Response<Body> {
        let (code, reason, message, details, retry_after) = match self {
            Answer::FlowControlThrottled {
                retry_after_seconds,
            } => {
                // http.Error: the text, a newline, text/plain; nosniff.
                let mut response = Response::new(Body::from(
                    b"Too many requests, please try again later.\n".to_vec(),
                ));
                *response.status_mut() = StatusCode::TOO_MANY_REQUESTS;
                let headers = response.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; charset=utf-8"),
                );
                headers.insert(
                    header::X_CONTENT_TYPE_OPTIONS,
                    HeaderValue::from_static("nosniff"),
                );
                headers.insert(header::RETRY_AFTER, HeaderValue::from(*retry_after_seconds));
                return response;
            }
            Answer::TooManyRequests {
                cause,
                retry_after_seconds,
            } => (
                StatusCode::TOO_MANY_REQUESTS,
                "TooManyRequests",
                format!("Too many requests: {cause}"),
                Some(json!({ "retryAfterSeconds": retry_after_seconds })),
                *retry_after_seconds,
            ),
            Answer::ServiceUnavailable => (
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                "the server is currently unable to handle the request".to_owned(),
                None,
                0,
            ),
            Answer::InternalError => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal error occurred: etcdserver: request timed out".to_owned(),
                Some(json!({ "causes": [{ "message": "etcdserver: request timed out" }] })),
                0,
            ),
            Answer::Timeout => (
                StatusCode::GATEWAY_TIMEOUT,
                "Timeout",
                "Timeout: request did not complete within requested timeout - context deadline \
                 exceeded"
                    .to_owned(),
                // retryAfterSeconds 0 is omitted: an empty details object.
                Some(json!({})),
                0,
            ),
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code.as_u16(),
        });
        if let Some(details) = details {
            status["details"] = details;
        }
        let mut response = Response::new(Body::from(status.to_string().into_bytes()));
        *response.status_mut() = code;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if retry_after > 0 {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(retry_after));
        }
        response
    }
}

/// When a scripted answer is given.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Moment {
    /// Instead of forwarding: the API server never saw the request.
    Instead,
    /// After the API server served the request: its effect stands, its answer is lost.
    AfterServing,
}

struct Fault {
    method: Method,
    path: String,
    remaining: usize,
    answer: Answer,
    moment: Moment,
}

/// One request that went through the layer.
#[derive(Clone, Debug, PartialEq)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    /// The HTTP status the client got; `None` when the API server could not be reached.
    pub status: Option<u16>,
    /// Whether the API server served the request (forwarded, with or without a scripted answer).
    pub served: bool,
}

/// (method, status, served by the API server) of each request, for readable assertions.
pub fn trace(seen: &[Seen]) -> Vec<(String, u16, bool)> {
    seen.iter()
        .map(|s| (s.method.to_string(), s.status.unwrap_or(0), s.served))
        .collect()
}

/// One entry of a [`trace`].
pub fn step(method: &str, status: u16, served: bool) -> (String, u16, bool) {
    (method.to_owned(), status, served)
}

#[derive(Default)]
struct Script {
    faults: Vec<Fault>,
    seen: Vec<Seen>,
}

/// A `tower::Service` for [`Client::new`]: scripted answers for matching requests, the real API
/// server (through `inner`) for the rest.
#[derive(Clone)]
pub struct ApiFaults {
    inner: Client,
    script: Arc<Mutex<Script>>,
}

/// The request path of the `K` object `name` in `namespace`, as the faults match it (no query).
pub fn object_path<K: Resource<DynamicType = ()>>(namespace: &str, name: &str) -> String {
    format!("{}/{name}", K::url_path(&(), Some(namespace)))
}

impl ApiFaults {
    /// Forwards to `inner` until a fault is scripted.
    pub fn new(inner: Client) -> Self {
        Self {
            inner,
            script: Arc::default(),
        }
    }

    /// A client through this layer, with `namespace` as its default namespace.
    pub fn client(&self, namespace: &str) -> Client {
        // The provider's own client stack over this layer, as over the API server's transport.
        peerpods_provider_byom::client_over(self.clone(), namespace)
    }

    /// The next `times` `method` requests to `path` are answered with `answer` and never reach the
    /// API server. Faults are used in the order they were scripted.
    pub fn fail_next(&self, method: Method, path: &str, times: usize, answer: Answer) {
        self.script(method, path, times, answer, Moment::Instead);
    }

    /// The next `times` `method` requests to `path` are served by the API server, and then answered
    /// with `answer` instead of the API server's answer (a write applied whose answer was lost).
    pub fn fail_next_after_serving(
        &self,
        method: Method,
        path: &str,
        times: usize,
        answer: Answer,
    ) {
        self.script(method, path, times, answer, Moment::AfterServing);
    }

    fn script(&self, method: Method, path: &str, times: usize, answer: Answer, moment: Moment) {
        self.lock().faults.push(Fault {
            method,
            path: path.to_owned(),
            remaining: times,
            answer,
            moment,
        });
    }

    /// Every request so far, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// How many requests went through the layer.
    pub fn requests(&self) -> usize {
        self.lock().seen.len()
    }

    /// How many requests the API server served.
    pub fn served(&self) -> usize {
        self.lock().seen.iter().filter(|s| s.served).count()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Script> {
        // A test that panicked while holding the lock has failed already: keep its script readable.
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The scripted fault due for this request, if any (used up by this call).
    fn due(&self, method: &Method, path: &str) -> Option<(Answer, Moment)> {
        let mut script = self.lock();
        let fault = script
            .faults
            .iter_mut()
            .find(|f| f.remaining > 0 && f.method == method && f.path == path)?;
        fault.remaining -= 1;
        Some((fault.answer.clone(), fault.moment))
    }

    fn record(&self, method: Method, path: String, status: Option<u16>, served: bool) {
        self.lock().seen.push(Seen {
            method,
            path,
            status,
            served,
        });
    }
}

impl tower::Service<Request<Body>> for ApiFaults {
    type Response = Response<Body>;
    type Error = kube::Error;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, kube::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<Body>) -> Self::Future {
        let method = request.method().clone();
        let path = request.uri().path().to_owned();
        let due = self.due(&method, &path);
        let layer = self.clone();
        Box::pin(async move {
            if let Some((answer, Moment::Instead)) = &due {
                let response = answer.response();
                layer.record(method, path, Some(response.status().as_u16()), false);
                return Ok(response);
            }
            let served = layer.inner.send(request).await;
            match (served, due) {
                (Ok(_), Some((answer, _))) => {
                    let response = answer.response();
                    layer.record(method, path, Some(response.status().as_u16()), true);
                    Ok(response)
                }
                (Ok(response), None) => {
                    layer.record(method, path, Some(response.status().as_u16()), true);
                    Ok(response)
                }
                (Err(error), _) => {
                    layer.record(method, path, None, false);
                    Err(error)
                }
            }
        })
    }
}
