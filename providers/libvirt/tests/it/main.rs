//! The libvirt provider's integration tests, one binary: the real libvirt client library against its
//! in-memory test driver and real sockets.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod attempts;
mod deletion;
mod hung_host;
