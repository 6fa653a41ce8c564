use thiserror::Error;

/// What can go wrong reading the cluster.
#[derive(Debug, Error)]
pub enum Error {
    #[error("cannot reach the cluster (kubeconfig or in-cluster config): {0}")]
    Connect(#[source] kube::Error),
    #[error("cannot list PeerPods: {0}")]
    ListPeerPods(#[source] kube::Error),
    #[error("cannot read the PeerPod: {0}")]
    ReadPeerPod(#[source] kube::Error),
    #[error("PeerPod {namespace}/{name} not found")]
    PeerPodNotFound { namespace: String, name: String },
    #[error("cannot list Events: {0}")]
    ListEvents(#[source] kube::Error),
    #[error("cannot list Nodes: {0}")]
    ListNodes(#[source] kube::Error),
    #[error("{0:?} is not <namespace>/<peerpod>")]
    BadReference(String),
}
