//! provider-service backend for Microsoft Azure (ARM through azure_core / azure_identity): work in progress.
