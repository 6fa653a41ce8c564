//! Google credentials from the configuration, built with the official `google-cloud-auth`
//! crate. Building never calls Google: a service-account key signs its own JWTs; the other
//! kinds fetch tokens on first use.

use google_cloud_auth::credentials::{
    Credentials, external_account, impersonated, service_account, user_account,
};
use peerpods_provider_core::ExposeSecret;
use serde_json::Value;

use crate::settings::{CREDENTIALS, CredentialSource, Problem};

/// The OAuth scope cloud-api-adaptor requests for its Compute Engine client.
pub const COMPUTE_SCOPE: &str = "https://www.googleapis.com/auth/compute";

/// Credentials, and the secret strings they hold (for the [`peerpods_provider_core::Redactor`]).
pub struct Built {
    pub credentials: Credentials,
    pub secrets: Vec<String>,
}

/// The credentials `source` describes, with [`COMPUTE_SCOPE`].
pub fn build(source: &CredentialSource) -> Result<Built, Problem> {
    match source {
        CredentialSource::Json { key, json } => from_json(key, json.expose_secret()),
        CredentialSource::ApplicationDefault => {
            let credentials = google_cloud_auth::credentials::Builder::default()
                .with_scopes([COMPUTE_SCOPE])
                .build()
                .map_err(|error| Problem {
                    key: CREDENTIALS,
                    reason: format!(
                        "is unset and application default credentials are unusable: {error}"
                    ),
                })?;
            Ok(Built {
                credentials,
                secrets: vec![],
            })
        }
    }
}

fn from_json(key: &'static str, text: &str) -> Result<Built, Problem> {
    let problem = |reason: String| Problem { key, reason };
    // serde_json's message may quote the text around the error: say only where it is.
    let json: Value = serde_json::from_str(text).map_err(|error| {
        problem(format!(
            "is not valid JSON (line {}, column {})",
            error.line(),
            error.column()
        ))
    })?;
    let kind = json
        .get("type")
        .and_then(Value::as_str)
        .ok_or_else(|| problem("has no \"type\" field: not a Google credentials file".into()))?
        .to_owned();
    let secrets = secrets_of(&json);
    let built = match kind.as_str() {
        "service_account" => {
            check_service_account(&json).map_err(|reason| problem(reason.into()))?;
            service_account::Builder::new(json)
                .with_access_specifier(service_account::AccessSpecifier::from_scopes([
                    COMPUTE_SCOPE,
                ]))
                .build()
        }
        "authorized_user" => user_account::Builder::new(json)
            .with_scopes([COMPUTE_SCOPE])
            .build(),
        "external_account" => external_account::Builder::new(json)
            .with_scopes([COMPUTE_SCOPE])
            .build(),
        "impersonated_service_account" => impersonated::Builder::new(json)
            .with_scopes([COMPUTE_SCOPE])
            .build(),
        other => {
            return Err(problem(format!(
                "has unsupported credentials type {other:?} (expected service_account, \
                 authorized_user, external_account or impersonated_service_account)"
            )));
        }
    };
    let redactor = peerpods_provider_core::Redactor::new(secrets.iter().cloned());
    let credentials = built.map_err(|error| {
        problem(redactor.redact(&format!("is not usable {kind} credentials: {error}")))
    })?;
    Ok(Built {
        credentials,
        secrets,
    })
}

/// The fields a service-account key needs to sign its own tokens (checked here so a broken key
/// is a configuration error, not a failure of the first call).
fn check_service_account(json: &Value) -> Result<(), &'static str> {
    let field = |name| {
        json.get(name)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
    };
    if field("client_email").is_none() {
        return Err("is a service-account key without \"client_email\"");
    }
    let key = field("private_key").ok_or("is a service-account key without \"private_key\"")?;
    if !(key.contains("-----BEGIN PRIVATE KEY-----")
        || key.contains("-----BEGIN RSA PRIVATE KEY-----"))
    {
        return Err("is a service-account key whose \"private_key\" is not a PEM private key");
    }
    Ok(())
}

/// Every secret string of a credentials file: the private key (whole and line by line, in case
/// a text repeats it with other line breaks), client secrets and refresh tokens.
fn secrets_of(json: &Value) -> Vec<String> {
    let mut secrets = Vec::new();
    for name in ["private_key", "client_secret", "refresh_token"] {
        if let Some(value) = json.get(name).and_then(Value::as_str) {
            secrets.push(value.to_owned());
            secrets.extend(
                value
                    .lines()
                    .filter(|line| line.len() >= 16 && !line.starts_with("-----"))
                    .map(str::to_owned),
            );
        }
    }
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_provider_core::SecretString;

    fn json(text: &str) -> CredentialSource {
        CredentialSource::Json {
            key: CREDENTIALS,
            json: SecretString::from(text.to_owned()),
        }
    }

    fn reason(source: &CredentialSource) -> String {
        match build(source) {
            Ok(_) => String::from("built"),
            Err(problem) => {
                assert_eq!(problem.key, CREDENTIALS);
                problem.reason
            }
        }
    }

    #[test]
    fn broken_files_are_config_problems_that_never_quote_the_file() {
        let not_json = reason(&json("{\"private_key\": \"hunter2-hunter2\""));
        assert!(not_json.contains("not valid JSON"), "{not_json}");
        assert!(!not_json.contains("hunter2"));
        assert!(reason(&json("{}")).contains("no \"type\""));
        assert!(reason(&json("{\"type\":\"gdch_service_account\"}")).contains("unsupported"));
        let no_key = reason(&json(
            "{\"type\":\"service_account\",\"client_email\":\"a@b.iam.gserviceaccount.com\"}",
        ));
        assert!(no_key.contains("private_key"), "{no_key}");
        let not_pem = reason(&json(
            "{\"type\":\"service_account\",\"client_email\":\"a@b\",\"private_key\":\"hunter2-hunter2\"}",
        ));
        assert!(not_pem.contains("not a PEM"), "{not_pem}");
        assert!(!not_pem.contains("hunter2"));
    }

    #[test]
    fn secrets_include_the_key_lines() {
        let json: Value = serde_json::json!({
            "private_key": "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\nabc\n-----END PRIVATE KEY-----\n",
            "client_email": "not-secret@example.iam.gserviceaccount.com",
        });
        let secrets = secrets_of(&json);
        assert!(secrets.contains(&"MIIEvQIBADANBgkqhkiG9w0BAQEFAASC".to_owned()));
        assert!(!secrets.iter().any(|s| s.contains("not-secret")));
        assert!(!secrets.contains(&"abc".to_owned()));
    }
}
