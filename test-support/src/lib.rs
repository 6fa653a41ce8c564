//! What the crates' tests share, so each harness exists once.
//!
//! - [`moto`]: one moto server (the EC2 emulator from PyPI) per test binary, and helpers that arrange
//!   and inspect its state with the real AWS SDK.

pub mod moto;
