//! What the Cleaned condition and `status.cleand` say, as plain values. No I/O here.

use crate::crd::CleanedReason;
use crate::provider::Waiting;

/// What the Cleaned condition and `status.cleand` say.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cleaned {
    /// The condition's status: the cleanup of this PeerPod is done.
    pub(crate) done: bool,
    /// `status.cleand`: the VM is confirmed gone.
    pub(crate) vm_gone: bool,
    pub(crate) reason: CleanedReason,
}

impl Cleaned {
    /// The cleanup waits for an operator: the VM stays, so does the finalizer.
    pub(crate) fn held(reason: CleanedReason) -> Self {
        Cleaned {
            done: false,
            vm_gone: false,
            reason,
        }
    }

    /// The VM is not confirmed gone yet, and nobody needs to act: the finalizer stays.
    pub(crate) fn pending(reason: CleanedReason) -> Self {
        Cleaned {
            done: false,
            vm_gone: false,
            reason,
        }
    }

    /// The cleanup is done, but the VM was deliberately not deleted.
    pub(crate) fn done_without_delete(reason: CleanedReason) -> Self {
        Cleaned {
            done: true,
            vm_gone: false,
            reason,
        }
    }
}

/// The condition and Event reason of a wait provider-service answered.
pub(crate) fn waiting_reason(waiting: Waiting) -> CleanedReason {
    match waiting {
        Waiting::CloudDeleting => CleanedReason::DeleteInProgress,
        Waiting::NotYetVisible { .. } => CleanedReason::InstanceNotYetVisible,
    }
}
