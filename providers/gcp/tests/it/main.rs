//! The GCP provider's integration tests, one binary: the backend through its `Provider` API against the
//! local Compute Engine emulator, with the real Compute Engine client and google-cloud-auth.

mod gcp;
mod gcp_faults;
