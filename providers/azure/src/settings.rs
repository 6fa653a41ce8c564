//! Azure settings from configuration keys (pure parsing). The keys are cloud-api-adaptor's names
//! (`AZURE_SUBSCRIPTION_ID`, `AZURE_RESOURCE_GROUP`, ...) plus the Azure SDKs' own environment
//! names for workload identity (`AZURE_FEDERATED_TOKEN_FILE`, `AZURE_AUTHORITY_HOST`) and this
//! backend's endpoint overrides.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use peerpods_provider_core::config::{SettingsRefusal, typed};
use peerpods_provider_core::{ExposeSecret, ProviderConfig, SecretString};

// The syntax of ARM names lives with instance ids; settings only apply it to their keys.
use crate::instance_id::{is_guid, resource_group_problem};

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "azure";

/// Azure public cloud's Resource Manager endpoint.
pub const PUBLIC_RESOURCE_MANAGER: &str = "https://management.azure.com";
/// Azure public cloud's Microsoft Entra ID authority.
pub const PUBLIC_AUTHORITY_HOST: &str = "https://login.microsoftonline.com";

/// How the backend proves who it is to Microsoft Entra ID.
#[derive(Clone)]
pub enum Credentials {
    /// `AZURE_CLIENT_SECRET` of the service principal `AZURE_CLIENT_ID`.
    ClientSecret(SecretString),
    /// No secret: a Kubernetes service account token in `AZURE_FEDERATED_TOKEN_FILE`, exchanged
    /// for an Entra ID token (workload identity), as cloud-api-adaptor does without a secret.
    WorkloadIdentity { token_file: PathBuf },
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Credentials::ClientSecret(_) => f.write_str("ClientSecret([redacted])"),
            Credentials::WorkloadIdentity { token_file } => f
                .debug_struct("WorkloadIdentity")
                .field("token_file", token_file)
                .finish(),
        }
    }
}

/// Everything the Azure provider reads from its configuration.
#[derive(Clone, Debug)]
pub struct AzureSettings {
    /// `AZURE_SUBSCRIPTION_ID`.
    pub subscription_id: String,
    /// `AZURE_RESOURCE_GROUP`: where cloud-api-adaptor creates the VMs.
    pub resource_group: String,
    /// `AZURE_REGION`: the region whose compute quota `capacity()` reports.
    pub region: String,
    /// `AZURE_TENANT_ID`.
    pub tenant_id: String,
    /// `AZURE_CLIENT_ID`.
    pub client_id: String,
    pub credentials: Credentials,
    /// `AZURE_AUTHORITY_HOST`: Entra ID authority (sovereign clouds, Azure Stack Hub, tests).
    pub authority_host: String,
    /// `AZURE_RESOURCE_MANAGER_ENDPOINT`: ARM endpoint (sovereign clouds, Azure Stack Hub, tests).
    pub resource_manager: String,
    /// `AZURE_RESOURCE_MANAGER_AUDIENCE`: the token audience of that endpoint; defaults to it.
    pub audience: String,
    /// `AZURE_CA_BUNDLE`: extra trusted CA certificates (PEM text or a file path), for Azure
    /// Stack Hub's own CA or a TLS-inspecting proxy. The system roots stay trusted.
    pub ca_bundle: Option<String>,
    /// `CLUSTER_TAG` (`key=value`): deleting a VM without this tag is refused, unless
    /// `DELETE_UNTAGGED=allow`.
    pub owner_tag: Option<(String, String)>,
    /// `AZURE_MAX_RETRIES`: retries of a call that failed with 408/5xx or no answer.
    pub max_retries: u32,
    /// `AZURE_RETRY_DELAY_MS`: first backoff delay (doubling with each retry).
    pub retry_delay: Duration,
    /// `AZURE_DELETE_TIMEOUT_SECONDS`: still accepted (and checked to be a number), but no longer
    /// read by a deletion, which has no bound of its own: it runs until the deletion engine
    /// finishes, and the caller bounds it (provider-service's detached delete task).
    pub delete_timeout: Duration,
    /// `AZURE_POLL_INTERVAL_MS`: the deletion's pace: the wait before looking again at a VM or
    /// part ARM is deleting, refused to delete for its state, or answered NotFound to.
    pub poll_interval: Duration,
    /// `AZURE_CONNECT_TIMEOUT_MS` and `AZURE_REQUEST_TIMEOUT_MS`, per HTTP request.
    pub connect_timeout: Duration,
    pub request_timeout: Duration,
}

/// A configuration key with an unusable value: the key and why (never the value itself, which
/// may be a secret).
#[derive(Debug, PartialEq, Eq)]
pub struct SettingsProblem {
    pub key: &'static str,
    pub reason: String,
}

impl AzureSettings {
    /// Reads the settings from `config` (blank values count as unset); numbers and durations through its
    /// typed getters.
    pub fn from_config(config: &ProviderConfig) -> Result<Self, SettingsProblem> {
        let get = |key: &str| config.get(key).map(str::to_owned);
        let required = |key: &'static str| {
            get(key).ok_or_else(|| SettingsProblem {
                key,
                reason: "is required".into(),
            })
        };
        let subscription_id = required("AZURE_SUBSCRIPTION_ID")?;
        if !is_guid(&subscription_id) {
            return Err(SettingsProblem {
                key: "AZURE_SUBSCRIPTION_ID",
                reason: "must be a GUID (8-4-4-4-12 hexadecimal digits)".into(),
            });
        }
        let resource_group = required("AZURE_RESOURCE_GROUP")?;
        if let Some(problem) = resource_group_problem(&resource_group) {
            return Err(SettingsProblem {
                key: "AZURE_RESOURCE_GROUP",
                reason: problem,
            });
        }
        let region = required("AZURE_REGION")?;
        let tenant_id = required("AZURE_TENANT_ID")?;
        if !tenant_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(SettingsProblem {
                key: "AZURE_TENANT_ID",
                reason: "must be a tenant GUID or domain name".into(),
            });
        }
        let client_id = required("AZURE_CLIENT_ID")?;
        let credentials = match get("AZURE_CLIENT_SECRET") {
            Some(secret) => Credentials::ClientSecret(SecretString::from(secret)),
            None => match get("AZURE_FEDERATED_TOKEN_FILE") {
                Some(path) => Credentials::WorkloadIdentity {
                    token_file: PathBuf::from(path),
                },
                None => {
                    return Err(SettingsProblem {
                        key: "AZURE_CLIENT_SECRET",
                        reason: "is required unless AZURE_FEDERATED_TOKEN_FILE (workload identity) is set".into(),
                    });
                }
            },
        };
        let authority_host = https_url(
            "AZURE_AUTHORITY_HOST",
            get("AZURE_AUTHORITY_HOST").unwrap_or_else(|| PUBLIC_AUTHORITY_HOST.into()),
        )?;
        let resource_manager = https_url(
            "AZURE_RESOURCE_MANAGER_ENDPOINT",
            get("AZURE_RESOURCE_MANAGER_ENDPOINT")
                .unwrap_or_else(|| PUBLIC_RESOURCE_MANAGER.into()),
        )?;
        let audience = match get("AZURE_RESOURCE_MANAGER_AUDIENCE") {
            Some(audience) => https_url("AZURE_RESOURCE_MANAGER_AUDIENCE", audience)?,
            None => resource_manager.clone(),
        };
        let millis = |key: &'static str, default: Duration| -> Result<Duration, SettingsProblem> {
            Ok(typed(key, config.duration_ms(key))?.unwrap_or(default))
        };
        Ok(AzureSettings {
            subscription_id,
            resource_group,
            region,
            tenant_id,
            client_id,
            credentials,
            authority_host,
            resource_manager,
            audience,
            ca_bundle: get("AZURE_CA_BUNDLE"),
            owner_tag: owner_tag(get("CLUSTER_TAG"), get("DELETE_UNTAGGED"))?,
            max_retries: typed("AZURE_MAX_RETRIES", config.number("AZURE_MAX_RETRIES"))?
                .unwrap_or(3),
            retry_delay: millis("AZURE_RETRY_DELAY_MS", Duration::from_millis(800))?,
            delete_timeout: typed(
                "AZURE_DELETE_TIMEOUT_SECONDS",
                config.duration_secs("AZURE_DELETE_TIMEOUT_SECONDS"),
            )?
            .unwrap_or(Duration::from_secs(300)),
            poll_interval: millis("AZURE_POLL_INTERVAL_MS", Duration::from_secs(5))?,
            connect_timeout: millis("AZURE_CONNECT_TIMEOUT_MS", Duration::from_secs(10))?,
            request_timeout: millis("AZURE_REQUEST_TIMEOUT_MS", Duration::from_secs(60))?,
        })
    }

    /// Values that must never appear in logs, errors or metrics.
    pub fn secrets(&self) -> Vec<String> {
        match &self.credentials {
            Credentials::ClientSecret(secret) => vec![secret.expose_secret().to_owned()],
            Credentials::WorkloadIdentity { .. } => Vec::new(),
        }
    }

    /// The OAuth scope of ARM tokens: the audience with `/.default`.
    pub fn scope(&self) -> String {
        format!("{}/.default", self.audience.trim_end_matches('/'))
    }
}

fn https_url(key: &'static str, value: String) -> Result<String, SettingsProblem> {
    let rest = value
        .strip_prefix("https://")
        .ok_or_else(|| SettingsProblem {
            key,
            reason: "must be an https:// URL (bearer tokens are never sent in clear text)".into(),
        })?;
    if rest.trim_end_matches('/').is_empty() || rest.contains(char::is_whitespace) {
        return Err(SettingsProblem {
            key,
            reason: "must be an https:// URL with a host".into(),
        });
    }
    Ok(value.trim_end_matches('/').to_owned())
}

impl SettingsRefusal for SettingsProblem {
    fn refused(key: &'static str, reason: String) -> Self {
        SettingsProblem { key, reason }
    }
}

/// The tag deletions require: `CLUSTER_TAG` unless `DELETE_UNTAGGED=allow` turns the check off.
fn owner_tag(
    cluster_tag: Option<String>,
    delete_untagged: Option<String>,
) -> Result<Option<(String, String)>, SettingsProblem> {
    let allow = match delete_untagged.as_deref() {
        None | Some("deny") => false,
        Some("allow") => true,
        Some(_) => {
            return Err(SettingsProblem {
                key: "DELETE_UNTAGGED",
                reason: "must be allow or deny".into(),
            });
        }
    };
    let Some(text) = cluster_tag else {
        return Ok(None);
    };
    match text.split_once('=') {
        Some((key, value)) if !key.trim().is_empty() => {
            Ok((!allow).then(|| (key.trim().to_owned(), value.trim().to_owned())))
        }
        _ => Err(SettingsProblem {
            key: "CLUSTER_TAG",
            reason: "must be key=value".into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    const SUB: &str = "00000000-1111-2222-3333-444444444444";

    fn settings(pairs: &[(&str, &str)]) -> Result<AzureSettings, SettingsProblem> {
        let mut map: HashMap<String, String> = [
            ("AZURE_SUBSCRIPTION_ID", SUB),
            ("AZURE_RESOURCE_GROUP", "peerpods-rg"),
            ("AZURE_REGION", "eastus"),
            ("AZURE_TENANT_ID", "72f988bf-86f1-41af-91ab-2d7cd011db47"),
            ("AZURE_CLIENT_ID", "app-id"),
            ("AZURE_CLIENT_SECRET", "s3cr3t-client-secret"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        for (k, v) in pairs {
            map.insert((*k).to_owned(), (*v).to_owned());
        }
        AzureSettings::from_config(&ProviderConfig::from_pairs(map))
    }

    #[test]
    fn defaults_point_at_the_public_cloud() {
        let s = settings(&[]).expect("valid");
        assert_eq!(s.resource_manager, PUBLIC_RESOURCE_MANAGER);
        assert_eq!(s.authority_host, PUBLIC_AUTHORITY_HOST);
        assert_eq!(s.scope(), "https://management.azure.com/.default");
        assert_eq!(s.max_retries, 3);
        assert_eq!(s.owner_tag, None);
        assert_eq!(s.secrets(), vec!["s3cr3t-client-secret"]);
    }

    #[test]
    fn debug_never_shows_the_secret() {
        let s = settings(&[]).expect("valid");
        let printed = format!("{s:?}");
        assert!(!printed.contains("s3cr3t-client-secret"), "{printed}");
        assert!(printed.contains("ClientSecret([redacted])"), "{printed}");
    }

    #[test]
    fn each_missing_key_is_named() {
        for key in [
            "AZURE_SUBSCRIPTION_ID",
            "AZURE_RESOURCE_GROUP",
            "AZURE_REGION",
            "AZURE_TENANT_ID",
            "AZURE_CLIENT_ID",
        ] {
            let problem = settings(&[(key, " ")]).expect_err(key);
            assert_eq!(problem.key, key);
        }
        let problem = settings(&[("AZURE_CLIENT_SECRET", "")]).expect_err("no credentials");
        assert_eq!(problem.key, "AZURE_CLIENT_SECRET");
    }

    #[test]
    fn workload_identity_without_a_secret() {
        let s = settings(&[
            ("AZURE_CLIENT_SECRET", ""),
            (
                "AZURE_FEDERATED_TOKEN_FILE",
                "/var/run/secrets/azure/tokens/azure-identity-token",
            ),
        ])
        .expect("valid");
        assert!(matches!(
            s.credentials,
            Credentials::WorkloadIdentity { .. }
        ));
        assert!(s.secrets().is_empty());
    }

    #[test]
    fn endpoints_must_be_https_and_keep_no_trailing_slash() {
        let s = settings(&[
            (
                "AZURE_RESOURCE_MANAGER_ENDPOINT",
                "https://management.local.azurestack.external/",
            ),
            (
                "AZURE_RESOURCE_MANAGER_AUDIENCE",
                "https://management.adfs.azurestack.local/abc",
            ),
        ])
        .expect("valid");
        assert_eq!(
            s.resource_manager,
            "https://management.local.azurestack.external"
        );
        assert_eq!(
            s.scope(),
            "https://management.adfs.azurestack.local/abc/.default"
        );
        for key in ["AZURE_RESOURCE_MANAGER_ENDPOINT", "AZURE_AUTHORITY_HOST"] {
            assert_eq!(
                settings(&[(key, "http://127.0.0.1:1")]).expect_err(key).key,
                key
            );
            assert_eq!(settings(&[(key, "https://")]).expect_err(key).key, key);
        }
    }

    #[test]
    fn malformed_values_name_their_key_but_not_the_value() {
        let p = settings(&[("AZURE_SUBSCRIPTION_ID", "not-a-guid")]).expect_err("guid");
        assert_eq!(p.key, "AZURE_SUBSCRIPTION_ID");
        assert!(!p.reason.contains("not-a-guid"));
        assert_eq!(
            settings(&[("AZURE_RESOURCE_GROUP", "bad/rg")])
                .expect_err("rg")
                .key,
            "AZURE_RESOURCE_GROUP"
        );
        assert_eq!(
            settings(&[("AZURE_MAX_RETRIES", "many")])
                .expect_err("n")
                .key,
            "AZURE_MAX_RETRIES"
        );
        assert_eq!(
            settings(&[("AZURE_POLL_INTERVAL_MS", "5s")])
                .expect_err("unit")
                .reason,
            r#"expected a whole number of milliseconds, got "5s""#
        );
        assert_eq!(
            settings(&[("CLUSTER_TAG", "novalue")])
                .expect_err("tag")
                .key,
            "CLUSTER_TAG"
        );
        assert_eq!(
            settings(&[("DELETE_UNTAGGED", "yes")])
                .expect_err("flag")
                .key,
            "DELETE_UNTAGGED"
        );
    }

    #[test]
    fn cluster_tag_guards_deletes_unless_untagged_deletes_are_allowed() {
        let s = settings(&[("CLUSTER_TAG", "peerpods.io/cluster=prod")]).expect("valid");
        assert_eq!(
            s.owner_tag,
            Some(("peerpods.io/cluster".into(), "prod".into()))
        );
        let s = settings(&[
            ("CLUSTER_TAG", "peerpods.io/cluster=prod"),
            ("DELETE_UNTAGGED", "allow"),
        ])
        .expect("valid");
        assert_eq!(s.owner_tag, None);
    }

    #[test]
    fn guids_are_recognised() {
        assert!(is_guid(SUB));
        assert!(is_guid("ABCDEF01-2345-6789-abcd-ef0123456789"));
        assert!(!is_guid("00000000-1111-2222-3333-44444444444"));
        assert!(!is_guid("0000000g-1111-2222-3333-444444444444"));
        assert!(!is_guid(""));
    }
}
