//! A local emulator of the azure endpoints provider-service calls: work in progress.
