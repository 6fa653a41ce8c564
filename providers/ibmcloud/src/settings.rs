//! Settings of both backends from configuration keys (pure parsing). Key names are
//! cloud-api-adaptor's (`IBMCLOUD_*` for VPC, `POWERVS_*` for Power Virtual Server); the endpoint
//! overrides and tuning knobs that cloud-api-adaptor does not have are marked as ours.

use std::time::Duration;

use peerpods_provider_core::{Error, ExposeSecret, ProviderConfig, SecretString};

/// IAM's public token endpoint (cloud-api-adaptor's default of `IBMCLOUD_IAM_ENDPOINT`).
pub const DEFAULT_IAM_ENDPOINT: &str = "https://iam.cloud.ibm.com/identity/token";
/// The Global Tagging API's public endpoint (the default of IBM's Go SDK, which CAA uses).
pub const DEFAULT_TAGGING_ENDPOINT: &str = "https://tags.global-search-tagging.cloud.ibm.com";
/// The Global Search API's public endpoint (`DefaultServiceURL` of IBM's Go SDK `globalsearchv2`).
pub const DEFAULT_SEARCH_ENDPOINT: &str = "https://api.global-search-tagging.cloud.ibm.com";

/// cloud-api-adaptor's default of its `-cr-token-filename` flag: the projected service
/// account token a trusted profile is assumed with.
pub const DEFAULT_CR_TOKEN_FILE: &str = "/var/run/secrets/tokens/vault-token";

/// What IAM exchanges for bearer tokens, as in cloud-api-adaptor: an API key, or else a trusted
/// profile assumed with the pod's compute-resource (service account) token.
#[derive(Clone)]
pub enum Credential {
    /// `IBMCLOUD_API_KEY`.
    ApiKey(SecretString),
    /// `IBMCLOUD_IAM_PROFILE_ID` and the file holding the compute-resource token,
    /// `IBMCLOUD_CR_TOKEN_FILENAME` (ours; CAA's flag `-cr-token-filename`), read at each
    /// exchange because the kubelet rotates it.
    TrustedProfile {
        profile_id: String,
        cr_token_file: std::path::PathBuf,
    },
}

/// How bearer tokens are obtained.
#[derive(Clone)]
pub struct IamSettings {
    pub credential: Credential,
    /// The full token URL (`.../identity/token`), from `IBMCLOUD_IAM_ENDPOINT`.
    pub token_url: String,
}

impl IamSettings {
    /// Values that must never appear in what the backend reports.
    pub fn secrets(&self) -> Vec<String> {
        match &self.credential {
            Credential::ApiKey(key) => vec![key.expose_secret().to_owned()],
            Credential::TrustedProfile { .. } => Vec::new(),
        }
    }
}

impl std::fmt::Debug for IamSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let credential = match &self.credential {
            Credential::ApiKey(_) => "api key [redacted]".to_owned(),
            Credential::TrustedProfile {
                profile_id,
                cr_token_file,
            } => format!(
                "trusted profile {profile_id} with {}",
                cr_token_file.display()
            ),
        };
        f.debug_struct("IamSettings")
            .field("credential", &credential)
            .field("token_url", &self.token_url)
            .finish()
    }
}

/// Bounds of every cloud call and of the wait for an asynchronous deletion.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CallPolicy {
    /// `IBMCLOUD_API_MAX_RETRIES` (ours): retries of a call that failed with 5xx or no answer.
    pub max_retries: u32,
    /// `IBMCLOUD_API_RETRY_BACKOFF_MS` (ours): first wait between retries, doubled each time.
    pub backoff: Duration,
    /// `IBMCLOUD_API_TIMEOUT_SECONDS` (ours): one HTTP request, connect to last byte.
    pub request_timeout: Duration,
    /// `IBMCLOUD_DELETE_TIMEOUT_SECONDS` (ours): how long a delete waits for the VM to be gone.
    pub delete_timeout: Duration,
    /// `IBMCLOUD_DELETE_POLL_MS` (ours): how often it looks.
    pub delete_poll: Duration,
}

impl Default for CallPolicy {
    fn default() -> Self {
        CallPolicy {
            max_retries: 3,
            backoff: Duration::from_millis(500),
            request_timeout: Duration::from_secs(30),
            delete_timeout: Duration::from_secs(120),
            delete_poll: Duration::from_secs(2),
        }
    }
}

/// Everything the VPC backend reads from its configuration.
#[derive(Clone, Debug)]
pub struct VpcSettings {
    pub iam: IamSettings,
    /// VPC API base URL including `/v1`: `IBMCLOUD_VPC_ENDPOINT`, else derived from
    /// `IBMCLOUD_ZONE` (`us-south-1` → `https://us-south.iaas.cloud.ibm.com/v1`).
    pub vpc_url: String,
    /// `IBMCLOUD_TAGGING_ENDPOINT` (ours): Global Tagging API base URL.
    pub tagging_url: String,
    /// `IBMCLOUD_SEARCH_ENDPOINT` (ours): Global Search API base URL, which lists instances.
    pub search_url: String,
    /// The VPC region (`us-south`): of `IBMCLOUD_ZONE`, else of a regional
    /// `IBMCLOUD_VPC_ENDPOINT`. Global Search is global, so listing filters by it; `None` when
    /// neither names one (listing then fails with a configuration error, deleting still works).
    pub region: Option<String>,
    pub policy: CallPolicy,
}

/// Everything the Power Virtual Server backend reads from its configuration.
#[derive(Clone, Debug)]
pub struct PowerVsSettings {
    pub iam: IamSettings,
    /// `POWERVS_SERVICE_INSTANCE_ID`: the workspace (cloud instance) CAA creates VMs in.
    pub workspace_id: String,
    /// `POWERVS_ZONE`, e.g. `dal10`.
    pub zone: String,
    /// Power API base URL: `IBMCLOUD_POWER_API_ENDPOINT` (the variable IBM's Power Go client
    /// reads, so CAA deployments may already set it), else the zone's regional endpoint.
    pub power_url: String,
    /// `IBMCLOUD_TAGGING_ENDPOINT` (ours).
    pub tagging_url: String,
    pub policy: CallPolicy,
}

/// What the parts both backends share read from either's settings.
pub trait Common {
    /// IAM, the bounds of every call, and the Global Tagging endpoint.
    fn common(&self) -> (&IamSettings, &CallPolicy, &str);
}

impl Common for VpcSettings {
    fn common(&self) -> (&IamSettings, &CallPolicy, &str) {
        (&self.iam, &self.policy, &self.tagging_url)
    }
}

impl Common for PowerVsSettings {
    fn common(&self) -> (&IamSettings, &CallPolicy, &str) {
        (&self.iam, &self.policy, &self.tagging_url)
    }
}

impl VpcSettings {
    pub fn from_config(config: &ProviderConfig) -> Result<Self, Error> {
        let vpc_url = match config.get("IBMCLOUD_VPC_ENDPOINT") {
            Some(url) => endpoint("IBMCLOUD_VPC_ENDPOINT", url)?,
            None => match config.get("IBMCLOUD_ZONE") {
                Some(zone) => vpc_url_of_zone(zone).ok_or_else(|| {
                    config_error("IBMCLOUD_ZONE", "expected a VPC zone name like us-south-1")
                })?,
                None => {
                    return Err(config_error(
                        "IBMCLOUD_VPC_ENDPOINT",
                        "required (or IBMCLOUD_ZONE to derive the regional endpoint)",
                    ));
                }
            },
        };
        let region = match config.get("IBMCLOUD_ZONE") {
            Some(zone) => region_of_zone(zone),
            None => region_of_vpc_url(&vpc_url),
        };
        let search_url = match config.get("IBMCLOUD_SEARCH_ENDPOINT") {
            Some(url) => endpoint("IBMCLOUD_SEARCH_ENDPOINT", url)?,
            None => DEFAULT_SEARCH_ENDPOINT.to_owned(),
        };
        Ok(VpcSettings {
            iam: iam_settings(config)?,
            vpc_url,
            tagging_url: tagging_url(config)?,
            search_url,
            region,
            policy: call_policy(config)?,
        })
    }
}

impl PowerVsSettings {
    pub fn from_config(config: &ProviderConfig) -> Result<Self, Error> {
        let workspace_id = config
            .get("POWERVS_SERVICE_INSTANCE_ID")
            .ok_or_else(|| config_error("POWERVS_SERVICE_INSTANCE_ID", "required"))?;
        if !crate::instance_id::is_uuid(workspace_id) {
            return Err(config_error(
                "POWERVS_SERVICE_INSTANCE_ID",
                "expected the workspace GUID (8-4-4-4-12 hexadecimal digits)",
            ));
        }
        let zone = config
            .get("POWERVS_ZONE")
            .ok_or_else(|| config_error("POWERVS_ZONE", "required"))?;
        if !zone
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        {
            return Err(config_error(
                "POWERVS_ZONE",
                "expected a Power Virtual Server zone like dal10 or eu-de-1",
            ));
        }
        let power_url = match config.get("IBMCLOUD_POWER_API_ENDPOINT") {
            Some(url) => power_endpoint(url, zone),
            None => format!("https://{}.power-iaas.cloud.ibm.com", power_region(zone)),
        };
        Ok(PowerVsSettings {
            iam: iam_settings(config)?,
            workspace_id: workspace_id.to_owned(),
            zone: zone.to_owned(),
            power_url,
            tagging_url: tagging_url(config)?,
            policy: call_policy(config)?,
        })
    }
}

fn config_error(key: &str, message: &str) -> Error {
    Error::config(key.to_owned(), message.to_owned())
}

fn iam_settings(config: &ProviderConfig) -> Result<IamSettings, Error> {
    let credential = match (
        config.secret("IBMCLOUD_API_KEY"),
        config.get("IBMCLOUD_IAM_PROFILE_ID"),
    ) {
        (Some(api_key), _) => Credential::ApiKey(api_key),
        (None, Some(profile_id)) => Credential::TrustedProfile {
            profile_id: profile_id.to_owned(),
            cr_token_file: config
                .get("IBMCLOUD_CR_TOKEN_FILENAME")
                .unwrap_or(DEFAULT_CR_TOKEN_FILE)
                .into(),
        },
        (None, None) => {
            return Err(config_error(
                "IBMCLOUD_API_KEY",
                "required (or IBMCLOUD_IAM_PROFILE_ID for a trusted profile)",
            ));
        }
    };
    let token_url = match config.get("IBMCLOUD_IAM_ENDPOINT") {
        Some(url) => iam_token_url(&endpoint("IBMCLOUD_IAM_ENDPOINT", url)?),
        None => DEFAULT_IAM_ENDPOINT.to_owned(),
    };
    Ok(IamSettings {
        credential,
        token_url,
    })
}

fn tagging_url(config: &ProviderConfig) -> Result<String, Error> {
    match config.get("IBMCLOUD_TAGGING_ENDPOINT") {
        Some(url) => endpoint("IBMCLOUD_TAGGING_ENDPOINT", url),
        None => Ok(DEFAULT_TAGGING_ENDPOINT.to_owned()),
    }
}

fn call_policy(config: &ProviderConfig) -> Result<CallPolicy, Error> {
    let defaults = CallPolicy::default();
    Ok(CallPolicy {
        max_retries: config
            .number("IBMCLOUD_API_MAX_RETRIES")?
            .map_or(defaults.max_retries, |n: u32| n.min(10)),
        backoff: config
            .duration_ms("IBMCLOUD_API_RETRY_BACKOFF_MS")?
            .unwrap_or(defaults.backoff),
        request_timeout: config
            .positive_duration_secs("IBMCLOUD_API_TIMEOUT_SECONDS")?
            .unwrap_or(defaults.request_timeout),
        delete_timeout: config
            .duration_secs("IBMCLOUD_DELETE_TIMEOUT_SECONDS")?
            .unwrap_or(defaults.delete_timeout),
        delete_poll: config
            .positive_duration_ms("IBMCLOUD_DELETE_POLL_MS")?
            .unwrap_or(defaults.delete_poll),
    })
}

/// An endpoint URL without its trailing slash; it must name its scheme.
fn endpoint(key: &str, url: &str) -> Result<String, Error> {
    if url.starts_with("https://") || url.starts_with("http://") {
        Ok(url.trim_end_matches('/').to_owned())
    } else {
        Err(config_error(key, "must start with https:// or http://"))
    }
}

/// IBM's SDKs accept the IAM endpoint with or without the `/identity/token` path.
pub fn iam_token_url(endpoint: &str) -> String {
    let base = endpoint.trim_end_matches('/');
    if base.ends_with("/identity/token") {
        base.to_owned()
    } else {
        format!("{base}/identity/token")
    }
}

/// The regional VPC endpoint of a zone (`us-south-1` → region `us-south`).
pub fn vpc_url_of_zone(zone: &str) -> Option<String> {
    region_of_zone(zone).map(|region| format!("https://{region}.iaas.cloud.ibm.com/v1"))
}

/// The VPC region of a zone: `us-south-1` → `us-south`.
pub fn region_of_zone(zone: &str) -> Option<String> {
    let (region, number) = zone.rsplit_once('-')?;
    let valid = !region.is_empty()
        && !number.is_empty()
        && number.chars().all(|c| c.is_ascii_digit())
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    valid.then(|| region.to_owned())
}

/// The region of a regional VPC endpoint, public (`https://us-south.iaas.cloud.ibm.com/v1`) or
/// private (`https://us-south.private.iaas.cloud.ibm.com/v1`); `None` for any other host.
pub fn region_of_vpc_url(url: &str) -> Option<String> {
    let host = reqwest::Url::parse(url).ok()?.host_str()?.to_owned();
    let region = host
        .strip_suffix(".private.iaas.cloud.ibm.com")
        .or_else(|| host.strip_suffix(".iaas.cloud.ibm.com"))?;
    let valid = !region.is_empty()
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    valid.then(|| region.to_owned())
}

/// The Power Virtual Server region of a zone, per the endpoint table of IBM's Power Cloud API
/// reference; unknown zones follow IBM's Power Go client (trailing digits, or `-<n>`, dropped).
pub fn power_region(zone: &str) -> String {
    let known = match zone {
        "dal10" | "dal12" | "us-south" => Some("us-south"),
        "wdc06" | "wdc07" | "us-east" => Some("us-east"),
        "eu-de-1" | "eu-de-2" => Some("eu-de"),
        "lon04" | "lon06" => Some("lon"),
        "syd04" | "syd05" => Some("syd"),
        "sao01" | "sao04" => Some("sao"),
        "tok04" => Some("tok"),
        "osa21" => Some("osa"),
        "mad02" | "mad04" => Some("mad"),
        "mon01" => Some("mon"),
        "tor01" => Some("tor"),
        "che01" => Some("che"),
        _ => None,
    };
    if let Some(region) = known {
        return region.to_owned();
    }
    match zone.rsplit_once('-') {
        Some((region, n)) if !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()) => {
            region.to_owned()
        }
        _ => zone
            .trim_end_matches(|c: char| c.is_ascii_digit())
            .to_owned(),
    }
}

/// `IBMCLOUD_POWER_API_ENDPOINT` as IBM's Power Go client reads it: a URL, a host, or a host
/// suffix starting with `.` that the region is prepended to.
pub fn power_endpoint(value: &str, zone: &str) -> String {
    let value = value.trim_end_matches('/');
    if value.starts_with("https://") || value.starts_with("http://") {
        value.to_owned()
    } else if value.starts_with('.') {
        format!("https://{}{value}", power_region(zone))
    } else {
        format!("https://{value}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(pairs: &[(&str, &str)]) -> ProviderConfig {
        ProviderConfig::from_pairs(pairs.iter().copied())
    }

    const WORKSPACE: &str = "7e0ba4c4-4d5e-4b3b-9c5e-0d1e2f3a4b5c";

    #[test]
    fn vpc_needs_an_api_key_and_an_endpoint() {
        let error = VpcSettings::from_config(&config(&[("IBMCLOUD_VPC_ENDPOINT", "https://x/v1")]))
            .expect_err("no key");
        assert!(matches!(error, Error::Config { ref key, .. } if key == "IBMCLOUD_API_KEY"));
        let error = VpcSettings::from_config(&config(&[("IBMCLOUD_API_KEY", "k-123456")]))
            .expect_err("no endpoint");
        assert!(matches!(error, Error::Config { ref key, .. } if key == "IBMCLOUD_VPC_ENDPOINT"));
    }

    #[test]
    fn vpc_endpoint_comes_from_the_zone_when_not_given() {
        let s = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("IBMCLOUD_ZONE", "eu-de-2"),
        ]))
        .expect("valid");
        assert_eq!(s.vpc_url, "https://eu-de.iaas.cloud.ibm.com/v1");
        assert_eq!(s.iam.token_url, DEFAULT_IAM_ENDPOINT);
        assert_eq!(s.tagging_url, DEFAULT_TAGGING_ENDPOINT);
        assert_eq!(s.search_url, DEFAULT_SEARCH_ENDPOINT);
        assert_eq!(s.region.as_deref(), Some("eu-de"));
        assert_eq!(s.iam.secrets(), vec!["k-123456".to_owned()]);
        assert!(!format!("{s:?}").contains("k-123456"));
        assert_eq!(vpc_url_of_zone("nozone"), None);
    }

    #[test]
    fn the_region_comes_from_the_zone_else_from_a_regional_endpoint() {
        let s = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            (
                "IBMCLOUD_VPC_ENDPOINT",
                "https://jp-tok.private.iaas.cloud.ibm.com/v1/",
            ),
            ("IBMCLOUD_SEARCH_ENDPOINT", "http://127.0.0.1:9/"),
        ]))
        .expect("valid");
        assert_eq!(s.region.as_deref(), Some("jp-tok"));
        assert_eq!(s.search_url, "http://127.0.0.1:9");
        assert_eq!(
            region_of_vpc_url("https://us-east.iaas.cloud.ibm.com/v1").as_deref(),
            Some("us-east")
        );
        assert_eq!(region_of_vpc_url("http://127.0.0.1:8080/v1"), None);
        let s = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("IBMCLOUD_VPC_ENDPOINT", "http://127.0.0.1:8080/v1"),
            ("IBMCLOUD_ZONE", "br-sao-3"),
        ]))
        .expect("valid");
        assert_eq!(s.region.as_deref(), Some("br-sao"), "the zone wins");
        let error = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("IBMCLOUD_ZONE", "us-south-1"),
            (
                "IBMCLOUD_SEARCH_ENDPOINT",
                "api.global-search-tagging.cloud.ibm.com",
            ),
        ]))
        .expect_err("scheme");
        assert!(
            matches!(error, Error::Config { ref key, .. } if key == "IBMCLOUD_SEARCH_ENDPOINT")
        );
    }

    #[test]
    fn iam_endpoint_may_omit_the_token_path() {
        assert_eq!(
            iam_token_url("https://iam.test.cloud.ibm.com"),
            "https://iam.test.cloud.ibm.com/identity/token"
        );
        assert_eq!(
            iam_token_url("https://iam.cloud.ibm.com/identity/token/"),
            "https://iam.cloud.ibm.com/identity/token"
        );
    }

    #[test]
    fn without_an_api_key_a_trusted_profile_is_used() {
        let s = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_IAM_PROFILE_ID", "Profile-9fd84246"),
            ("IBMCLOUD_ZONE", "us-south-1"),
        ]))
        .expect("profile");
        assert!(matches!(
            s.iam.credential,
            Credential::TrustedProfile { ref cr_token_file, .. }
                if cr_token_file.to_str() == Some(DEFAULT_CR_TOKEN_FILE)
        ));
        assert!(s.iam.secrets().is_empty());
        let s = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("IBMCLOUD_IAM_PROFILE_ID", "Profile-1"),
            ("IBMCLOUD_ZONE", "us-south-1"),
        ]))
        .expect("both");
        assert!(
            matches!(s.iam.credential, Credential::ApiKey(_)),
            "the key wins, as in CAA"
        );
    }

    #[test]
    fn bad_values_name_their_key_never_a_credential() {
        let error = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("IBMCLOUD_VPC_ENDPOINT", "us-south.iaas.cloud.ibm.com"),
        ]))
        .expect_err("scheme");
        assert!(matches!(error, Error::Config { ref key, .. } if key == "IBMCLOUD_VPC_ENDPOINT"));
        let error = VpcSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("IBMCLOUD_ZONE", "us-south-1"),
            ("IBMCLOUD_DELETE_POLL_MS", "0"),
        ]))
        .expect_err("zero");
        assert!(matches!(error, Error::Config { ref key, .. } if key == "IBMCLOUD_DELETE_POLL_MS"));
        assert!(!error.to_string().contains("k-123456"));
        // A number's own bad value is named (it is no credential), through the shared typed getter.
        assert_eq!(
            error.to_string(),
            r#"config IBMCLOUD_DELETE_POLL_MS: expected a whole number of milliseconds greater than zero, got "0""#
        );
    }

    #[test]
    fn powervs_reads_workspace_zone_and_endpoint() {
        let s = PowerVsSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("POWERVS_SERVICE_INSTANCE_ID", WORKSPACE),
            ("POWERVS_ZONE", "dal10"),
        ]))
        .expect("valid");
        assert_eq!(s.power_url, "https://us-south.power-iaas.cloud.ibm.com");
        assert_eq!(s.workspace_id, WORKSPACE);
        let error = PowerVsSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("POWERVS_SERVICE_INSTANCE_ID", WORKSPACE),
        ]))
        .expect_err("zone");
        assert!(matches!(error, Error::Config { ref key, .. } if key == "POWERVS_ZONE"));
        let error = PowerVsSettings::from_config(&config(&[
            ("IBMCLOUD_API_KEY", "k-123456"),
            ("POWERVS_SERVICE_INSTANCE_ID", "my-workspace"),
            ("POWERVS_ZONE", "dal10"),
        ]))
        .expect_err("guid");
        assert!(
            matches!(error, Error::Config { ref key, .. } if key == "POWERVS_SERVICE_INSTANCE_ID")
        );
    }

    #[test]
    fn power_regions_follow_ibms_table_and_client() {
        assert_eq!(power_region("dal12"), "us-south");
        assert_eq!(power_region("wdc06"), "us-east");
        assert_eq!(power_region("eu-de-1"), "eu-de");
        assert_eq!(power_region("lon06"), "lon");
        assert_eq!(power_region("abc07"), "abc");
        assert_eq!(power_region("xy-zz-3"), "xy-zz");
        assert_eq!(
            power_endpoint(".power-iaas.test.cloud.ibm.com", "dal10"),
            "https://us-south.power-iaas.test.cloud.ibm.com"
        );
        assert_eq!(
            power_endpoint("http://127.0.0.1:9/", "dal10"),
            "http://127.0.0.1:9"
        );
    }
}
