//! provider-service's integration tests, one binary: the service started as main.rs starts it (or its
//! binary, as deployed) and called through real gRPC clients, against moto, the cloud emulators,
//! libvirt's test driver and the local control plane.
#![allow(clippy::unwrap_used)] // a test may unwrap (the workspace denies it elsewhere)

mod all_clouds;
mod auth;
mod aws_grpc;
mod aws_web_identity;
mod bad_input;
mod common;
mod config_reload;
mod detached_deletes;
mod do_not_delete;
mod exhaustion;
mod grpcurl;
mod http2_limits;
mod idle_connections;
mod libvirt;
mod load;
mod node_bound;
mod nodelay;
mod queued_deletes;
mod review_budget;
mod safe_defaults;
mod tls;
mod token_cache;
mod token_precheck;
