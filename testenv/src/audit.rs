//! kube-apiserver's audit log, for a control plane started with [`Options::audit`](crate::Options::audit): who
//! did what to which object, as the API server saw and authorized it (Metadata level: no bodies).

use std::collections::BTreeMap;

use serde::Deserialize;

/// The user extra in which the API server names the credential a request came with (`JTI=<id>` for a
/// ServiceAccount token).
pub const CREDENTIAL_ID: &str = "authentication.kubernetes.io/credential-id";

/// The annotation holding the authorizer's decision, `allow` or `forbid`.
const DECISION: &str = "authorization.k8s.io/decision";

/// One audit event (`audit.k8s.io/v1` `Event`), the fields tests read.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AuditEvent {
    /// `ResponseStarted` (a watch begins streaming) or `ResponseComplete`.
    pub stage: String,
    /// The authorization verb: `get`, `list`, `watch`, `create`, `update`, `patch`, `delete`, ...
    pub verb: String,
    #[serde(rename = "requestURI")]
    pub request_uri: String,
    pub user: AuditUser,
    /// Absent for non-resource requests (`/healthz`, `/version`, ...).
    #[serde(default)]
    pub object_ref: Option<ObjectRef>,
    #[serde(default)]
    pub response_status: Option<ResponseStatus>,
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct AuditUser {
    pub username: String,
    #[serde(default)]
    pub groups: Vec<String>,
    #[serde(default)]
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The object a request was about; empty strings where the request named none (e.g. the namespace of a
/// cluster-wide list, the name of a create).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct ObjectRef {
    /// `""` for the core group.
    pub api_group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
}

#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct ResponseStatus {
    /// The HTTP status code; absent while a watch is still streaming.
    pub code: Option<u16>,
}

impl AuditEvent {
    /// Whether the authorizer allowed the request.
    pub fn allowed(&self) -> bool {
        self.annotations.get(DECISION).map(String::as_str) == Some("allow")
    }

    /// The HTTP status code of the answer, when there is one.
    pub fn code(&self) -> Option<u16> {
        self.response_status.as_ref().and_then(|s| s.code)
    }

    /// The credential the request came with, as the API server names it (see [`CREDENTIAL_ID`]).
    pub fn credential_id(&self) -> Option<&str> {
        self.user
            .extra
            .get(CREDENTIAL_ID)
            .and_then(|ids| ids.first())
            .map(String::as_str)
    }
}

/// The events of an audit log's text (JSON lines). A last line without its newline is still being written and
/// is left for the next read.
pub fn parse(text: &str) -> Result<Vec<AuditEvent>, serde_json::Error> {
    let complete = match text.rfind('\n') {
        Some(end) => &text[..=end],
        None => "",
    };
    complete
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(serde_json::from_str)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GET: &str = r#"{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"a","stage":"ResponseComplete","requestURI":"/api/v1/namespaces/ns/configmaps/cm","verb":"get","user":{"username":"system:serviceaccount:ns:app","groups":["system:serviceaccounts","system:authenticated"],"extra":{"authentication.kubernetes.io/credential-id":["JTI=1234"]}},"sourceIPs":["127.0.0.1"],"objectRef":{"resource":"configmaps","namespace":"ns","name":"cm","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"annotations":{"authorization.k8s.io/decision":"allow","authorization.k8s.io/reason":"RBAC: allowed"}}"#;
    const FORBIDDEN: &str = r#"{"kind":"Event","stage":"ResponseComplete","requestURI":"/apis/apps/v1/deployments","verb":"list","user":{"username":"system:serviceaccount:ns:app"},"objectRef":{"resource":"deployments","apiGroup":"apps","apiVersion":"v1"},"responseStatus":{"code":403},"annotations":{"authorization.k8s.io/decision":"forbid"}}"#;
    const HEALTHZ: &str = r#"{"kind":"Event","stage":"ResponseComplete","requestURI":"/healthz","verb":"get","user":{"username":"system:anonymous"},"responseStatus":{"code":200}}"#;

    #[test]
    fn reads_who_did_what_to_which_object() {
        let text = format!("{GET}\n{FORBIDDEN}\n{HEALTHZ}\n");
        let events = parse(&text).expect("parses");
        assert_eq!(events.len(), 3);
        let get = &events[0];
        assert_eq!(get.user.username, "system:serviceaccount:ns:app");
        assert_eq!(get.verb, "get");
        assert_eq!(
            get.object_ref,
            Some(ObjectRef {
                api_group: String::new(),
                resource: "configmaps".into(),
                subresource: String::new(),
                namespace: "ns".into(),
                name: "cm".into(),
            })
        );
        assert!(get.allowed());
        assert_eq!(get.code(), Some(200));
        assert_eq!(get.credential_id(), Some("JTI=1234"));

        let forbidden = &events[1];
        assert!(!forbidden.allowed());
        assert_eq!(forbidden.code(), Some(403));
        assert_eq!(
            forbidden.object_ref.as_ref().map(|o| o.api_group.as_str()),
            Some("apps")
        );
        assert_eq!(forbidden.credential_id(), None);

        assert_eq!(events[2].object_ref, None);
        assert!(!events[2].allowed(), "no decision recorded");
    }

    #[test]
    fn a_line_still_being_written_is_left_for_later() {
        let text = format!("{GET}\n{}", &FORBIDDEN[..40]);
        assert_eq!(parse(&text).expect("parses").len(), 1);
        assert!(parse("").expect("empty").is_empty());
    }

    #[test]
    fn a_broken_line_is_an_error() {
        assert!(parse("{\"stage\":\n").is_err());
    }
}
