//! A real, local Kubernetes control plane for tests: embedded etcd, kube-apiserver and kube-controller-manager
//! (garbage collector, namespace, ServiceAccount, Deployment, ReplicaSet, DaemonSet controllers and a few more),
//! built from the Go module in `testenv/controlplane` and run on 127.0.0.1.
//!
//! One control plane starts per test process, on first use ([`shared`]); each test gets its own namespace
//! ([`namespace`]). There is no scheduler and no kubelet: Pods stay Pending and Node objects are created through
//! the API.

mod controlplane;
mod error;
mod helpers;

pub use controlplane::{ControlPlane, binary_path, shared};
pub use error::Error;
pub use helpers::{apply_crds, namespace, repo_root, service_account_token, wait_for};
