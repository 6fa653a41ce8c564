//! provider-service backend for Alibaba Cloud ECS: work in progress.
