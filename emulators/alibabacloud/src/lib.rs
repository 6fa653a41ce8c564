//! A local emulator of the alibabacloud endpoints provider-service calls: work in progress.
