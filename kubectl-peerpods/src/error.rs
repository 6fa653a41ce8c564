use thiserror::Error;

/// What can go wrong reading the cluster, or releasing a PeerPod.
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
    #[error(
        "PeerPod {namespace}/{name} is not being deleted: peerpod-ctrl reads {} only on a PeerPod being \
         deleted, so nothing was written",
        peerpods_api::peerpod::RELEASE
    )]
    NotBeingDeleted { namespace: String, name: String },
    #[error(
        "PeerPod {namespace}/{name} is already released (peerpod-ctrl's finalizer is gone): nothing to do"
    )]
    AlreadyReleased { namespace: String, name: String },
    #[error(
        "releasing PeerPod {namespace}/{name} needs a yes: run it on a terminal to be asked, or pass --yes; \
         nothing was written"
    )]
    NoTerminal { namespace: String, name: String },
    #[error("not confirmed: nothing was written")]
    NotConfirmed,
    #[error("cannot ask on the terminal: {0}")]
    Terminal(#[source] std::io::Error),
    #[error("cannot annotate the PeerPod: {0}")]
    PatchPeerPod(#[source] kube::Error),
}
