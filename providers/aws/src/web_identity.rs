//! Credentials from a web identity: the projected ServiceAccount token exchanged with STS
//! `AssumeRoleWithWebIdentity` for the role's temporary keys (EKS's IAM roles for service
//! accounts). The SDK's own provider builds its STS client from the process environment only, so
//! the configured endpoint override (`AWS_ENDPOINT_URL`, `AWS_ENDPOINT_URL_STS`) would not reach
//! it; this one takes the STS client the provider configured. The client's identity cache keeps
//! the keys until shortly before they expire, and the token is read again at each exchange, so a
//! token the kubelet rotated is the one sent.

use std::time::SystemTime;

use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{self, ProvideCredentials, future};
use aws_sdk_ec2::error::DisplayErrorContext;

use super::settings::WebIdentity;

/// Where credentials came from, as the SDK records it (never the credentials).
const PROVIDER_NAME: &str = "WebIdentityToken";

#[derive(Debug)]
pub struct WebIdentityProvider {
    identity: WebIdentity,
    /// Unsigned: `AssumeRoleWithWebIdentity` is authenticated by the token alone.
    sts: aws_sdk_sts::Client,
}

impl WebIdentityProvider {
    pub fn new(identity: WebIdentity, sts: aws_sdk_sts::Client) -> Self {
        Self { identity, sts }
    }

    async fn exchange(&self) -> provider::Result {
        let token = tokio::fs::read_to_string(&self.identity.token_file)
            .await
            .map_err(|error| {
                CredentialsError::provider_error(format!(
                    "reading the web identity token {}: {error}",
                    self.identity.token_file.display()
                ))
            })?;
        let answer = self
            .sts
            .assume_role_with_web_identity()
            .role_arn(&self.identity.role_arn)
            .role_session_name(&self.identity.session_name)
            .web_identity_token(token.trim())
            .send()
            .await
            .map_err(|error| {
                // The message names the role and STS's code; the token is never part of it.
                CredentialsError::provider_error(format!(
                    "STS refused the web identity for {}: {}",
                    self.identity.role_arn,
                    DisplayErrorContext(&error)
                ))
            })?;
        let Some(keys) = answer.credentials else {
            return Err(CredentialsError::unhandled(
                "STS answered AssumeRoleWithWebIdentity without credentials",
            ));
        };
        let expiry = SystemTime::try_from(keys.expiration).map_err(|_| {
            CredentialsError::unhandled("STS answered an expiration time out of range")
        })?;
        Ok(Credentials::new(
            keys.access_key_id,
            keys.secret_access_key,
            Some(keys.session_token),
            Some(expiry),
            PROVIDER_NAME,
        ))
    }
}

impl ProvideCredentials for WebIdentityProvider {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.exchange())
    }
}
