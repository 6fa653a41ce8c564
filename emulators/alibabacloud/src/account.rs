//! The account the emulator serves: its keys, region, RAM role and OIDC token.

/// The access key id the emulator accepts.
pub const ACCESS_KEY_ID: &str = "LTAI5tEmulatorAccessKey01";
/// The access key secret the emulator accepts (until [`AlibabaCloudEmulator::reject_credentials`](crate::AlibabaCloudEmulator::reject_credentials)).
pub const ACCESS_KEY_SECRET: &str = "emulator-secret-Xq7v2Lr9Nw4Tz1Kp";
/// The region the emulator serves.
pub const REGION: &str = "cn-beijing";
/// The RAM role STS lets the OIDC token assume (RRSA).
pub const ROLE_ARN: &str = "acs:ram::113511544585****:role/peerpods-provider-service";
/// The OIDC provider registered in RAM (the cluster's issuer, for RRSA).
pub const OIDC_PROVIDER_ARN: &str = "acs:ram::113511544585****:oidc-provider/ack-rrsa-c1";
/// The OIDC token STS accepts until [`AlibabaCloudEmulator::rotate_oidc_token`](crate::AlibabaCloudEmulator::rotate_oidc_token): what a test
/// writes into the token file, as the kubelet writes the projected ServiceAccount token.
pub const OIDC_TOKEN: &str =
    "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQifQ.c2lnbmF0dXJl";
