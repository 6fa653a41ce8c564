//! A real, local Kubernetes control plane for tests: embedded etcd, kube-apiserver and kube-controller-manager
//! (garbage collector, namespace, ServiceAccount, Deployment, ReplicaSet, DaemonSet controllers and a few more),
//! built from the Go module in `testenv/controlplane` and run on 127.0.0.1.
//!
//! One control plane starts per test process, on first use ([`shared`]); each test gets its own namespace
//! ([`namespace`]). In a test binary of several modules, a module whose tests install cluster-wide objects takes
//! a control plane of its own ([`shared_for`]`(module_path!())`). By default there is no scheduler and no kubelet: Pods stay Pending and Node objects are created through
//! the API.
//!
//! With a control plane of its own serving on the node address, a test can add a real node ([`node`]: kubelet,
//! containerd, kube-proxy, kube-scheduler, CoreDNS) so that pods run.
//!
//! [`proxy::Proxy`] puts a TCP proxy in front of the API server that a test can black-hole.
//!
//! A control plane of one's own ([`ControlPlane::start_with`]) can keep kube-apiserver's audit log
//! ([`Options::audit`]): every request with its user, credential, verb and object, as [`audit::AuditEvent`]s.

pub mod audit;
mod controlplane;
mod error;
mod helpers;
pub mod node;
pub mod proxy;

pub use controlplane::{ControlPlane, Options, binary_path, shared, shared_for};
pub use error::Error;
pub use helpers::{
    apply_crds, credential_id, grant_metrics_reader, harness_name, in_a_process_of_its_own,
    namespace, repo_root, service_account_token, wait_for, wait_for_event,
};
