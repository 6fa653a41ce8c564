//! What every local cloud emulator (`emulators/<cloud>`) offers the tests that use it, so one
//! scenario (a PeerPod deleted → its VM and the VM's parts gone → finalizer released) runs
//! unchanged on each cloud.
//!
//! An emulator is a small HTTP server on 127.0.0.1, started by the test that needs it and
//! stopped when dropped. It implements exactly the endpoints its backend calls, with the shapes,
//! status codes, headers and error bodies of the cloud's published API specification, and is
//! driven only through the backend's real client code. These methods arrange and inspect its
//! state directly, as a test would through the cloud's console.

/// A running local emulator of one cloud.
pub trait CloudEmulator: Send + Sync {
    /// cloud-api-adaptor's `CLOUD_PROVIDER` name of the cloud, e.g. `azure`.
    fn provider(&self) -> &'static str;

    /// The provider configuration (keys as in `peer-pods-cm` / `peer-pods-secret`, plus the
    /// endpoint overrides the backend documents) that points the backend at this emulator,
    /// with `CLOUD_PROVIDER` set.
    fn config(&self) -> Vec<(String, String)>;

    /// Creates a running VM as cloud-api-adaptor would, with the parts it creates with one
    /// (network interface, disk, public address, ...), carrying `tags`. Returns the id a PeerPod
    /// records in `spec.instanceID` for it.
    fn create_vm(&self, name: &str, tags: &[(&str, &str)]) -> String;

    /// Whether the VM, or any part created with it, still exists.
    fn vm_or_parts_exist(&self, instance_id: &str) -> bool;

    /// The emulator's fault layer (see [`crate::faults`]): latency, hangs, server errors and
    /// throttling at a rate, eventual consistency, long-running operations of N polls.
    fn fault_layer(&self) -> &crate::faults::FaultLayer;

    /// Sets the fault layer's knobs (replacing earlier ones) and restarts its counts.
    fn set_faults(&self, faults: crate::faults::Faults) {
        self.fault_layer().set(faults);
    }

    /// The faults answered since the knobs were last set.
    fn injected(&self) -> crate::faults::Injected {
        self.fault_layer().injected()
    }
}

/// One provider-service configuration serving several clouds: the clouds' keys with one `CLOUD_PROVIDER`
/// naming `providers`. No key may mean two things to two clouds, except the keys the two IBM clouds share
/// (IAM, Global Tagging, tuning): the first value serves both, as one IBM Cloud account's would.
///
/// # Panics
/// When two clouds give one key different values.
pub fn merged_config(
    providers: &[&str],
    pairs: impl IntoIterator<Item = (String, String)>,
) -> Vec<(String, String)> {
    let mut config: Vec<(String, String)> = Vec::new();
    for (key, value) in pairs.into_iter().filter(|(k, _)| k != "CLOUD_PROVIDER") {
        match config.iter().find(|(k, _)| *k == key) {
            None => config.push((key, value)),
            Some((_, first)) => assert!(
                *first == value || key.starts_with("IBMCLOUD_"),
                "two clouds read {key} differently"
            ),
        }
    }
    config.push(("CLOUD_PROVIDER".into(), providers.join(",")));
    config
}
