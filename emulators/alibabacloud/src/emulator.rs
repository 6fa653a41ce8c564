//! [`AlibabaCloudEmulator`]: the server on its own thread, and what a test makes it do.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;

use test_support::cloud::CloudEmulator;
use tokio::sync::oneshot;

use crate::account::{ACCESS_KEY_ID, ACCESS_KEY_SECRET, REGION};
use crate::handlers;
use crate::state::{EcsRefusal, State};

/// A running emulator; dropping it stops the server.
pub struct AlibabaCloudEmulator {
    address: SocketAddr,
    state: Arc<Mutex<State>>,
    faults: Arc<test_support::faults::FaultLayer>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl AlibabaCloudEmulator {
    /// Starts an emulator on a free port of 127.0.0.1. Panics if it cannot (test tooling).
    pub fn start() -> Self {
        Self::try_start().unwrap_or_else(|e| panic!("starting the Alibaba Cloud emulator: {e}"))
    }

    pub fn try_start() -> std::io::Result<Self> {
        let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
        listener.set_nonblocking(true)?;
        let address = listener.local_addr()?;
        let state = State::new(ACCESS_KEY_SECRET);
        let faults = Arc::clone(&state.faults);
        let state = Arc::new(Mutex::new(state));
        let (shutdown, stopped) = oneshot::channel::<()>();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let router = handlers::router(Arc::clone(&state));
        let thread = std::thread::Builder::new()
            .name("alibabacloud-emulator".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                        return;
                    };
                    // Not a graceful shutdown: keep-alive connections of a client that
                    // outlives the emulator must not keep it running. Dropping the runtime
                    // ends every connection task.
                    tokio::select! {
                        _ = axum::serve(listener, router) => {}
                        _ = stopped => {}
                    }
                });
            })?;
        Ok(Self {
            address,
            state,
            faults,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `http://127.0.0.1:<port>`: both the ECS and the VPC endpoint.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.address)
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next `calls` requests are refused with HTTP 429, `Retry-After: <retry_after_secs>`
    /// and ECS's flow-control error `Throttling.User`.
    pub fn throttle_next(&self, calls: u32, retry_after_secs: u64) {
        self.state().throttle = (calls, retry_after_secs);
    }

    /// The next `calls` requests fail with `status` (500 `InternalError`, 503
    /// `ServiceUnavailable`, ...).
    pub fn fail_next(&self, calls: u32, status: u16) {
        self.state().fail = (calls, status);
    }

    /// The next `calls` requests for `action` fail with `status` (503 `ServiceUnavailable`,
    /// otherwise `InternalError`); other actions are answered as usual.
    pub fn fail_next_of(&self, action: &str, calls: u32, status: u16) {
        self.state()
            .fail_action
            .insert(action.to_owned(), (calls, status));
    }

    /// The next `calls` requests for `action` are refused with the documented `refusal`
    /// (throttling, a busy instance, a conflicting request), its real status, body and headers.
    pub fn refuse_next_of(&self, action: &str, calls: u32, refusal: EcsRefusal) {
        self.state()
            .refuse_action
            .insert(action.to_owned(), (calls, refusal));
    }

    /// From now on the configured secret no longer matches (the key pair was rotated): every
    /// request gets ECS's `SignatureDoesNotMatch`.
    pub fn reject_credentials(&self) {
        self.state().secret = "rotated-secret-value-0000".into();
    }

    /// From now on STS accepts only `token` (the kubelet rotated the projected token; the old
    /// one is no longer valid).
    pub fn rotate_oidc_token(&self, token: &str) {
        self.state().oidc_token = token.to_owned();
    }

    /// Every temporary key STS issues from now on lasts `lifetime` (to the second), whatever
    /// `DurationSeconds` asks: a short one makes a backend exchange again without waiting.
    pub fn set_temporary_key_lifetime(&self, lifetime: std::time::Duration) {
        self.state().key_lifetime = Some(lifetime);
    }

    /// The clock passes the `Expiration` of every temporary key issued so far: each is refused
    /// from now on with `InvalidSecurityToken.Expired`.
    pub fn expire_temporary_keys(&self) {
        let past = jiff::Timestamp::now()
            .checked_sub(jiff::SignedDuration::from_secs(1))
            .unwrap_or_else(|_| jiff::Timestamp::now());
        for key in self.state().temporary.values_mut() {
            key.expires = past;
        }
    }

    /// The temporary keys STS issued, in order: `(AccessKeyId, AccessKeySecret, SecurityToken)`.
    pub fn temporary_keys(&self) -> Vec<(String, String, String)> {
        let state = self.state();
        state
            .issued
            .iter()
            .filter_map(|id| {
                let key = state.temporary.get(id)?;
                Some((id.clone(), key.secret.clone(), key.security_token.clone()))
            })
            .collect()
    }

    /// The key id of each authenticated ECS or VPC request so far, in order.
    pub fn signers(&self) -> Vec<String> {
        self.state().signers.clone()
    }

    /// Requests received so far (all actions), including refused ones.
    pub fn requests(&self) -> usize {
        self.state().requests.len()
    }

    /// Requests received so far for `action`.
    pub fn requests_of(&self, action: &str) -> usize {
        self.state()
            .requests
            .iter()
            .filter(|a| a.as_str() == action)
            .count()
    }

    /// Creates a running instance carrying `tags`; with `with_eip`, also the add-on NIC and the
    /// EIP bound to it, as cloud-api-adaptor does for multi-NIC pods with `USE_PUBLIC_IP`.
    pub fn create_instance(&self, name: &str, tags: &[(&str, &str)], with_eip: bool) -> String {
        self.state().create_instance(name, tags, with_eip, 2, 4096)
    }

    /// The query parameters of every request for `action` received so far, in order.
    pub fn params_of(&self, action: &str) -> Vec<Vec<(String, String)>> {
        self.state()
            .params
            .iter()
            .filter(|(a, _)| a == action)
            .map(|(_, params)| params.clone())
            .collect()
    }

    /// The next authenticated `action` request is answered 200 with exactly `body`, whatever
    /// the emulated account holds: the way to feed a response example of Alibaba Cloud's API
    /// reference through the backend's real client code.
    pub fn answer_next_verbatim(&self, action: &str, body: &str) {
        self.state()
            .verbatim
            .entry(action.to_owned())
            .or_default()
            .push_back(body.to_owned());
    }

    /// Binds one more EIP to the instance's add-on NIC; returns its allocation id (`None` for
    /// an instance without add-on NIC).
    pub fn add_eip(&self, instance_id: &str) -> Option<String> {
        self.state().add_eip(instance_id)
    }

    /// Binds an EIP of the operator's (allocated with `description`, not by cloud-api-adaptor)
    /// to the instance's add-on NIC; returns its allocation id (`None` without add-on NIC).
    pub fn add_operator_eip(&self, instance_id: &str, description: &str) -> Option<String> {
        self.state().add_operator_eip(instance_id, description)
    }

    /// Tags of the EIP (`TagResources`), `None` when it is not allocated.
    pub fn eip_tags(&self, allocation_id: &str) -> Option<Vec<(String, String)>> {
        self.state()
            .eips
            .get(allocation_id)
            .map(|eip| eip.tags.clone())
    }

    /// Whether the EIP is bound to anything.
    pub fn eip_bound(&self, allocation_id: &str) -> bool {
        self.state()
            .eips
            .get(allocation_id)
            .is_some_and(|eip| eip.bound_to.is_some())
    }

    /// Creates an instance of `vcpus` and `memory_mib` (for capacity figures).
    pub fn create_sized_instance(
        &self,
        name: &str,
        tags: &[(&str, &str)],
        vcpus: u64,
        memory_mib: u64,
    ) -> String {
        self.state()
            .create_instance(name, tags, false, vcpus, memory_mib)
    }

    /// Whether ECS still lists the instance.
    pub fn instance_exists(&self, instance_id: &str) -> bool {
        self.state().instances.contains_key(instance_id)
    }

    /// The allocation id of the EIP bound to the instance's add-on NIC, if one was created.
    pub fn eip_of(&self, instance_id: &str) -> Option<String> {
        self.state()
            .instances
            .get(instance_id)
            .and_then(|i| i.eip.clone())
    }

    /// Whether the EIP is still allocated.
    pub fn eip_exists(&self, allocation_id: &str) -> bool {
        self.state().eips.contains_key(allocation_id)
    }

    /// Puts the instance in the middle of its release (someone else deleted it): it stays
    /// listed as `Stopping` for `polls` more `DescribeInstances` answers, and `DeleteInstance`
    /// answers `IncorrectInstanceStatus` meanwhile.
    pub fn begin_release(&self, instance_id: &str, polls: u32) {
        if let Some(instance) = self.state().instances.get_mut(instance_id) {
            instance.releasing = Some(polls);
            instance.status = "Stopping".into();
        }
    }

    /// How many `DescribeInstances` answers still list an instance after `DeleteInstance`
    /// accepted it (ECS releases asynchronously); default 1.
    pub fn set_release_polls(&self, polls: u32) {
        self.state().release_polls = polls;
    }

    /// Sets an account attribute `DescribeAccountAttributes` reports; `None` leaves it out of the
    /// answers. `used-postpaid-instance-vcpu-count` is the emulated instances' vCPUs unless set.
    pub fn set_account_attribute(&self, name: &str, value: Option<&str>) {
        let mut state = self.state();
        state.attributes.retain(|(n, _)| n != name);
        // An empty value is an attribute the answers leave out.
        state
            .attributes
            .push((name.to_owned(), value.unwrap_or_default().to_owned()));
    }

    /// Caps `DescribeInstances` pages below ECS's own 100, to exercise paging.
    pub fn set_page_limit(&self, instances: usize) {
        self.state().page_limit = instances.max(1);
    }
}

impl CloudEmulator for AlibabaCloudEmulator {
    fn provider(&self) -> &'static str {
        "alibabacloud"
    }

    fn config(&self) -> Vec<(String, String)> {
        let endpoint = self.endpoint();
        [
            ("CLOUD_PROVIDER", "alibabacloud"),
            ("ALIBABACLOUD_ACCESS_KEY_ID", ACCESS_KEY_ID),
            ("ALIBABACLOUD_ACCESS_KEY_SECRET", ACCESS_KEY_SECRET),
            ("REGION", REGION),
            ("ALIBABACLOUD_ECS_ENDPOINT", &endpoint),
            ("ALIBABACLOUD_VPC_ENDPOINT", &endpoint),
            ("ALIBABACLOUD_POLL_INTERVAL_MS", "10"),
            ("ALIBABACLOUD_WAIT_TIMEOUT_MS", "5000"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    fn create_vm(&self, name: &str, tags: &[(&str, &str)]) -> String {
        self.create_instance(name, tags, true)
    }

    fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        self.state().vm_or_parts_exist(instance_id)
    }

    fn fault_layer(&self) -> &test_support::faults::FaultLayer {
        &self.faults
    }
}

impl Drop for AlibabaCloudEmulator {
    fn drop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
