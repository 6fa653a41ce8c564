//! bench's integration test, in the one test binary of the crate: the fault storm at a reduced size.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod fault_storm;
