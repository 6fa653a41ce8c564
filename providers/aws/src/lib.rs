//! The AWS backend: EC2 through the official AWS SDK for Rust.
//!
//! [`AwsProvider`] is the [`Provider`](peerpods_provider_core::Provider) implementation; the only
//! public entry, with its settings, its batching policy and its `cloud_provider` name ([`NAME`]).

/// Every HTTP attempt the EC2 SDK makes (its retries included), counted and classified.
mod attempts;
/// Coalescing policy for the ports' calls of concurrent deletions.
mod batch;
/// Batching the ports' calls of concurrent deletions into batched EC2 calls.
mod batcher;
/// Every EC2 call, bounded, rate-limited, counted.
mod ec2;
/// What an EC2 error means, and the crate error it becomes for one caller.
mod failure;
/// Syntax of EC2 instance ids.
mod instance_id;
/// The deletion engine's ports (`peerpods_provider_core::DeletionPorts`): EC2's calls and answers
/// translated; the engine (`peerpods_provider_core::Deleter`) decides the rest.
mod ports;
/// [`AwsProvider`]: the `Provider` implementation over EC2.
mod provider;
/// Configuration keys (cloud-api-adaptor's names) → [`AwsSettings`].
mod settings;
/// Reading a batched `TerminateInstances` answer per id (pure).
mod terminate;
/// Credentials from a web identity token exchanged with STS (IRSA), at the configured endpoint.
mod web_identity;

pub use batch::BatchPolicy;
pub use provider::AwsProvider;
pub use settings::{AwsSettings, CredentialSource, NAME, WebIdentity};
