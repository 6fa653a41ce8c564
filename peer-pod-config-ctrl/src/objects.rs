//! The objects a PeerPodConfig owns, built as plain values (no I/O) so they can be unit-tested.
//!
//! Names follow upstream so existing clusters and runbooks recognise them: the CAA DaemonSet is
//! `peerpodconfig-ctrl-caa-daemon`, the webhook objects carry the `peer-pods-webhook` prefix of the upstream
//! webhook manifests, and the serving certificate lives in Secret `webhook-server-cert`.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    RollingUpdateDaemonSet,
};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapEnvSource, Container, ContainerPort, EnvFromSource, EnvVar,
    EnvVarSource, HTTPGetAction, HostPathVolumeSource, KeyToPath, ObjectFieldSelector,
    PodSecurityContext, PodSpec, PodTemplateSpec, Probe, ProjectedVolumeSource,
    ResourceRequirements, SeccompProfile, SecretEnvSource, SecretProjection, SecretVolumeSource,
    SecurityContext, Service, ServiceAccountTokenProjection, ServicePort, ServiceSpec, Volume,
    VolumeMount, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use peerpods_protocol::decide::{DEVELOPER_MODE_KEY, DeveloperMode};

use crate::Error;
use crate::crd::{CloudProvider, PeerPodConfig, PullPolicy};

/// CAA DaemonSet name, as upstream.
pub const CAA_DAEMONSET: &str = "peerpodconfig-ctrl-caa-daemon";
/// Webhook Deployment name.
pub const WEBHOOK_DEPLOYMENT: &str = "peer-pods-webhook";
/// Webhook Service name; the serving certificate is issued for `<this>.<namespace>.svc`.
pub const WEBHOOK_SERVICE: &str = "peer-pods-webhook-service";
/// Cluster-scoped MutatingWebhookConfiguration name.
pub const WEBHOOK_CONFIGURATION: &str = "peer-pods-webhook-mutating-webhook-configuration";
/// The single webhook inside the configuration, as upstream.
pub const MUTATING_WEBHOOK: &str = "mwebhook.peerpods.io";
/// Secret with the webhook serving certificate (`tls.crt`, `tls.key`, `ca.crt`).
pub const WEBHOOK_CERT_SECRET: &str = "webhook-server-cert";
/// Path the webhook serves.
pub const WEBHOOK_PATH: &str = "/mutate-v1-pod";
/// Port the webhook container listens on.
pub const WEBHOOK_PORT: i32 = 9443;
/// The extended resource this controller advertises on nodes and the webhook requests.
pub const EXTENDED_RESOURCE: &str = "kata.peerpods.io/vm";
/// Label on every owned object, naming the PeerPodConfig it belongs to (cluster-scoped objects cannot carry an
/// owner reference to a namespaced owner).
pub const OWNER_LABEL: &str = "confidentialcontainers.org/peerpodconfig";
/// Label naming the namespace of that PeerPodConfig.
pub const OWNER_NAMESPACE_LABEL: &str = "confidentialcontainers.org/peerpodconfig-namespace";

const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", crate::FIELD_MANAGER);
// Upstream's DaemonSet selector. A DaemonSet's selector is immutable, so keeping it lets this controller adopt a
// DaemonSet the upstream controller created.
const CAA_SELECTOR: (&str, &str) = ("name", "caa-daemonset");
// The label cloud-api-adaptor's chart gives CAA pods (its selector), kept on ours so what selects CAA pods by it
// (monitoring, runbooks) finds them too.
const CAA_CHART_LABEL: (&str, &str) = ("app", "cloud-api-adaptor");
const WEBHOOK_SELECTOR: (&str, &str) = ("app.kubernetes.io/name", "peer-pods-webhook");
const WEBHOOK_CERT_DIR: &str = "/tmp/k8s-webhook-server/serving-certs";
const WEBHOOK_HEALTH_PORT: i32 = 8081;
/// The webhook's metrics port: TLS, each scrape's token reviewed (TokenReview and SubjectAccessReview for `get`
/// on `/metrics`), as every service of the chart serves them with `metrics.secure`. Always on for the webhook this
/// controller renders: its metrics are never served in plain HTTP, and without the review rights the chart grants
/// its ServiceAccount a scrape is refused, not answered.
pub const WEBHOOK_METRICS_PORT: i32 = 8443;

/// DNS name of the webhook Service, the name the API server dials and the certificate must match.
pub fn webhook_dns_names(namespace: &str) -> Vec<String> {
    vec![
        format!("{WEBHOOK_SERVICE}.{namespace}.svc"),
        format!("{WEBHOOK_SERVICE}.{namespace}.svc.cluster.local"),
    ]
}

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
/// Lifetime of CAA's projected token; the kubelet renews it at 80 %.
const CAA_TOKEN_SECONDS: i64 = 3600;

/// Environment, volume and mount that wire CAA to provider-service.
fn provider_service_wiring(wiring: &ProviderServiceWiring) -> (Vec<EnvVar>, Volume, VolumeMount) {
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
            provider: explicit.or_else(|| value(CM_CLOUD_PROVIDER).and_then(parse_cloud)),
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

/// CAA's `CLOUD_PROVIDER` name, also in the spelling of the chart's provider file names (`ibmcloudpowervs`).
fn parse_cloud(name: &str) -> Option<CloudProvider> {
    match name {
        "ibmcloudpowervs" => Some(CloudProvider::IbmcloudPowervs),
        other => other.parse().ok(),
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
    let wiring = provider_service.map(provider_service_wiring);
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
    if let Some((wired, _, _)) = &wiring {
        env.extend(wired.iter().cloned());
    }
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
    let mount = |name: &str, path: &str, read_only: bool| VolumeMount {
        name: name.into(),
        mount_path: path.into(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    };
    let host_path = |name: &str, path: &str, type_: Option<&str>| Volume {
        name: name.into(),
        host_path: Some(HostPathVolumeSource {
            path: path.into(),
            type_: type_.map(Into::into),
        }),
        ..Volume::default()
    };
    let secret = |name: &str, secret: &str| Volume {
        name: name.into(),
        secret: Some(SecretVolumeSource {
            secret_name: Some(secret.into()),
            optional: Some(true),
            default_mode: Some(0o600),
            ..SecretVolumeSource::default()
        }),
        ..Volume::default()
    };
    let token = |name: &str, audience: &str, path: &str, mode: Option<i32>| Volume {
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
    };

    // In the chart's order: the per-cloud credentials first, then the host paths every cloud needs. What each
    // cloud adds is the cloud's own fact (`caa_wiring`); an unknown cloud adds nothing.
    let cloud_wiring = cloud.provider.map(CloudProvider::caa_wiring);
    let ssh_keys = cloud_wiring.is_some_and(|w| w.ssh_keys);
    let cloud_token = cloud_wiring.and_then(|w| w.token);
    let token_parts = |after_host_paths: bool, mounts: &mut Vec<_>, volumes: &mut Vec<_>| {
        if let Some(t) = cloud_token.filter(|t| t.after_host_paths == after_host_paths) {
            mounts.push(mount(t.volume, t.mount_path, t.read_only));
            volumes.push(token(t.volume, t.audience, t.file, t.mode));
        }
    };
    let mut mounts = Vec::new();
    let mut volumes = Vec::new();
    if ssh_keys {
        mounts.push(mount("ssh", "/root/.ssh/", true));
        volumes.push(secret("ssh", "ssh-key-secret"));
    }
    if cloud.agent_tls {
        mounts.push(mount("certs", CAA_CERTS_DIR, true));
        volumes.push(secret("certs", "certs-for-tls"));
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
    if let Some((_, volume, mount)) = wiring {
        mounts.push(mount);
        volumes.push(volume);
    }

    let container = Container {
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
    };
    let mut pod_labels = labels(config, CAA_SELECTOR);
    pod_labels.insert(CAA_CHART_LABEL.0.into(), CAA_CHART_LABEL.1.into());
    pod_labels.insert("app.kubernetes.io/name".into(), "cloud-api-adaptor".into());
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
            template: PodTemplateSpec {
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
            },
            ..DaemonSetSpec::default()
        },
        status: None,
    })
}

/// Metadata of the webhook serving certificate Secret.
pub fn secret_meta(config: &PeerPodConfig, namespace: &str) -> Result<ObjectMeta, Error> {
    owned_meta(config, WEBHOOK_CERT_SECRET, namespace, WEBHOOK_SELECTOR)
}

/// CPU the webhook container requests: idle it uses next to none; a burst of admissions is short.
pub const WEBHOOK_CPU_REQUEST: &str = "10m";
/// Memory the webhook container requests: its resident set at rest with room for ordinary pods' admissions.
pub const WEBHOOK_MEMORY_REQUEST: &str = "64Mi";
/// The webhook container's memory limit: its worst case, every share of its admission budget taken by the
/// largest reviews at once (peerpods-webhook's `ADMISSION_BUDGET_BYTES`, measured by its `tests/it/memory.rs`),
/// with headroom. No CPU limit: throttling a webhook only turns load into API server time-outs.
pub const WEBHOOK_MEMORY_LIMIT: &str = "320Mi";

/// The peer-pods webhook Deployment. Non-root, read-only root filesystem, serving certificate from
/// `webhook-server-cert`.
pub fn webhook_deployment(config: &PeerPodConfig, namespace: &str) -> Result<Deployment, Error> {
    let spec = &config.spec;
    let selector = BTreeMap::from([(WEBHOOK_SELECTOR.0.to_owned(), WEBHOOK_SELECTOR.1.to_owned())]);
    let mut env = vec![
        EnvVar {
            name: "TARGET_RUNTIMECLASS".into(),
            value: Some(spec.webhook.target_runtime_class.clone()),
            ..EnvVar::default()
        },
        EnvVar {
            name: "POD_VM_EXTENDED_RESOURCE".into(),
            value: Some(EXTENDED_RESOURCE.into()),
            ..EnvVar::default()
        },
    ];
    env.extend([
        EnvVar {
            name: "METRICS_SECURE".into(),
            value: Some("true".into()),
            ..EnvVar::default()
        },
        EnvVar {
            name: "METRICS_LISTEN".into(),
            value: Some(format!("0.0.0.0:{WEBHOOK_METRICS_PORT}")),
            ..EnvVar::default()
        },
    ]);
    if let Some(instance_type) = spec.instance_type.as_ref().filter(|t| !t.is_empty()) {
        env.push(EnvVar {
            name: "POD_VM_INSTANCE_TYPE".into(),
            value: Some(instance_type.clone()),
            ..EnvVar::default()
        });
    }
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(WEBHOOK_HEALTH_PORT),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    };
    let container = Container {
        name: "manager".into(),
        image: Some(spec.webhook.image.clone()),
        image_pull_policy: spec
            .webhook
            .image_pull_policy
            .map(|p| p.as_str().to_owned()),
        args: Some(vec![format!(
            "--health-probe-bind-address=:{WEBHOOK_HEALTH_PORT}"
        )]),
        env: Some(env),
        ports: Some(vec![
            ContainerPort {
                name: Some("webhook-server".into()),
                container_port: WEBHOOK_PORT,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
            ContainerPort {
                name: Some("metrics".into()),
                container_port: WEBHOOK_METRICS_PORT,
                protocol: Some("TCP".into()),
                ..ContainerPort::default()
            },
        ]),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity(WEBHOOK_CPU_REQUEST.into())),
                ("memory".to_owned(), Quantity(WEBHOOK_MEMORY_REQUEST.into())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(WEBHOOK_MEMORY_LIMIT.into()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            read_only_root_filesystem: Some(true),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".into()]),
                ..Capabilities::default()
            }),
            ..SecurityContext::default()
        }),
        volume_mounts: Some(vec![VolumeMount {
            name: "cert".into(),
            mount_path: WEBHOOK_CERT_DIR.into(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        ..Container::default()
    };
    Ok(Deployment {
        metadata: owned_meta(config, WEBHOOK_DEPLOYMENT, namespace, WEBHOOK_SELECTOR)?,
        spec: DeploymentSpec {
            replicas: Some(spec.webhook.replicas),
            selector: LabelSelector {
                match_labels: Some(selector),
                ..LabelSelector::default()
            },
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels(config, WEBHOOK_SELECTOR)),
                    ..ObjectMeta::default()
                }),
                spec: Some(PodSpec {
                    service_account_name: Some(spec.webhook.service_account_name.clone()),
                    // The token reviews scrapes of the secure metrics port; admissions need no API call.
                    automount_service_account_token: Some(true),
                    security_context: Some(PodSecurityContext {
                        run_as_non_root: Some(true),
                        ..PodSecurityContext::default()
                    }),
                    termination_grace_period_seconds: Some(10),
                    containers: vec![container],
                    volumes: Some(vec![Volume {
                        name: "cert".into(),
                        secret: Some(SecretVolumeSource {
                            secret_name: Some(WEBHOOK_CERT_SECRET.into()),
                            ..SecretVolumeSource::default()
                        }),
                        ..Volume::default()
                    }]),
                    ..PodSpec::default()
                }),
            },
            ..DeploymentSpec::default()
        },
        status: None,
    })
}

/// The webhook Service: port 443 in front of the container's 9443.
pub fn webhook_service(config: &PeerPodConfig, namespace: &str) -> Result<Service, Error> {
    Ok(Service {
        metadata: owned_meta(config, WEBHOOK_SERVICE, namespace, WEBHOOK_SELECTOR)?,
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(
                WEBHOOK_SELECTOR.0.to_owned(),
                WEBHOOK_SELECTOR.1.to_owned(),
            )])),
            ports: Some(vec![ServicePort {
                name: Some("webhook".into()),
                port: 443,
                protocol: Some("TCP".into()),
                target_port: Some(IntOrString::Int(WEBHOOK_PORT)),
                ..ServicePort::default()
            }]),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// This controller's part of the MutatingWebhookConfiguration the chart creates (uid `uid`): its one webhook,
/// wiring the API server to the webhook and carrying `ca_bundle` (PEM), and its owner labels. Server-side applied
/// under this controller's field manager: `webhooks` is a list keyed by name, so the entry is this controller's
/// and whatever the chart sets stays the chart's.
///
/// `uid` makes the apply a precondition on the chart's object. An apply to a missing object creates it when the
/// caller may create (the chart's RBAC grants no create, and the API server checks create for such an apply; but
/// without the chart, as in `make dev`, the controller may run with wider rights): with a uid the API server
/// refuses instead ("uid mismatch ... no existing object was found"), so a configuration deleted after the cache
/// saw it is never recreated by this controller, whatever its credentials.
///
/// Besides upstream's wiring it has a match condition on the runtime class: the webhook fails closed, and this way
/// a webhook outage only blocks peer pods, never every pod in the cluster.
pub fn webhook_configuration(
    config: &PeerPodConfig,
    namespace: &str,
    ca_bundle: &[u8],
    uid: &str,
) -> MutatingWebhookConfiguration {
    let runtime_class = &config.spec.webhook.target_runtime_class;
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_CONFIGURATION.into()),
            uid: Some(uid.to_owned()),
            // The owner labels only (they lead a change back to the PeerPodConfig): the object's other labels,
            // app.kubernetes.io/managed-by above all, are the chart's, and a forced apply would take them over.
            labels: Some(BTreeMap::from([
                (OWNER_LABEL.to_owned(), config.name_any()),
                (
                    OWNER_NAMESPACE_LABEL.to_owned(),
                    config.namespace().unwrap_or_default(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        webhooks: Some(vec![MutatingWebhook {
            name: MUTATING_WEBHOOK.into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                ca_bundle: Some(ByteString(ca_bundle.to_vec())),
                service: Some(ServiceReference {
                    name: WEBHOOK_SERVICE.into(),
                    namespace: namespace.into(),
                    path: Some(WEBHOOK_PATH.into()),
                    port: Some(443),
                }),
                url: None,
            },
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            reinvocation_policy: Some("IfNeeded".into()),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["pods".into()]),
                scope: None,
            }]),
            namespace_selector: Some(LabelSelector {
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "kubernetes.io/metadata.name".into(),
                    operator: "NotIn".into(),
                    values: Some(vec!["kube-system".into(), namespace.to_owned()]),
                }]),
                match_labels: None,
            }),
            match_conditions: Some(vec![MatchCondition {
                name: "peer-pod-runtime-class".into(),
                expression: format!(
                    "has(object.spec.runtimeClassName) && object.spec.runtimeClassName == '{}'",
                    runtime_class.replace('\\', "\\\\").replace('\'', "\\'")
                ),
            }]),
            ..MutatingWebhook::default()
        }]),
    }
}

/// The webhook configuration as this controller applies it once a PeerPodConfig is deleted: nothing but its name
/// and `uid` (the same precondition). Server-side apply drops what this field manager set before and no longer
/// sets, the webhook entry, the owner labels and the applied-hash annotation, and leaves the object and the
/// chart's fields alone.
pub fn webhook_configuration_released(uid: &str) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta {
            name: Some(WEBHOOK_CONFIGURATION.into()),
            uid: Some(uid.to_owned()),
            ..ObjectMeta::default()
        },
        webhooks: None,
    }
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
    use crate::crd::PeerPodConfigSpec;

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
    fn webhook_configuration_wiring() {
        let config = config(serde_json::json!({"limit": 3}));
        let mwc = webhook_configuration(&config, "peer-pods", b"PEM", "uid-of-the-charts");
        assert_eq!(mwc.metadata.uid.as_deref(), Some("uid-of-the-charts"));
        assert!(labelled_for(&mwc.metadata, &config));
        assert!(
            !mwc.metadata
                .labels
                .as_ref()
                .unwrap()
                .contains_key(MANAGED_BY.0),
            "app.kubernetes.io/managed-by is the chart's (Helm)"
        );
        let hook = &mwc.webhooks.unwrap()[0];
        assert_eq!(hook.name, MUTATING_WEBHOOK);
        assert_eq!(hook.failure_policy.as_deref(), Some("Fail"));
        assert_eq!(hook.side_effects, "None");
        assert_eq!(hook.reinvocation_policy.as_deref(), Some("IfNeeded"));
        let svc = hook.client_config.service.as_ref().unwrap();
        assert_eq!(
            (
                svc.name.as_str(),
                svc.namespace.as_str(),
                svc.path.as_deref()
            ),
            (WEBHOOK_SERVICE, "peer-pods", Some("/mutate-v1-pod"))
        );
        assert_eq!(hook.client_config.ca_bundle.as_ref().unwrap().0, b"PEM");
        let rule = &hook.rules.as_ref().unwrap()[0];
        assert_eq!(rule.operations.as_deref(), Some(&["CREATE".to_owned()][..]));
        let excluded = hook
            .namespace_selector
            .as_ref()
            .unwrap()
            .match_expressions
            .as_ref()
            .unwrap()[0]
            .values
            .clone();
        assert_eq!(
            excluded,
            Some(vec!["kube-system".to_owned(), "peer-pods".to_owned()])
        );
        assert!(
            hook.match_conditions.as_ref().unwrap()[0]
                .expression
                .contains("'kata-remote'")
        );
    }

    #[test]
    fn the_rendered_webhook_serves_metrics_only_behind_review() {
        let config = config(serde_json::json!({"limit": 3}));
        let deployment = webhook_deployment(&config, "peer-pods").unwrap();
        let pod = deployment.spec.template.spec.as_ref().unwrap();
        let container = &pod.containers[0];
        let env: BTreeMap<_, _> = container
            .env
            .iter()
            .flatten()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        // The variables of runtime's SecureMetricsArgs: /metrics moves off the plain health port.
        assert_eq!(env["METRICS_SECURE"], Some("true"));
        assert_eq!(
            env["METRICS_LISTEN"],
            Some(format!("0.0.0.0:{WEBHOOK_METRICS_PORT}").as_str())
        );
        assert!(
            container
                .ports
                .iter()
                .flatten()
                .any(|p| p.name.as_deref() == Some("metrics")
                    && p.container_port == WEBHOOK_METRICS_PORT)
        );
        assert_eq!(pod.automount_service_account_token, Some(true));
    }

    #[test]
    fn webhook_deployment_and_service_line_up() {
        let config = config(serde_json::json!({"limit": 3, "instanceType": "t3.small"}));
        let deployment = webhook_deployment(&config, "peer-pods").unwrap();
        let service = webhook_service(&config, "peer-pods").unwrap();
        let pod = deployment.spec.template.spec.as_ref().unwrap();
        let port = pod.containers[0].ports.as_ref().unwrap()[0].container_port;
        let svc_spec = service.spec.as_ref().unwrap();
        assert_eq!(
            svc_spec.ports.as_ref().unwrap()[0].target_port,
            Some(IntOrString::Int(port))
        );
        let pod_labels = deployment
            .spec
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        assert!(
            svc_spec
                .selector
                .as_ref()
                .unwrap()
                .iter()
                .all(|(k, v)| pod_labels.get(k) == Some(v))
        );
        assert_eq!(
            pod.volumes.as_ref().unwrap()[0]
                .secret
                .as_ref()
                .unwrap()
                .secret_name
                .as_deref(),
            Some(WEBHOOK_CERT_SECRET)
        );
        let env = pod.containers[0].env.as_ref().unwrap();
        assert!(env.iter().any(|e| e.name == "POD_VM_INSTANCE_TYPE" && e.value.as_deref() == Some("t3.small")));
        // Placed by its requests, capped by its memory limit (the webhook's worst case fits in it).
        let resources = pod.containers[0].resources.as_ref().unwrap();
        let requests = resources.requests.as_ref().unwrap();
        assert_eq!(requests["cpu"].0, WEBHOOK_CPU_REQUEST);
        assert_eq!(requests["memory"].0, WEBHOOK_MEMORY_REQUEST);
        assert_eq!(
            resources.limits.as_ref().unwrap()["memory"].0,
            WEBHOOK_MEMORY_LIMIT
        );
        assert!(labelled_for(&deployment.metadata, &config));
    }

    #[test]
    fn runtime_class_is_quoted_in_the_match_condition() {
        let config =
            config(serde_json::json!({"limit": 3, "webhook": {"targetRuntimeClass": "a'b"}}));
        let mwc = webhook_configuration(&config, "ns", b"", "uid");
        assert!(
            mwc.webhooks.unwrap()[0].match_conditions.as_ref().unwrap()[0]
                .expression
                .ends_with("== 'a\\'b'")
        );
    }

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
