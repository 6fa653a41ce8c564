//! The Alibaba Cloud provider's integration tests, one binary: the backend through its `Provider` API
//! against the local ECS/VPC emulator, with the real signed HTTP client.

mod alibabacloud;
mod alibabacloud_answers;
mod alibabacloud_deletion;
mod alibabacloud_faults;
mod alibabacloud_rrsa;
