//! AWS settings from configuration keys (pure parsing; the keys are cloud-api-adaptor's names).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use peerpods_provider_core::deletion::window_from_config;
use peerpods_provider_core::{Error, OwnerTag, ProviderConfig, parse_tags};

use super::batch::BatchPolicy;

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "aws";

/// The setting of the consistency window, named when an instance is not yet visible.
pub const NOT_FOUND_WINDOW_SETTING: &str = "AWS_NOT_FOUND_WINDOW_SECS";

/// How long a NotFound must persist before it counts as gone: EC2 is eventually consistent (right
/// after `RunInstances` other calls may not know the new id, and a filtered `DescribeInstances`
/// may not list it), and its documentation ("Eventual consistency in the Amazon EC2 API") backs
/// off "up to about five minutes" for a new id to propagate.
pub const DEFAULT_NOT_FOUND_WINDOW: Duration = Duration::from_secs(300);

/// How long a deletion waits before looking again while EC2 terminates an instance (its
/// `shutting-down` lasts from seconds to minutes), refuses it for its state, or releases an
/// address: lookups of concurrent deletions share one `DescribeInstances`, so this costs little.
pub const DEFAULT_DELETE_POLL: Duration = Duration::from_secs(2);

/// How long a deletion waits after EC2 accepted the termination before its first look: an
/// instance that terminates at once (one already stopped) is confirmed then, one still
/// `shutting-down` is looked at again every [`DEFAULT_DELETE_POLL`]. The looks of concurrent
/// deletions share one `DescribeInstances`, so a storm of deletions pays one more call.
pub const DEFAULT_DELETE_FIRST_LOOK: Duration = Duration::from_millis(250);

/// Static credentials given in the configuration. Never printed: `Debug` hides the values.
#[derive(Clone, PartialEq, Eq)]
pub struct StaticCredentials {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: Option<String>,
}

impl fmt::Debug for StaticCredentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StaticCredentials([redacted])")
    }
}

/// A web identity to exchange for credentials with STS `AssumeRoleWithWebIdentity`: what EKS's
/// IAM roles for service accounts (IRSA) puts in a pod's environment. Neither value is secret:
/// the token is read from its file on each exchange, so a rotated token is picked up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WebIdentity {
    /// `AWS_WEB_IDENTITY_TOKEN_FILE`: the projected ServiceAccount token.
    pub token_file: PathBuf,
    /// `AWS_ROLE_ARN`: the IAM role to assume.
    pub role_arn: String,
    /// `AWS_ROLE_SESSION_NAME`; without it `peerpods-provider-service`.
    pub session_name: String,
}

/// The STS session name when `AWS_ROLE_SESSION_NAME` is unset: what CloudTrail shows for the
/// calls made with the role.
pub const DEFAULT_SESSION_NAME: &str = "peerpods-provider-service";

/// Where the EC2 calls' credentials come from, decided by the configuration alone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CredentialSource {
    /// `AWS_ACCESS_KEY_ID` + `AWS_SECRET_ACCESS_KEY` (+ `AWS_SESSION_TOKEN`). They win over a
    /// web identity configured beside them, as in the SDK's own chain.
    Static(StaticCredentials),
    /// `AWS_WEB_IDENTITY_TOKEN_FILE` + `AWS_ROLE_ARN`, exchanged with STS at `sts_endpoint_url`
    /// (the endpoint override applies to STS as to EC2).
    WebIdentity(WebIdentity),
    /// Neither: the SDK's default chain (EKS Pod Identity's container credentials, a profile,
    /// instance metadata).
    DefaultChain,
}

impl CredentialSource {
    /// Its name in logs (never a credential).
    pub fn describe(&self) -> String {
        match self {
            CredentialSource::Static(_) => "static keys from the configuration".to_owned(),
            CredentialSource::WebIdentity(identity) => format!(
                "web identity: role {} with the token in {}",
                identity.role_arn,
                identity.token_file.display()
            ),
            CredentialSource::DefaultChain => "the AWS SDK's default credential chain".to_owned(),
        }
    }
}

/// Everything the AWS provider reads from its configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AwsSettings {
    /// `AWS_REGION`; without it the SDK's default region chain decides.
    pub region: Option<String>,
    /// Static keys, a web identity or the SDK's default chain ([`CredentialSource`]).
    pub credentials: CredentialSource,
    /// Whether a web identity is configured but static keys win over it (logged as a warning).
    pub web_identity_ignored: bool,
    /// `AWS_ENDPOINT_URL`: another EC2 endpoint, e.g. a local emulator.
    pub endpoint_url: Option<String>,
    /// `AWS_ENDPOINT_URL_STS`, else `AWS_ENDPOINT_URL` (the SDK's own precedence): where a web
    /// identity is exchanged; `None` is STS's regional endpoint.
    pub sts_endpoint_url: Option<String>,
    /// `TAGS` (`k=v,k2=v2`): the tags cloud-api-adaptor puts on the instances of this cluster.
    pub cluster_tags: BTreeMap<String, String>,
    /// `CLUSTER_TAG` (`key=value`): the tag this cluster's instances carry (peerpod-ctrl's
    /// `--cluster-tag`). With it, deleting an instance that lacks it is refused, unless
    /// `DELETE_UNTAGGED=allow`.
    pub owner_tag: Option<(String, String)>,
    /// `AWS_DELETE_BATCH_IDLE_MS`, `AWS_DELETE_BATCH_MAX_WAIT_MS`, `AWS_DELETE_BATCH_MAX_IDS`.
    pub batch: BatchPolicy,
    /// `AWS_MAX_CONCURRENT_CALLS`: EC2 calls in flight at once.
    pub max_concurrent_calls: usize,
    /// `AWS_CALLS_PER_SECOND`: sustained EC2 call rate (bursts up to `AWS_CALL_BURST`).
    pub calls_per_second: u32,
    /// `AWS_CALL_BURST`.
    pub call_burst: u32,
    /// `AWS_MAX_ATTEMPTS` (the SDK's own name): attempts per call including the SDK's retries.
    pub max_attempts: u32,
    /// `AWS_CONNECT_TIMEOUT_MS` and `AWS_OPERATION_TIMEOUT_MS`.
    pub connect_timeout: Duration,
    pub operation_timeout: Duration,
    /// `AWS_NOT_FOUND_WINDOW_SECS`: how long EC2 must keep not showing an instance, from the
    /// first time this process looked for it in vain, before it counts as gone (EC2 is eventually
    /// consistent: a new instance can be unknown for a while). 0 believes the first NotFound.
    pub not_found_window: Duration,
    /// `AWS_DELETE_POLL_MS` (ours): how long a deletion waits before looking again.
    pub delete_poll: Duration,
    /// `AWS_DELETE_FIRST_LOOK_MS` (ours): the wait before the first look after EC2 accepted
    /// the termination (the poll when longer).
    pub delete_first_look: Duration,
}

/// A configuration key with an unusable value: the key and why (never the value itself, which
/// may be a secret).
#[derive(Debug, PartialEq, Eq)]
pub struct SettingsProblem {
    pub key: String,
    pub reason: String,
}

impl AwsSettings {
    /// Reads the settings from `config` (blank values count as unset); numbers and durations through its
    /// typed getters.
    pub fn from_config(config: &ProviderConfig) -> Result<Self, SettingsProblem> {
        let get = |key: &str| config.get(key).map(str::to_owned);
        let static_keys = match (get("AWS_ACCESS_KEY_ID"), get("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key_id), Some(secret_access_key)) => Some(StaticCredentials {
                access_key_id,
                secret_access_key,
                session_token: get("AWS_SESSION_TOKEN"),
            }),
            (None, None) => None,
            (Some(_), None) => return Err(missing("AWS_SECRET_ACCESS_KEY", "AWS_ACCESS_KEY_ID")),
            (None, Some(_)) => return Err(missing("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")),
        };
        let web_identity = match (get("AWS_WEB_IDENTITY_TOKEN_FILE"), get("AWS_ROLE_ARN")) {
            (Some(token_file), Some(role_arn)) => Some(WebIdentity {
                token_file: PathBuf::from(token_file),
                role_arn,
                session_name: get("AWS_ROLE_SESSION_NAME")
                    .unwrap_or_else(|| DEFAULT_SESSION_NAME.to_owned()),
            }),
            (None, None) => None,
            (Some(_), None) => return Err(missing("AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE")),
            (None, Some(_)) => return Err(missing("AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN")),
        };
        let web_identity_ignored = static_keys.is_some() && web_identity.is_some();
        let credentials = match (static_keys, web_identity) {
            (Some(keys), _) => CredentialSource::Static(keys),
            (None, Some(identity)) => CredentialSource::WebIdentity(identity),
            (None, None) => CredentialSource::DefaultChain,
        };
        let endpoint_url = url(get, "AWS_ENDPOINT_URL")?;
        let sts_endpoint_url = url(get, "AWS_ENDPOINT_URL_STS")?.or_else(|| endpoint_url.clone());
        let defaults = BatchPolicy::default();
        let millis = |key: &'static str, default: Duration| -> Result<Duration, SettingsProblem> {
            Ok(typed(config.duration_ms(key))?.unwrap_or(default))
        };
        Ok(Self {
            region: get("AWS_REGION"),
            credentials,
            web_identity_ignored,
            endpoint_url,
            sts_endpoint_url,
            cluster_tags: parse_tags(get("TAGS").as_deref().unwrap_or("")).map_err(from_core)?,
            owner_tag: OwnerTag::parse(
                get("CLUSTER_TAG").as_deref(),
                get("DELETE_UNTAGGED").as_deref(),
            )
            .map_err(from_core)?
            .required()
            .map(|(k, v)| (k.to_owned(), v.to_owned())),
            batch: BatchPolicy {
                idle: millis("AWS_DELETE_BATCH_IDLE_MS", defaults.idle)?,
                max_wait: millis("AWS_DELETE_BATCH_MAX_WAIT_MS", defaults.max_wait)?,
                max_ids: typed(config.positive("AWS_DELETE_BATCH_MAX_IDS"))?
                    .unwrap_or(defaults.max_ids)
                    // EC2's own limit per TerminateInstances call.
                    .min(1000),
            },
            max_concurrent_calls: typed(config.positive("AWS_MAX_CONCURRENT_CALLS"))?.unwrap_or(8),
            // EC2 refills its API token buckets at 5 (mutating) to 20 (describe) calls/s per account.
            calls_per_second: typed(config.positive("AWS_CALLS_PER_SECOND"))?.unwrap_or(20),
            call_burst: typed(config.positive("AWS_CALL_BURST"))?.unwrap_or(50),
            max_attempts: typed(config.positive("AWS_MAX_ATTEMPTS"))?.unwrap_or(3),
            connect_timeout: millis("AWS_CONNECT_TIMEOUT_MS", Duration::from_secs(5))?,
            operation_timeout: millis("AWS_OPERATION_TIMEOUT_MS", Duration::from_secs(60))?,
            not_found_window: window_from_config(
                config,
                NOT_FOUND_WINDOW_SETTING,
                DEFAULT_NOT_FOUND_WINDOW,
            )
            .map_err(from_core)?
            .0,
            delete_poll: typed(config.positive_duration_ms("AWS_DELETE_POLL_MS"))?
                .unwrap_or(DEFAULT_DELETE_POLL),
            delete_first_look: typed(config.positive_duration_ms("AWS_DELETE_FIRST_LOOK_MS"))?
                .unwrap_or(DEFAULT_DELETE_FIRST_LOOK),
        })
    }

    /// Values that must never appear in logs, errors or metrics.
    pub fn secrets(&self) -> Vec<String> {
        match &self.credentials {
            CredentialSource::Static(c) => {
                [Some(c.secret_access_key.clone()), c.session_token.clone()]
                    .into_iter()
                    .flatten()
                    .collect()
            }
            // The token is read from its file at each exchange; STS's answers never echo it.
            CredentialSource::WebIdentity(_) | CredentialSource::DefaultChain => Vec::new(),
        }
    }
}

/// An endpoint URL setting: unset, or a URL with an http(s) scheme.
fn url(
    get: impl Fn(&str) -> Option<String>,
    key: &'static str,
) -> Result<Option<String>, SettingsProblem> {
    match get(key) {
        Some(url) if !(url.starts_with("http://") || url.starts_with("https://")) => {
            Err(SettingsProblem {
                key: key.to_owned(),
                reason: "must start with http:// or https://".into(),
            })
        }
        other => Ok(other),
    }
}

fn missing(key: &'static str, other: &str) -> SettingsProblem {
    SettingsProblem {
        key: key.to_owned(),
        reason: format!("must be set when {other} is set"),
    }
}

/// A typed getter's refusal as a settings problem.
fn typed<T>(got: Result<Option<T>, Error>) -> Result<Option<T>, SettingsProblem> {
    got.map_err(from_core)
}

/// A core configuration error (key and message) as a settings problem.
fn from_core(error: Error) -> SettingsProblem {
    match error {
        Error::Config { key, message, .. } => SettingsProblem {
            key,
            reason: message,
        },
        other => SettingsProblem {
            key: String::new(),
            reason: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(pairs: &[(&str, &str)]) -> Result<AwsSettings, SettingsProblem> {
        AwsSettings::from_config(&ProviderConfig::from_pairs(pairs.iter().copied()))
    }

    #[test]
    fn defaults_without_any_key() {
        let s = settings(&[]).expect("defaults");
        assert_eq!(s.region, None);
        assert_eq!(s.credentials, CredentialSource::DefaultChain);
        assert_eq!(s.sts_endpoint_url, None);
        assert_eq!(s.batch, BatchPolicy::default());
        assert!(s.cluster_tags.is_empty());
        assert_eq!(s.owner_tag, None);
        assert!(s.secrets().is_empty());
        assert_eq!(s.not_found_window, Duration::from_secs(300));
        assert_eq!(s.delete_poll, Duration::from_secs(2));
        assert_eq!(s.delete_first_look, Duration::from_millis(250));
    }

    #[test]
    fn the_delete_poll_and_its_first_look_are_read_in_milliseconds_and_are_never_zero() {
        let s = settings(&[("AWS_DELETE_POLL_MS", "50")]).expect("valid");
        assert_eq!(s.delete_poll, Duration::from_millis(50));
        assert_eq!(
            settings(&[("AWS_DELETE_POLL_MS", "0")])
                .expect_err("zero")
                .key,
            "AWS_DELETE_POLL_MS"
        );
        let s = settings(&[("AWS_DELETE_FIRST_LOOK_MS", "10")]).expect("valid");
        assert_eq!(s.delete_first_look, Duration::from_millis(10));
        assert_eq!(
            settings(&[("AWS_DELETE_FIRST_LOOK_MS", "0")])
                .expect_err("zero")
                .key,
            "AWS_DELETE_FIRST_LOOK_MS"
        );
    }

    #[test]
    fn the_not_found_window_is_read_in_seconds_and_may_be_zero() {
        let s = settings(&[("AWS_NOT_FOUND_WINDOW_SECS", "20")]).expect("valid");
        assert_eq!(s.not_found_window, Duration::from_secs(20));
        let s = settings(&[("AWS_NOT_FOUND_WINDOW_SECS", "0")]).expect("valid");
        assert_eq!(s.not_found_window, Duration::ZERO);
        assert_eq!(
            settings(&[("AWS_NOT_FOUND_WINDOW_SECS", "5m")])
                .expect_err("not a number")
                .key,
            "AWS_NOT_FOUND_WINDOW_SECS"
        );
    }

    #[test]
    fn static_keys_and_endpoint_are_read() {
        let s = settings(&[
            ("AWS_REGION", "eu-west-1"),
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret-value-1234"),
            ("AWS_SESSION_TOKEN", " token-value-5678\n"),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
            ("AWS_DELETE_BATCH_IDLE_MS", "30"),
            ("AWS_DELETE_BATCH_MAX_IDS", "7"),
        ])
        .expect("valid");
        assert_eq!(s.region.as_deref(), Some("eu-west-1"));
        let CredentialSource::Static(creds) = s.credentials.clone() else {
            panic!("static credentials: {:?}", s.credentials);
        };
        assert_eq!(creds.session_token.as_deref(), Some("token-value-5678"));
        assert_eq!(s.endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));
        assert_eq!(s.batch.idle, Duration::from_millis(30));
        assert_eq!(s.batch.max_ids, 7);
        assert_eq!(s.secrets(), vec!["secret-value-1234", "token-value-5678"]);
        let printed = format!("{s:?}");
        assert!(!printed.contains("secret-value-1234"), "{printed}");
        assert!(!printed.contains("token-value-5678"), "{printed}");
    }

    #[test]
    fn a_web_identity_is_used_without_static_keys_and_sts_follows_the_endpoint() {
        let s = settings(&[
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/eks/token"),
            (
                "AWS_ROLE_ARN",
                "arn:aws:iam::123456789012:role/provider-service",
            ),
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
        ])
        .expect("valid");
        assert_eq!(
            s.credentials,
            CredentialSource::WebIdentity(WebIdentity {
                token_file: PathBuf::from("/var/run/secrets/eks/token"),
                role_arn: "arn:aws:iam::123456789012:role/provider-service".to_owned(),
                session_name: DEFAULT_SESSION_NAME.to_owned(),
            })
        );
        assert!(!s.web_identity_ignored);
        assert_eq!(s.sts_endpoint_url.as_deref(), Some("http://127.0.0.1:5000"));

        let s = settings(&[
            ("AWS_ENDPOINT_URL", "http://127.0.0.1:5000"),
            ("AWS_ENDPOINT_URL_STS", "https://sts.example"),
        ])
        .expect("valid");
        assert_eq!(s.sts_endpoint_url.as_deref(), Some("https://sts.example"));
        assert_eq!(
            settings(&[("AWS_ENDPOINT_URL_STS", "sts.example")])
                .expect_err("scheme")
                .key,
            "AWS_ENDPOINT_URL_STS"
        );
    }

    #[test]
    fn static_keys_win_over_a_web_identity_and_say_so() {
        let s = settings(&[
            ("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE"),
            ("AWS_SECRET_ACCESS_KEY", "secret-value-1234"),
            ("AWS_WEB_IDENTITY_TOKEN_FILE", "/token"),
            ("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/r"),
        ])
        .expect("valid");
        assert!(matches!(s.credentials, CredentialSource::Static(_)));
        assert!(s.web_identity_ignored);
    }

    #[test]
    fn half_a_web_identity_names_the_missing_key() {
        assert_eq!(
            settings(&[("AWS_WEB_IDENTITY_TOKEN_FILE", "/token")])
                .expect_err("no role")
                .key,
            "AWS_ROLE_ARN"
        );
        assert_eq!(
            settings(&[("AWS_ROLE_ARN", "arn:aws:iam::123456789012:role/r")])
                .expect_err("no token file")
                .key,
            "AWS_WEB_IDENTITY_TOKEN_FILE"
        );
    }

    #[test]
    fn half_a_key_pair_names_the_missing_key() {
        let err = settings(&[("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")]).expect_err("incomplete");
        assert_eq!(err.key, "AWS_SECRET_ACCESS_KEY");
        let err = settings(&[("AWS_SECRET_ACCESS_KEY", "s3cr3t-value")]).expect_err("incomplete");
        assert_eq!(err.key, "AWS_ACCESS_KEY_ID");
        assert!(!err.reason.contains("s3cr3t"));
    }

    #[test]
    fn bad_numbers_and_urls_name_their_key() {
        assert_eq!(
            settings(&[("AWS_DELETE_BATCH_MAX_IDS", "0")])
                .expect_err("zero")
                .key,
            "AWS_DELETE_BATCH_MAX_IDS"
        );
        assert_eq!(
            settings(&[("AWS_CALLS_PER_SECOND", "fast")])
                .expect_err("nan")
                .key,
            "AWS_CALLS_PER_SECOND"
        );
        assert_eq!(
            settings(&[("AWS_CALLS_PER_SECOND", "fast")])
                .expect_err("nan")
                .reason,
            r#"expected a whole number greater than zero, got "fast""#
        );
        assert_eq!(
            settings(&[("AWS_ENDPOINT_URL", "127.0.0.1:5000")])
                .expect_err("scheme")
                .key,
            "AWS_ENDPOINT_URL"
        );
    }

    #[test]
    fn batch_size_is_capped_at_ec2_limit() {
        let s = settings(&[("AWS_DELETE_BATCH_MAX_IDS", "5000")]).expect("valid");
        assert_eq!(s.batch.max_ids, 1000);
    }

    #[test]
    fn cluster_tag_guards_deletes_unless_untagged_deletes_are_allowed() {
        let s = settings(&[("CLUSTER_TAG", "peerpods.io/cluster=prod")]).expect("valid");
        assert_eq!(
            s.owner_tag,
            Some(("peerpods.io/cluster".to_owned(), "prod".to_owned()))
        );
        let s = settings(&[
            ("CLUSTER_TAG", "peerpods.io/cluster=prod"),
            ("DELETE_UNTAGGED", "allow"),
        ])
        .expect("valid");
        assert_eq!(s.owner_tag, None);
        assert_eq!(
            settings(&[("CLUSTER_TAG", "nokey")]).expect_err("bad").key,
            "CLUSTER_TAG"
        );
        assert_eq!(
            settings(&[("DELETE_UNTAGGED", "yes")])
                .expect_err("bad")
                .key,
            "DELETE_UNTAGGED"
        );
    }
}
