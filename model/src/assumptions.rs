//! The model's configuration: what it assumes of the world, and which faults and actors it
//! lets in.

/// What the model takes for granted about the world. Each is needed: its test shows the
/// counterexample without it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Assumptions {
    /// A lookup lags (answers NotFound for a VM that exists, deleting or not) only while the VM
    /// is younger than the consistency window: the window's own premise. Without it no window
    /// is long enough, and a NotFound of an old VM still deleting would be believed.
    pub lag_only_while_young: bool,
    /// Once the VM is gone, a listing shows every part left: a lagging listing only happens
    /// while the VM exists (after it, nothing would name the part again).
    pub lists_catch_up_by_gone: bool,
    /// An age the cloud tells (from its creation time) is never older than the VM is: the
    /// driver takes a clock-skew allowance off every age for this. Without it a new VM told old
    /// has its lagging NotFound believed.
    pub told_ages_are_true: bool,
}

impl Assumptions {
    pub const ALL: Assumptions = Assumptions {
        lag_only_while_young: true,
        lists_catch_up_by_gone: true,
        told_ages_are_true: true,
    };
}

/// The model.
#[derive(Clone, Debug)]
pub struct DeletionProtocol {
    pub assume: Assumptions,
    /// Adversarial cloud answers (lost answers included) along one run.
    pub faults: u8,
    pub restarts: u8,
    pub lease_expiries: u8,
    /// A user may restore a copy of CAA's PeerPod (and delete it).
    pub restore: bool,
    /// CAA calls DeleteInstance itself when the Pod ends (on the other provider-service
    /// replica), racing peerpod-ctrl's.
    pub caa_deletes: bool,
    /// A lookup that shows the VM tells its age, as clouds that report a creation time do;
    /// otherwise the engine knows the age only from its first sighting (libvirt).
    pub cloud_tells_age: bool,
}

impl Default for DeletionProtocol {
    fn default() -> Self {
        DeletionProtocol {
            assume: Assumptions::ALL,
            faults: 1,
            restarts: 1,
            lease_expiries: 1,
            restore: true,
            caa_deletes: true,
            cloud_tells_age: false,
        }
    }
}
