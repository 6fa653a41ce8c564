//! A local emulator of the Azure endpoints provider-service's Azure backend calls: Microsoft
//! Entra ID's token endpoint and the Azure Resource Manager calls for VMs, network interfaces,
//! public IP addresses, managed disks, asynchronous operations and compute usages. HTTPS on
//! 127.0.0.1 with its own CA (see [`AzureEmulator::ca_pem`]); response bodies come from the
//! published examples in `fixtures/` (see the README).
//!
//! It runs on its own thread and tokio runtime, so it outlives any test runtime and works from
//! synchronous code; dropping it stops the server.

/// The emulated subscription: Entra ID and ARM's answers from the state, and the test's knobs.
mod cloud;
/// [`AzureEmulator`]: the HTTPS server on its own thread, and what a test makes it do.
mod emulator;
/// The emulator's own CA and serving certificate.
mod tls;
#[cfg(test)]
mod visibility_tests;

pub use cloud::{
    ArmRefusal, CLIENT_ID, CLIENT_SECRET, FEDERATED_TOKEN, REGION, RESOURCE_GROUP, SUBSCRIPTION_ID,
    Seen, TENANT_ID, VmOptions, VmParts,
};
pub use emulator::AzureEmulator;
