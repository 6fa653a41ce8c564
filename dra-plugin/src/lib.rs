//! peerpods-dra-plugin: the kubelet plugin of DRA driver `vm.peerpods.io`, the driver whose devices are the slots of
//! the cluster-wide peer-pod VM pool (PeerPodConfig `capacityMode: dra`). The scheduler allocates a slot; the
//! kubelet then asks the driver's plugin on the node to prepare the claim before it starts the pod. A slot is
//! nothing the node has to set up (the VM is cloud-api-adaptor's business), so preparing and unpreparing succeed
//! with nothing to inject: the plugin exists because the 1.37 kubelet calls one for every allocated claim.
//!
//! - Decide (pure): [`claims`] (which claims of a request are answered, and how).
//! - Answer: [`registration`] (the kubelet's plugin-registration API: who we are, where the DRA socket is, which
//!   API versions), [`node`] (the DRA v1 API: prepare, unprepare).
//! - Serve: [`serve`] (the one way to start it: both sockets, stale ones removed, SIGTERM removes them),
//!   [`authority`] (the kubelet's registration calls made readable to tonic's HTTP/2: their `:authority` is a path),
//!   [`sockets`] (where they are: the kubelet's layout), [`driver`] (the driver name, which names the files).
//! - [`api`]: the generated gRPC code of the two vendored kubelet APIs (`proto/`).
//! - [`Error`]: the one error type, with a stable `reason()`.

pub mod api;
pub mod authority;
pub mod claims;
pub mod driver;
mod error;
pub mod node;
pub mod registration;
pub mod serve;
pub mod sockets;

pub use error::Error;
