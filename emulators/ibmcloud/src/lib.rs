//! A local emulator of the ibmcloud endpoints provider-service calls: work in progress.
