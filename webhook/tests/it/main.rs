//! peerpods-webhook's integration tests, one binary: the webhook over real sockets (HTTPS, health), behind
//! the real API server, side by side with cloud-api-adaptor's webhook (the Go reference in
//! `tests/caa-reference`), and its memory measured on the real binary.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod api_server;
mod caa_parity;
mod certificates;
mod idle_connections;
mod memory;
mod per_peer;
mod robustness;
mod serving;
mod support;
