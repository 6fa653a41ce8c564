//! Credentials that EC2 (here: moto with request authentication switched on) refuses.
//! On a moto server of its own: moto's authentication is a server-wide setting.

use crate::aws_support::{SECRET_ACCESS_KEY, config_for, moto_with_env, unknown_id};
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::CloudCalls;
use peerpods_provider_core::Error;
use peerpods_provider_core::Provider;

#[tokio::test(flavor = "multi_thread")]
async fn refused_credentials_are_a_permission_error_without_the_secret() {
    // moto checks every request against its IAM users once this count of free requests is spent.
    let moto = moto_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", "0")]);
    let provider = AwsProvider::from_config(
        &config_for(&moto.endpoint, &[("AWS_MAX_ATTEMPTS", "1")]),
        CloudCalls::default(),
    )
    .await
    .expect("provider");

    let error = provider
        .delete_instance(&unknown_id(3))
        .await
        .expect_err("unknown access key");

    assert!(
        matches!(error, Error::CloudPermissionDenied { .. }),
        "{error:?}"
    );
    assert!(!error.to_string().contains(SECRET_ACCESS_KEY), "{error}");
    let health = provider.health().await;
    assert!(!health.healthy, "{health:?}");
    assert!(!health.message.contains(SECRET_ACCESS_KEY));
}
