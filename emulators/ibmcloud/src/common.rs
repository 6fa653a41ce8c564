//! What both emulators share: the server thread, IAM's token endpoint, Global Tagging, the
//! fault-injection knobs and the request counter.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use axum::Router;
use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};
use test_support::faults::{Fault, FaultLayer};

/// The API key the emulators accept.
pub const API_KEY: &str = "emulated-ibmcloud-api-key-7f3a9c2e";
/// The account every token and CRN belongs to.
pub const ACCOUNT_ID: &str = "aa2432b1fa4d4ace891e9b80fc104e34";

pub const IAM_TOKEN: &str = include_str!("../fixtures/iam_token.json");
pub const IAM_API_KEY_NOT_FOUND: &str =
    include_str!("../fixtures/iam_error_api_key_not_found.json");
pub const TAG_LIST: &str = include_str!("../fixtures/tagging_tag_list.json");

/// A fixture as JSON (fixtures are checked by this crate's tests, so they parse).
pub fn fixture(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Faults to inject into the next cloud API calls (IAM excluded), and what was asked.
#[derive(Default)]
pub struct Knobs {
    pub throttle_next: u32,
    pub retry_after_seconds: u64,
    pub fail_next: u32,
    pub reject_api_key: bool,
    /// How many GETs an instance still shows after its DELETE was accepted (VPC: as
    /// `deleting`; Power: still listed); the fault layer's operation polls set it too.
    pub deleting_polls: u32,
    pub revoke_issued_tokens: bool,
    pub requests: u64,
    pub requests_by_route: BTreeMap<String, u64>,
    pub token_seq: u64,
    /// The trusted profile IAM lets assume, and the compute-resource token it accepts for it.
    pub trusted_profile: Option<(String, String)>,
    /// Every request received, as `METHOD /path?query`, in order (IAM included).
    pub log: Vec<String>,
    /// Bodies to answer verbatim, by route, each once and in order (see
    /// [`IbmEmulator::answer_next_verbatim`]).
    pub verbatim: BTreeMap<String, VecDeque<(StatusCode, String)>>,
}

/// The fault and IAM knobs every IBM Cloud emulator offers, written once.
pub trait IbmEmulator {
    /// Runs `change` on this emulator's knobs.
    fn with_knobs<R>(&self, change: impl FnOnce(&mut Knobs) -> R) -> R;

    /// The next `calls` cloud API calls answer 429 with `Retry-After: retry_after_seconds`.
    fn throttle_next(&self, calls: u32, retry_after_seconds: u64) {
        self.with_knobs(|k| {
            k.throttle_next = calls;
            k.retry_after_seconds = retry_after_seconds;
        });
    }

    /// The next `calls` cloud API calls answer 503.
    fn fail_next(&self, calls: u32) {
        self.with_knobs(|k| k.fail_next = calls);
    }

    /// How many GETs an instance still shows after its DELETE (default 2).
    fn set_deleting_polls(&self, polls: u32) {
        self.with_knobs(|k| k.deleting_polls = polls);
    }

    /// IAM refuses the API key (as it does a deleted one) while `reject` is set.
    fn reject_api_key(&self, reject: bool) {
        self.with_knobs(|k| k.reject_api_key = reject);
    }

    /// Every token issued so far is refused (401) until IAM issues a new one.
    fn revoke_tokens(&self) {
        self.with_knobs(|k| k.revoke_issued_tokens = true);
    }

    /// Requests received so far (IAM included).
    fn requests(&self) -> u64 {
        self.with_knobs(|k| k.requests)
    }

    /// Requests received so far for one route, e.g. `DELETE /v1/instances/{id}`.
    fn requests_to(&self, route: &str) -> u64 {
        self.with_knobs(|k| k.requests_by_route.get(route).copied().unwrap_or(0))
    }

    /// Every request received so far, as `METHOD /path?query`, in order.
    fn request_log(&self) -> Vec<String> {
        self.with_knobs(|k| k.log.clone())
    }

    /// The next authorized request to `route` (e.g. `GET /v1/instances`) is answered with
    /// `status` and exactly `body`, whatever the emulated account holds: the way to feed a
    /// response example of IBM's reference through a backend's real client code.
    fn answer_next_verbatim(&self, route: &str, status: u16, body: &str) {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::OK);
        self.with_knobs(|k| {
            k.verbatim
                .entry(route.to_owned())
                .or_default()
                .push_back((status, body.to_owned()))
        });
    }
}

/// A backend's configuration against an emulator: `CLOUD_PROVIDER` and the API key, the
/// cloud's own `endpoints` (endpoints, zone, workspace), and short retry and deletion waits.
pub fn provider_config(provider: &str, endpoints: Vec<(&str, String)>) -> Vec<(String, String)> {
    [
        ("CLOUD_PROVIDER", provider.to_owned()),
        ("IBMCLOUD_API_KEY", API_KEY.to_owned()),
    ]
    .into_iter()
    .chain(endpoints)
    .chain([
        ("IBMCLOUD_API_RETRY_BACKOFF_MS", "10".to_owned()),
        ("IBMCLOUD_DELETE_POLL_MS", "10".to_owned()),
        ("IBMCLOUD_DELETE_TIMEOUT_SECONDS", "10".to_owned()),
    ])
    .map(|(k, v)| (k.to_owned(), v))
    .collect()
}

/// The verbatim answer queued for `route`, if any (taken).
pub fn verbatim(knobs: &mut Knobs, route: &str) -> Option<Response> {
    let (status, body) = knobs.verbatim.get_mut(route)?.pop_front()?;
    Some(
        (
            status,
            [("content-type", HeaderValue::from_static("application/json"))],
            body,
        )
            .into_response(),
    )
}

/// `METHOD /path?query` of a request, for the request log.
pub fn request_line(method: &axum::http::Method, uri: &axum::http::Uri) -> String {
    match uri.query() {
        Some(query) => format!("{method} {}?{query}", uri.path()),
        None => format!("{method} {}", uri.path()),
    }
}

/// A JSON answer.
pub fn answer(status: StatusCode, body: &Value) -> Response {
    (
        status,
        [("content-type", HeaderValue::from_static("application/json"))],
        body.to_string(),
    )
        .into_response()
}

pub fn no_content() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

/// Counts and logs the request (`line`: see [`request_line`]) and answers an injected fault if
/// one is due.
pub fn injected(
    knobs: &mut Knobs,
    route: &str,
    line: String,
    throttled: &Value,
    failed: &Value,
) -> Option<Response> {
    knobs.requests += 1;
    knobs.log.push(line);
    *knobs.requests_by_route.entry(route.to_owned()).or_default() += 1;
    if knobs.fail_next > 0 {
        knobs.fail_next -= 1;
        return Some(answer(StatusCode::SERVICE_UNAVAILABLE, failed));
    }
    if knobs.throttle_next > 0 {
        knobs.throttle_next -= 1;
        let mut response = answer(StatusCode::TOO_MANY_REQUESTS, throttled);
        if let Ok(value) = HeaderValue::from_str(&knobs.retry_after_seconds.to_string()) {
            response.headers_mut().insert("retry-after", value);
        }
        return Some(response);
    }
    None
}

/// The fault layer's answer for one cloud API request (IAM is spared), after its latency or
/// hang: the cloud's throttling answer (429 `too_many_requests`, `Retry-After: 1`) or its 5xx
/// (503), or `None` to serve the request.
pub async fn layer_fault(
    faults: &FaultLayer,
    throttled: &Value,
    failed: &Value,
) -> Option<Response> {
    match faults.before_request().await {
        Fault::None => None,
        Fault::Throttled => {
            let mut response = answer(StatusCode::TOO_MANY_REQUESTS, throttled);
            response
                .headers_mut()
                .insert("retry-after", HeaderValue::from_static("1"));
            Some(response)
        }
        Fault::ServerError | Fault::Hang(_) => {
            Some(answer(StatusCode::SERVICE_UNAVAILABLE, failed))
        }
    }
}

/// Tokens IAM issued. IAM is one global service whose tokens every IBM Cloud API accepts, so the
/// emulators of one process share them: a provider-service serving both VPC and Power Virtual
/// Server through one IAM endpoint works against the two emulators as against IBM Cloud.
fn issued_tokens() -> std::sync::MutexGuard<'static, BTreeSet<String>> {
    static ISSUED: std::sync::OnceLock<std::sync::Mutex<BTreeSet<String>>> =
        std::sync::OnceLock::new();
    match ISSUED.get_or_init(Default::default).lock() {
        Ok(guard) => guard,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// Whether the request carries a bearer token IAM issued, unless this emulator revoked them.
pub fn authorized(knobs: &Knobs, headers: &HeaderMap) -> bool {
    let Some(token) = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    !knobs.revoke_issued_tokens && issued_tokens().contains(token)
}

/// `POST /identity/token`: the API key grant of IAM's identity token API.
pub fn iam_token(knobs: &mut Knobs, body: &Bytes) -> Response {
    knobs.requests += 1;
    knobs.log.push("POST /identity/token".into());
    *knobs
        .requests_by_route
        .entry("POST /identity/token".into())
        .or_default() += 1;
    let form: BTreeMap<String, String> = url_decode_form(body);
    let field = |name: &str| form.get(name).map(String::as_str);
    let accepted = match field("grant_type") {
        Some("urn:ibm:params:oauth:grant-type:apikey") => field("apikey") == Some(API_KEY),
        Some("urn:ibm:params:oauth:grant-type:cr-token") => knobs
            .trusted_profile
            .as_ref()
            .is_some_and(|(profile, token)| {
                field("profile_id") == Some(profile.as_str())
                    && field("cr_token") == Some(token.as_str())
            }),
        _ => {
            let mut error = fixture(IAM_API_KEY_NOT_FOUND);
            error["errorCode"] = json!("BXNIM0103E");
            error["errorMessage"] = json!("Unsupported grant type.");
            return answer(StatusCode::BAD_REQUEST, &error);
        }
    };
    if knobs.reject_api_key || !accepted {
        return answer(StatusCode::BAD_REQUEST, &fixture(IAM_API_KEY_NOT_FOUND));
    }
    // Unique across the emulators of the process, whose tokens are shared.
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    knobs.token_seq = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
    let now = jiff::Timestamp::now().as_second();
    let claims = json!({
        "iam_id": "iam-ServiceId-emulated",
        "id": "iam-ServiceId-emulated",
        "account": { "valid": true, "bss": ACCOUNT_ID },
        "iat": now,
        "exp": now + 3600,
        "jti": format!("token-{}", knobs.token_seq),
    });
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let token = format!(
        "{}.{}.{}",
        b64.encode(br#"{"kid":"20171030-00:00:00","alg":"RS256"}"#),
        b64.encode(claims.to_string()),
        b64.encode(format!("signature-{}", knobs.token_seq)),
    );
    knobs.revoke_issued_tokens = false;
    issued_tokens().insert(token.clone());
    let mut body = fixture(IAM_TOKEN);
    body["access_token"] = json!(token);
    body["expires_in"] = json!(3600);
    body["expiration"] = json!(now + 3600);
    answer(StatusCode::OK, &body)
}

/// `GET /v3/tags?attached_to=<crn>&tag_type=&offset=&limit=`: the Global Tagging API's tag
/// list. The emulated resources carry user tags only, and `tag_type` defaults to `user`.
pub fn tag_list(
    tags: &BTreeMap<String, Vec<String>>,
    query: &BTreeMap<String, String>,
) -> Response {
    let user_tags = query.get("tag_type").is_none_or(|t| t == "user");
    let names = query
        .get("attached_to")
        .and_then(|crn| tags.get(crn))
        .filter(|_| user_tags)
        .cloned()
        .unwrap_or_default();
    let offset: usize = query
        .get("offset")
        .and_then(|o| o.parse().ok())
        .unwrap_or(0);
    let limit: usize = query
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(100);
    let mut body = fixture(TAG_LIST);
    body["total_count"] = json!(names.len());
    body["offset"] = json!(offset);
    body["limit"] = json!(limit);
    body["items"] = names
        .iter()
        .skip(offset)
        .take(limit)
        .map(|name| json!({ "name": name }))
        .collect();
    answer(StatusCode::OK, &body)
}

/// `a=1&b=x%20y` → map (also used for query strings).
pub fn url_decode_form(body: &[u8]) -> BTreeMap<String, String> {
    form_urlencoded::parse(body).into_owned().collect()
}

/// An emulator's HTTP server: its own thread and tokio runtime, so it outlives any test's
/// runtime and works from sync code; dropping it stops it.
pub struct Server {
    pub addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    pub fn start(router: Router) -> std::io::Result<Server> {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("ibmcloud-emulator".into())
            .spawn(move || {
                let runtime = match tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(1)
                    .enable_all()
                    .build()
                {
                    Ok(runtime) => runtime,
                    Err(e) => {
                        let _ = addr_tx.send(Err(e));
                        return;
                    }
                };
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                        Ok(listener) => listener,
                        Err(e) => {
                            let _ = addr_tx.send(Err(e));
                            return;
                        }
                    };
                    let _ = addr_tx.send(listener.local_addr());
                    tokio::select! {
                        _ = axum::serve(listener, router) => {}
                        _ = stop_rx => {}
                    }
                });
            })?;
        let addr = addr_rx
            .recv()
            .map_err(|_| std::io::Error::other("emulator thread ended before listening"))??;
        Ok(Server {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Shared state behind both emulators' routers.
pub type Shared<T> = Arc<Mutex<T>>;

/// A deterministic UUID-shaped id from a counter and a salt (no randomness needed in tests).
pub fn uuid_like(seq: u64, salt: u32) -> String {
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        salt,
        (seq >> 32) & 0xffff,
        (seq >> 16) & 0xfff,
        salt & 0xfff,
        seq
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixtures_parse() {
        for text in [IAM_TOKEN, IAM_API_KEY_NOT_FOUND, TAG_LIST] {
            assert!(serde_json::from_str::<Value>(text).is_ok());
        }
    }

    #[test]
    fn forms_decode() {
        let form = url_decode_form(b"grant_type=urn%3Aibm%3Aparams&apikey=a+b%2F");
        assert_eq!(form["grant_type"], "urn:ibm:params");
        assert_eq!(form["apikey"], "a b/");
    }

    #[test]
    fn ids_look_like_uuids() {
        let id = uuid_like(7, 0xabc);
        assert_eq!(id.len(), 36);
        assert_eq!(id.split('-').count(), 5);
    }
}
