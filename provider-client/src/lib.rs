//! The provider-service client of the controllers (and of the tests and the bench that call provider-service as
//! they do), apart from the runtime so a service that never calls provider-service (the webhook) does not link it.
//!
//! - [`connect`]: a client whose calls carry the ServiceAccount token, the trace context and the call deadline,
//!   over a channel that trusts a CA file reloaded when it changes.
//! - [`ProviderArgs`]: the flags that configure it, flattened into a controller's command line.
//! - [`retry_after`]: how long a throttled answer asks to wait.
//! - [`capacity()`]: GetCapacity as a [`Capacity`] of [`Figure`]s, the domain's terms.
//! - [`Error`]: the one error type, with a stable `reason()`.

mod args;
mod capacity;
mod client;
mod error;

pub use args::{DEFAULT_PROVIDER_TIMEOUT, ProviderArgs, ProviderAuth};
pub use capacity::{Capacity, Figure, capacity};
pub use client::{
    CallCredentials, ProviderChannel, ProviderClient, ProviderClientConfig, TokenFile, connect,
    retry_after,
};
pub use error::Error;
