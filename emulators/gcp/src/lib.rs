//! A local emulator of the gcp endpoints provider-service calls: work in progress.
