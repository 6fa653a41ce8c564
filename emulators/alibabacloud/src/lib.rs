//! A local emulator of the Alibaba Cloud ECS and VPC RPC endpoints provider-service calls, for
//! tests: `DescribeInstances`, `DeleteInstance`, `DescribeAccountAttributes` (ECS 2014-05-26),
//! `DescribeEipAddresses`, `UnassociateEipAddress`, `ReleaseEipAddress` (VPC 2016-04-28), and
//! STS (2015-04-01) `AssumeRoleWithOIDC`, whose temporary keys sign ECS and VPC calls with
//! their security token (RRSA).
//!
//! An axum server on 127.0.0.1 (own thread, own tokio runtime; stopped on drop). It verifies
//! every request's V3 signature (`ACS3-HMAC-SHA256`, written here independently of the backend)
//! and answers with the shapes, status codes and error bodies of Alibaba Cloud's API reference;
//! the response bodies start from the reference's examples in `fixtures/`.

/// The account the emulator serves: keys, region, RAM role, OIDC token.
mod account;
/// [`AlibabaCloudEmulator`]: the server on its own thread, and what a test makes it do.
mod emulator;
/// Response examples of Alibaba Cloud's API reference.
pub mod examples;
/// The ECS, VPC and STS actions, answered from the state.
mod handlers;
/// The V3 request signature (`ACS3-HMAC-SHA256`), verified independently of the backend.
mod signature;
/// The emulated account's instances, EIPs and faults.
mod state;
#[cfg(test)]
mod visibility_tests;

pub use account::{
    ACCESS_KEY_ID, ACCESS_KEY_SECRET, OIDC_PROVIDER_ARN, OIDC_TOKEN, REGION, ROLE_ARN,
};
pub use emulator::AlibabaCloudEmulator;
pub use state::{CAA_EIP_DESCRIPTION, DEFAULT_MAX_VCPUS, EcsRefusal};
