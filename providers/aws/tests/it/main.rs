//! The AWS provider's integration tests, one binary: the real AWS SDK against moto server, through the
//! `Provider` trait. Each module is one concern; they share one moto harness.

mod aws;
mod aws_answers;
mod aws_attempts;
mod aws_auth;
mod aws_consistency;
mod aws_errors;
mod aws_faults;
mod aws_least_privilege;
mod aws_support;
