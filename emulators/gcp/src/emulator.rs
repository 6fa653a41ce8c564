//! [`GcpEmulator`]: the server on its own thread, and what a test makes it do.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use axum::Router;
use test_support::cloud::CloudEmulator;
use test_support::faults::FaultLayer;

use crate::cloud::{Cloud, OperationFailure, RateRefusal, Vm, creation_timestamp, handle};
use crate::fixtures::{SERVICE_ACCOUNT_KEY, WRONG_SERVICE_ACCOUNT_KEY};
use crate::jwt;
use crate::project::{PROJECT, ZONE};

/// A running Compute Engine emulator. Stopped when dropped.
pub struct GcpEmulator {
    url: String,
    state: Arc<Mutex<Cloud>>,
    faults: Arc<FaultLayer>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl GcpEmulator {
    /// Starts an emulator with no VMs, trusting [`GcpEmulator::credentials_json`].
    pub fn start() -> std::io::Result<Self> {
        let trusted = jwt::TrustedKey::from_service_account(SERVICE_ACCOUNT_KEY)
            .map_err(std::io::Error::other)?;
        let state = Arc::new(Mutex::new(Cloud::new(trusted)));
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let url = format!("http://{}", listener.local_addr()?);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let faults = Arc::new(FaultLayer::from_env());
        let app = Router::new()
            .fallback(handle)
            .with_state((Arc::clone(&state), Arc::clone(&faults)));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("gcp-emulator".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    tokio::select! {
                        _ = async { axum::serve(listener, app).await } => {}
                        _ = stopped => {}
                    }
                });
                runtime.shutdown_background();
            })?;
        Ok(GcpEmulator {
            url,
            state,
            faults,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Base URL, e.g. `http://127.0.0.1:41234` (the backend's `GCP_COMPUTE_ENDPOINT`).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The service-account key file the emulator trusts (`GCP_CREDENTIALS`).
    pub fn credentials_json() -> &'static str {
        SERVICE_ACCOUNT_KEY
    }

    /// A key file of the same account with another private key: its tokens fail verification.
    pub fn wrong_credentials_json() -> &'static str {
        WRONG_SERVICE_ACCOUNT_KEY
    }

    /// The next `calls` requests are answered 429 with `Retry-After: retry_after_secs`.
    pub fn throttle_next(&self, calls: u32, retry_after_secs: u64) {
        let mut cloud = self.cloud();
        cloud.throttle_next = calls;
        cloud.retry_after_secs = retry_after_secs;
    }

    /// The next `calls` requests (for [`RateRefusal::ResourceOperationRateExceeded`]: the next
    /// `calls` deletions) are refused with 403 and the body Compute Engine sends for `refusal`,
    /// without a `Retry-After` (Compute Engine sends none).
    pub fn refuse_rate_next(&self, calls: u32, refusal: RateRefusal) {
        let mut cloud = self.cloud();
        cloud.refuse_rate_next = calls;
        cloud.rate_refusal = refusal;
    }

    /// The next `deletions` accepted deletions end `DONE` with `failure` instead of deleting.
    pub fn fail_next_operations(&self, deletions: u32, failure: OperationFailure) {
        let mut cloud = self.cloud();
        cloud.fail_next_operations = deletions;
        cloud.operation_failure = failure;
    }

    /// The next `calls` requests are answered with the 5xx `status` (500, 502, 503 or 504).
    pub fn fail_next(&self, calls: u32, status: u16) {
        let mut cloud = self.cloud();
        cloud.fail_next = calls;
        cloud.fail_status = status;
    }

    /// Whether every token is refused (401), as for a revoked key.
    pub fn reject_credentials(&self, reject: bool) {
        self.cloud().reject_credentials = reject;
    }

    /// How many `zoneOperations.get` calls see a deletion RUNNING before it is DONE
    /// (default 0: the first poll sees it DONE).
    pub fn set_operation_polls(&self, polls: u32) {
        self.cloud().operation_polls = polls;
    }

    /// Starts deleting the VM as another client would: it is STOPPING, further deletions are
    /// refused as `resourceNotReady`, and it is gone after `gets` more `instances.get` calls.
    pub fn begin_deletion(&self, name: &str, gets: u32) {
        if let Some(vm) = self.cloud().vms.get_mut(name) {
            vm.status = "STOPPING";
            vm.gone_after_gets = Some(gets);
        }
    }

    /// At most `size` instances per `instances.list` page (default 500).
    pub fn set_page_size(&self, size: usize) {
        self.cloud().page_size = size.max(1);
    }

    /// Overrides one quota of the region (`CPUS`, `INSTANCES`, ...). Without an override,
    /// `CPUS` and `INSTANCES` usage follow the emulated VMs.
    pub fn set_region_quota(&self, metric: &str, limit: f64, usage: f64) {
        self.cloud()
            .quota_overrides
            .insert(metric.to_owned(), (limit, usage));
    }

    /// Requests received so far (any endpoint, any answer).
    pub fn requests(&self) -> usize {
        self.cloud().log.len()
    }

    /// `METHOD path` of every request received so far.
    pub fn request_log(&self) -> Vec<String> {
        self.cloud().log.clone()
    }

    /// Whether the instance exists (in any status).
    pub fn instance_exists(&self, name: &str) -> bool {
        self.cloud().vms.contains_key(name)
    }

    /// Whether the boot disk created with the instance exists.
    pub fn disk_exists(&self, name: &str) -> bool {
        self.cloud().disks.contains_key(name)
    }

    /// The instance's status (`RUNNING`, `STOPPING`, ...), if it exists.
    pub fn instance_status(&self, name: &str) -> Option<String> {
        self.cloud().vms.get(name).map(|vm| vm.status.to_owned())
    }

    fn cloud(&self) -> MutexGuard<'_, Cloud> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for GcpEmulator {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl CloudEmulator for GcpEmulator {
    fn provider(&self) -> &'static str {
        "gcp"
    }

    fn config(&self) -> Vec<(String, String)> {
        [
            ("CLOUD_PROVIDER", "gcp"),
            ("GCP_PROJECT_ID", PROJECT),
            ("GCP_ZONE", ZONE),
            ("GCP_CREDENTIALS", SERVICE_ACCOUNT_KEY),
            ("GCP_COMPUTE_ENDPOINT", self.url.as_str()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    /// A RUNNING instance as cloud-api-adaptor creates one: a boot disk of the same name with
    /// `autoDelete`, one network interface with an ephemeral external address, `tags` as labels.
    /// Its `creationTimestamp` is the fault layer's ([`FaultLayer::created`]): an hour ago, or
    /// now while a knob makes new instances lag, or the knobs' `created_age` ago.
    fn create_vm(&self, name: &str, tags: &[(&str, &str)]) -> String {
        let created = creation_timestamp(&self.faults, name);
        let mut cloud = self.cloud();
        cloud.next_id += 1;
        let vm = Vm {
            id: 4_568_311_740_296_217_402 + cloud.next_id,
            created,
            labels: tags
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            status: "RUNNING",
            gone_after_gets: None,
        };
        cloud.vms.insert(name.to_owned(), vm);
        cloud.disks.insert(name.to_owned(), name.to_owned());
        name.to_owned()
    }

    fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        let cloud = self.cloud();
        cloud.vms.contains_key(instance_id)
            || cloud.disks.values().any(|owner| owner == instance_id)
    }

    fn fault_layer(&self) -> &FaultLayer {
        &self.faults
    }
}
