//! One AdmissionReview in, one out: reading the request, deciding with [`crate::mutation`], and answering in
//! the form the API server expects. Pure; the HTTP layer only moves bytes.
//!
//! Every answer is an AdmissionReview (`admission.k8s.io/v1`) whose response echoes the request's uid:
//! - a peer pod being created: allowed, with a JSON patch;
//! - anything else (another runtime class, not a Pod, not a create, a subresource): allowed, unchanged;
//! - a request that cannot be read, or a Pod whose quantities cannot: refused with code 400 and the reason,
//!   never a panic.

use k8s_openapi::api::core::v1::Pod;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, GroupVersionKind, TypeMeta};

use crate::Error;
use crate::mutation::{self, PodView, Target};

/// What became of one review (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// A peer pod got its patch.
    Mutated,
    /// Allowed as it is.
    Unchanged,
    /// Refused: the request or the Pod in it cannot be read.
    Invalid,
    /// Refused: the webhook failed to build its answer.
    Failed,
    /// Not decided: the webhook was deciding as many as it may at once (HTTP 429, retried by the caller).
    Shed,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Mutated => "mutated",
            Outcome::Unchanged => "unchanged",
            Outcome::Invalid => "invalid",
            Outcome::Failed => "failed",
            Outcome::Shed => "shed",
        }
    }
}

/// The AdmissionReview versions the API server may send (the webhook configuration asks for v1).
const REVIEW_VERSIONS: [&str; 2] = ["admission.k8s.io/v1", "admission.k8s.io/v1beta1"];

/// The answer to the AdmissionReview in `body`.
pub fn review(body: &[u8], target: &Target) -> (Outcome, AdmissionReview<DynamicObject>) {
    if let Some(head) = pod_creation(body) {
        return review_pod_creation(body, &head, target);
    }
    let request: AdmissionRequest<DynamicObject> =
        match serde_json::from_slice::<AdmissionReview<DynamicObject>>(body)
            .map_err(|e| Error::malformed_from("", e))
            .and_then(|review| {
                // The answer echoes the request's apiVersion and kind: one the API server does not send is
                // refused rather than echoed.
                let types = &review.types;
                if !is_review_type(types) {
                    return Err(Error::malformed(format!(
                        "{} {} is not an AdmissionReview of {}",
                        types.api_version,
                        types.kind,
                        REVIEW_VERSIONS.join(" or ")
                    )));
                }
                review.try_into().map_err(|e| Error::malformed_from("", e))
            }) {
            Ok(request) => request,
            Err(error) => return unreadable(&error, 400),
        };
    let allowed = AdmissionResponse::from(&request);
    let pod = match pod_created(&request) {
        Ok(Some(pod)) => pod,
        Ok(None) => return (Outcome::Unchanged, allowed.into_review()),
        Err(error) => return refuse(&request_head(&request), allowed, &error),
    };
    let patch = match mutation::patch(&pod, target) {
        Ok(Some(patch)) => patch,
        Ok(None) => return (Outcome::Unchanged, allowed.into_review()),
        Err(error) => return refuse(&request_head(&request), allowed, &error),
    };
    answer_with_patch(&request_head(&request), allowed, patch)
}

fn is_review_type(types: &TypeMeta) -> bool {
    types.kind == "AdmissionReview" && REVIEW_VERSIONS.contains(&types.api_version.as_str())
}

/// An AdmissionReview read without its objects: what is needed to tell a Pod's creation, to answer and to log.
/// Reading it skips the objects without keeping any of them.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReviewHead {
    api_version: String,
    kind: String,
    request: RequestHead,
}

#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct RequestHead {
    uid: String,
    kind: GroupVersionKind,
    operation: Operation,
    sub_resource: Option<String>,
    #[serde(default)]
    name: String,
    namespace: Option<String>,
}

/// Only the object of a review's request, parsed into the view the mutation reads.
#[derive(serde::Deserialize)]
struct ReviewObject {
    request: RequestObject,
}

#[derive(serde::Deserialize)]
struct RequestObject {
    object: Option<PodView>,
}

/// The head of `body` when it is the creation of a Pod (not a subresource), the one request that carries a Pod
/// to mutate; `None` for anything else, which the general path answers (and refuses as it always did when it
/// cannot be read).
fn pod_creation(body: &[u8]) -> Option<ReviewHead> {
    let head: ReviewHead = serde_json::from_slice(body).ok()?;
    let types = TypeMeta {
        api_version: head.api_version.clone(),
        kind: head.kind.clone(),
    };
    let request = &head.request;
    let is_pod = request.kind.group.is_empty() && request.kind.kind == "Pod";
    (is_review_type(&types)
        && is_pod
        && request.operation == Operation::Create
        && request.sub_resource.is_none())
    .then_some(head)
}

/// A Pod's creation, read straight into the view the mutation needs ([`PodView`]): the request's memory follows
/// the containers' resources, not the size of everything else in the Pod.
fn review_pod_creation(
    body: &[u8],
    head: &ReviewHead,
    target: &Target,
) -> (Outcome, AdmissionReview<DynamicObject>) {
    let mut request = Head {
        uid: &head.request.uid,
        name: head.request.name.clone(),
        namespace: head.request.namespace.as_deref().unwrap_or_default(),
    };
    let mut allowed = AdmissionResponse::invalid("");
    allowed.types = TypeMeta {
        api_version: head.api_version.clone(),
        kind: head.kind.clone(),
    };
    allowed.uid = head.request.uid.clone();
    allowed.allowed = true;
    allowed.result = Default::default();
    let pod = match serde_json::from_slice::<ReviewObject>(body) {
        Ok(ReviewObject {
            request: RequestObject { object: Some(pod) },
        }) => pod,
        Ok(_) => {
            let error = Error::malformed("a create request without an object");
            return refuse(&request, allowed, &error);
        }
        Err(e) => {
            let error = Error::malformed_from("the object is not a Pod", e);
            return refuse(&request, allowed, &error);
        }
    };
    if request.name.is_empty()
        && let Some(prefix) = &pod.metadata.generate_name
    {
        request.name = format!("{prefix}*");
    }
    match mutation::patch_view(&pod, target) {
        Ok(Some(patch)) => {
            drop(pod);
            answer_with_patch(&request, allowed, patch)
        }
        Ok(None) => (Outcome::Unchanged, allowed.into_review()),
        Err(error) => refuse(&request, allowed, &error),
    }
}

/// What a refusal or a mutation logs about the request.
struct Head<'a> {
    uid: &'a str,
    /// The pod's name, or its generateName prefix.
    name: String,
    namespace: &'a str,
}

fn request_head(request: &AdmissionRequest<DynamicObject>) -> Head<'_> {
    Head {
        uid: &request.uid,
        name: pod_name(request),
        namespace: request.namespace.as_deref().unwrap_or_default(),
    }
}

fn answer_with_patch(
    request: &Head<'_>,
    allowed: AdmissionResponse,
    patch: json_patch::Patch,
) -> (Outcome, AdmissionReview<DynamicObject>) {
    let operations = patch.0.len();
    match allowed.clone().with_patch(patch) {
        Ok(response) => {
            tracing::info!(
                namespace = request.namespace,
                pod = %request.name,
                uid = %request.uid,
                operations,
                "peer pod: resources moved to VM-size annotations"
            );
            (Outcome::Mutated, response.into_review())
        }
        Err(e) => refuse(request, allowed, &Error::Patch(e.into())),
    }
}

/// The answer to a request that cannot be read (its body, or the AdmissionReview in it): refused with `code`
/// and the reason. It has no uid to echo; the API server reports the call as failed, with this message in the
/// webhook's log and metrics rather than a dropped connection.
pub fn unreadable(error: &Error, code: u16) -> (Outcome, AdmissionReview<DynamicObject>) {
    tracing::warn!(%error, code, "refused an unreadable admission request");
    let mut response = AdmissionResponse::invalid(error.to_string());
    response.result.code = code;
    (Outcome::Invalid, response.into_review())
}

/// The Pod being created, or `None` for anything the webhook leaves alone. Only creation is mutated: the
/// resources of an existing pod's containers cannot be replaced, and subresources (`resize`, `binding`,
/// `ephemeralcontainers`) are not the pod's creation.
fn pod_created(request: &AdmissionRequest<DynamicObject>) -> Result<Option<Pod>, Error> {
    let is_pod = request.kind.group.is_empty() && request.kind.kind == "Pod";
    if !is_pod || request.operation != Operation::Create || request.sub_resource.is_some() {
        return Ok(None);
    }
    let Some(object) = &request.object else {
        return Err(Error::malformed("a create request without an object"));
    };
    serde_json::to_value(object)
        .and_then(serde_json::from_value)
        .map(Some)
        .map_err(|e| Error::malformed_from("the object is not a Pod", e))
}

fn refuse(
    request: &Head<'_>,
    allowed: AdmissionResponse,
    error: &Error,
) -> (Outcome, AdmissionReview<DynamicObject>) {
    let (outcome, code) = if error.is_bad_request() {
        (Outcome::Invalid, 400)
    } else {
        (Outcome::Failed, 500)
    };
    tracing::warn!(
        namespace = request.namespace,
        pod = %request.name,
        uid = %request.uid,
        reason = error.reason(),
        %error,
        "refused a pod"
    );
    let mut response = allowed.deny(error);
    response.result.code = code;
    (outcome, response.into_review())
}

/// The pod's name, or its generateName prefix (a created pod often has no name yet).
fn pod_name(request: &AdmissionRequest<DynamicObject>) -> String {
    if !request.name.is_empty() {
        return request.name.clone();
    }
    request
        .object
        .as_ref()
        .and_then(|o| o.metadata.generate_name.clone())
        .map(|prefix| format!("{prefix}*"))
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const UID: &str = "0c9a8d74-9cb7-44dd-b98e-09fd62def2f4";

    fn request(operation: &str, kind: Value, object: Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": UID,
                "kind": kind,
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "namespace": "apps",
                "operation": operation,
                "userInfo": {"username": "alice"},
                "object": object,
                "dryRun": false
            }
        }))
        .unwrap()
    }

    /// A valid review with its apiVersion and kind replaced.
    fn with_types(api_version: &str, kind: &str) -> Vec<u8> {
        let mut review: Value =
            serde_json::from_slice(&request("CREATE", pod_kind(), pod("kata-remote"))).unwrap();
        review["apiVersion"] = api_version.into();
        review["kind"] = kind.into();
        serde_json::to_vec(&review).unwrap()
    }

    fn pod_kind() -> Value {
        json!({"group": "", "version": "v1", "kind": "Pod"})
    }

    fn pod(runtime_class: &str) -> Value {
        json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"generateName": "web-", "namespace": "apps"},
            "spec": {
                "runtimeClassName": runtime_class,
                "containers": [{"name": "web", "image": "nginx", "resources": {
                    "requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}}]
            }
        })
    }

    /// The review as the API server reads it.
    fn answer(body: &[u8]) -> (Outcome, Value) {
        let (outcome, review) = review(body, &Target::default());
        (outcome, serde_json::to_value(review).unwrap())
    }

    #[test]
    fn a_peer_pod_is_allowed_with_a_json_patch() {
        let (outcome, review) = answer(&request("CREATE", pod_kind(), pod("kata-remote")));
        assert_eq!(outcome, Outcome::Mutated);
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        let response = &review["response"];
        assert_eq!(response["uid"], UID);
        assert_eq!(response["allowed"], true);
        assert_eq!(response["patchType"], "JSONPatch");
        // The patch travels as bytes (a JSON array of numbers, which the API server's decoder takes for a
        // byte slice as it takes base64); applied to the object it yields the peer pod.
        let bytes: Vec<u8> = serde_json::from_value(response["patch"].clone()).unwrap();
        let patch: json_patch::Patch = serde_json::from_slice(&bytes).unwrap();
        let mut object = pod("kata-remote");
        json_patch::patch(&mut object, &patch).unwrap();
        assert_eq!(
            object["metadata"]["annotations"],
            json!({mutation::VCPUS_ANNOTATION: "2", mutation::MEMORY_ANNOTATION: "2048"})
        );
        assert_eq!(
            object["spec"]["containers"][0]["resources"],
            json!({"requests": {"kata.peerpods.io/vm": "1"}, "limits": {"kata.peerpods.io/vm": "1"}})
        );
    }

    #[test]
    fn other_pods_and_objects_are_allowed_unchanged() {
        for (operation, kind, object) in [
            ("CREATE", pod_kind(), pod("runc")),
            ("UPDATE", pod_kind(), pod("kata-remote")),
            (
                "CREATE",
                json!({"group": "apps", "version": "v1", "kind": "Deployment"}),
                json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "d"}, "spec": {}}),
            ),
            (
                "CREATE",
                json!({"group": "", "version": "v1", "kind": "ConfigMap"}),
                json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}}),
            ),
        ] {
            let (outcome, review) = answer(&request(operation, kind.clone(), object));
            assert_eq!(outcome, Outcome::Unchanged, "{operation} {kind}");
            let response = &review["response"];
            assert_eq!(response["uid"], UID);
            assert_eq!(response["allowed"], true);
            assert!(response.get("patch").is_none(), "{response}");
            assert!(response.get("patchType").is_none(), "{response}");
        }
    }

    #[test]
    fn a_subresource_is_not_the_pods_creation() {
        let mut body: Value =
            serde_json::from_slice(&request("CREATE", pod_kind(), pod("kata-remote"))).unwrap();
        body["request"]["subResource"] = json!("ephemeralcontainers");
        let (outcome, _) = answer(&serde_json::to_vec(&body).unwrap());
        assert_eq!(outcome, Outcome::Unchanged);
    }

    #[test]
    fn a_malformed_request_gets_a_400_answer() {
        for body in [
            b"not json".to_vec(),
            b"{}".to_vec(),
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}),
            )
            .unwrap(),
            serde_json::to_vec(
                &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {"uid": UID}}),
            )
            .unwrap(),
            with_types("x", "AdmissionReview"),
            with_types("admission.k8s.io/v1", "Pod"),
            with_types("", ""),
        ] {
            let (outcome, review) = answer(&body);
            assert_eq!(
                outcome,
                Outcome::Invalid,
                "{}",
                String::from_utf8_lossy(&body)
            );
            assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
            let response = &review["response"];
            assert_eq!(response["allowed"], false);
            assert_eq!(response["status"]["code"], 400);
            assert!(
                response["status"]["message"]
                    .as_str()
                    .unwrap()
                    .starts_with("malformed admission request"),
                "{response}"
            );
        }
    }

    #[test]
    fn a_pod_that_cannot_be_read_is_refused_with_its_uid() {
        let mut bad_quantity = pod("kata-remote");
        bad_quantity["spec"]["containers"][0]["resources"]["limits"]["cpu"] = json!("two");
        let not_a_pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
            "spec": {"containers": "none"}});
        for (object, message) in [
            (
                bad_quantity,
                "spec.containers[0].resources.limits[cpu]: quantity \"two\": no digits",
            ),
            (
                not_a_pod,
                "malformed admission request: the object is not a Pod",
            ),
            (
                Value::Null,
                "malformed admission request: a create request without an object",
            ),
        ] {
            let (outcome, review) = answer(&request("CREATE", pod_kind(), object));
            assert_eq!(outcome, Outcome::Invalid);
            let response = &review["response"];
            assert_eq!(response["uid"], UID);
            assert_eq!(response["allowed"], false);
            assert_eq!(response["status"]["code"], 400);
            let got = response["status"]["message"].as_str().unwrap();
            assert!(got.starts_with(message), "{got}");
        }
    }
}
