//! Which PeerPodConfig is acted on, and why one cannot be (pure: the caller passes what the caches hold).
//!
//! One cluster has one CAA DaemonSet and one webhook, so two configs would fight over them and over node
//! capacity: only the oldest PeerPodConfig in the controller's namespace is acted on.

use std::sync::Arc;

use kube::ResourceExt;

use peerpods_api::peerpodconfig::{CapacityMode, PeerPodConfig, node_selector_problem};

/// Why a PeerPodConfig cannot be acted on: the reason, and a message naming what is wrong.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    pub reason: InvalidReason,
    pub message: String,
}

/// Why a PeerPodConfig is not acted on: the reason of its Invalid condition and of the Warning Event.
pub use peerpods_api::peerpodconfig::InvalidReason;

/// The ServiceAccounts the rendered workloads may run as, as the controller was told (`--caa-service-account`,
/// `--webhook-service-account`, set by the chart from its values). The RBAC the chart ships is bound to these;
/// any other name (provider-service's, a privileged one) would hand that account's rights to a privileged
/// DaemonSet on every selected node, so a PeerPodConfig naming one renders nothing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllowedServiceAccounts {
    pub caa: String,
    pub webhook: String,
}

impl Default for AllowedServiceAccounts {
    /// The chart's defaults, which are also the PeerPodConfig's.
    fn default() -> Self {
        Self {
            caa: peerpods_api::peerpodconfig::CaaSpec::default().service_account_name,
            webhook: peerpods_api::peerpodconfig::WebhookSpec::default().service_account_name,
        }
    }
}

/// The PeerPodConfig acted on: the oldest one in `namespace` that is not being deleted (ties broken by name).
pub fn active_config(
    configs: impl IntoIterator<Item = Arc<PeerPodConfig>>,
    namespace: &str,
) -> Option<Arc<PeerPodConfig>> {
    configs
        .into_iter()
        .filter(|c| {
            c.namespace().as_deref() == Some(namespace) && c.metadata.deletion_timestamp.is_none()
        })
        .min_by(|a, b| {
            (a.creation_timestamp().map(|t| t.0), a.name_any())
                .cmp(&(b.creation_timestamp().map(|t| t.0), b.name_any()))
        })
}

/// Why `config` cannot be acted on, if it cannot. `namespace` is the controller's; `active` is what
/// [`active_config`] found.
pub fn validate(
    config: &PeerPodConfig,
    namespace: &str,
    active: Option<&PeerPodConfig>,
    allowed: &AllowedServiceAccounts,
) -> Option<Invalid> {
    if config.namespace().as_deref().unwrap_or_default() != namespace {
        return Some(Invalid {
            reason: InvalidReason::WrongNamespace,
            message: format!(
                "PeerPodConfigs are acted on only in namespace {namespace}, where the DaemonSet and webhook live \
                 (owner references cannot cross namespaces)"
            ),
        });
    }
    if let Some(first) = active.filter(|first| first.uid() != config.uid()) {
        return Some(Invalid {
            reason: InvalidReason::DuplicateConfig,
            message: format!(
                "PeerPodConfig {} already configures peer pods on this cluster; only the oldest one is acted on",
                first.name_any()
            ),
        });
    }
    if let Err(message) = config.spec.parsed_limit() {
        return Some(Invalid {
            reason: InvalidReason::InvalidLimit,
            message,
        });
    }
    if config.spec.capacity_mode == CapacityMode::Dra && config.spec.limit_per_node.is_some() {
        return Some(Invalid {
            reason: InvalidReason::PerNodeLimitInDraMode,
            message: "limitPerNode cannot be used with capacityMode dra: the pool is cluster-wide; set limit \
                      (the pool size) instead, or capacityMode node"
                .into(),
        });
    }
    if let Some(message) = node_selector_problem(&config.spec.node_selector) {
        return Some(Invalid {
            reason: InvalidReason::InvalidNodeSelector,
            message,
        });
    }
    for (field, named, allowed) in [
        (
            "spec.caa.serviceAccountName",
            &config.spec.caa.service_account_name,
            &allowed.caa,
        ),
        (
            "spec.webhook.serviceAccountName",
            &config.spec.webhook.service_account_name,
            &allowed.webhook,
        ),
    ] {
        if named != allowed {
            return Some(Invalid {
                reason: InvalidReason::ServiceAccountNotAllowed,
                message: format!(
                    "{field} is {named}, but this controller runs it only as ServiceAccount {allowed} (the one the \
                     chart grants its RBAC to); nothing is rendered"
                ),
            });
        }
    }
    None
}

/// Whether `config`, being deleted, may have written node capacity or the webhook configuration: only the
/// acted-on PeerPodConfig ever did, and a duplicate or misplaced one must not remove what the acted-on one
/// owns. `active` is [`active_config`] (which skips configs being deleted, so `config` itself is not in it).
pub fn may_have_written(
    config: &PeerPodConfig,
    namespace: &str,
    active: Option<&PeerPodConfig>,
) -> bool {
    config.namespace().as_deref() == Some(namespace)
        && active.is_none_or(|active| {
            active.creation_timestamp().map(|t| t.0) >= config.creation_timestamp().map(|t| t.0)
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    fn config(namespace: &str, name: &str, created: i64, spec: serde_json::Value) -> PeerPodConfig {
        let mut c = PeerPodConfig::new(name, serde_json::from_value(spec).expect("spec"));
        c.metadata.namespace = Some(namespace.into());
        c.metadata.uid = Some(format!("uid-{name}"));
        c.metadata.creation_timestamp = Some(Time(
            jiff::Timestamp::from_second(1_700_000_000 + created).expect("time"),
        ));
        c
    }

    static ALLOWED: std::sync::LazyLock<AllowedServiceAccounts> =
        std::sync::LazyLock::new(AllowedServiceAccounts::default);

    fn valid(namespace: &str, name: &str, created: i64) -> PeerPodConfig {
        config(namespace, name, created, serde_json::json!({"limit": 10}))
    }

    #[test]
    fn a_per_node_limit_is_refused_in_dra_mode() {
        let dra = config(
            "pp",
            "c",
            0,
            serde_json::json!({"limitPerNode": 2, "capacityMode": "dra"}),
        );
        let invalid = validate(&dra, "pp", None, &ALLOWED).expect("refused");
        assert_eq!(invalid.reason, InvalidReason::PerNodeLimitInDraMode);
        let node = config("pp", "c", 0, serde_json::json!({"limitPerNode": 2}));
        assert_eq!(validate(&node, "pp", None, &ALLOWED), None);
    }

    #[test]
    fn the_oldest_config_in_the_namespace_is_active() {
        let configs = [
            valid("pp", "newer", 5),
            valid("pp", "older", 1),
            valid("elsewhere", "oldest", 0),
        ]
        .map(Arc::new);
        let active = active_config(configs.iter().cloned(), "pp").expect("one is active");
        assert_eq!(active.name_any(), "older");
        let mut deleting = valid("pp", "older", 1);
        deleting.metadata.deletion_timestamp = deleting.metadata.creation_timestamp.clone();
        let configs = [Arc::new(deleting), Arc::new(valid("pp", "newer", 5))];
        let active = active_config(configs.iter().cloned(), "pp").expect("one is active");
        assert_eq!(
            active.name_any(),
            "newer",
            "one being deleted is not active"
        );
        assert!(active_config([], "pp").is_none());
    }

    #[test]
    fn same_second_ties_go_to_the_first_name() {
        let configs = [valid("pp", "b", 1), valid("pp", "a", 1)].map(Arc::new);
        let active = active_config(configs.iter().cloned(), "pp").expect("one is active");
        assert_eq!(active.name_any(), "a");
    }

    #[test]
    fn the_active_config_is_valid_and_others_are_duplicates() {
        let first = valid("pp", "first", 0);
        let second = valid("pp", "second", 1);
        assert_eq!(validate(&first, "pp", Some(&first), &ALLOWED), None);
        let invalid = validate(&second, "pp", Some(&first), &ALLOWED).expect("duplicate");
        assert_eq!(invalid.reason, InvalidReason::DuplicateConfig);
        assert!(invalid.message.contains("first"), "{}", invalid.message);
    }

    #[test]
    fn wrong_namespace_is_reported_first() {
        let misplaced = config("default", "x", 0, serde_json::json!({"limit": "ten"}));
        let invalid = validate(&misplaced, "pp", None, &ALLOWED).expect("misplaced");
        assert_eq!(invalid.reason, InvalidReason::WrongNamespace);
        assert!(invalid.message.contains("namespace pp"));
    }

    #[test]
    fn bad_limits_and_selectors_are_invalid() {
        let bad_limit = config("pp", "x", 0, serde_json::json!({"limit": "ten"}));
        assert_eq!(
            validate(&bad_limit, "pp", Some(&bad_limit), &ALLOWED).map(|i| i.reason),
            Some(InvalidReason::InvalidLimit)
        );
        let both = config(
            "pp",
            "x",
            0,
            serde_json::json!({"limit": 1, "limitPerNode": 1}),
        );
        assert_eq!(
            validate(&both, "pp", None, &ALLOWED).map(|i| i.reason),
            Some(InvalidReason::InvalidLimit)
        );
        let bad_selector = config(
            "pp",
            "x",
            0,
            serde_json::json!({"limit": 1, "nodeSelector": {"not a key!": "x"}}),
        );
        assert_eq!(
            validate(&bad_selector, "pp", None, &ALLOWED).map(|i| i.reason),
            Some(InvalidReason::InvalidNodeSelector)
        );
    }

    #[test]
    fn only_the_service_accounts_the_controller_was_told_are_rendered() {
        let allowed = AllowedServiceAccounts {
            caa: "caa-sa".into(),
            webhook: "webhook-sa".into(),
        };
        let spec = |caa: &str, webhook: &str| {
            serde_json::json!({"limit": 1, "caa": {"serviceAccountName": caa},
                               "webhook": {"serviceAccountName": webhook}})
        };
        let ok = config("pp", "x", 0, spec("caa-sa", "webhook-sa"));
        assert_eq!(validate(&ok, "pp", None, &allowed), None);
        for (caa, webhook, field) in [
            (
                "release-peerpods-provider-service",
                "webhook-sa",
                "spec.caa.serviceAccountName",
            ),
            (
                "caa-sa",
                "release-peerpods-provider-service",
                "spec.webhook.serviceAccountName",
            ),
        ] {
            let invalid = validate(
                &config("pp", "x", 0, spec(caa, webhook)),
                "pp",
                None,
                &allowed,
            )
            .expect("another ServiceAccount");
            assert_eq!(invalid.reason, InvalidReason::ServiceAccountNotAllowed);
            assert!(
                invalid.message.contains(field)
                    && invalid
                        .message
                        .contains("release-peerpods-provider-service"),
                "{}",
                invalid.message
            );
        }
        // The defaults of a PeerPodConfig are the chart's.
        let defaults = config("pp", "x", 0, serde_json::json!({"limit": 1}));
        assert_eq!(validate(&defaults, "pp", None, &ALLOWED), None);
    }

    #[test]
    fn only_the_acted_on_config_cleans_up() {
        let active = valid("pp", "active", 1);
        let older_deleting = valid("pp", "older", 0);
        let newer_duplicate = valid("pp", "newer", 5);
        assert!(may_have_written(&older_deleting, "pp", Some(&active)));
        assert!(!may_have_written(&newer_duplicate, "pp", Some(&active)));
        assert!(
            may_have_written(&newer_duplicate, "pp", None),
            "the last one left"
        );
        assert!(!may_have_written(&valid("default", "x", 0), "pp", None));
    }
}
