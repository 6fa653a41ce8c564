//! IAM: the API key (or a trusted profile's compute-resource token) is exchanged for a bearer
//! token (`POST /identity/token`, grant type `urn:ibm:params:oauth:grant-type:apikey` or
//! `...:cr-token`), cached, and exchanged again before it expires.
//! One exchange serves all concurrent callers: they queue on one lock and the first refreshes.

use base64::Engine;
use jiff::{SignedDuration, Timestamp};
use peerpods_provider_core::{Error, ExposeSecret, SecretString};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::http::{Answer, Http};
use crate::settings::{Credential, IamSettings};

const API_KEY_GRANT: &str = "urn:ibm:params:oauth:grant-type:apikey";
const CR_TOKEN_GRANT: &str = "urn:ibm:params:oauth:grant-type:cr-token";

/// A bearer token and the account it belongs to (PowerVS needs the account in its CRN header).
#[derive(Clone)]
pub struct Token {
    pub bearer: SecretString,
    pub account: Option<String>,
}

struct Cached {
    token: Token,
    refresh_at: Timestamp,
}

/// The token source of one backend.
pub struct Iam {
    settings: IamSettings,
    cached: Mutex<Option<Cached>>,
}

/// IAM's answer to a token request (IAM identity token API reference).
#[derive(Deserialize)]
struct TokenAnswer {
    access_token: String,
    expires_in: Option<i64>,
    expiration: Option<i64>,
}

impl Iam {
    pub fn new(settings: IamSettings) -> Self {
        Iam {
            settings,
            cached: Mutex::new(None),
        }
    }

    /// A token valid for a while yet, exchanging the API key when the cached one is due.
    pub async fn token(&self, http: &Http) -> Result<Token, Error> {
        let mut cached = self.cached.lock().await;
        if let Some(c) = cached.as_ref()
            && Timestamp::now() < c.refresh_at
        {
            return Ok(c.token.clone());
        }
        let obtained = Timestamp::now();
        let form = self.grant().await?;
        let form: Vec<(&str, &str)> = form.iter().map(|(k, v)| (*k, v.expose_secret())).collect();
        let answer = http
            .send(
                "GetIamToken",
                "exchanging credentials for an IAM token",
                || {
                    http.client()
                        .post(&self.settings.token_url)
                        .header("Accept", "application/json")
                        .form(&form)
                },
            )
            .await?;
        let parsed: TokenAnswer = token_answer(answer, http)?;
        let token = Token {
            account: account_of(&parsed.access_token),
            bearer: SecretString::from(parsed.access_token),
        };
        *cached = Some(Cached {
            token: token.clone(),
            refresh_at: refresh_at(obtained, parsed.expires_in, parsed.expiration),
        });
        Ok(token)
    }

    /// The form of the token request; a trusted profile's token file is read each time.
    async fn grant(&self) -> Result<Vec<(&'static str, SecretString)>, Error> {
        let secret = |v: &str| SecretString::from(v.to_owned());
        match &self.settings.credential {
            Credential::ApiKey(key) => Ok(vec![
                ("grant_type", secret(API_KEY_GRANT)),
                ("apikey", key.clone()),
            ]),
            Credential::TrustedProfile {
                profile_id,
                cr_token_file,
            } => {
                let cr_token = tokio::fs::read_to_string(cr_token_file)
                    .await
                    .map_err(|e| {
                        Error::cloud_unauthenticated(format!(
                            "reading the compute resource token {}: {e}",
                            cr_token_file.display()
                        ))
                        .with_source(e)
                    })?;
                Ok(vec![
                    ("grant_type", secret(CR_TOKEN_GRANT)),
                    ("cr_token", secret(cr_token.trim())),
                    ("profile_id", secret(profile_id)),
                ])
            }
        }
    }

    /// Forgets `used` if it is still the cached token (the cloud refused it: revoked or expired
    /// early), so the next caller exchanges the key again.
    pub async fn forget(&self, used: &Token) {
        let mut cached = self.cached.lock().await;
        if cached
            .as_ref()
            .is_some_and(|c| c.token.bearer.expose_secret() == used.bearer.expose_secret())
        {
            *cached = None;
        }
    }
}

/// IAM refuses a wrong, deleted or disabled API key (or profile token) with 400 (`BXNIM0415E`)
/// or 401: either way this service's own credentials are the problem.
fn token_answer(answer: Answer, http: &Http) -> Result<TokenAnswer, Error> {
    match answer.status.as_u16() {
        200..=299 => serde_json::from_str(&answer.body).map_err(|e| {
            Error::internal(format!("IAM token answer unreadable: {e}")).with_source(e)
        }),
        400 | 401 => Err(Error::cloud_unauthenticated(format!(
            "IAM refused the credentials: HTTP {}: {}",
            answer.status.as_u16(),
            http.cloud_message(&answer.body)
        ))),
        _ => Err(answer.into_error("exchanging credentials for an IAM token", http)),
    }
}

/// When to exchange again: after 80% of the token's lifetime (what IBM's SDKs do), never later
/// than one minute before it expires. `expiration` (Unix seconds) wins over `expires_in`.
pub fn refresh_at(
    obtained: Timestamp,
    expires_in: Option<i64>,
    expiration: Option<i64>,
) -> Timestamp {
    let expires = expiration
        .and_then(|at| Timestamp::from_second(at).ok())
        .or_else(|| {
            expires_in.and_then(|s| obtained.checked_add(SignedDuration::from_secs(s)).ok())
        })
        .unwrap_or(obtained);
    let lifetime = expires.duration_since(obtained);
    if lifetime <= SignedDuration::ZERO {
        return obtained;
    }
    let eighty_percent = SignedDuration::from_secs(lifetime.as_secs() * 4 / 5);
    let by_fraction = obtained.checked_add(eighty_percent).unwrap_or(obtained);
    let by_margin = expires
        .checked_sub(SignedDuration::from_secs(60))
        .unwrap_or(obtained);
    by_fraction.min(by_margin).max(obtained)
}

/// The account id (`account.bss` claim) of an IAM access token, a JWT. Only read, never
/// verified: the token came from IAM over TLS and the cloud checks it on every call.
pub fn account_of(access_token: &str) -> Option<String> {
    let payload = access_token.split('.').nth(1)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .ok()?;
    let claims: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    claims
        .get("account")?
        .get("bss")?
        .as_str()
        .map(str::to_owned)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> Timestamp {
        s.parse().expect("timestamp")
    }

    #[test]
    fn refresh_after_eighty_percent_of_the_lifetime() {
        let obtained = at("2026-01-01T00:00:00Z");
        assert_eq!(
            refresh_at(obtained, Some(3600), None),
            at("2026-01-01T00:48:00Z")
        );
        let expiration = at("2026-01-01T01:00:00Z").as_second();
        assert_eq!(
            refresh_at(obtained, Some(10), Some(expiration)),
            at("2026-01-01T00:48:00Z")
        );
    }

    #[test]
    fn short_lived_tokens_refresh_a_minute_early_and_dead_ones_at_once() {
        let obtained = at("2026-01-01T00:00:00Z");
        assert_eq!(
            refresh_at(obtained, Some(120), None),
            at("2026-01-01T00:01:00Z")
        );
        assert_eq!(refresh_at(obtained, Some(30), None), obtained);
        assert_eq!(refresh_at(obtained, None, None), obtained);
        assert_eq!(refresh_at(obtained, Some(-5), None), obtained);
    }

    #[test]
    fn account_is_read_from_the_token_claims() {
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"iam_id":"iam-ServiceId-1","account":{"valid":true,"bss":"a1b2c3"}}"#);
        assert_eq!(
            account_of(&format!("eyJhbGciOiJSUzI1NiJ9.{claims}.c2ln")),
            Some("a1b2c3".into())
        );
        assert_eq!(account_of("opaque-token"), None);
        assert_eq!(account_of("a.!!!.c"), None);
    }
}
