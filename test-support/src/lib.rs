//! What the crates' tests share, so each harness exists once.
//!
//! - [`byom`]: a bring-your-own-machine pool on the local control plane, as cloud-api-adaptor writes it.
//! - [`cloud`]: what every local cloud emulator (`emulators/<cloud>`) offers the tests.
//! - [`moto`]: one moto server (the EC2 emulator from PyPI) per test binary, and helpers that arrange
//!   and inspect its state with the real AWS SDK.

pub mod byom;
pub mod cloud;
pub mod moto;
