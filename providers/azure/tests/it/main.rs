//! The Azure provider's integration tests, one binary: the backend through its `Provider` API against
//! the local Azure emulator, with the real azure_core pipeline and azure_identity credentials.

mod azure;
mod azure_answers;
mod azure_auth;
mod azure_faults;
mod azure_support;
