//! provider-service backend for Google Cloud (Compute Engine through the official google-cloud-compute-v1 crate): work in progress.
