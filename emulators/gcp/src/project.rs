//! The project, zone and machine type the emulator serves.

/// The project the emulator serves.
pub const PROJECT: &str = "emulated-project";
/// The zone the emulator serves.
pub const ZONE: &str = "us-central1-a";
/// The region of [`ZONE`].
pub const REGION: &str = "us-central1";
/// vCPUs of the machine type the emulated VMs have (n2d-standard-2, as in the fixture).
pub const VCPUS_PER_VM: u32 = 2;
