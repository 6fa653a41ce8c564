//! The kubelet's gRPC APIs a DRA plugin serves, generated from the files vendored in `proto/` (k8s.io/kubelet
//! v0.37.1). Their package names are the wire names: the kubelet calls `/pluginregistration.Registration/...` and
//! `/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/...`.

/// Plugin registration (`pluginregistration`, the kubelet's plugin watcher API, version v1).
// Generated code: its doc comments are the proto comments verbatim, which rustdoc lints dislike.
#[allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]
pub mod pluginregistration {
    tonic::include_proto!("pluginregistration");
}

/// DRA v1 (`k8s.io.kubelet.pkg.apis.dra.v1`): NodePrepareResources and NodeUnprepareResources.
#[allow(clippy::doc_lazy_continuation, clippy::doc_overindented_list_items)]
pub mod dra {
    tonic::include_proto!("k8s.io.kubelet.pkg.apis.dra.v1");
}
