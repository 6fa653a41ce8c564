//! How the CAA DaemonSet reaches provider-service: the endpoint, the projected ServiceAccount token and the CA
//! that CAA's container is given (docs/caa-integration.md).

use k8s_openapi::api::core::v1::{
    EnvVar, KeyToPath, ProjectedVolumeSource, SecretProjection, ServiceAccountTokenProjection,
    Volume, VolumeMount, VolumeProjection,
};

use super::CAA_TOKEN_SECONDS;

/// How the CAA DaemonSet reaches provider-service, so CAA can call GetCapacity and DeleteInstance out of the
/// box. docs/caa-integration.md documents the variables CAA reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderServiceWiring {
    /// `https://host:port` (or `http://` for local development).
    pub endpoint: String,
    /// Secret in the DaemonSet's namespace whose `ca.crt` is the CA of provider-service's certificate. Only
    /// that key is projected into CAA (the Secret may hold provider-service's own key too). `None` with a
    /// plaintext endpoint.
    pub ca_secret: Option<String>,
    /// Audience of the projected ServiceAccount token (provider-service checks it).
    pub audience: String,
    /// Name to verify the certificate against, when it differs from the endpoint's host.
    pub server_name: Option<String>,
}

/// Where the provider-service token and CA are mounted in the CAA container.
pub const CAA_PROVIDER_DIR: &str = "/var/run/secrets/peerpods/provider-service";
/// The variables CAA reads to call provider-service.
pub const ENV_PROVIDER_ENDPOINT: &str = "PROVIDER_SERVICE_ENDPOINT";
pub const ENV_PROVIDER_CA_FILE: &str = "PROVIDER_SERVICE_CA_FILE";
pub const ENV_PROVIDER_TOKEN_FILE: &str = "PROVIDER_SERVICE_TOKEN_FILE";
pub const ENV_PROVIDER_SERVER_NAME: &str = "PROVIDER_SERVICE_SERVER_NAME";
/// Environment, volume and mount that wire CAA to provider-service.
pub(super) fn provider_service_wiring(
    wiring: &ProviderServiceWiring,
) -> (Vec<EnvVar>, Volume, VolumeMount) {
    let var = |name: &str, value: String| EnvVar {
        name: name.into(),
        value: Some(value),
        ..EnvVar::default()
    };
    let mut env = vec![
        var(ENV_PROVIDER_ENDPOINT, wiring.endpoint.clone()),
        var(ENV_PROVIDER_TOKEN_FILE, format!("{CAA_PROVIDER_DIR}/token")),
    ];
    let mut sources = vec![VolumeProjection {
        service_account_token: Some(ServiceAccountTokenProjection {
            audience: Some(wiring.audience.clone()),
            expiration_seconds: Some(CAA_TOKEN_SECONDS),
            path: "token".into(),
            ..ServiceAccountTokenProjection::default()
        }),
        ..VolumeProjection::default()
    }];
    if let Some(secret) = &wiring.ca_secret {
        env.push(var(
            ENV_PROVIDER_CA_FILE,
            format!("{CAA_PROVIDER_DIR}/ca.crt"),
        ));
        sources.push(VolumeProjection {
            secret: Some(SecretProjection {
                name: secret.clone(),
                items: Some(vec![KeyToPath {
                    key: "ca.crt".into(),
                    path: "ca.crt".into(),
                    ..KeyToPath::default()
                }]),
                optional: Some(false),
            }),
            ..VolumeProjection::default()
        });
    }
    if let Some(name) = &wiring.server_name {
        env.push(var(ENV_PROVIDER_SERVER_NAME, name.clone()));
    }
    let volume = Volume {
        name: "provider-service".into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(sources),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    };
    let mount = VolumeMount {
        name: "provider-service".into(),
        mount_path: CAA_PROVIDER_DIR.into(),
        read_only: Some(true),
        ..VolumeMount::default()
    };
    (env, volume, mount)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::objects::caa_daemonset;
    use crate::objects::tests::{cloud, config};

    #[test]
    fn caa_is_wired_to_provider_service_with_its_ca_and_a_projected_token() {
        let config = config(
            serde_json::json!({"limit": "4", "caa": {"env": {"PROVIDER_SERVICE_ENDPOINT": "https://elsewhere"}}}),
        );
        let wiring = ProviderServiceWiring {
            endpoint: "https://provider-service.peer-pods.svc:50051".into(),
            ca_secret: Some("provider-service-tls".into()),
            audience: "provider-service".into(),
            server_name: None,
        };
        let ds = caa_daemonset(&config, "peer-pods", Some(&wiring), &cloud(None, false)).unwrap();
        let pod = ds.spec.template.spec.unwrap();
        let c = &pod.containers[0];
        let env: BTreeMap<_, _> = c
            .env
            .as_ref()
            .unwrap()
            .iter()
            .map(|e| (e.name.as_str(), e.value.clone().unwrap_or_default()))
            .collect();
        assert_eq!(
            env[ENV_PROVIDER_ENDPOINT], wiring.endpoint,
            "the controller's endpoint wins"
        );
        assert_eq!(
            env[ENV_PROVIDER_CA_FILE],
            format!("{CAA_PROVIDER_DIR}/ca.crt")
        );
        assert_eq!(
            env[ENV_PROVIDER_TOKEN_FILE],
            format!("{CAA_PROVIDER_DIR}/token")
        );
        assert!(!env.contains_key(ENV_PROVIDER_SERVER_NAME));
        assert_eq!(
            c.env
                .as_ref()
                .unwrap()
                .iter()
                .filter(|e| e.name == ENV_PROVIDER_ENDPOINT)
                .count(),
            1
        );
        let mount = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.name == "provider-service")
            .unwrap();
        assert_eq!(mount.mount_path, CAA_PROVIDER_DIR);
        let volume = pod
            .volumes
            .unwrap()
            .into_iter()
            .find(|v| v.name == "provider-service")
            .unwrap();
        let sources = volume.projected.unwrap().sources.unwrap();
        let token = sources[0].service_account_token.as_ref().unwrap();
        assert_eq!(token.audience.as_deref(), Some("provider-service"));
        let ca = sources[1].secret.as_ref().unwrap();
        assert_eq!(ca.name, "provider-service-tls");
        let items = ca.items.as_ref().unwrap();
        assert_eq!(items.len(), 1, "only ca.crt, never the service's key");
        assert_eq!(items[0].key, "ca.crt");
    }

    #[test]
    fn without_wiring_caa_gets_no_provider_service_settings() {
        let config = config(serde_json::json!({"limit": "4"}));
        let ds = caa_daemonset(&config, "peer-pods", None, &cloud(None, false)).unwrap();
        let pod = ds.spec.template.spec.unwrap();
        assert!(
            pod.containers[0]
                .env
                .as_ref()
                .unwrap()
                .iter()
                .all(|e| !e.name.starts_with("PROVIDER_SERVICE_"))
        );
        assert!(
            pod.volumes
                .unwrap()
                .iter()
                .all(|v| v.name != "provider-service")
        );
    }
}
