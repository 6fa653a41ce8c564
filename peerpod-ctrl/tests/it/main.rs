//! peerpod-ctrl's integration tests, one binary: the controller against the real control plane and the real
//! provider-service (libvirt's test driver, and every cloud's local emulator), each scenario in a namespace of its
//! own and one at a time (`Scenario`). The trace test runs in a process of its own: it installs the global
//! tracing subscriber.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod adopt;
mod ca_rotation;
mod clouds;
mod in_use;
mod operate;
mod outage;
mod scenarios;
mod support;
mod trace;
