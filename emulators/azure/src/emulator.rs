//! [`AzureEmulator`]: the HTTPS server on its own thread, the handler in front of the cloud's state, and what
//! a test makes it do.

use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use test_support::faults::{Fault, FaultLayer};
use tokio::sync::oneshot;

use crate::cloud::{
    ArmRefusal, CLIENT_ID, CLIENT_SECRET, Cloud, REGION, RESOURCE_GROUP, Reply, SUBSCRIPTION_ID,
    Seen, TENANT_ID, VmOptions, VmParts,
};
use crate::tls;

type Shared = Arc<Mutex<Cloud>>;

/// What the server's handler reaches: the cloud's state and the fault layer in front of it.
#[derive(Clone)]
struct Server {
    cloud: Shared,
    faults: Arc<FaultLayer>,
}

/// A running Azure emulator.
pub struct AzureEmulator {
    cloud: Shared,
    faults: Arc<FaultLayer>,
    endpoint: String,
    ca_pem: String,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl AzureEmulator {
    /// Starts the emulator on a free port of 127.0.0.1. Panics if it cannot (a test harness).
    pub fn start() -> Self {
        let certificates = tls::certificates().unwrap_or_else(|e| panic!("certificates: {e}"));
        let cloud: Shared = Arc::new(Mutex::new(Cloud::new(String::new())));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (shutdown_tx, shutdown_rx) = oneshot::channel::<()>();
        let faults = Arc::new(FaultLayer::from_env());
        let server = Server {
            cloud: Arc::clone(&cloud),
            faults: Arc::clone(&faults),
        };
        let server_config = Arc::clone(&certificates.server_config);
        let thread = std::thread::spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
            {
                Ok(runtime) => runtime,
                Err(e) => {
                    let _ = ready_tx.send(Err(e.to_string()));
                    return;
                }
            };
            runtime.block_on(async move {
                let tcp = match tokio::net::TcpListener::bind("127.0.0.1:0").await {
                    Ok(tcp) => tcp,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                let _ = ready_tx.send(tcp.local_addr().map_err(|e| e.to_string()));
                let listener = tls::TlsListener {
                    tcp,
                    acceptor: tokio_rustls::TlsAcceptor::from(server_config),
                };
                let app = axum::Router::new().fallback(serve).with_state(server);
                // No graceful shutdown: clients keep pooled connections open, and a test must
                // not hang on them. Dropping the runtime closes everything.
                tokio::select! {
                    _ = axum::serve(listener, app) => {}
                    _ = shutdown_rx => {}
                }
            });
        });
        let addr = ready_rx
            .recv()
            .unwrap_or_else(|e| panic!("emulator thread: {e}"))
            .unwrap_or_else(|e| panic!("emulator: {e}"));
        let endpoint = format!("https://{addr}");
        lock(&cloud).base = endpoint.clone();
        AzureEmulator {
            cloud,
            faults,
            endpoint,
            ca_pem: certificates.ca_pem,
            shutdown: Some(shutdown_tx),
            thread: Some(thread),
        }
    }

    /// The base URL of both the ARM endpoint and the Entra ID authority.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The PEM of the CA that signed the emulator's certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// Creates a VM with the given options; returns its ARM resource id. Its `timeCreated` is
    /// the fault layer's ([`FaultLayer::created`]): an hour ago, or now while a knob makes new
    /// VMs lag, or the knobs' `created_age` ago.
    pub fn create_vm_with(&self, name: &str, tags: &[(&str, &str)], options: VmOptions) -> String {
        let created = self.faults.created(&name.to_ascii_lowercase());
        lock(&self.cloud).create_vm(name, tags, options, created)
    }

    /// The names of the parts a VM was created with.
    pub fn parts_of(&self, name: &str) -> Option<VmParts> {
        lock(&self.cloud).parts_of(name)
    }

    /// Attaches managed disk `disk` (created if absent) to VM `vm` as a data disk with
    /// `delete_option`: `Detach` as the Azure Disk CSI driver attaches a persistent volume's
    /// disk, `Delete` for a disk that goes with the VM.
    pub fn attach_data_disk(&self, vm: &str, disk: &str, delete_option: &str) -> bool {
        lock(&self.cloud).attach_data_disk(vm, disk, delete_option)
    }

    /// Creates managed disk `name` with `tags`, attached to no VM (a disk left behind, or
    /// someone else's that happens to carry a VM's name).
    pub fn create_disk(&self, name: &str, tags: &[(&str, &str)]) {
        lock(&self.cloud).create_disk(name, tags);
    }

    /// Marks a VM as being deleted by someone else (provisioningState `Deleting`); it stays so
    /// for as many looks as [`Self::set_operation_polls`] says.
    pub fn start_deleting(&self, name: &str) -> bool {
        lock(&self.cloud).start_deleting(name)
    }

    pub fn vm_exists(&self, name: &str) -> bool {
        lock(&self.cloud).vm_exists(name)
    }

    pub fn network_interface_exists(&self, name: &str) -> bool {
        lock(&self.cloud).network_interface_exists(name)
    }

    pub fn public_ip_exists(&self, name: &str) -> bool {
        lock(&self.cloud).public_ip_exists(name)
    }

    pub fn disk_exists(&self, name: &str) -> bool {
        lock(&self.cloud).disk_exists(name)
    }

    /// The next `count` ARM requests are answered 429 with `Retry-After: retry_after_secs`.
    pub fn throttle_next(&self, count: u32, retry_after_secs: u64) {
        let mut cloud = lock(&self.cloud);
        cloud.knobs.throttle_next = count;
        cloud.knobs.throttle_retry_after = retry_after_secs;
    }

    /// The next `count` ARM requests are answered with `status` (a 5xx) and ARM's error body.
    pub fn fail_next(&self, count: u32, status: u16) {
        let mut cloud = lock(&self.cloud);
        cloud.knobs.fail_next = count;
        cloud.knobs.fail_status = status;
    }

    /// The next `count` ARM requests of `method` (e.g. `DELETE`) are answered with ARM's
    /// documented `refusal` (throttling or "another operation holds the resource"), its real
    /// status, body and headers.
    pub fn refuse_next(&self, method: &'static str, count: u32, refusal: ArmRefusal) {
        let mut cloud = lock(&self.cloud);
        cloud.knobs.refuse_next = count;
        cloud.knobs.refuse_method = method;
        cloud.knobs.refusal = Some(refusal);
    }

    /// The token endpoint refuses every credential (401 `invalid_client`).
    pub fn reject_credentials(&self, reject: bool) {
        lock(&self.cloud).knobs.reject_credentials = reject;
    }

    /// A VM deletion takes this many looks (polls of its operation or `GET`s of the VM, from
    /// any caller) before the VM is gone: until then its operation answers `InProgress` (with
    /// `Retry-After: retry_after_secs`) and the VM `provisioningState: Deleting`.
    pub fn set_operation_polls(&self, polls: u32, retry_after_secs: u64) {
        let mut cloud = lock(&self.cloud);
        cloud.knobs.polls_before_done = polls;
        cloud.knobs.poll_retry_after = retry_after_secs;
    }

    /// After a VM's deletion, ARM refuses this many deletions of its (`Detach`) interface with
    /// 400 `NicReservedForAnotherVm`, as it keeps an interface reserved for up to 180 s.
    pub fn reserve_nics_after_delete(&self, refusals: u32) {
        lock(&self.cloud).knobs.nic_reservation = refusals;
    }

    /// VMs per page of the VM list (ARM pages with `nextLink`).
    pub fn set_page_size(&self, size: usize) {
        lock(&self.cloud).knobs.page_size = size;
    }

    /// The regional quotas the usages API reports (`virtualMachines`, `cores`).
    pub fn set_quota(&self, vm_limit: u64, core_limit: u64) {
        let mut cloud = lock(&self.cloud);
        cloud.knobs.vm_limit = vm_limit;
        cloud.knobs.core_limit = core_limit;
    }

    /// ARM requests received so far (token requests not included).
    pub fn arm_requests(&self) -> Vec<Seen> {
        lock(&self.cloud).arm_requests.clone()
    }

    /// Number of ARM requests with this method whose path contains `fragment`
    /// (case-insensitive).
    pub fn arm_requests_matching(&self, method: &str, fragment: &str) -> usize {
        let fragment = fragment.to_ascii_lowercase();
        lock(&self.cloud)
            .arm_requests
            .iter()
            .filter(|s| s.method == method && s.path.to_ascii_lowercase().contains(&fragment))
            .count()
    }

    /// Requests to the token endpoint so far.
    pub fn token_requests(&self) -> u64 {
        lock(&self.cloud).token_requests
    }

    /// The configuration with workload identity instead of a client secret: the federated
    /// token file must contain [`FEDERATED_TOKEN`](crate::FEDERATED_TOKEN).
    pub fn workload_identity_config(&self, token_file: &str) -> Vec<(String, String)> {
        let mut config: Vec<(String, String)> = self
            .config_pairs()
            .into_iter()
            .filter(|(k, _)| k != "AZURE_CLIENT_SECRET")
            .collect();
        config.push(("AZURE_FEDERATED_TOKEN_FILE".into(), token_file.into()));
        config
    }

    fn config_pairs(&self) -> Vec<(String, String)> {
        [
            ("CLOUD_PROVIDER", "azure"),
            ("AZURE_SUBSCRIPTION_ID", SUBSCRIPTION_ID),
            ("AZURE_RESOURCE_GROUP", RESOURCE_GROUP),
            ("AZURE_REGION", REGION),
            ("AZURE_TENANT_ID", TENANT_ID),
            ("AZURE_CLIENT_ID", CLIENT_ID),
            ("AZURE_CLIENT_SECRET", CLIENT_SECRET),
            ("AZURE_AUTHORITY_HOST", &self.endpoint),
            ("AZURE_RESOURCE_MANAGER_ENDPOINT", &self.endpoint),
            ("AZURE_CA_BUNDLE", &self.ca_pem),
            // Quick retries: the emulator's failures are injected, not real outages.
            ("AZURE_RETRY_DELAY_MS", "10"),
            // Quick re-looks at a VM or part ARM is deleting.
            ("AZURE_POLL_INTERVAL_MS", "100"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }
}

impl test_support::cloud::CloudEmulator for AzureEmulator {
    fn provider(&self) -> &'static str {
        "azure"
    }

    fn config(&self) -> Vec<(String, String)> {
        self.config_pairs()
    }

    fn create_vm(&self, name: &str, tags: &[(&str, &str)]) -> String {
        self.create_vm_with(name, tags, VmOptions::default())
    }

    fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        let name = instance_id.rsplit('/').next().unwrap_or(instance_id);
        lock(&self.cloud).vm_or_parts_exist(name)
    }

    fn fault_layer(&self) -> &FaultLayer {
        &self.faults
    }
}

impl Drop for AzureEmulator {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn lock(cloud: &Shared) -> MutexGuard<'_, Cloud> {
    // A test that panicked while holding the lock leaves a usable state behind.
    cloud
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

async fn serve(
    State(Server { cloud, faults }): State<Server>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response<Body> {
    // The fault layer stands in front of ARM (Entra ID's token endpoint is spared).
    if !uri.path().contains("/oauth2/") {
        match faults.before_request().await {
            Fault::Throttled => return into_response(Reply::throttled(1)),
            Fault::ServerError | Fault::Hang(_) => return into_response(Reply::server_error(500)),
            Fault::None => {}
        }
        if let Some(polls) = faults.operation_polls() {
            lock(&cloud).knobs.polls_before_done = polls;
        }
    }
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let reply = lock(&cloud).handle(
        method.as_str(),
        uri.path(),
        uri.query().unwrap_or(""),
        authorization.as_deref(),
        &body,
        &faults,
    );
    into_response(reply)
}

fn into_response(reply: Reply) -> Response<Body> {
    let mut response = Response::builder()
        .status(StatusCode::from_u16(reply.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header("x-ms-request-id", "00000000-0000-0000-0000-000000000000");
    for (name, value) in reply.headers {
        response = response.header(name, value);
    }
    let body = match reply.body {
        Some(json) => {
            response = response.header("content-type", "application/json; charset=utf-8");
            Body::from(json.to_string())
        }
        None => Body::empty(),
    };
    response
        .body(body)
        .unwrap_or_else(|_| Response::new(Body::empty()))
}
