//! Configuration keys (cloud-api-adaptor's names, from `peer-pods-cm` / `peer-pods-secret`) →
//! [`GcpSettings`]. Pure: the caller supplies the lookup, so nothing here reads the environment
//! or the network. A problem names the key, never its value.

use std::time::Duration;

use peerpods_provider_core::SecretString;

/// The `cloud_provider` name of this backend.
pub const NAME: &str = "gcp";

/// cloud-api-adaptor's project key (`-gcp-project-id`).
pub const PROJECT_ID: &str = "GCP_PROJECT_ID";
/// cloud-api-adaptor's zone key (`-zone`): the zone its pod VMs are created in.
pub const ZONE: &str = "GCP_ZONE";
/// cloud-api-adaptor's credentials key (`-gcp-credentials`): the JSON text of a credentials
/// file (normally a service-account key), kept in `peer-pods-secret`.
pub const CREDENTIALS: &str = "GCP_CREDENTIALS";
/// The standard Application Default Credentials variable: a path to a credentials file, e.g.
/// a mounted Secret. Read here (not by the auth library) so a mounted file is validated with
/// the rest of the configuration.
pub const CREDENTIALS_FILE: &str = "GOOGLE_APPLICATION_CREDENTIALS";
/// Endpoint override of the Compute Engine API (private or sovereign clouds, emulators):
/// the scheme and host the `/compute/v1/...` paths are appended to. Not a cloud-api-adaptor key.
pub const COMPUTE_ENDPOINT: &str = "GCP_COMPUTE_ENDPOINT";
/// How long one HTTP attempt to Compute Engine may take, in milliseconds; a hung attempt ends
/// there and is retried like a 5xx. Not a cloud-api-adaptor key.
pub const REQUEST_TIMEOUT: &str = "GCP_REQUEST_TIMEOUT_MS";
/// [`REQUEST_TIMEOUT`] when unset: ample for any single Compute Engine answer.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Where the backend's Google credentials come from.
pub enum CredentialSource {
    /// The JSON text of a credentials file, and the key it was read from.
    Json {
        key: &'static str,
        json: SecretString,
    },
    /// Application Default Credentials: workload identity or the metadata server of the node.
    ApplicationDefault,
}

impl std::fmt::Debug for CredentialSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CredentialSource::Json { key, .. } => write!(f, "Json({key})"),
            CredentialSource::ApplicationDefault => f.write_str("ApplicationDefault"),
        }
    }
}

/// The parsed configuration of the GCP backend.
#[derive(Debug)]
pub struct GcpSettings {
    pub project_id: String,
    pub zone: String,
    /// The region of `zone`, whose quotas are the capacity figures.
    pub region: String,
    pub credentials: CredentialSource,
    /// `None`: Google's public endpoint.
    pub compute_endpoint: Option<String>,
    /// The bound of one HTTP attempt ([`REQUEST_TIMEOUT`]).
    pub request_timeout: Duration,
}

/// A configuration problem: which key, and why (never the value).
#[derive(Debug, PartialEq, Eq)]
pub struct Problem {
    pub key: &'static str,
    pub reason: String,
}

impl Problem {
    fn new(key: &'static str, reason: impl Into<String>) -> Self {
        Problem {
            key,
            reason: reason.into(),
        }
    }
}

impl GcpSettings {
    /// Reads the settings through `lookup` (unset and empty are both `None`); `read_file` reads
    /// the file named by [`CREDENTIALS_FILE`].
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
        read_file: impl Fn(&str) -> std::io::Result<String>,
    ) -> Result<Self, Problem> {
        let project_id =
            lookup(PROJECT_ID).ok_or_else(|| Problem::new(PROJECT_ID, "is required"))?;
        if let Some(reason) = project_id_problem(&project_id) {
            return Err(Problem::new(PROJECT_ID, reason));
        }
        let zone = lookup(ZONE).ok_or_else(|| Problem::new(ZONE, "is required"))?;
        let region = region_of(&zone).ok_or_else(|| {
            Problem::new(
                ZONE,
                "is not a zone name like us-central1-a (region, a hyphen, a zone letter)",
            )
        })?;
        let credentials = if let Some(json) = lookup(CREDENTIALS) {
            CredentialSource::Json {
                key: CREDENTIALS,
                json: SecretString::from(json),
            }
        } else if let Some(path) = lookup(CREDENTIALS_FILE) {
            let json = read_file(&path).map_err(|error| {
                Problem::new(
                    CREDENTIALS_FILE,
                    format!("cannot read the credentials file: {}", error.kind()),
                )
            })?;
            CredentialSource::Json {
                key: CREDENTIALS_FILE,
                json: SecretString::from(json),
            }
        } else {
            CredentialSource::ApplicationDefault
        };
        let compute_endpoint = lookup(COMPUTE_ENDPOINT)
            .map(|endpoint| {
                if endpoint.starts_with("https://") || endpoint.starts_with("http://") {
                    Ok(endpoint.trim_end_matches('/').to_owned())
                } else {
                    Err(Problem::new(
                        COMPUTE_ENDPOINT,
                        "must be an http:// or https:// URL",
                    ))
                }
            })
            .transpose()?;
        Ok(GcpSettings {
            project_id,
            zone,
            region,
            credentials,
            compute_endpoint,
            // Typed numbers are read from the `ProviderConfig` by `GcpProvider::from_config`.
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        })
    }
}

/// Why `id` cannot be a project id (6–30 lowercase letters, digits and hyphens, starting with a
/// letter; legacy domain-scoped ids `example.com:name` are accepted too), or `None`.
fn project_id_problem(id: &str) -> Option<&'static str> {
    let name = id.rsplit_once(':').map_or(id, |(_, name)| name);
    if !(6..=30).contains(&name.len()) {
        return Some("is not a project id: 6 to 30 characters expected");
    }
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        return Some("is not a project id: must start with a lowercase letter");
    }
    if !name
        .chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        return Some("is not a project id: only lowercase letters, digits and hyphens");
    }
    None
}

/// The region of a zone name: `us-central1-a` → `us-central1`. `None` when `zone` is not
/// shaped like a zone (the last part must be a single letter, the region part needs a hyphen).
pub fn region_of(zone: &str) -> Option<String> {
    let (region, letter) = zone.rsplit_once('-')?;
    let valid_letter = letter.len() == 1 && letter.chars().all(|c| c.is_ascii_lowercase());
    let valid_region = region.contains('-')
        && region
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !region.starts_with('-');
    (valid_letter && valid_region).then(|| region.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use peerpods_provider_core::ExposeSecret;
    use std::collections::BTreeMap;

    fn settings(pairs: &[(&str, &str)]) -> Result<GcpSettings, Problem> {
        let map: BTreeMap<String, String> = pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        GcpSettings::from_lookup(
            |key| map.get(key).cloned(),
            |path| {
                if path == "/mounted/key.json" {
                    Ok("{\"type\":\"service_account\"}".to_owned())
                } else {
                    Err(std::io::Error::from(std::io::ErrorKind::NotFound))
                }
            },
        )
    }

    #[test]
    fn reads_caa_keys_and_derives_the_region() {
        let s = settings(&[
            (PROJECT_ID, "my-project-1"),
            (ZONE, "europe-west4-b"),
            (CREDENTIALS, "{\"type\":\"service_account\"}"),
            (COMPUTE_ENDPOINT, "http://127.0.0.1:9/"),
        ])
        .expect("valid");
        assert_eq!(s.project_id, "my-project-1");
        assert_eq!(s.region, "europe-west4");
        assert_eq!(s.compute_endpoint.as_deref(), Some("http://127.0.0.1:9"));
        assert!(matches!(
            s.credentials,
            CredentialSource::Json {
                key: CREDENTIALS,
                ..
            }
        ));
    }

    #[test]
    fn missing_or_malformed_keys_are_named() {
        assert_eq!(
            settings(&[(ZONE, "us-east1-b")]).err().map(|p| p.key),
            Some(PROJECT_ID)
        );
        assert_eq!(
            settings(&[(PROJECT_ID, "my-project")]).err().map(|p| p.key),
            Some(ZONE)
        );
        assert_eq!(
            settings(&[(PROJECT_ID, "My_Project"), (ZONE, "us-east1-b")])
                .err()
                .map(|p| p.key),
            Some(PROJECT_ID)
        );
        assert_eq!(
            settings(&[(PROJECT_ID, "my-project"), (ZONE, "us-east1")])
                .err()
                .map(|p| p.key),
            Some(ZONE)
        );
        assert_eq!(
            settings(&[
                (PROJECT_ID, "my-project"),
                (ZONE, "us-east1-b"),
                (COMPUTE_ENDPOINT, "compute.internal")
            ])
            .err()
            .map(|p| p.key),
            Some(COMPUTE_ENDPOINT)
        );
    }

    #[test]
    fn credentials_come_from_the_key_then_the_file_then_adc() {
        let base = [(PROJECT_ID, "my-project"), (ZONE, "us-east1-b")];
        let from_file =
            settings(&[base[0], base[1], (CREDENTIALS_FILE, "/mounted/key.json")]).expect("file");
        match from_file.credentials {
            CredentialSource::Json { key, json } => {
                assert_eq!(key, CREDENTIALS_FILE);
                assert!(json.expose_secret().contains("service_account"));
            }
            CredentialSource::ApplicationDefault => panic!("expected the file"),
        }
        let unreadable =
            settings(&[base[0], base[1], (CREDENTIALS_FILE, "/nowhere")]).expect_err("unreadable");
        assert_eq!(unreadable.key, CREDENTIALS_FILE);
        assert!(!unreadable.reason.contains("/nowhere"));
        assert!(matches!(
            settings(&base).expect("adc").credentials,
            CredentialSource::ApplicationDefault
        ));
    }

    #[test]
    fn regions_of_zones() {
        assert_eq!(region_of("us-central1-a").as_deref(), Some("us-central1"));
        assert_eq!(
            region_of("northamerica-northeast2-c").as_deref(),
            Some("northamerica-northeast2")
        );
        assert_eq!(region_of("us-central1"), None);
        assert_eq!(region_of("uscentral1-a"), None);
        assert_eq!(region_of("us-central1-ab"), None);
        assert_eq!(region_of(""), None);
    }
}
