//! provider-service backend for bring-your-own-machine pools (cloud-api-adaptor's ConfigMap protocol): work in progress.
