//! The Alibaba Cloud backend: ECS instances and the EIPs cloud-api-adaptor binds to them.
//!
//! There is no official Alibaba Cloud SDK for Rust, so the backend speaks the documented ECS
//! (2014-05-26) and VPC (2016-04-28) RPC APIs over reqwest (rustls with ring), signed with
//! Alibaba's V3 signature.
//!
//! [`AlibabaCloudProvider`] is the [`Provider`](peerpods_provider_core::Provider) implementation;
//! the only public entry, with the setting of its not-found window ([`NOT_FOUND_WINDOW_SETTING`]),
//! why RRSA gave it no key ([`RrsaError`], [`RrsaReason`]) and its `cloud_provider` name
//! ([`NAME`]).

/// Reading ECS/VPC JSON answers (pure).
mod answers;
/// Every HTTP call, signed, retried, counted.
mod api;
/// The signing key, static or RRSA's temporary one from STS `AssumeRoleWithOIDC`.
mod credentials;
/// The deletion engine's ports: lookups and deletes of the instance and its EIPs.
mod deletion;
/// What an error answer means.
mod failure;
/// Syntax of ECS instance ids.
mod instance_id;
/// [`AlibabaCloudProvider`]: the `Provider` implementation over ECS and VPC.
mod provider;
/// Configuration keys (cloud-api-adaptor's names, RRSA's, endpoint overrides).
mod settings;
/// `ACS3-HMAC-SHA256` request signatures (pure).
mod signature;

pub use credentials::{RrsaError, RrsaReason};
pub use provider::{AlibabaCloudProvider, NOT_FOUND_WINDOW_SETTING};
pub use settings::NAME;
