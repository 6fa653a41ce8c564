//! test-support's integration test, in the one test binary of the crate: the workspace's layering.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod layering;
