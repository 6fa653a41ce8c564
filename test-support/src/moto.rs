//! moto, the EC2 emulator from PyPI, for the tests of any crate: one server per test binary, on
//! 127.0.0.1 and a port the OS picks, and helpers that drive it with the real AWS SDK. The bench
//! starts servers of its own ([`Moto::start`]); a moto that cannot be started is an error saying how
//! to install it ([`shared`]), a panic only for the tests ([`moto`]).
//!
//! moto runs inside a small Python wrapper that reads its stdin until EOF and then stops the
//! server. The test process holds the write end of that pipe for its whole life, so the server
//! goes away whenever the test binary ends, also when it panics or is killed.
//!
//! The wrapper serves moto's own WSGI application behind a fault layer, which also counts the EC2
//! calls by the access key that signed them (the bench's cloud-call figures): what moto never
//! does, EC2 does, and [`Faults`] turns it on. EC2's
//! eventual consistency (`InvalidInstanceID.NotFound` for given ids, or during an instance's first
//! seconds after `RunInstances`, to each kind of call on its own: a call naming it, a filtered
//! `DescribeInstances` that leaves it out, a `TerminateInstances`; or flapping between answers),
//! server errors and throttling at a rate, each answered with EC2's own XML error body. Off unless
//! set; [`Moto::reset`] turns it off again.
#![allow(clippy::unwrap_used)] // test support: a failed setup ends the test with its message

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};

pub use crate::faults::{CallKind, Flapping, Visibility};

pub const ACCESS_KEY_ID: &str = "AKIDTESTPEERPODS";
/// Dummy, but treated as a secret by the provider: tests check it never shows up in errors.
pub const SECRET_ACCESS_KEY: &str = "test-secret-9f8e7d6c5b4a";
pub const REGION: &str = "us-east-1";
/// An AMI that moto knows in every region.
pub const IMAGE_ID: &str = "ami-12c6146b";

/// moto's server application behind the fault layer, served as moto's ThreadedMotoServer serves
/// it, for `python -c`: prints its port on the first line of stdout, stops at EOF on stdin.
/// `POST /peerpods-faults` (JSON, see [`Faults`]) sets the faults and answers what was injected
/// so far, `GET` only answers; `GET /peerpods-requests` answers the EC2 calls received so far
/// (faulted ones included) as `{access key: {action: count}}`; `POST /moto-api/reset` also
/// clears faults and counts. A harness of its own runs it through [`Moto::start`].
pub const WRAPPER: &str = r#"
import collections, io, json, random, re, sys, threading, time, urllib.parse, uuid
import xml.etree.ElementTree as ElementTree
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

lock = threading.Lock()
faults = {}
created = {}
injected = collections.Counter()
flaps = collections.Counter()
requests = collections.defaultdict(collections.Counter)
rng = random.Random(0)
credential = re.compile(r"Credential=([^/]+)/")
launched = re.compile(rb"<instanceId>(i-[0-9a-f]+)</instanceId>")
instance_param = re.compile(r"InstanceId\.\d+")

def answer(start_response, status, content_type, body):
    start_response(status, [("Content-Type", content_type), ("Content-Length", str(len(body)))])
    return [body]

def ec2_error(start_response, status, code, message):
    # EC2's error body (EC2 API reference, "Error codes"): Response/Errors/Error + RequestID.
    body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>%s</Code>'
            '<Message>%s</Message></Error></Errors><RequestID>%s</RequestID></Response>'
            % (code, message, uuid.uuid4())).encode()
    return answer(start_response, status, "text/xml;charset=UTF-8", body)

def not_found_message(ids):
    if len(ids) == 1:
        return "The instance ID '%s' does not exist" % ids[0]
    return "The instance IDs '%s' do not exist" % ", ".join(ids)

def hides(instance, kind, now):
    # Whether a call of kind ("get", "list" or "delete") does not see the instance: launched
    # less than the kind's window ago, or a flapping answer drawn not found (the draw repeats
    # with the seed, the id and the answers about it before). Called with the lock held.
    at = created.get(instance)
    if at is None:
        return False
    age = now - at
    window = max(faults.get("invisible_for_secs", 0), faults.get("invisible", {}).get(kind, 0))
    if age < window:
        return True
    flapping = faults.get("flapping") or {}
    bound, answers = flapping.get("window_secs", 0), flapping.get("answers", 0)
    if kind not in flapping.get("kinds", ()) or flapping.get("miss_rate", 0) <= 0:
        return False
    if (not bound and not answers) or (bound and age >= bound) or (answers and flaps[instance] >= answers):
        return False
    count = flaps[instance]
    flaps[instance] += 1
    draw = random.Random("%s:%s:%d" % (faults.get("seed", 0), instance, count)).random()
    return draw < flapping["miss_rate"]

def lists_hide():
    # Whether a list (DescribeInstances without InstanceId.N) may leave instances out.
    flapping = faults.get("flapping") or {}
    return (faults.get("invisible_for_secs", 0) > 0 or faults.get("invisible", {}).get("list", 0) > 0
            or "list" in flapping.get("kinds", ()))

def without_hidden(text):
    # The DescribeInstances answer without the instances a list does not see (counted), and
    # without reservations left empty, as EC2 lists them.
    root = ElementTree.fromstring(text)
    namespace = root.tag[1:].partition("}")[0] if root.tag.startswith("{") else ""
    name = lambda tag: "{%s}%s" % (namespace, tag) if namespace else tag
    reservations = root.find(name("reservationSet"))
    if reservations is None:
        return text
    now, changed = time.monotonic(), False
    with lock:
        for reservation in list(reservations):
            instances = reservation.find(name("instancesSet"))
            if instances is None:
                continue
            for item in list(instances):
                instance = item.findtext(name("instanceId"))
                if instance and hides(instance, "list", now):
                    instances.remove(item)
                    injected["not_found"] += 1
                    changed = True
            if len(instances) == 0:
                reservations.remove(reservation)
    if not changed:
        return text
    ElementTree.register_namespace("", namespace)
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + ElementTree.tostring(root)

def fault_for(action, key, ids):
    # (seconds to wait first, the fault to answer or None)
    with lock:
        if not action or faults.get("access_key") not in (None, key):
            return 0, None
        delay = faults.get("latency_secs", 0)
        if rng.random() < faults.get("throttle_rate", 0):
            injected["throttled"] += 1
            return delay, ("503 Service Unavailable", "RequestLimitExceeded", "Request limit exceeded.")
        if rng.random() < faults.get("server_error_rate", 0):
            injected["server_error"] += 1
            return delay, ("500 Internal Server Error", "InternalError", "An internal error has occurred.")
        if faults.get("hang_rate", 0) and rng.random() < faults["hang_rate"]:
            # Held far past any client deadline, then EC2's overload answer.
            injected["hang"] += 1
            return delay + faults.get("hang_secs", 600), ("503 Service Unavailable", "Unavailable",
                "The server is overloaded and can't handle the request.")
        refusal = faults.get("refuse")
        if refusal and refusal.get("action") == action and refusal.get("times", 0) > 0:
            refusal["times"] -= 1
            injected["refused"] += 1
            message = refusal["message"].replace("{id}", ids[0] if ids else "")
            return delay, (refusal["status"], refusal["code"], message)
        hidden = set(faults.get("hidden_ids", ()))
        kind = "delete" if action == "TerminateInstances" else "get"
        now = time.monotonic()
        unknown = [i for i in ids if i in hidden or hides(i, kind, now)]
        if unknown:
            injected["not_found"] += 1
            return delay, ("400 Bad Request", "InvalidInstanceID.NotFound", not_found_message(unknown))
    return delay, None

def faulty(app):
    def handle(environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        path = environ.get("PATH_INFO", "")
        if path == "/peerpods-faults":
            with lock:
                if environ.get("REQUEST_METHOD") == "POST":
                    faults.clear()
                    faults.update(json.loads(body or b"{}"))
                    rng.seed(faults.get("seed", 0))
                    injected.clear()
                    flaps.clear()
                text = json.dumps(dict(injected)).encode()
            return answer(start_response, "200 OK", "application/json", text)
        if path == "/peerpods-requests":
            with lock:
                text = json.dumps(requests).encode()
            return answer(start_response, "200 OK", "application/json", text)
        if path == "/moto-api/reset":
            with lock:
                faults.clear()
                created.clear()
                injected.clear()
                flaps.clear()
                requests.clear()
            return app(environ, start_response)
        query = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        query.update(urllib.parse.parse_qs(environ.get("QUERY_STRING", "")))
        action = query.get("Action", [""])[0]
        key = credential.search(environ.get("HTTP_AUTHORIZATION", ""))
        ids = [values[0] for name, values in sorted(query.items()) if instance_param.fullmatch(name)]
        key = key.group(1) if key else "-"
        if action:
            with lock:
                requests[key][action] += 1
        delay, fault = fault_for(action, key, ids)
        if delay:
            time.sleep(delay)
        if fault:
            return ec2_error(start_response, *fault)
        with lock:
            listing = (action == "DescribeInstances" and not ids and lists_hide()
                       and faults.get("access_key") in (None, key))
        if action != "RunInstances" and not listing:
            return app(environ, start_response)
        started = {}
        def keep(status, headers, exc_info=None):
            started["status"], started["headers"] = status, headers
        text = b"".join(app(environ, keep))
        if action == "RunInstances":
            # Remember when each instance was launched: it may be unknown for its first seconds.
            with lock:
                for instance in launched.findall(text):
                    created[instance.decode()] = time.monotonic()
        elif started["status"].startswith("200"):
            # A list (a filtered DescribeInstances) leaves out the instances it does not see.
            text = without_hidden(text)
        headers = [(k, v) for k, v in started["headers"] if k.lower() != "content-length"]
        start_response(started["status"], headers + [("Content-Length", str(len(text)))])
        return [text]
    return handle

server = make_server("127.0.0.1", 0, faulty(DomainDispatcherApplication(create_backend_app)), threaded=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_port, flush=True)
sys.stdin.read()
server.shutdown()
"#;

/// What EC2 does and moto does not, for the layer in front of moto to answer instead of it.
/// Faults apply to EC2 calls (requests with an `Action`), after the latency, in this order:
/// throttling, server errors, hangs, unknown instances; a request they spare reaches moto, and a
/// list's answer then leaves out the instances the list does not see.
///
/// The kinds of call ([`CallKind`]) of EC2: `get` is any call naming the instance as
/// `InstanceId.N` but `TerminateInstances` (e.g. `DescribeInstances` by ids), answered
/// `InvalidInstanceID.NotFound` (HTTP 400) naming the ids it does not see; `delete` is
/// `TerminateInstances`, answered the same; `list` is a `DescribeInstances` without
/// `InstanceId.N` (with `Filter.N`, e.g. `instance-id` or `tag:...`, or none), whose answer leaves
/// the instance out (and a reservation left empty). Each instance left out is counted in
/// `not_found`; a call naming ids counts once.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// Instance ids EC2 answers `InvalidInstanceID.NotFound` for (HTTP 400), in any call that
    /// names them as `InstanceId.N`, whether moto knows them or not. Lists still show them.
    pub hidden_ids: Vec<String>,
    /// EC2's eventual consistency: an instance launched through this server less than this long
    /// ago is unknown to every kind of call ([`Visibility::all`] of it, added to `invisible`).
    pub invisible_after_launch: Duration,
    /// How long after its launch each kind of call does not see an instance (the longer of this
    /// and `invisible_after_launch` holds for each kind).
    pub invisible: Visibility,
    /// Answers that disagree between calls, drawn from `seed` as the emulators' fault layer
    /// draws them ([`Flapping`]).
    pub flapping: Flapping,
    /// Share of calls (0 to 1) answered HTTP 500 `InternalError`.
    pub server_error_rate: f64,
    /// Share of calls (0 to 1) answered HTTP 503 `RequestLimitExceeded`, as EC2 throttles.
    pub throttle_rate: f64,
    /// Added to every faultable call before it is answered (or faulted).
    pub latency: Duration,
    /// Share of calls (0 to 1) that hang: held for `hang_for` (zero: 600 s), then answered HTTP
    /// 503 `Unavailable`, long after any client deadline.
    pub hang_rate: f64,
    pub hang_for: Duration,
    /// Only calls signed with this access key id get faults (the test's own arranging and
    /// checking, signed with another key, are spared); `None`: every call.
    pub access_key: Option<String>,
    /// Seed of the rates' random draws, so a run can be repeated.
    pub seed: u64,
    /// One of EC2's documented error answers for the next calls of one action (after the
    /// throttling, server-error and hang draws, before unknown instances).
    pub refuse: Option<Ec2Refusal>,
}

/// An EC2 error answer (EC2 API reference, "Error codes") for the next `times` calls of
/// `action`, with EC2's XML error body. `{id}` in `message` becomes the call's first
/// `InstanceId.N`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ec2Refusal {
    pub action: String,
    pub times: u32,
    /// The HTTP status line, e.g. `400 Bad Request`.
    pub status: String,
    pub code: String,
    pub message: String,
}

impl Ec2Refusal {
    /// `IncorrectInstanceState` (400): "The instance is in an incorrect state for the requested
    /// operation", e.g. a `TerminateInstances` of an instance in a transition.
    pub fn incorrect_instance_state(action: &str, times: u32) -> Self {
        Ec2Refusal {
            action: action.to_owned(),
            times,
            status: "400 Bad Request".to_owned(),
            code: "IncorrectInstanceState".to_owned(),
            message: "The instance '{id}' is not in a state from which it can be terminated."
                .to_owned(),
        }
    }

    /// `RequestLimitExceeded` (503): EC2's throttling of an account's API requests.
    pub fn request_limit_exceeded(action: &str, times: u32) -> Self {
        Ec2Refusal {
            action: action.to_owned(),
            times,
            status: "503 Service Unavailable".to_owned(),
            code: "RequestLimitExceeded".to_owned(),
            message: "Request limit exceeded.".to_owned(),
        }
    }
}

/// How many faults the layer answered since they were set.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Injected {
    pub not_found: u64,
    pub server_errors: u64,
    pub throttled: u64,
    pub hangs: u64,
    /// Answers of [`Faults::refuse`].
    pub refused: u64,
}

pub struct Moto {
    pub endpoint: String,
    port: u16,
    // Held, never used: closing it (at process exit) stops the server.
    _stdin: Mutex<ChildStdin>,
    _child: Mutex<Child>,
}

/// The Python interpreter of the venv that `make test` installs moto into.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("MOTO_PYTHON") {
        return PathBuf::from(python);
    }
    // This crate sits at the repository's top level, beside `.tools/`.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/bin/python")
}

/// The moto server of this test binary, shared by its tests. Panics when moto cannot be started, with
/// [`shared`]'s error (how to install it): for tests.
pub fn moto() -> &'static Moto {
    shared(&[]).unwrap_or_else(|e| panic!("{e}"))
}

/// A moto server of its own, with `env` set for it: for a test that needs a server-wide setting (e.g.
/// request authentication) without imposing it on the binary's other tests. It stops when dropped.
/// Panics when moto cannot be started (with how to install it): for tests.
pub fn moto_with_env(env: &[(&str, &str)]) -> Moto {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let log_path = std::env::temp_dir().join(format!("moto-{}-own-{n}.log", std::process::id()));
    Moto::start(&python(), &log_path, env).unwrap_or_else(|e| panic!("{e}"))
}

/// The moto server of this process, started on first use with `env` set for it (the Python of
/// `MOTO_PYTHON`, else the venv `make moto` fills), or why it could not be started. A failed start is
/// not retried: every later caller gets the same error.
pub fn shared(env: &[(&str, &str)]) -> Result<&'static Moto, &'static crate::Error> {
    static MOTO: OnceLock<Result<Moto, crate::Error>> = OnceLock::new();
    MOTO.get_or_init(|| {
        let log_path = std::env::temp_dir().join(format!("moto-{}.log", std::process::id()));
        Moto::start(&python(), &log_path, env)
    })
    .as_ref()
}

impl Moto {
    /// Starts a moto server of its own: `python` runs the wrapper with `env` set, its stderr goes to
    /// `log_path`. It stops when the returned `Moto` is dropped (the wrapper's stdin closes). A Python
    /// that cannot be run is [`crate::Error::MotoMissing`], which says how to install moto.
    pub fn start(
        python: &Path,
        log_path: &Path,
        env: &[(&str, &str)],
    ) -> Result<Moto, crate::Error> {
        let io = |context: &str| {
            let context = context.to_owned();
            move |source| crate::Error::Io { context, source }
        };
        let log = std::fs::File::create(log_path)
            .map_err(io(&format!("creating moto's log {}", log_path.display())))?;
        let mut child = Command::new(python)
            .args(["-c", WRAPPER])
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|source| crate::Error::MotoMissing {
                python: python.to_owned(),
                source,
            })?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(crate::Error::Io {
                context: "moto's pipes".to_owned(),
                source: std::io::Error::other("stdin or stdout not piped"),
            });
        };
        let mut first_line = String::new();
        BufReader::new(stdout)
            .read_line(&mut first_line)
            .map_err(io("reading moto's port"))?;
        let Ok(port) = first_line.trim().parse::<u16>() else {
            return Err(crate::Error::MotoStart {
                printed: first_line,
                log_path: log_path.to_owned(),
                log: std::fs::read_to_string(log_path).unwrap_or_default(),
            });
        };
        Ok(Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            port,
            _stdin: Mutex::new(stdin),
            _child: Mutex::new(child),
        })
    }
}

impl Moto {
    /// Forgets every resource (`POST /moto-api/reset`) and turns the faults off.
    pub fn reset(&self) {
        self.post("/moto-api/reset", "");
    }

    /// Sets the faults of the layer in front of moto (replacing earlier ones) and restarts the
    /// count of injected faults.
    pub fn set_faults(&self, faults: &Faults) {
        let body = serde_json::json!({
            "hidden_ids": faults.hidden_ids,
            "invisible_for_secs": faults.invisible_after_launch.as_secs_f64(),
            "invisible": {
                "get": faults.invisible.get.as_secs_f64(),
                "list": faults.invisible.list.as_secs_f64(),
                "delete": faults.invisible.delete.as_secs_f64(),
            },
            "flapping": {
                "kinds": faults.flapping.kinds.iter().map(|kind| kind.name()).collect::<Vec<_>>(),
                "window_secs": faults.flapping.window.as_secs_f64(),
                "answers": faults.flapping.answers,
                "miss_rate": faults.flapping.miss_rate,
            },
            "server_error_rate": faults.server_error_rate,
            "throttle_rate": faults.throttle_rate,
            "latency_secs": faults.latency.as_secs_f64(),
            "hang_rate": faults.hang_rate,
            "hang_secs": if faults.hang_for.is_zero() { 600.0 } else { faults.hang_for.as_secs_f64() },
            "access_key": faults.access_key,
            "seed": faults.seed,
            "refuse": faults.refuse.as_ref().map(|r| serde_json::json!({
                "action": r.action,
                "times": r.times,
                "status": r.status,
                "code": r.code,
                "message": r.message,
            })),
        });
        self.post("/peerpods-faults", &body.to_string());
    }

    /// The faults answered since they were last set.
    pub fn injected(&self) -> Injected {
        let answer = self.request("GET", "/peerpods-faults", "");
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let counts: serde_json::Value = serde_json::from_str(body).expect("fault counts");
        let count = |name: &str| counts[name].as_u64().unwrap_or(0);
        Injected {
            not_found: count("not_found"),
            server_errors: count("server_error"),
            throttled: count("throttled"),
            hangs: count("hang"),
            refused: count("refused"),
        }
    }

    /// EC2 calls received so far (every HTTP attempt, faulted ones included) signed with
    /// `access_key`, by action.
    pub fn requests_signed_by(&self, access_key: &str) -> BTreeMap<String, u64> {
        let answer = self.request("GET", "/peerpods-requests", "");
        let body = answer.split("\r\n\r\n").nth(1).unwrap_or_default();
        let mut by_key: BTreeMap<String, BTreeMap<String, u64>> =
            serde_json::from_str(body).expect("request counts");
        by_key.remove(access_key).unwrap_or_default()
    }

    /// One call of IAM's query API (`Action` and its parameters), unsigned, and the body of
    /// moto's 200 answer (panics on any other). Only for the first requests of a server started
    /// with `INITIAL_NO_AUTH_ACTION_COUNT`: moto neither authenticates nor authorizes those, and
    /// this is how a test creates the IAM users whose keys every later request must then carry.
    pub fn iam_unsigned(&self, params: &[(&str, &str)]) -> String {
        let body = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(params)
            .finish();
        // The credential scope names the service: moto routes the request to IAM by it.
        let headers = format!(
            "Authorization: AWS4-HMAC-SHA256 Credential=IAMSETUP/20260101/{REGION}/iam/aws4_request, \
             SignedHeaders=host, Signature=0\r\n"
        );
        let answer = self.request_with("POST", "/", &headers, FORM, &body);
        let (status, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
        assert!(status.contains(" 200 "), "IAM {params:?} failed: {answer}");
        body.to_owned()
    }

    fn post(&self, path: &str, body: &str) {
        let answer = self.request("POST", path, body);
        assert!(
            answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
            "POST {path} failed: {answer}"
        );
    }

    /// One request over a socket, the whole answer as text. Plain HTTP/1.0: these few control
    /// requests do not justify an HTTP client dependency.
    fn request(&self, method: &str, path: &str, body: &str) -> String {
        self.request_with(method, path, "", "application/json", body)
    }

    /// [`Moto::request`] with `headers` (each line ending in CRLF) and a content type of its own.
    fn request_with(
        &self,
        method: &str,
        path: &str,
        headers: &str,
        content_type: &str,
        body: &str,
    ) -> String {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("set timeout");
        let request = format!(
            "{method} {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n{headers}Content-Type: {content_type}\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).expect("send request");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("read answer");
        answer
    }

    /// provider-service configuration keys pointing at this server with dummy static credentials.
    pub fn config(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        config_for(&self.endpoint, extra)
    }

    /// A plain SDK client for arranging and inspecting moto's state.
    pub fn client(&self) -> aws_sdk_ec2::Client {
        self.client_as(ACCESS_KEY_ID, SECRET_ACCESS_KEY)
    }

    /// [`Moto::client`] signing with these keys (an IAM user's, where moto enforces IAM).
    pub fn client_as(&self, access_key_id: &str, secret_access_key: &str) -> aws_sdk_ec2::Client {
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .endpoint_url(&self.endpoint)
            .credentials_provider(Credentials::new(
                access_key_id,
                secret_access_key,
                None,
                None,
                "test",
            ))
            .http_client(
                aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https(),
            )
            .build();
        aws_sdk_ec2::Client::from_conf(config)
    }
}

const FORM: &str = "application/x-www-form-urlencoded";

/// provider-service configuration keys for the AWS provider against `endpoint`; `extra` adds or
/// overrides keys.
pub fn config_for(endpoint: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = [
        ("CLOUD_PROVIDER", "aws"),
        ("AWS_REGION", REGION),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
        ("AWS_ENDPOINT_URL", endpoint),
    ]
    .into_iter()
    .filter(|(key, _)| !extra.iter().any(|(k, _)| k == key))
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    pairs.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    pairs
}

/// Tests of one binary share one moto server; each takes this lock and resets moto first, so
/// no test sees another's instances.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// This test binary's moto to one test, emptied: the [`SERIAL`] guard (held for the whole test)
/// and a client for arranging and inspecting moto's state.
pub async fn alone() -> (tokio::sync::MutexGuard<'static, ()>, aws_sdk_ec2::Client) {
    let serial = SERIAL.lock().await;
    moto().reset();
    (serial, moto().client())
}

/// Launches `count` running instances with `tags` and returns their ids.
pub async fn run_instances(
    client: &aws_sdk_ec2::Client,
    count: i32,
    tags: &[(&str, &str)],
) -> Vec<String> {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut request = client
        .run_instances()
        .image_id(IMAGE_ID)
        .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
        .min_count(count)
        .max_count(count);
    if !tags.is_empty() {
        let mut spec = TagSpecification::builder().resource_type(ResourceType::Instance);
        for (key, value) in tags {
            spec = spec.tags(Tag::builder().key(*key).value(*value).build());
        }
        request = request.tag_specifications(spec.build());
    }
    let output = request.send().await.expect("RunInstances");
    output
        .instances()
        .iter()
        .map(|i| i.instance_id().expect("instance id").to_owned())
        .collect()
}

/// The state name of an instance as moto reports it now.
pub async fn state_of(client: &aws_sdk_ec2::Client, instance_id: &str) -> String {
    let output = client
        .describe_instances()
        .instance_ids(instance_id)
        .send()
        .await
        .expect("DescribeInstances");
    output
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find_map(|i| i.state()?.name().map(|n| n.as_str().to_owned()))
        .expect("instance state")
}

/// A well-formed id that no instance has (moto makes 17-digit ids from random hex).
pub fn unknown_id(n: usize) -> String {
    format!("i-{n:017x}")
}

/// A port on 127.0.0.1 where nothing listens.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn log_path(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("moto-{}-{name}.log", std::process::id()))
    }

    #[test]
    fn a_python_that_cannot_run_is_an_error_saying_how_to_install_moto() {
        let log = log_path("missing");
        let refused = Moto::start(Path::new("/nonexistent/venv/bin/python"), &log, &[]).err();
        let _ = std::fs::remove_file(&log);
        let Some(e @ crate::Error::MotoMissing { .. }) = refused else {
            panic!("not MotoMissing: {refused:?}");
        };
        assert!(
            e.to_string()
                .contains("`make moto` installs moto[ec2,server] into the venv"),
            "{e}"
        );
    }

    #[test]
    fn a_program_that_prints_no_port_is_an_error_naming_its_log() {
        let log = log_path("no-port");
        // Runs, ignores the wrapper and prints nothing.
        let refused = Moto::start(Path::new("true"), &log, &[]).err();
        let _ = std::fs::remove_file(&log);
        let Some(crate::Error::MotoStart {
            printed, log_path, ..
        }) = refused
        else {
            panic!("not MotoStart: {refused:?}");
        };
        assert_eq!(printed, "");
        assert_eq!(log_path, log);
    }
}
