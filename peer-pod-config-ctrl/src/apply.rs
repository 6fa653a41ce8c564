//! Server-side apply of owned objects, sent only when something differs.
//!
//! Two checks decide whether an object needs a write:
//! - the hash of the desired object, kept in an annotation, catches changes on our side (including fields we
//!   stopped setting, which a plain "is desired contained in current" check would miss);
//! - "every field we set has that value in the live object" catches changes made by others (`kubectl edit`).
//!
//! When both hold, nothing is sent: a steady cluster costs zero writes. Otherwise one apply with `force` takes the
//! fields back under our field manager.

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::Error;
use crate::name::FIELD_MANAGER;

/// Annotation with the hash of the last applied desired object.
pub const APPLIED_HASH: &str = "confidentialcontainers.org/applied-hash";

/// Put the hash of `desired` (without the annotation itself) into its annotations.
pub fn stamp<K: Resource + Serialize>(mut desired: K) -> Result<K, Error> {
    desired.annotations_mut().remove(APPLIED_HASH);
    let json = serde_json::to_vec(&desired).map_err(|e| Error::Serialize(e.into()))?;
    desired.annotations_mut().insert(
        APPLIED_HASH.into(),
        format!("{:016x}", crate::spread::fnv1a(&json)),
    );
    Ok(desired)
}

/// Whether every field of `desired` has the same value in `current`. Maps may have extra keys in `current`
/// (defaults, status, fields of other managers); lists must match element by element.
pub fn contains(current: &Value, desired: &Value) -> bool {
    match (current, desired) {
        (Value::Object(cur), Value::Object(want)) => want
            .iter()
            .all(|(key, value)| cur.get(key).is_some_and(|c| contains(c, value))),
        (Value::Array(cur), Value::Array(want)) => {
            cur.len() == want.len() && cur.iter().zip(want).all(|(c, w)| contains(c, w))
        }
        (cur, want) => cur == want,
    }
}

/// Whether `current` already is what `desired` (stamped) asks for.
pub fn up_to_date<K: Serialize>(current: &K, desired: &K) -> Result<bool, Error> {
    let cur = serde_json::to_value(current).map_err(|e| Error::Serialize(e.into()))?;
    let want = serde_json::to_value(desired).map_err(|e| Error::Serialize(e.into()))?;
    Ok(contains(&cur, &want))
}

/// Apply `desired` unless `current` (the object as the controller's cache, or its own last write, has it; `None`
/// when it does not exist) already matches. Returns whether a write was sent, and the live object. No read: the
/// caches the watches fill are what is compared (`crate::caches`).
pub async fn ensure<K>(api: &Api<K>, desired: K, current: Option<K>) -> Result<(bool, K), Error>
where
    K: Resource + Clone + DeserializeOwned + Serialize + std::fmt::Debug,
    K::DynamicType: Default,
{
    let kind = kind_of::<K>();
    let name = desired
        .meta()
        .name
        .clone()
        .ok_or(Error::MissingMetadata("name"))?;
    let desired = stamp(desired)?;
    if let Some(current) = current
        && up_to_date(&current, &desired)?
    {
        return Ok((false, current));
    }
    let live = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&desired),
        )
        .await
        .map_err(|source| Error::Apply { kind, name, source })?;
    Ok((true, live))
}

/// Every kind this controller applies (metric label values).
pub const KINDS: [&str; 7] = [
    "DaemonSet",
    "DeviceClass",
    "ResourceSlice",
    "Deployment",
    "Service",
    "Secret",
    "MutatingWebhookConfiguration",
];

/// Kind name for errors and metric labels.
pub fn kind_of<K: Resource>() -> &'static str
where
    K::DynamicType: Default,
{
    // Resource::kind returns a Cow tied to the dynamic type; every kind we apply is static, so leak nothing and
    // match the few we know.
    match K::kind(&K::DynamicType::default()).as_ref() {
        "DaemonSet" => "DaemonSet",
        "DeviceClass" => "DeviceClass",
        "ResourceSlice" => "ResourceSlice",
        "Deployment" => "Deployment",
        "Service" => "Service",
        "Secret" => "Secret",
        "MutatingWebhookConfiguration" => "MutatingWebhookConfiguration",
        _ => "Object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn extra_fields_in_the_live_object_are_fine() {
        let current = json!({"a": 1, "b": {"c": [ {"x": 1, "default": true} ], "d": 2}});
        assert!(contains(&current, &json!({"b": {"c": [ {"x": 1} ]}})));
    }

    #[test]
    fn changed_or_missing_fields_are_not() {
        let current = json!({"a": 1, "list": [1, 2]});
        assert!(!contains(&current, &json!({"a": 2})));
        assert!(!contains(&current, &json!({"z": 1})));
        assert!(!contains(&current, &json!({"list": [1]})));
        assert!(!contains(&current, &json!({"list": [1, 3]})));
    }

    #[test]
    fn stamp_changes_with_the_desired_object_only() {
        let cfg = crate::objects::tests::config(json!({"limit": 2}));
        let a = stamp(crate::objects::webhook_service(&cfg, "ns").unwrap()).unwrap();
        let again = stamp(a.clone()).unwrap();
        assert_eq!(
            a.annotations().get(APPLIED_HASH),
            again.annotations().get(APPLIED_HASH)
        );
        let other = stamp(crate::objects::webhook_service(&cfg, "other").unwrap()).unwrap();
        assert_ne!(
            a.annotations().get(APPLIED_HASH),
            other.annotations().get(APPLIED_HASH)
        );
        assert!(up_to_date(&a, &a).unwrap());
        assert!(!up_to_date(&a, &other).unwrap());
    }
}
