//! The cloud-api-adaptor DaemonSet and what it depends on besides the PeerPodConfig: the cloud it serves (its
//! per-cloud credentials), CAA's agent TLS certificates and developer mode, and the provider-service wiring.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapEnvSource, Container, EnvFromSource, EnvVar, EnvVarSource,
    HTTPGetAction, HostPathVolumeSource, ObjectFieldSelector, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, SeccompProfile, SecretEnvSource, SecretVolumeSource, SecurityContext,
    ServiceAccountTokenProjection, Volume, VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use peerpods_protocol::decide::{DEVELOPER_MODE_KEY, DeveloperMode};

use super::provider_service::{ProviderServiceWiring, provider_service_wiring};
use super::{CAA_TOKEN_SECONDS, labels, owned_meta};
use crate::Error;
use peerpods_api::peerpodconfig::{CloudProvider, PeerPodConfig, PeerPodConfigSpec, PullPolicy};

/// CAA DaemonSet name, as upstream.
pub const CAA_DAEMONSET: &str = "peerpodconfig-ctrl-caa-daemon";
// Upstream's DaemonSet selector. A DaemonSet's selector is immutable, so keeping it lets this controller adopt a
// DaemonSet the upstream controller created.
const CAA_SELECTOR: (&str, &str) = ("name", "caa-daemonset");
// The label cloud-api-adaptor's chart gives CAA pods (its selector), kept on ours so what selects CAA pods by it
// (monitoring, runbooks) finds them too.
const CAA_CHART_LABEL: (&str, &str) = ("app", "cloud-api-adaptor");

/// Where CAA's agent TLS certificates (`CACERT_FILE` and friends) are mounted, as cloud-api-adaptor's chart does.
pub const CAA_CERTS_DIR: &str = "/etc/certificates";
/// The ConfigMap keys the DaemonSet's shape depends on.
pub const CM_CLOUD_PROVIDER: &str = "CLOUD_PROVIDER";
pub const CM_CACERT_FILE: &str = "CACERT_FILE";

/// What the CAA DaemonSet depends on besides the PeerPodConfig: the cloud it serves, whether CAA's agent TLS
/// certificates are configured, and CAA's developer mode. cloud-api-adaptor's chart decides the per-cloud parts
/// from the first two (its `provider` value and `providerConfigs.<cloud>.CACERT_FILE`), which end up in
/// `peer-pods-cm` beside `PODVM_DEVELOPER_MODE`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaaCloud {
    /// The cloud, when known. Unknown renders only the parts every cloud shares.
    pub provider: Option<CloudProvider>,
    /// `CACERT_FILE` is set: the `certs-for-tls` Secret is mounted at [`CAA_CERTS_DIR`].
    pub agent_tls: bool,
    /// CAA's developer mode (`PODVM_DEVELOPER_MODE`): its pods carry it ([`DEVELOPER_MODE_ANNOTATION`]), and node
    /// capacity follows it (`crate::plan::node_ceiling`).
    pub developer_mode: DeveloperMode,
}

impl CaaCloud {
    /// The cloud from `spec.caa.provider` (wins) or the ConfigMap's `CLOUD_PROVIDER`, the agent TLS setting
    /// from its `CACERT_FILE` and the developer mode from its `PODVM_DEVELOPER_MODE`. `config_map` is the
    /// ConfigMap's data (empty when it does not exist), `None` when it could not be read: the developer mode is
    /// then unknown.
    pub fn resolve(
        explicit: Option<CloudProvider>,
        config_map: Option<&BTreeMap<String, String>>,
    ) -> Self {
        let value = |key: &str| {
            config_map
                .and_then(|data| data.get(key))
                .map(|v| v.trim())
                .filter(|v| !v.is_empty())
        };
        Self {
            provider: explicit
                .or_else(|| value(CM_CLOUD_PROVIDER).and_then(CloudProvider::from_config_map)),
            agent_tls: value(CM_CACERT_FILE).is_some(),
            developer_mode: config_map.map_or(DeveloperMode::Unknown, |data| {
                DeveloperMode::from_setting(data.get(DEVELOPER_MODE_KEY).map(String::as_str))
            }),
        }
    }
}

/// Annotation on the CAA DaemonSet's pod template naming CAA's developer mode while it is not off. CAA reads its
/// ConfigMap only when it starts, so a change of `PODVM_DEVELOPER_MODE` changes the template and rolls CAA's pods:
/// the mode they run with is the one this controller plans capacity for. Off carries no annotation (a cluster that
/// never set the key sees no change).
pub const DEVELOPER_MODE_ANNOTATION: &str = "confidentialcontainers.org/caa-developer-mode";

/// The value of [`DEVELOPER_MODE_ANNOTATION`] for `mode`; `None`: no annotation.
pub fn developer_mode_annotation(mode: DeveloperMode) -> Option<&'static str> {
    match mode {
        DeveloperMode::Off => None,
        DeveloperMode::On => Some("on"),
        DeveloperMode::Unknown => Some("unknown"),
    }
}

/// The developer mode a CAA DaemonSet's pod template was rendered for (from [`DEVELOPER_MODE_ANNOTATION`]).
pub fn rendered_developer_mode(daemonset: &DaemonSet) -> DeveloperMode {
    let value = daemonset
        .spec
        .template
        .metadata
        .as_ref()
        .and_then(|meta| meta.annotations.as_ref())
        .and_then(|annotations| annotations.get(DEVELOPER_MODE_ANNOTATION));
    match value.map(String::as_str) {
        None => DeveloperMode::Off,
        Some("on") => DeveloperMode::On,
        Some(_) => DeveloperMode::Unknown,
    }
}

/// The cloud-api-adaptor DaemonSet, field for field as cloud-api-adaptor v0.22's Helm chart renders it for
/// `cloud`, except for what this controller changes on purpose (docs/caa-daemonset.md lists it):
/// `PEERPODS_LIMIT_PER_NODE=-1` so CAA leaves node capacity to this controller, the provider-service wiring
/// given `provider_service`, the name, labels, selector and owner reference.
pub fn caa_daemonset(
    config: &PeerPodConfig,
    namespace: &str,
    provider_service: Option<&ProviderServiceWiring>,
    cloud: &CaaCloud,
) -> Result<DaemonSet, Error> {
    let spec = &config.spec;
    let selector = BTreeMap::from([(CAA_SELECTOR.0.to_owned(), CAA_SELECTOR.1.to_owned())]);
    let (wired_env, wired_volume) = match provider_service.map(provider_service_wiring) {
        Some((env, volume, mount)) => (env, Some((volume, mount))),
        None => (Vec::new(), None),
    };
    let (mounts, volumes) = caa_volumes(cloud, wired_volume);
    let container = caa_container(spec, caa_env(spec, wired_env), mounts);
    Ok(DaemonSet {
        metadata: owned_meta(
            config,
            CAA_DAEMONSET,
            namespace,
            ("app.kubernetes.io/name", "cloud-api-adaptor"),
        )?,
        spec: DaemonSetSpec {
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            // As the chart: the new CAA starts before the old one stops (maxSurge), so a node never goes without
            // one during an update.
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_unavailable: Some(IntOrString::Int(0)),
                    max_surge: Some(IntOrString::Int(1)),
                }),
            }),
            template: caa_pod_template(config, cloud, container, volumes),
            ..DaemonSetSpec::default()
        },
        status: None,
    })
}

/// CAA's pods: on the host network of the selected nodes, labelled as the chart labels them, annotated with the
/// developer mode they run with.
fn caa_pod_template(
    config: &PeerPodConfig,
    cloud: &CaaCloud,
    container: Container,
    volumes: Vec<Volume>,
) -> PodTemplateSpec {
    let spec = &config.spec;
    let mut pod_labels = labels(config, CAA_SELECTOR);
    pod_labels.insert(CAA_CHART_LABEL.0.into(), CAA_CHART_LABEL.1.into());
    pod_labels.insert("app.kubernetes.io/name".into(), "cloud-api-adaptor".into());
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels),
            annotations: developer_mode_annotation(cloud.developer_mode).map(|value| {
                BTreeMap::from([(DEVELOPER_MODE_ANNOTATION.to_owned(), value.to_owned())])
            }),
            ..ObjectMeta::default()
        }),
        spec: Some(PodSpec {
            service_account_name: Some(spec.caa.service_account_name.clone()),
            containers: vec![container],
            host_network: Some(true),
            dns_policy: Some("ClusterFirstWithHostNet".into()),
            node_selector: Some(spec.node_selector.clone()).filter(|s| !s.is_empty()),
            volumes: Some(volumes),
            ..PodSpec::default()
        }),
    }
}

/// CAA's environment: the node and pod it runs as, node capacity left to this controller, the provider-service
/// variables (`wired`), then `spec.caa.env` except where the controller's settings win.
fn caa_env(spec: &PeerPodConfigSpec, wired: Vec<EnvVar>) -> Vec<EnvVar> {
    let field_ref = |name: &str, path: &str| EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource {
            field_ref: Some(ObjectFieldSelector {
                field_path: path.into(),
                ..ObjectFieldSelector::default()
            }),
            ..EnvVarSource::default()
        }),
        ..EnvVar::default()
    };
    // NODE_NAME: CAA patches its node, reads ibmcloud's zone labels and byom's pool by it. POD_UID: CAA's shutdown
    // leaves the node's capacity alone when the node's owner annotation names someone else; unset, it removes it.
    let mut env = vec![
        field_ref("NODE_NAME", "spec.nodeName"),
        field_ref("POD_UID", "metadata.uid"),
        EnvVar {
            name: "PEERPODS_LIMIT_PER_NODE".into(),
            value: Some("-1".into()),
            ..EnvVar::default()
        },
    ];
    env.extend(wired);
    // The controller's settings win over spec.caa.env for the variables it sets.
    let ours: Vec<String> = env.iter().map(|e| e.name.clone()).collect();
    env.extend(
        spec.caa
            .env
            .iter()
            .filter(|(name, _)| !ours.contains(name))
            .map(|(name, value)| EnvVar {
                name: name.clone(),
                value: Some(value.clone()),
                ..EnvVar::default()
            }),
    );
    env
}

/// CAA's volume mounts and volumes, in the chart's order: the per-cloud credentials first, then the host paths
/// every cloud needs, the cloud's token where it comes after them, and last the provider-service volume
/// (`wired`). What each cloud adds is the cloud's own fact (`caa_wiring`); an unknown cloud adds nothing.
fn caa_volumes(
    cloud: &CaaCloud,
    wired: Option<(Volume, VolumeMount)>,
) -> (Vec<VolumeMount>, Vec<Volume>) {
    let cloud_wiring = cloud.provider.map(CloudProvider::caa_wiring);
    let ssh_keys = cloud_wiring.is_some_and(|w| w.ssh_keys);
    let cloud_token = cloud_wiring.and_then(|w| w.token);
    let token_parts = |after_host_paths: bool, mounts: &mut Vec<_>, volumes: &mut Vec<_>| {
        if let Some(t) = cloud_token.filter(|t| t.after_host_paths == after_host_paths) {
            mounts.push(mount(t.volume, t.mount_path, t.read_only));
            volumes.push(token_volume(t.volume, t.audience, t.file, t.mode));
        }
    };
    let mut mounts = Vec::new();
    let mut volumes = Vec::new();
    if ssh_keys {
        mounts.push(mount("ssh", "/root/.ssh/", true));
        volumes.push(secret_volume("ssh", "ssh-key-secret"));
    }
    if cloud.agent_tls {
        mounts.push(mount("certs", CAA_CERTS_DIR, true));
        volumes.push(secret_volume("certs", "certs-for-tls"));
    }
    token_parts(false, &mut mounts, &mut volumes);
    mounts.extend([
        mount("pods-dir", "/run/peerpod", false),
        VolumeMount {
            mount_propagation: Some("HostToContainer".into()),
            ..mount("netns", "/run/netns", false)
        },
        mount("xtables-lock", "/run/xtables.lock", false),
        mount("lib-modules", "/lib/modules", true),
        mount(
            "kata-direct-volumes-dir",
            "/run/kata-containers/shared/direct-volumes",
            false,
        ),
    ]);
    volumes.extend([
        host_path("pods-dir", "/run/peerpod", None),
        host_path("netns", "/run/netns", None),
        host_path("xtables-lock", "/run/xtables.lock", Some("FileOrCreate")),
        host_path("lib-modules", "/lib/modules", Some("")),
        host_path(
            "kata-direct-volumes-dir",
            "/run/kata-containers/shared/direct-volumes",
            Some("DirectoryOrCreate"),
        ),
    ]);
    token_parts(true, &mut mounts, &mut volumes);
    if let Some((volume, mount)) = wired {
        mounts.push(mount);
        volumes.push(volume);
    }
    (mounts, volumes)
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

fn host_path(name: &str, path: &str, type_: Option<&str>) -> Volume {
    Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: type_.map(Into::into),
        }),
        ..Volume::default()
    }
}

/// A Secret volume CAA starts without (optional), readable by its owner only.
fn secret_volume(name: &str, secret: &str) -> Volume {
    Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            optional: Some(true),
            default_mode: Some(0o600),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// A projected ServiceAccount token for `audience` (a cloud's workload identity).
fn token_volume(name: &str, audience: &str, path: &str, mode: Option<i32>) -> Volume {
    Volume {
        name: name.into(),
        projected: Some(ProjectedVolumeSource {
            default_mode: mode,
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(audience.into()),
                    expiration_seconds: Some(CAA_TOKEN_SECONDS),
                    path: path.into(),
                    ..ServiceAccountTokenProjection::default()
                }),
                ..VolumeProjection::default()
            }]),
            ..ProjectedVolumeSource::default()
        }),
        ..Volume::default()
    }
}

/// The `cloud-api-adaptor-con` container: CAA's image, the capabilities it needs on the host network, its
/// startup probe, and its settings from the cloud Secret and CAA's ConfigMap.
fn caa_container(
    spec: &PeerPodConfigSpec,
    env: Vec<EnvVar>,
    mounts: Vec<VolumeMount>,
) -> Container {
    Container {
        name: "cloud-api-adaptor-con".into(),
        image: Some(spec.caa.image.clone()),
        // Not CAA's chart's Always: a privileged container on every selected node runs the image that was
        // pulled and checked once, not whatever its tag points at when a node next restarts it.
        image_pull_policy: Some(
            spec.caa
                .image_pull_policy
                .unwrap_or(PullPolicy::IfNotPresent)
                .as_str()
                .to_owned(),
        ),
        command: Some(vec!["/usr/local/bin/entrypoint.sh".into()]),
        security_context: Some(SecurityContext {
            capabilities: Some(Capabilities {
                add: Some(vec!["NET_ADMIN".into(), "SYS_ADMIN".into()]),
                ..Capabilities::default()
            }),
            // The runtime's default syscall filter, which CAA's chart leaves off (Unconfined): with SYS_ADMIN
            // and the host network, it still keeps the syscalls no container needs out of reach.
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            }),
            ..SecurityContext::default()
        }),
        startup_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/startup".into()),
                port: IntOrString::Int(8000),
                host: Some("127.0.0.1".into()),
                ..HTTPGetAction::default()
            }),
            failure_threshold: Some(30),
            period_seconds: Some(20),
            initial_delay_seconds: Some(20),
            ..Probe::default()
        }),
        env_from: Some(vec![
            EnvFromSource {
                secret_ref: Some(SecretEnvSource {
                    name: spec.cloud_secret_name.clone(),
                    ..SecretEnvSource::default()
                }),
                ..EnvFromSource::default()
            },
            EnvFromSource {
                config_map_ref: Some(ConfigMapEnvSource {
                    name: spec.config_map_name.clone(),
                    ..ConfigMapEnvSource::default()
                }),
                ..EnvFromSource::default()
            },
        ]),
        env: Some(env),
        volume_mounts: Some(mounts),
        ..Container::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::tests::{cloud, config};

    #[test]
    fn caa_pulls_its_image_if_not_present_under_the_runtime_default_seccomp_profile() {
        let libvirt = cloud(Some(CloudProvider::Libvirt), false);
        let container = |spec: serde_json::Value| {
            caa_daemonset(&config(spec), "peer-pods", None, &libvirt)
                .unwrap()
                .spec
                .template
                .spec
                .unwrap()
                .containers
                .remove(0)
        };
        let c = container(serde_json::json!({}));
        assert_eq!(c.image_pull_policy.as_deref(), Some("IfNotPresent"));
        assert_eq!(
            c.security_context.unwrap().seccomp_profile,
            Some(SeccompProfile {
                type_: "RuntimeDefault".into(),
                localhost_profile: None,
            })
        );
        // A digest the user gives is passed on as it is; an explicit policy is the user's.
        let pinned = "quay.io/confidential-containers/cloud-api-adaptor@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let c =
            container(serde_json::json!({"caa": {"image": pinned, "imagePullPolicy": "Always"}}));
        assert_eq!(c.image.as_deref(), Some(pinned));
        assert_eq!(c.image_pull_policy.as_deref(), Some("Always"));
    }

    #[test]
    fn daemonset_matches_upstream_and_disables_caa_capacity() {
        let config = config(
            serde_json::json!({"limit": "10", "caa": {"env": {"PEERPODS_LIMIT_PER_NODE": "5", "X": "1"}}}),
        );
        let libvirt = cloud(Some(CloudProvider::Libvirt), false);
        let ds = caa_daemonset(&config, "peer-pods", None, &libvirt).unwrap();
        assert_eq!(ds.metadata.name.as_deref(), Some(CAA_DAEMONSET));
        assert_eq!(
            ds.metadata.owner_references.as_ref().unwrap()[0].controller,
            Some(true)
        );
        let pod = ds.spec.template.spec.unwrap();
        assert_eq!(pod.host_network, Some(true));
        assert_eq!(
            pod.service_account_name.as_deref(),
            Some("cloud-api-adaptor")
        );
        assert_eq!(
            pod.node_selector.unwrap().get("node.kubernetes.io/worker"),
            Some(&String::new())
        );
        let c = &pod.containers[0];
        let security = c.security_context.as_ref().unwrap();
        assert_eq!(security.privileged, None);
        assert_eq!(
            security.capabilities.as_ref().unwrap().add.as_deref(),
            Some(&["NET_ADMIN".to_owned(), "SYS_ADMIN".to_owned()][..])
        );
        let env = c.env.as_ref().unwrap();
        let limit: Vec<_> = env
            .iter()
            .filter(|e| e.name == "PEERPODS_LIMIT_PER_NODE")
            .collect();
        assert_eq!(
            limit.len(),
            1,
            "the user cannot turn CAA's own advertising back on"
        );
        assert_eq!(limit[0].value.as_deref(), Some("-1"));
        assert!(env.iter().any(|e| e.name == "X"));
        let env_from = c.env_from.as_ref().unwrap();
        assert_eq!(
            env_from[0].secret_ref.as_ref().unwrap().name,
            "peer-pods-secret"
        );
        assert_eq!(
            env_from[1].config_map_ref.as_ref().unwrap().name,
            "peer-pods-cm"
        );
        let netns = c
            .volume_mounts
            .as_ref()
            .unwrap()
            .iter()
            .find(|m| m.mount_path == "/run/netns")
            .unwrap();
        assert_eq!(netns.mount_propagation.as_deref(), Some("HostToContainer"));
        let volumes = pod.volumes.unwrap();
        let ssh = volumes
            .iter()
            .find(|v| v.name == "ssh")
            .unwrap()
            .secret
            .as_ref()
            .unwrap();
        assert_eq!(
            (ssh.secret_name.as_deref(), ssh.optional),
            (Some("ssh-key-secret"), Some(true))
        );
    }

    #[test]
    fn the_cloud_comes_from_the_spec_first_then_the_config_map() {
        let data = BTreeMap::from([
            (CM_CLOUD_PROVIDER.to_owned(), "ibmcloudpowervs".to_owned()),
            (
                CM_CACERT_FILE.to_owned(),
                "/etc/certificates/ca.crt".to_owned(),
            ),
        ]);
        assert_eq!(
            CaaCloud::resolve(None, Some(&data)),
            cloud(Some(CloudProvider::IbmcloudPowervs), true)
        );
        assert_eq!(
            CaaCloud::resolve(Some(CloudProvider::Aws), Some(&data)).provider,
            Some(CloudProvider::Aws),
            "spec.caa.provider wins"
        );
        let blank = BTreeMap::from([
            (CM_CLOUD_PROVIDER.to_owned(), "nimbus".to_owned()),
            (CM_CACERT_FILE.to_owned(), " ".to_owned()),
        ]);
        assert_eq!(CaaCloud::resolve(None, Some(&blank)), cloud(None, false));
        // Unreadable: no per-cloud parts, and whether CAA keeps VMs cannot be told.
        assert_eq!(
            CaaCloud::resolve(None, None),
            CaaCloud {
                developer_mode: DeveloperMode::Unknown,
                ..cloud(None, false)
            }
        );
    }

    #[test]
    fn per_cloud_parts_follow_the_cloud() {
        let config = config(serde_json::json!({"limit": "4"}));
        let volumes = |provider, agent_tls| {
            let ds =
                caa_daemonset(&config, "peer-pods", None, &cloud(provider, agent_tls)).unwrap();
            let pod = ds.spec.template.spec.unwrap();
            let mounts: Vec<String> = pod.containers[0]
                .volume_mounts
                .as_ref()
                .unwrap()
                .iter()
                .map(|m| m.name.clone())
                .collect();
            let volumes: Vec<String> = pod.volumes.unwrap().into_iter().map(|v| v.name).collect();
            assert_eq!(mounts, volumes, "every volume mounted, in the same order");
            volumes
        };
        let shared = [
            "pods-dir",
            "netns",
            "xtables-lock",
            "lib-modules",
            "kata-direct-volumes-dir",
        ];
        assert_eq!(volumes(Some(CloudProvider::Aws), false), shared);
        assert_eq!(volumes(Some(CloudProvider::Byom), false)[0], "ssh");
        assert_eq!(volumes(Some(CloudProvider::Azure), true)[0], "certs");
        assert_eq!(
            volumes(Some(CloudProvider::Alibabacloud), false)[0],
            "rrsa-oidc-token"
        );
        assert_eq!(
            volumes(Some(CloudProvider::Ibmcloud), false)
                .last()
                .map(String::as_str),
            Some("vault-token")
        );
        assert_eq!(volumes(None, false), shared);
    }

    #[test]
    fn the_developer_mode_of_caas_config_map_is_on_the_pod_template_unless_off() {
        let config = config(serde_json::json!({"limit": "4"}));
        let setting = |value: Option<&str>| {
            let mut data = BTreeMap::from([(CM_CLOUD_PROVIDER.to_owned(), "libvirt".to_owned())]);
            if let Some(value) = value {
                data.insert(DEVELOPER_MODE_KEY.to_owned(), value.to_owned());
            }
            CaaCloud::resolve(None, Some(&data))
        };
        let template = |cloud: &CaaCloud| {
            let ds = caa_daemonset(&config, "peer-pods", None, cloud).unwrap();
            assert_eq!(rendered_developer_mode(&ds), cloud.developer_mode);
            ds.spec.template.metadata.unwrap()
        };
        let annotation = |cloud: &CaaCloud| {
            template(cloud)
                .annotations
                .and_then(|a| a.get(DEVELOPER_MODE_ANNOTATION).cloned())
        };
        // Off, however it is spelled or left out, renders the template of an install that never set it.
        for off in [None, Some(""), Some("false"), Some("0")] {
            let cloud = setting(off);
            assert_eq!(cloud.developer_mode, DeveloperMode::Off, "{off:?}");
            assert_eq!(template(&cloud).annotations, None, "{off:?}");
        }
        assert_eq!(setting(Some("true")).developer_mode, DeveloperMode::On);
        assert_eq!(annotation(&setting(Some("true"))).as_deref(), Some("on"));
        assert_eq!(
            annotation(&setting(Some("yes"))).as_deref(),
            Some("unknown")
        );
        assert_eq!(
            annotation(&CaaCloud::resolve(None, None)).as_deref(),
            Some("unknown"),
            "an unreadable ConfigMap"
        );
        // Switching the mode changes the template (the DaemonSet rolls CAA's pods), and nothing else.
        let on = caa_daemonset(&config, "peer-pods", None, &setting(Some("true"))).unwrap();
        let off = caa_daemonset(&config, "peer-pods", None, &setting(Some("false"))).unwrap();
        assert_ne!(on.spec, off.spec);
        let mut without = on.spec.clone();
        if let Some(meta) = without.template.metadata.as_mut() {
            meta.annotations = None;
        }
        assert_eq!(without, off.spec);
    }
}
