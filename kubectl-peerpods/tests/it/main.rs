//! kubectl-peerpods against the local control plane (testenv), one binary with a module per concern.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod release;
mod status;
