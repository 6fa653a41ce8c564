//! The IBM Cloud providers' integration tests, one binary: the VPC and Power Virtual Server backends through
//! their `Provider` API against the local emulators, with the real IAM exchange and HTTP clients.

mod conflicts;
mod faults;
mod held_deletes;
mod ibm_support;
mod powervs;
mod vpc;
