//! Whether every permission the chart grants is used: the chart's RBAC objects expanded into single
//! permissions ([`grants`]), the requests the API server allowed to the workloads' credentials, from its audit
//! log ([`uses`]), and the permissions no request needed ([`unused`]).
//!
//! A permission is one verb on one resource (subresource included) of one API group, for one user, in one
//! namespace or all of them, on one named object or any. It is used when an allowed request matches it in every
//! part. Rules with `*` are kept literally, so they are never used: least privilege has no place for them.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, Subject,
};
use testenv::audit::AuditEvent;

/// The chart's RBAC objects, as rendered.
#[derive(Debug, Clone, Default)]
pub struct Rbac {
    pub roles: Vec<Role>,
    pub cluster_roles: Vec<ClusterRole>,
    pub role_bindings: Vec<RoleBinding>,
    pub cluster_role_bindings: Vec<ClusterRoleBinding>,
}

/// One permission a binding gives.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Grant {
    /// The user as the API server authenticates it (`system:serviceaccount:<namespace>:<name>`).
    pub user: String,
    pub verb: String,
    /// `""` for the core group.
    pub api_group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// `None`: every namespace (and cluster-scoped objects).
    pub namespace: Option<String>,
    /// `None`: any object.
    pub name: Option<String>,
}

/// One request the API server allowed, reduced to what authorization looked at.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Use {
    pub user: String,
    pub verb: String,
    pub api_group: String,
    /// `resource` or `resource/subresource`.
    pub resource: String,
    /// `""` for cluster-scoped objects and requests across namespaces.
    pub namespace: String,
    /// `""` when the request named no object (a create, a list or watch of many).
    pub name: String,
}

impl Grant {
    /// Whether `request` needed this permission.
    pub fn used_by(&self, request: &Use) -> bool {
        self.user == request.user
            && self.verb == request.verb
            && self.api_group == request.api_group
            && self.resource == request.resource
            && self
                .namespace
                .as_ref()
                .is_none_or(|ns| *ns == request.namespace)
            && self.name.as_ref().is_none_or(|n| *n == request.name)
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let group = if self.api_group.is_empty() {
            "core"
        } else {
            &self.api_group
        };
        write!(
            f,
            "{} may {} {} ({group})",
            self.user, self.verb, self.resource
        )?;
        if let Some(name) = &self.name {
            write!(f, " named {name}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => write!(f, " in every namespace"),
        }
    }
}

/// Every single permission the bindings in `rbac` give to their subjects. A binding to a role that is not in
/// `rbac` gives nothing here: the chart would depend on a role it does not ship.
pub fn grants(rbac: &Rbac) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for binding in &rbac.cluster_role_bindings {
        let rules = rbac
            .cluster_roles
            .iter()
            .filter(|r| {
                binding.role_ref.kind == "ClusterRole"
                    && r.metadata.name.as_deref() == Some(&binding.role_ref.name)
            })
            .flat_map(|r| r.rules.iter().flatten());
        let users = users(binding.subjects.iter().flatten(), None);
        expand(rules, &users, None, &mut out);
    }
    for binding in &rbac.role_bindings {
        let ns = binding.metadata.namespace.clone().unwrap_or_default();
        let role_ref = &binding.role_ref;
        let rules: Vec<&PolicyRule> = match role_ref.kind.as_str() {
            "Role" => rbac
                .roles
                .iter()
                .filter(|r| {
                    r.metadata.name.as_deref() == Some(&role_ref.name)
                        && r.metadata.namespace.as_deref() == Some(&ns)
                })
                .flat_map(|r| r.rules.iter().flatten())
                .collect(),
            "ClusterRole" => rbac
                .cluster_roles
                .iter()
                .filter(|r| r.metadata.name.as_deref() == Some(&role_ref.name))
                .flat_map(|r| r.rules.iter().flatten())
                .collect(),
            _ => Vec::new(),
        };
        let users = users(binding.subjects.iter().flatten(), Some(&ns));
        expand(rules, &users, Some(&ns), &mut out);
    }
    out
}

/// Users named by binding subjects: ServiceAccounts (their namespace defaults to the binding's) and users.
/// Groups name nobody in particular and are left out.
fn users<'a>(subjects: impl Iterator<Item = &'a Subject>, binding_ns: Option<&str>) -> Vec<String> {
    subjects
        .filter_map(|s| match s.kind.as_str() {
            "ServiceAccount" => {
                let ns = s.namespace.as_deref().or(binding_ns).unwrap_or_default();
                Some(format!("system:serviceaccount:{ns}:{}", s.name))
            }
            "User" => Some(s.name.clone()),
            _ => None,
        })
        .collect()
}

fn expand<'a>(
    rules: impl IntoIterator<Item = &'a PolicyRule>,
    users: &[String],
    namespace: Option<&str>,
    out: &mut BTreeSet<Grant>,
) {
    for rule in rules {
        let names: Vec<Option<String>> = match rule.resource_names.as_deref() {
            Some(names) if !names.is_empty() => names.iter().cloned().map(Some).collect(),
            _ => vec![None],
        };
        for user in users {
            for api_group in rule.api_groups.iter().flatten() {
                for resource in rule.resources.iter().flatten() {
                    for verb in &rule.verbs {
                        for name in &names {
                            out.insert(Grant {
                                user: user.clone(),
                                verb: verb.clone(),
                                api_group: api_group.clone(),
                                resource: resource.clone(),
                                namespace: namespace.map(str::to_owned),
                                name: name.clone(),
                            });
                        }
                    }
                }
            }
        }
    }
}

/// The requests of `events` that the API server allowed to one of `credentials` (as the API server names
/// them, see [`testenv::credential_id`]). A patch or update that created its object (201) also needed
/// `create`: the API server checks that verb too, without an event of its own.
pub fn uses(events: &[AuditEvent], credentials: &BTreeSet<String>) -> BTreeSet<Use> {
    let mut out = BTreeSet::new();
    for event in events {
        let (Some(object), Some(credential)) = (&event.object_ref, event.credential_id()) else {
            continue;
        };
        if !event.allowed() || !credentials.contains(credential) {
            continue;
        }
        let resource = if object.subresource.is_empty() {
            object.resource.clone()
        } else {
            format!("{}/{}", object.resource, object.subresource)
        };
        let request = Use {
            user: event.user.username.clone(),
            verb: event.verb.clone(),
            api_group: object.api_group.clone(),
            resource,
            namespace: object.namespace.clone(),
            name: object.name.clone(),
        };
        if matches!(event.verb.as_str(), "patch" | "update") && event.code() == Some(201) {
            out.insert(Use {
                verb: "create".into(),
                ..request.clone()
            });
        }
        out.insert(request);
    }
    out
}

/// The permissions of `grants` that none of `uses` needed.
pub fn unused<'a>(grants: &'a BTreeSet<Grant>, uses: &BTreeSet<Use>) -> Vec<&'a Grant> {
    grants
        .iter()
        .filter(|g| !uses.iter().any(|u| g.used_by(u)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::rbac::v1::RoleRef;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    const SA: &str = "system:serviceaccount:peerpods:ctrl";

    fn rule(groups: &[&str], resources: &[&str], verbs: &[&str], names: &[&str]) -> PolicyRule {
        let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        PolicyRule {
            api_groups: Some(strings(groups)),
            resources: Some(strings(resources)),
            verbs: strings(verbs),
            resource_names: (!names.is_empty()).then(|| strings(names)),
            ..PolicyRule::default()
        }
    }

    fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            name: Some(name.into()),
            namespace: namespace.map(str::to_owned),
            ..ObjectMeta::default()
        }
    }

    fn subject() -> Vec<Subject> {
        vec![Subject {
            kind: "ServiceAccount".into(),
            name: "ctrl".into(),
            namespace: Some("peerpods".into()),
            ..Subject::default()
        }]
    }

    /// A controller's chart RBAC: a ClusterRole for PeerPods everywhere, a Role for its Lease by name.
    fn chart() -> Rbac {
        Rbac {
            cluster_roles: vec![ClusterRole {
                metadata: meta("ctrl", None),
                rules: Some(vec![
                    rule(
                        &["confidentialcontainers.org"],
                        &["peerpods"],
                        &["list", "watch", "patch"],
                        &[],
                    ),
                    rule(
                        &["confidentialcontainers.org"],
                        &["peerpods/status"],
                        &["patch"],
                        &[],
                    ),
                ]),
                ..ClusterRole::default()
            }],
            cluster_role_bindings: vec![ClusterRoleBinding {
                metadata: meta("ctrl", None),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: "ctrl".into(),
                },
                subjects: Some(subject()),
            }],
            roles: vec![Role {
                metadata: meta("ctrl", Some("peerpods")),
                rules: Some(vec![
                    rule(&["coordination.k8s.io"], &["leases"], &["create"], &[]),
                    rule(
                        &["coordination.k8s.io"],
                        &["leases"],
                        &["get", "update"],
                        &["ctrl-lock"],
                    ),
                ]),
            }],
            role_bindings: vec![RoleBinding {
                metadata: meta("ctrl", Some("peerpods")),
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "ctrl".into(),
                },
                subjects: Some(subject()),
            }],
        }
    }

    fn request(verb: &str, group: &str, resource: &str, ns: &str, name: &str) -> Use {
        Use {
            user: SA.into(),
            verb: verb.into(),
            api_group: group.into(),
            resource: resource.into(),
            namespace: ns.into(),
            name: name.into(),
        }
    }

    /// What the controller does at run time: every grant once.
    fn every_use() -> BTreeSet<Use> {
        let pp = "confidentialcontainers.org";
        let lease = "coordination.k8s.io";
        BTreeSet::from([
            request("list", pp, "peerpods", "", ""),
            request("watch", pp, "peerpods", "", ""),
            request("patch", pp, "peerpods", "apps", "web-abc"),
            request("patch", pp, "peerpods/status", "apps", "web-abc"),
            request("create", lease, "leases", "peerpods", ""),
            request("get", lease, "leases", "peerpods", "ctrl-lock"),
            request("update", lease, "leases", "peerpods", "ctrl-lock"),
        ])
    }

    #[test]
    fn bindings_expand_into_single_permissions_with_their_scope() {
        let grants = grants(&chart());
        assert_eq!(grants.len(), 7);
        let lease_get = grants
            .iter()
            .find(|g| g.resource == "leases" && g.verb == "get")
            .expect("lease get");
        assert_eq!(lease_get.namespace.as_deref(), Some("peerpods"));
        assert_eq!(lease_get.name.as_deref(), Some("ctrl-lock"));
        assert_eq!(
            lease_get.to_string(),
            format!(
                "{SA} may get leases (coordination.k8s.io) named ctrl-lock in namespace peerpods"
            )
        );
        assert!(
            grants
                .iter()
                .any(|g| g.resource == "peerpods/status" && g.namespace.is_none())
        );
    }

    #[test]
    fn every_grant_used_leaves_nothing() {
        let grants = grants(&chart());
        assert_eq!(unused(&grants, &every_use()), Vec::<&Grant>::new());
    }

    #[test]
    fn a_granted_but_unused_verb_is_reported() {
        let grants = grants(&chart());
        let mut uses = every_use();
        uses.retain(|u| u.resource != "peerpods/status");
        let found: Vec<String> = unused(&grants, &uses)
            .iter()
            .map(|g| g.to_string())
            .collect();
        assert_eq!(
            found,
            [format!(
                "{SA} may patch peerpods/status (confidentialcontainers.org) in every namespace"
            )]
        );
    }

    #[test]
    fn a_use_elsewhere_or_by_someone_else_does_not_count() {
        let grants = grants(&chart());
        let lease = "coordination.k8s.io";
        let mut uses = every_use();
        uses.retain(|u| u.verb != "update");
        // Another Lease, another namespace, another user: none is the granted update.
        uses.insert(request("update", lease, "leases", "peerpods", "other-lock"));
        uses.insert(request("update", lease, "leases", "elsewhere", "ctrl-lock"));
        uses.insert(Use {
            user: "system:serviceaccount:peerpods:other".into(),
            ..request("update", lease, "leases", "peerpods", "ctrl-lock")
        });
        let found: Vec<&str> = unused(&grants, &uses)
            .iter()
            .map(|g| g.verb.as_str())
            .collect();
        assert_eq!(found, ["update"]);
    }

    #[test]
    fn a_wildcard_is_never_used() {
        let mut rbac = chart();
        rbac.cluster_roles[0]
            .rules
            .get_or_insert_default()
            .push(rule(&["*"], &["*"], &["*"], &[]));
        let grants = grants(&rbac);
        let found: Vec<String> = unused(&grants, &every_use())
            .iter()
            .map(|g| g.verb.clone())
            .collect();
        assert_eq!(found, ["*"]);
    }

    fn event(verb: &str, code: u16, decision: &str, credential: &str, object: &str) -> String {
        format!(
            r#"{{"stage":"ResponseComplete","requestURI":"/x","verb":"{verb}","user":{{"username":"{SA}","extra":{{"authentication.kubernetes.io/credential-id":["{credential}"]}}}},"objectRef":{object},"responseStatus":{{"code":{code}}},"annotations":{{"authorization.k8s.io/decision":"{decision}"}}}}"#
        )
    }

    #[test]
    fn uses_are_the_allowed_requests_of_the_workloads_credentials() {
        let lease = r#"{"apiGroup":"coordination.k8s.io","resource":"leases","namespace":"peerpods","name":"ctrl-lock"}"#;
        let status = r#"{"apiGroup":"confidentialcontainers.org","resource":"peerpods","subresource":"status","namespace":"apps","name":"web-abc"}"#;
        let text = [
            // Server-side apply that created the Lease: patch, and create with it.
            event("patch", 201, "allow", "JTI=workload", lease),
            event("patch", 200, "allow", "JTI=workload", status),
            // Refused, or made with the test's own token of the same ServiceAccount: not the workload's.
            event("delete", 403, "forbid", "JTI=workload", lease),
            event("get", 200, "allow", "JTI=test", lease),
        ]
        .join("\n")
            + "\n";
        let events = testenv::audit::parse(&text).expect("events");
        let found = uses(&events, &BTreeSet::from(["JTI=workload".to_owned()]));
        let lease = "coordination.k8s.io";
        assert_eq!(
            found,
            BTreeSet::from([
                request("create", lease, "leases", "peerpods", "ctrl-lock"),
                request("patch", lease, "leases", "peerpods", "ctrl-lock"),
                request(
                    "patch",
                    "confidentialcontainers.org",
                    "peerpods/status",
                    "apps",
                    "web-abc"
                ),
            ])
        );
    }
}
