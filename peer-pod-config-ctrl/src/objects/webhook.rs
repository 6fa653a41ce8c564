//! The peer-pods webhook: its Deployment, Service and serving certificate Secret, and this controller's entry in
//! the MutatingWebhookConfiguration the chart creates.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MatchCondition, MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations,
    ServiceReference, WebhookClientConfig,
};
use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EnvVar, HTTPGetAction, PodSecurityContext, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, SecretVolumeSource, SecurityContext, Service,
    ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{EXTENDED_RESOURCE, OWNER_LABEL, OWNER_NAMESPACE_LABEL, labels, owned_meta};
use crate::Error;
use peerpods_api::peerpodconfig::{PeerPodConfig, PeerPodConfigSpec};

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
pub use peerpods_api::keys::WEBHOOK_PATH;
/// Port the webhook container listens on.
pub const WEBHOOK_PORT: i32 = 9443;

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
                    containers: vec![webhook_container(spec)],
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

/// The webhook's environment: the runtime class it mutates pods of, the resource it requests for them, its
/// secure metrics, and the instance type when the spec names one.
fn webhook_env(spec: &PeerPodConfigSpec) -> Vec<EnvVar> {
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
    env
}

/// The `manager` container: its ports, probes, resources and the serving certificate, locked down.
fn webhook_container(spec: &PeerPodConfigSpec) -> Container {
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::Int(WEBHOOK_HEALTH_PORT),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    };
    Container {
        name: "manager".into(),
        image: Some(spec.webhook.image.clone()),
        image_pull_policy: spec
            .webhook
            .image_pull_policy
            .map(|p| p.as_str().to_owned()),
        args: Some(vec![format!(
            "--health-probe-bind-address=:{WEBHOOK_HEALTH_PORT}"
        )]),
        env: Some(webhook_env(spec)),
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
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::tests::config;
    use crate::objects::{MANAGED_BY, labelled_for};

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
}
