//! The objects a PeerPodConfig owns, built as plain values (no I/O) so they can be unit-tested.
//!
//! Names follow upstream so existing clusters and runbooks recognise them: the CAA DaemonSet is
//! `peerpodconfig-ctrl-caa-daemon`, the webhook objects carry the `peer-pods-webhook` prefix of the upstream
//! webhook manifests, and the serving certificate lives in Secret `webhook-server-cert`.
//!
//! - [`caa_daemonset`] and what it depends on ([`CaaCloud`]): the CAA DaemonSet and its per-cloud parts.
//! - [`ProviderServiceWiring`]: how CAA reaches provider-service.
//! - [`webhook_deployment`], [`webhook_service`], [`secret_meta`], [`webhook_configuration`]: the peer-pods
//!   webhook.
//! - Here: the owner labels and metadata every owned object carries.

mod caa;
mod provider_service;
mod webhook;

pub use caa::{
    CAA_CERTS_DIR, CAA_DAEMONSET, CM_CACERT_FILE, CM_CLOUD_PROVIDER, CaaCloud,
    DEVELOPER_MODE_ANNOTATION, caa_daemonset, developer_mode_annotation, rendered_developer_mode,
};
pub use provider_service::{
    CAA_PROVIDER_DIR, ENV_PROVIDER_CA_FILE, ENV_PROVIDER_ENDPOINT, ENV_PROVIDER_SERVER_NAME,
    ENV_PROVIDER_TOKEN_FILE, ProviderServiceWiring,
};
pub use webhook::{
    MUTATING_WEBHOOK, WEBHOOK_CERT_SECRET, WEBHOOK_CONFIGURATION, WEBHOOK_CPU_REQUEST,
    WEBHOOK_DEPLOYMENT, WEBHOOK_MEMORY_LIMIT, WEBHOOK_MEMORY_REQUEST, WEBHOOK_METRICS_PORT,
    WEBHOOK_PATH, WEBHOOK_PORT, WEBHOOK_SERVICE, secret_meta, webhook_configuration,
    webhook_configuration_released, webhook_deployment, webhook_dns_names, webhook_service,
};

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kube::{Resource, ResourceExt};

use crate::Error;
use peerpods_api::peerpodconfig::PeerPodConfig;

/// The extended resource this controller advertises on nodes and the webhook requests.
pub use peerpods_api::keys::EXTENDED_RESOURCE;
/// Label on every owned object, naming the PeerPodConfig it belongs to (cluster-scoped objects cannot carry an
/// owner reference to a namespaced owner).
pub const OWNER_LABEL: &str = "confidentialcontainers.org/peerpodconfig";
/// Label naming the namespace of that PeerPodConfig.
pub const OWNER_NAMESPACE_LABEL: &str = "confidentialcontainers.org/peerpodconfig-namespace";

const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", crate::name::FIELD_MANAGER);
/// Lifetime of CAA's projected tokens (provider-service's and the clouds'); the kubelet renews them at 80 %.
const CAA_TOKEN_SECONDS: i64 = 3600;

fn labels(config: &PeerPodConfig, extra: (&str, &str)) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        (OWNER_LABEL.to_owned(), config.name_any()),
        (
            OWNER_NAMESPACE_LABEL.to_owned(),
            config.namespace().unwrap_or_default(),
        ),
        (extra.0.to_owned(), extra.1.to_owned()),
    ])
}

/// The labels every owned object carries: managed by this controller, and which PeerPodConfig it belongs to.
pub fn owner_labels(config: &PeerPodConfig) -> BTreeMap<String, String> {
    BTreeMap::from([
        (MANAGED_BY.0.to_owned(), MANAGED_BY.1.to_owned()),
        (OWNER_LABEL.to_owned(), config.name_any()),
        (
            OWNER_NAMESPACE_LABEL.to_owned(),
            config.namespace().unwrap_or_default(),
        ),
    ])
}

/// Metadata of a namespaced object owned by `config`: its owner labels and a controller owner reference.
pub fn owned_meta_for(
    config: &PeerPodConfig,
    name: &str,
    namespace: &str,
) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(owner_labels(config)),
        owner_references: Some(vec![owner_reference(config)?]),
        ..ObjectMeta::default()
    })
}

fn owner_reference(config: &PeerPodConfig) -> Result<OwnerReference, Error> {
    config
        .controller_owner_ref(&())
        .ok_or(Error::MissingMetadata("uid"))
}

fn owned_meta(
    config: &PeerPodConfig,
    name: &str,
    namespace: &str,
    extra: (&str, &str),
) -> Result<ObjectMeta, Error> {
    Ok(ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        labels: Some(labels(config, extra)),
        owner_references: Some(vec![owner_reference(config)?]),
        ..ObjectMeta::default()
    })
}

/// Whether `config` is the owner recorded on an owned object's labels.
pub fn labelled_for(meta: &ObjectMeta, config: &PeerPodConfig) -> bool {
    let labels = meta.labels.as_ref();
    labels.and_then(|l| l.get(OWNER_LABEL)) == Some(&config.name_any())
        && labels.and_then(|l| l.get(OWNER_NAMESPACE_LABEL)) == config.namespace().as_ref()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use peerpods_api::peerpodconfig::{CloudProvider, PeerPodConfigSpec};
    use peerpods_protocol::decide::DeveloperMode;

    pub(crate) fn config(spec: serde_json::Value) -> PeerPodConfig {
        let spec: PeerPodConfigSpec = serde_json::from_value(spec).unwrap();
        let mut config = PeerPodConfig::new("peerpodconfig", spec);
        config.metadata.namespace = Some("peer-pods".into());
        config.metadata.uid = Some("5b0c1e8e-1111-2222-3333-444455556666".into());
        config
    }

    /// CAA's ConfigMap as most clusters have it: developer mode off.
    pub(crate) fn cloud(provider: Option<CloudProvider>, agent_tls: bool) -> CaaCloud {
        CaaCloud {
            provider,
            agent_tls,
            developer_mode: DeveloperMode::Off,
        }
    }
}
