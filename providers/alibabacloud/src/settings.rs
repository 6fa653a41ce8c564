//! Alibaba Cloud settings from configuration keys (pure parsing). The credential, region and tag
//! keys are cloud-api-adaptor's (`src/cloud-providers/alibabacloud/manager.go`); the RRSA keys are
//! the ones ACK's RRSA webhook injects and Alibaba's SDKs read; the endpoint and timing keys are
//! this backend's own.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use peerpods_provider_core::config::{SettingsRefusal, typed};
use peerpods_provider_core::{ProviderConfig, SecretString};

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "alibabacloud";

/// cloud-api-adaptor's key of the access key id.
pub const ACCESS_KEY_ID: &str = "ALIBABACLOUD_ACCESS_KEY_ID";
/// cloud-api-adaptor's key of the access key secret.
pub const ACCESS_KEY_SECRET: &str = "ALIBABACLOUD_ACCESS_KEY_SECRET";
/// cloud-api-adaptor's region key (default `cn-beijing`, as there).
pub const REGION: &str = "REGION";
/// cloud-api-adaptor's tags (`k=v,k2=v2`) put on every peer-pod VM.
pub const TAGS: &str = "TAGS";
/// ECS endpoint override (sovereign/private clouds, tests); default `https://ecs.<region>.aliyuncs.com`.
pub const ECS_ENDPOINT: &str = "ALIBABACLOUD_ECS_ENDPOINT";
/// VPC endpoint override; default `https://vpc.<region>.aliyuncs.com`.
pub const VPC_ENDPOINT: &str = "ALIBABACLOUD_VPC_ENDPOINT";
/// STS endpoint override (RRSA's `AssumeRoleWithOIDC`; tests, private clouds); scheme, host and
/// port. Unset: [`ACK_STS_ENDPOINT`], else `https://sts.aliyuncs.com`, the endpoint Alibaba's
/// credential SDKs call.
pub const STS_ENDPOINT: &str = "ALIBABACLOUD_STS_ENDPOINT";
/// The STS endpoint ACK's RRSA webhook (0.4.0 and later) injects, a host name such as
/// `sts-vpc.cn-hangzhou.aliyuncs.com` (reachable from the cluster's VPC), called over HTTPS.
pub const ACK_STS_ENDPOINT: &str = "ALIBABA_CLOUD_STS_ENDPOINT";
/// RRSA: the RAM role to assume (injected by ACK's RRSA webhook).
pub const ROLE_ARN: &str = "ALIBABA_CLOUD_ROLE_ARN";
/// RRSA: the cluster's OIDC provider registered in RAM (injected by the webhook).
pub const OIDC_PROVIDER_ARN: &str = "ALIBABA_CLOUD_OIDC_PROVIDER_ARN";
/// RRSA: the projected ServiceAccount token the kubelet rotates (injected by the webhook).
pub const OIDC_TOKEN_FILE: &str = "ALIBABA_CLOUD_OIDC_TOKEN_FILE";
/// RRSA: the STS session name (`RoleSessionName`, what ActionTrail shows); default
/// [`DEFAULT_SESSION_NAME`].
pub const ROLE_SESSION_NAME: &str = "ALIBABA_CLOUD_ROLE_SESSION_NAME";
/// The STS session name when [`ROLE_SESSION_NAME`] is unset.
pub const DEFAULT_SESSION_NAME: &str = "peerpods-provider-service";
/// Attempts per call when the cloud answers 5xx or not at all (default 3).
pub const MAX_ATTEMPTS: &str = "ALIBABACLOUD_MAX_ATTEMPTS";
/// Timeout of one HTTP request in milliseconds (default 10000).
pub const REQUEST_TIMEOUT_MS: &str = "ALIBABACLOUD_REQUEST_TIMEOUT_MS";
/// How long a delete waits for an instance or EIP to change state, in ms (default 30000, as
/// cloud-api-adaptor waits for `IncorrectInstanceStatus` to clear).
pub const WAIT_TIMEOUT_MS: &str = "ALIBABACLOUD_WAIT_TIMEOUT_MS";
/// Pause between two state polls in milliseconds (default 1000, as cloud-api-adaptor).
pub const POLL_INTERVAL_MS: &str = "ALIBABACLOUD_POLL_INTERVAL_MS";

const DEFAULT_REGION: &str = "cn-beijing";

/// The key pair; `Debug` never shows the secret.
#[derive(Clone)]
pub struct AccessKey {
    pub id: String,
    pub secret: SecretString,
}

impl fmt::Debug for AccessKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AccessKey")
            .field("id", &self.id)
            .field("secret", &"[redacted]")
            .finish()
    }
}

/// RRSA (RAM Roles for Service Accounts on ACK): the pod's OIDC token exchanged with STS
/// `AssumeRoleWithOIDC` for the role's temporary key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rrsa {
    pub role_arn: String,
    pub oidc_provider_arn: String,
    /// Read again at each exchange: the kubelet rotates the token in place.
    pub token_file: PathBuf,
    pub session_name: String,
}

/// Where the signing key comes from, in cloud-api-adaptor's order: its static key pair when
/// one is set, otherwise RRSA.
#[derive(Clone, Debug)]
pub enum Credential {
    AccessKey(AccessKey),
    Rrsa(Rrsa),
}

/// Everything the backend reads from its configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub credential: Credential,
    pub region: String,
    pub ecs_endpoint: String,
    pub vpc_endpoint: String,
    pub sts_endpoint: String,
    pub cluster_tags: BTreeMap<String, String>,
    pub max_attempts: u32,
    pub request_timeout: Duration,
    pub wait_timeout: Duration,
    pub poll_interval: Duration,
}

/// An unusable key: which, and why (never a credential's value).
#[derive(Debug, PartialEq, Eq)]
pub struct SettingsProblem {
    pub key: &'static str,
    pub reason: String,
}

impl Settings {
    pub fn from_config(config: &ProviderConfig) -> Result<Self, SettingsProblem> {
        let credential = credential(config)?;
        let region = config.get(REGION).unwrap_or(DEFAULT_REGION).to_owned();
        if !region
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err(SettingsProblem {
                key: REGION,
                reason: "expected a region id such as cn-beijing".into(),
            });
        }
        let ecs_endpoint = endpoint(config, ECS_ENDPOINT, || {
            format!("https://ecs.{region}.aliyuncs.com")
        })?;
        let vpc_endpoint = endpoint(config, VPC_ENDPOINT, || {
            format!("https://vpc.{region}.aliyuncs.com")
        })?;
        let sts_endpoint = match config.get(ACK_STS_ENDPOINT) {
            // A bare host, as the webhook writes it; a URL is taken as it is.
            Some(ack) if config.get(STS_ENDPOINT).is_none() => {
                let url = if ack.contains("://") {
                    ack.to_owned()
                } else {
                    format!("https://{ack}")
                };
                endpoint(
                    &ProviderConfig::from_pairs([(ACK_STS_ENDPOINT, url)]),
                    ACK_STS_ENDPOINT,
                    String::new,
                )?
            }
            _ => endpoint(config, STS_ENDPOINT, || "https://sts.aliyuncs.com".into())?,
        };
        Ok(Settings {
            cluster_tags: parse_tags(config.get(TAGS).unwrap_or(""))?,
            max_attempts: typed(MAX_ATTEMPTS, config.number_in(MAX_ATTEMPTS, 1..=10))?.unwrap_or(3),
            request_timeout: millis(config, REQUEST_TIMEOUT_MS, 10_000)?,
            wait_timeout: millis(config, WAIT_TIMEOUT_MS, 30_000)?,
            poll_interval: millis(config, POLL_INTERVAL_MS, 1_000)?,
            credential,
            region,
            ecs_endpoint,
            vpc_endpoint,
            sts_endpoint,
        })
    }
}

/// The static key pair when its id is set; otherwise RRSA when any of its keys is set (then all
/// three are required); otherwise the key id is what is missing.
fn credential(config: &ProviderConfig) -> Result<Credential, SettingsProblem> {
    if let Some(id) = config.get(ACCESS_KEY_ID) {
        return Ok(Credential::AccessKey(AccessKey {
            id: id.to_owned(),
            secret: config.secret(ACCESS_KEY_SECRET).ok_or_else(|| {
                missing(
                    ACCESS_KEY_SECRET,
                    "required with ALIBABACLOUD_ACCESS_KEY_ID",
                )
            })?,
        }));
    }
    let rrsa = [ROLE_ARN, OIDC_PROVIDER_ARN, OIDC_TOKEN_FILE].map(|key| (key, config.get(key)));
    if rrsa.iter().all(|(_, value)| value.is_none()) {
        return Err(missing(
            ACCESS_KEY_ID,
            "required (cloud-api-adaptor's static access key), or RRSA's ALIBABA_CLOUD_ROLE_ARN, \
             ALIBABA_CLOUD_OIDC_PROVIDER_ARN and ALIBABA_CLOUD_OIDC_TOKEN_FILE",
        ));
    }
    let [role_arn, oidc_provider_arn, token_file] = rrsa.map(|(key, value)| {
        value
            .map(str::to_owned)
            .ok_or_else(|| missing(key, "required for RRSA (with ALIBABA_CLOUD_ROLE_ARN, ALIBABA_CLOUD_OIDC_PROVIDER_ARN and ALIBABA_CLOUD_OIDC_TOKEN_FILE)"))
    });
    Ok(Credential::Rrsa(Rrsa {
        role_arn: role_arn?,
        oidc_provider_arn: oidc_provider_arn?,
        token_file: PathBuf::from(token_file?),
        session_name: config
            .get(ROLE_SESSION_NAME)
            .unwrap_or(DEFAULT_SESSION_NAME)
            .to_owned(),
    }))
}

fn missing(key: &'static str, reason: &str) -> SettingsProblem {
    SettingsProblem {
        key,
        reason: reason.into(),
    }
}

fn endpoint(
    config: &ProviderConfig,
    key: &'static str,
    default: impl FnOnce() -> String,
) -> Result<String, SettingsProblem> {
    let Some(url) = config.get(key) else {
        return Ok(default());
    };
    let url = url.trim_end_matches('/');
    let parsed = reqwest::Url::parse(url).map_err(|e| SettingsProblem {
        key,
        reason: format!("not a URL: {e}"),
    })?;
    if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
        return Err(SettingsProblem {
            key,
            reason: "expected an http:// or https:// URL with a host".into(),
        });
    }
    if parsed.path() != "/" || parsed.query().is_some() {
        return Err(SettingsProblem {
            key,
            reason: "expected scheme, host and port only (RPC APIs are called on /)".into(),
        });
    }
    Ok(url.to_owned())
}

/// A duration in milliseconds greater than zero, `default` when unset.
fn millis(
    config: &ProviderConfig,
    key: &'static str,
    default: u64,
) -> Result<Duration, SettingsProblem> {
    Ok(typed(key, config.positive_duration_ms(key))?.unwrap_or(Duration::from_millis(default)))
}

impl SettingsRefusal for SettingsProblem {
    fn refused(key: &'static str, reason: String) -> Self {
        SettingsProblem { key, reason }
    }
}

/// `k=v,k2=v2` as cloud-api-adaptor's `KeyValueFlag` reads it; blanks are skipped.
pub fn parse_tags(text: &str) -> Result<BTreeMap<String, String>, SettingsProblem> {
    let mut tags = BTreeMap::new();
    for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                tags.insert(key.trim().to_owned(), value.trim().to_owned());
            }
            _ => {
                return Err(SettingsProblem {
                    key: TAGS,
                    reason: "expected key=value pairs separated by commas".into(),
                });
            }
        }
    }
    Ok(tags)
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_provider_core::ExposeSecret;

    fn settings(pairs: &[(&str, &str)]) -> Result<Settings, SettingsProblem> {
        Settings::from_config(&ProviderConfig::from_pairs(pairs.iter().copied()))
    }

    const KEYS: [(&str, &str); 2] = [
        (ACCESS_KEY_ID, "LTAI5tExampleKeyId"),
        (ACCESS_KEY_SECRET, "s3cr3t-example-value"),
    ];

    #[test]
    fn defaults_follow_cloud_api_adaptor() {
        let s = settings(&KEYS).expect("valid");
        assert_eq!(s.region, "cn-beijing");
        assert_eq!(s.ecs_endpoint, "https://ecs.cn-beijing.aliyuncs.com");
        assert_eq!(s.vpc_endpoint, "https://vpc.cn-beijing.aliyuncs.com");
        let Credential::AccessKey(key) = &s.credential else {
            panic!("static keys expected: {:?}", s.credential)
        };
        assert_eq!(key.secret.expose_secret(), "s3cr3t-example-value");
        assert_eq!(s.sts_endpoint, "https://sts.aliyuncs.com");
        assert!(s.cluster_tags.is_empty());
        assert_eq!(s.max_attempts, 3);
        assert!(!format!("{s:?}").contains("s3cr3t-example-value"));
    }

    #[test]
    fn missing_keys_are_named() {
        assert_eq!(settings(&[]).expect_err("no key").key, ACCESS_KEY_ID);
        let problem = settings(&[KEYS[0]]).expect_err("no secret");
        assert_eq!(problem.key, ACCESS_KEY_SECRET);
    }

    #[test]
    fn without_static_keys_rrsa_is_read_and_all_its_keys_are_required() {
        let rrsa = [
            (ROLE_ARN, "acs:ram::1:role/peerpods"),
            (OIDC_PROVIDER_ARN, "acs:ram::1:oidc-provider/ack-rrsa-c1"),
            (
                OIDC_TOKEN_FILE,
                "/var/run/secrets/ack.alibabacloud.com/rrsa-tokens/token",
            ),
        ];
        let s = settings(&rrsa).expect("RRSA");
        assert_eq!(
            format!("{:?}", s.credential),
            format!(
                "{:?}",
                Credential::Rrsa(Rrsa {
                    role_arn: "acs:ram::1:role/peerpods".into(),
                    oidc_provider_arn: "acs:ram::1:oidc-provider/ack-rrsa-c1".into(),
                    token_file: "/var/run/secrets/ack.alibabacloud.com/rrsa-tokens/token".into(),
                    session_name: DEFAULT_SESSION_NAME.into(),
                })
            )
        );
        // Static keys win, as in cloud-api-adaptor.
        let mut both = rrsa.to_vec();
        both.extend(KEYS);
        assert!(matches!(
            settings(&both).expect("static").credential,
            Credential::AccessKey(_)
        ));
        for left_out in 0..3 {
            let partial: Vec<_> = rrsa
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != left_out)
                .map(|(_, pair)| *pair)
                .collect();
            assert_eq!(
                settings(&partial).expect_err("partial").key,
                rrsa[left_out].0
            );
        }
        assert!(
            settings(&[])
                .expect_err("nothing")
                .reason
                .contains(ROLE_ARN)
        );

        // The webhook's STS endpoint is a host; ours wins over it.
        let mut ack = rrsa.to_vec();
        ack.push((ACK_STS_ENDPOINT, "sts-vpc.cn-hangzhou.aliyuncs.com"));
        assert_eq!(
            settings(&ack).expect("RRSA").sts_endpoint,
            "https://sts-vpc.cn-hangzhou.aliyuncs.com"
        );
        ack.push((STS_ENDPOINT, "http://127.0.0.1:9000"));
        assert_eq!(
            settings(&ack).expect("RRSA").sts_endpoint,
            "http://127.0.0.1:9000"
        );
    }

    #[test]
    fn endpoints_and_tags_are_read_and_checked() {
        let mut pairs = KEYS.to_vec();
        pairs.extend([
            (REGION, "eu-central-1"),
            (ECS_ENDPOINT, "http://127.0.0.1:8080/"),
            (TAGS, "cluster=c1, team = pods ,"),
        ]);
        let s = settings(&pairs).expect("valid");
        assert_eq!(s.ecs_endpoint, "http://127.0.0.1:8080");
        assert_eq!(s.vpc_endpoint, "https://vpc.eu-central-1.aliyuncs.com");
        assert_eq!(s.cluster_tags.get("team").map(String::as_str), Some("pods"));

        for (key, bad) in [
            (ECS_ENDPOINT, "127.0.0.1:8080"),
            (VPC_ENDPOINT, "http://host/path"),
            (STS_ENDPOINT, "sts.example"),
            (TAGS, "novalue"),
            (REGION, "Not A Region"),
            (MAX_ATTEMPTS, "0"),
            (POLL_INTERVAL_MS, "soon"),
        ] {
            let mut pairs = KEYS.to_vec();
            pairs.push((key, bad));
            let problem = settings(&pairs).expect_err(bad);
            assert_eq!(problem.key, key);
        }
        // Numbers and durations are read by the shared typed getters: the refusal says what the key takes.
        let mut pairs = KEYS.to_vec();
        pairs.push((MAX_ATTEMPTS, "11"));
        assert_eq!(
            settings(&pairs).expect_err("out of range").reason,
            r#"expected a whole number from 1 to 10, got "11""#
        );
    }
}
