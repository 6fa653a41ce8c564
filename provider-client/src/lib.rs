//! The provider-service client of the controllers (and of the tests and the bench that call provider-service as
//! they do), apart from the runtime so a service that never calls provider-service (the webhook) does not link it.
//!
//! - [`connect`]: a client whose calls carry the ServiceAccount token, the trace context and the call deadline,
//!   over a channel that trusts a CA file reloaded when it changes.
//! - [`ProviderArgs`]: the flags that configure it, flattened into a controller's command line.
//! - [`ProviderService`]: the domain client both controllers call provider-service through; its answers
//!   ([`DeleteAnswer`], [`Instance`], [`Capacity`] of [`Figure`]s) carry no protobuf type.
//! - [`Failure`]: what an error answer says (who failed, and whether it changes by itself), read once for both
//!   controllers, inside a [`CallError`]; [`retry_after`]: how long a throttled answer asks to wait.
//! - [`breaker`]: the circuit breaker a controller turns on in front of its deletes
//!   ([`ProviderService::with_breaker`]); [`held_delay`]: when a held call asks again.
//! - [`Error`]: the one error type of building a client, with a stable `reason()`.

mod answers;
mod args;
pub mod breaker;
mod capacity;
mod client;
mod error;
mod failure;
mod service;

pub use answers::{About, DeleteAnswer, Deleted, Instance, Waiting};
pub use args::{DEFAULT_PROVIDER_TIMEOUT, ProviderArgs, ProviderAuth};
pub use breaker::held_delay;
pub use capacity::{Capacity, Figure};
pub use client::{
    CallCredentials, ProviderChannel, ProviderClient, ProviderClientConfig, TokenFile, connect,
    retry_after,
};
pub use error::Error;
pub use failure::{CallError, CloudFailure, Failure, Held, Refusal, Scope};
pub use service::ProviderService;
