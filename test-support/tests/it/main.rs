//! test-support's integration tests, in the one test binary of the crate: the workspace's layering and
//! vocabulary, and the eventual consistency of the layer in front of moto.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod layering;
mod moto_visibility;
mod vocabulary;
