//! The one way the controllers write the status of their objects: server-side apply to the status
//! subresource, under a field manager per writer.
//!
//! An apply carries only the fields its writer has an opinion on. The API server merges it into the live
//! object and records in `managedFields` which manager owns which field; a condition list that the CRD
//! declares a map keyed by `type` is merged entry by entry, so a condition another manager wrote stays
//! whatever this controller's cached copy of the object says. A merge patch, by contrast, replaces the whole
//! list with the writer's (possibly stale) copy.

use std::borrow::Cow;
use std::fmt::Debug;

use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The body of a status apply: apply needs the object's `apiVersion` and `kind`.
#[derive(Debug, Serialize)]
struct StatusApply<'a, S> {
    #[serde(rename = "apiVersion")]
    api_version: Cow<'a, str>,
    kind: Cow<'a, str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<Precondition<'a>>,
    status: &'a S,
}

/// `metadata.resourceVersion` in an apply is a precondition: the API server refuses the write with 409
/// Conflict when the object has changed since that version.
#[derive(Debug, Serialize)]
struct Precondition<'a> {
    #[serde(rename = "resourceVersion")]
    resource_version: &'a str,
}

/// Applies `status` to the status of the object `name` as field manager `manager`, returning the object as
/// written. With `resource_version`, the write lands only on that version of the object (else 409 Conflict).
///
/// The apply is forced: a field of `status` another manager holds with a different value is taken over
/// instead of failing with a conflict. A controller cannot ask anyone to resolve such a conflict, and
/// refusing would leave its status stale for good (Kubernetes' guidance for controllers is to force); the
/// fields in question are the controller's own status it is the writer of, never one another manager added
/// (a condition of another type is another field and is not touched).
pub async fn apply_status<K, S>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: &S,
    resource_version: Option<&str>,
) -> Result<K, kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
    K::DynamicType: Default,
    S: Serialize + Debug,
{
    let dynamic_type = K::DynamicType::default();
    let body = StatusApply {
        api_version: K::api_version(&dynamic_type),
        kind: K::kind(&dynamic_type),
        metadata: resource_version.map(|resource_version| Precondition { resource_version }),
        status,
    };
    api.patch_status(
        name,
        &PatchParams::apply(manager).force(),
        &Patch::Apply(&body),
    )
    .await
}
