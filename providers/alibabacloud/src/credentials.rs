//! The key every ECS and VPC call is signed with: cloud-api-adaptor's static key pair, or RRSA's
//! temporary one.
//!
//! RRSA (RAM Roles for Service Accounts, ACK): the projected ServiceAccount token in
//! `ALIBABA_CLOUD_OIDC_TOKEN_FILE` is exchanged with STS `AssumeRoleWithOIDC` (RPC, 2015-04-01)
//! for the role's `AccessKeyId`, `AccessKeySecret` and `SecurityToken`, which sign every call
//! until shortly before their `Expiration` (the V3 signature carries the token in the signed
//! `x-acs-security-token` header). The token file is read again at each exchange: the kubelet
//! rotates it in place. One exchange serves all concurrent callers: they queue on one lock and the
//! first exchanges; a key the cloud calls expired (clocks apart) is forgotten and exchanged again.
//! The pure parts (the request form, reading the answer, when to exchange again) are here; the
//! HTTP call is `api`'s, which counts it like every other call.

use std::fmt;
use std::path::PathBuf;

use jiff::{SignedDuration, Timestamp};
use peerpods_provider_core::{ExposeSecret, SecretString};
use serde_json::Value;

use super::settings::Rrsa;
use super::signature::percent_encode;

/// STS's action and version for RRSA.
pub const ASSUME_ROLE_WITH_OIDC: &str = "AssumeRoleWithOIDC";
pub const STS_VERSION: &str = "2015-04-01";

/// Exchange again this long before `Expiration` at the latest: what Alibaba's credential SDKs
/// do (credentials-go refreshes 180 s before), so a call signed just before never arrives late.
const REFRESH_MARGIN: SignedDuration = SignedDuration::from_secs(180);

/// A key pair that signs calls, with the STS token of a temporary one. `Debug` never shows the
/// secret or the token.
#[derive(Clone)]
pub struct SigningKey {
    pub id: String,
    pub secret: SecretString,
    pub security_token: Option<SecretString>,
}

impl fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SigningKey")
            .field("id", &self.id)
            .field("secret", &"[redacted]")
            .field("temporary", &self.security_token.is_some())
            .finish()
    }
}

/// Why RRSA gave no key; the stable name of each cause (logs, metric labels, tests).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RrsaReason {
    /// The OIDC token file cannot be read (not mounted, no permission).
    TokenFileUnreadable,
    /// The OIDC token file is empty.
    TokenFileEmpty,
    /// STS refused the exchange (wrong or expired token, provider or role not trusting it).
    StsRefused,
    /// STS answered 2xx without usable credentials.
    StsAnswerUnreadable,
}

impl RrsaReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RrsaReason::TokenFileUnreadable => "TokenFileUnreadable",
            RrsaReason::TokenFileEmpty => "TokenFileEmpty",
            RrsaReason::StsRefused => "StsRefused",
            RrsaReason::StsAnswerUnreadable => "StsAnswerUnreadable",
        }
    }
}

/// What went wrong getting RRSA's temporary key: the cause behind the backend's
/// `CloudUnauthenticated` (its `source()`). Never carries the token or a secret.
#[derive(Debug, thiserror::Error)]
pub enum RrsaError {
    #[error("reading the RRSA OIDC token file {path} (ALIBABA_CLOUD_OIDC_TOKEN_FILE): {source}")]
    TokenFile {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the RRSA OIDC token file {path} (ALIBABA_CLOUD_OIDC_TOKEN_FILE) is empty")]
    EmptyToken { path: PathBuf },
    #[error("STS refused AssumeRoleWithOIDC for role {role_arn}: HTTP {status}: {code}: {message}")]
    Refused {
        role_arn: String,
        status: u16,
        code: String,
        message: String,
    },
    #[error("STS answered AssumeRoleWithOIDC without usable credentials: {what}")]
    Unreadable { what: String },
}

impl RrsaError {
    pub fn reason(&self) -> RrsaReason {
        match self {
            RrsaError::TokenFile { .. } => RrsaReason::TokenFileUnreadable,
            RrsaError::EmptyToken { .. } => RrsaReason::TokenFileEmpty,
            RrsaError::Refused { .. } => RrsaReason::StsRefused,
            RrsaError::Unreadable { .. } => RrsaReason::StsAnswerUnreadable,
        }
    }
}

/// Reads the OIDC token as the kubelet last wrote it.
pub async fn read_token(rrsa: &Rrsa) -> Result<SecretString, RrsaError> {
    let text = tokio::fs::read_to_string(&rrsa.token_file)
        .await
        .map_err(|source| RrsaError::TokenFile {
            path: rrsa.token_file.clone(),
            source,
        })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(RrsaError::EmptyToken {
            path: rrsa.token_file.clone(),
        });
    }
    Ok(SecretString::from(token.to_owned()))
}

/// The `AssumeRoleWithOIDC` parameters, form-encoded: sent as the body so the token never
/// appears in a URL (proxies and access logs keep URLs). `DurationSeconds` is left to the role's
/// default (3600).
pub fn exchange_form(rrsa: &Rrsa, token: &SecretString) -> String {
    [
        ("OIDCProviderArn", rrsa.oidc_provider_arn.as_str()),
        ("OIDCToken", token.expose_secret()),
        ("RoleArn", rrsa.role_arn.as_str()),
        ("RoleSessionName", rrsa.session_name.as_str()),
    ]
    .iter()
    .map(|(k, v)| format!("{k}={}", percent_encode(v)))
    .collect::<Vec<_>>()
    .join("&")
}

/// The temporary key and its expiry from STS's answer (`Credentials.AccessKeyId`,
/// `AccessKeySecret`, `SecurityToken`, `Expiration` as `2021-10-20T04:27:09Z`).
pub fn read_answer(answer: &Value) -> Result<(SigningKey, Timestamp), RrsaError> {
    let credentials = answer
        .get("Credentials")
        .ok_or_else(|| unreadable("no Credentials"))?;
    let field = |name: &str| {
        credentials
            .get(name)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| unreadable(&format!("no Credentials.{name}")))
    };
    let expiration = field("Expiration")?;
    let expires: Timestamp = expiration
        .parse()
        .map_err(|_| unreadable(&format!("Expiration {expiration:?} is not a UTC time")))?;
    Ok((
        SigningKey {
            id: field("AccessKeyId")?.to_owned(),
            secret: SecretString::from(field("AccessKeySecret")?.to_owned()),
            security_token: Some(SecretString::from(field("SecurityToken")?.to_owned())),
        },
        expires,
    ))
}

fn unreadable(what: &str) -> RrsaError {
    RrsaError::Unreadable { what: what.into() }
}

/// When to exchange again: after 80% of the key's lifetime, never later than [`REFRESH_MARGIN`]
/// before it expires, and at once for a key that is short-lived or already expired.
pub fn refresh_at(obtained: Timestamp, expires: Timestamp) -> Timestamp {
    let lifetime = expires.duration_since(obtained);
    if lifetime <= SignedDuration::ZERO {
        return obtained;
    }
    let eighty_percent = SignedDuration::from_secs(lifetime.as_secs() * 4 / 5);
    let by_fraction = obtained.checked_add(eighty_percent).unwrap_or(obtained);
    let by_margin = expires.checked_sub(REFRESH_MARGIN).unwrap_or(obtained);
    by_fraction.min(by_margin).max(obtained)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn a_key_is_exchanged_again_before_it_expires() {
        let obtained = at("2026-01-01T00:00:00Z");
        // An hour (the default DurationSeconds): after 48 minutes.
        assert_eq!(
            refresh_at(obtained, at("2026-01-01T01:00:00Z")),
            at("2026-01-01T00:48:00Z")
        );
        // 15 minutes (STS's minimum): three minutes before it expires.
        assert_eq!(
            refresh_at(obtained, at("2026-01-01T00:15:00Z")),
            at("2026-01-01T00:12:00Z")
        );
        // Inside the margin, or already expired: at once.
        assert_eq!(refresh_at(obtained, at("2026-01-01T00:02:00Z")), obtained);
        assert_eq!(refresh_at(obtained, at("2025-12-31T23:00:00Z")), obtained);
    }

    /// The response example of the `AssumeRoleWithOIDC` API reference.
    #[test]
    fn the_documented_answer_is_read() {
        let answer = json!({
            "RequestId": "3D57EAD2-8723-1F26-B69C-F8707D8B565D",
            "AssumedRoleUser": {"AssumedRoleId": "33157794895460****",
                "Arn": "acs:ram::113511544585****:role/testoidc/TestOidcAssumedRoleSession"},
            "Credentials": {
                "SecurityToken": "CAIShwJ1q6Ft5B2yfSjIr5bSEsj4g7BihPWGWHz****",
                "Expiration": "2021-10-20T04:27:09Z",
                "AccessKeySecret": "CVwjCkNzTMupZ8NbTCxCBRq3K16jtcWFTJAyBEv2****",
                "AccessKeyId": "STS.NUgYrLnoC37mZZCNnAbez****"
            }
        });
        let (key, expires) = read_answer(&answer).expect("read");
        assert_eq!(key.id, "STS.NUgYrLnoC37mZZCNnAbez****");
        assert_eq!(
            key.security_token.as_ref().map(ExposeSecret::expose_secret),
            Some("CAIShwJ1q6Ft5B2yfSjIr5bSEsj4g7BihPWGWHz****")
        );
        assert_eq!(expires, at("2021-10-20T04:27:09Z"));
        assert!(!format!("{key:?}").contains("CVwjCkNz"));

        let mut without_token = answer.clone();
        without_token["Credentials"]["SecurityToken"] = json!("");
        let error = read_answer(&without_token).expect_err("no token");
        assert_eq!(error.reason(), RrsaReason::StsAnswerUnreadable);
        assert!(error.to_string().contains("Credentials.SecurityToken"));
    }

    #[test]
    fn the_token_travels_form_encoded_in_the_body() {
        let rrsa = Rrsa {
            role_arn: "acs:ram::1:role/r".into(),
            oidc_provider_arn: "acs:ram::1:oidc-provider/p".into(),
            token_file: "/t".into(),
            session_name: "s".into(),
        };
        assert_eq!(
            exchange_form(&rrsa, &SecretString::from("a.b+c/d".to_owned())),
            "OIDCProviderArn=acs%3Aram%3A%3A1%3Aoidc-provider%2Fp&OIDCToken=a.b%2Bc%2Fd\
             &RoleArn=acs%3Aram%3A%3A1%3Arole%2Fr&RoleSessionName=s"
        );
    }
}
