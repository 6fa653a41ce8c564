//! kubeconform schemas from the API server's OpenAPI v2 document (`GET /openapi/v2`).
//!
//! kubeconform normally downloads per-kind JSON schemas generated from Kubernetes' OpenAPI document; offline
//! we make the same thing from the running API server, which also publishes the schemas of installed CRDs.
//! Each kind gets one self-contained file: a reference to its definition plus every definition reachable
//! from it. OpenAPI's Kubernetes-specific formats become plain JSON schema (an `int-or-string` accepts both,
//! a quantity accepts numbers), and in strict mode objects with declared properties refuse undeclared ones,
//! the way kubeconform's published `-strict` schemas do.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::{Map, Value, json};

use crate::Error;

/// kubeconform `-schema-location` template (relative to the schema directory) matching [`relative_path`].
/// kubeconform's `.Group` is the part of apiVersion before the slash: `v1` for the core group.
pub const LOCATION_TEMPLATE: &str =
    "{{ .Group }}/{{ .ResourceAPIVersion }}/{{ .ResourceKind }}.json";

/// Quantities (`cpu: 1`, `memory: 64Mi`) are strings or numbers in manifests.
const QUANTITY: &str = "io.k8s.apimachinery.pkg.api.resource.Quantity";

/// The schema of one kind.
#[derive(Debug, Clone, PartialEq)]
pub struct KindSchema {
    pub group: String,
    pub version: String,
    pub kind: String,
    pub schema: Value,
}

impl KindSchema {
    /// Where kubeconform looks for this kind's schema under [`LOCATION_TEMPLATE`].
    pub fn relative_path(&self) -> PathBuf {
        relative_path(&self.group, &self.version, &self.kind)
    }
}

/// `<group or, for the core group, version>/<version>/<lowercase kind>.json`.
pub fn relative_path(group: &str, version: &str, kind: &str) -> PathBuf {
    let first = if group.is_empty() { version } else { group };
    PathBuf::from(first)
        .join(version)
        .join(format!("{}.json", kind.to_lowercase()))
}

/// One schema per group/version/kind the document declares (`x-kubernetes-group-version-kind`).
pub fn from_openapi_v2(document: &Value, strict: bool) -> Result<Vec<KindSchema>, Error> {
    let definitions = document
        .get("definitions")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::NotOpenApi("no definitions object".into()))?;
    let mut out = Vec::new();
    for (name, definition) in definitions {
        let Some(gvks) = definition
            .get("x-kubernetes-group-version-kind")
            .and_then(Value::as_array)
        else {
            continue;
        };
        let reachable = closure(definitions, name)?;
        let mut included = Map::new();
        for dep in &reachable {
            let mut def = definitions
                .get(dep)
                .cloned()
                .ok_or_else(|| Error::MissingDefinition(dep.clone()))?;
            if dep == QUANTITY {
                def = json!({"type": ["string", "number"]});
            }
            patch(&mut def, strict);
            included.insert(dep.clone(), def);
        }
        let schema = json!({
            "allOf": [{"$ref": format!("#/definitions/{name}")}],
            "definitions": included,
        });
        for gvk in gvks {
            let field = |key: &str| gvk.get(key).and_then(Value::as_str).unwrap_or_default();
            out.push(KindSchema {
                group: field("group").to_string(),
                version: field("version").to_string(),
                kind: field("kind").to_string(),
                schema: schema.clone(),
            });
        }
    }
    Ok(out)
}

/// Names of the definitions reachable from `start` (itself included) through `$ref`s.
fn closure(definitions: &Map<String, Value>, start: &str) -> Result<BTreeSet<String>, Error> {
    let mut seen = BTreeSet::new();
    let mut todo = vec![start.to_string()];
    while let Some(name) = todo.pop() {
        if !seen.insert(name.clone()) {
            continue;
        }
        let definition = definitions
            .get(&name)
            .ok_or_else(|| Error::MissingDefinition(name.clone()))?;
        let mut refs = Vec::new();
        collect_refs(definition, &mut refs);
        todo.extend(refs.into_iter().filter(|r| !seen.contains(r)));
    }
    Ok(seen)
}

fn collect_refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            if let Some(name) = map
                .get("$ref")
                .and_then(Value::as_str)
                .and_then(|r| r.strip_prefix("#/definitions/"))
            {
                out.push(name.to_string());
            }
            map.values().for_each(|v| collect_refs(v, out));
        }
        Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
        _ => {}
    }
}

/// Rewrites OpenAPI's Kubernetes extensions into JSON schema, recursively.
fn patch(value: &mut Value, strict: bool) {
    let Value::Object(map) = value else {
        if let Value::Array(items) = value {
            items.iter_mut().for_each(|v| patch(v, strict));
        }
        return;
    };
    if map.get("format").and_then(Value::as_str) == Some("int-or-string") {
        map.insert("type".into(), json!(["string", "integer"]));
    }
    let preserves_unknown = map
        .get("x-kubernetes-preserve-unknown-fields")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if strict
        && !preserves_unknown
        && map.contains_key("properties")
        && !map.contains_key("additionalProperties")
    {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    // Only schema-valued keywords: `properties` maps names to schemas, the others are schemas (or lists).
    if let Some(Value::Object(properties)) = map.get_mut("properties") {
        properties.values_mut().for_each(|v| patch(v, strict));
    }
    for key in [
        "items",
        "additionalProperties",
        "allOf",
        "anyOf",
        "oneOf",
        "not",
    ] {
        if let Some(v) = map.get_mut(key) {
            patch(v, strict);
        }
    }
}

/// How many schemas each group/version has: a summary for test logs.
pub fn count_by_group_version(schemas: &[KindSchema]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for s in schemas {
        *counts
            .entry(format!("{}/{}", s.group, s.version))
            .or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn document() -> Value {
        json!({
            "swagger": "2.0",
            "definitions": {
                "io.k8s.api.apps.v1.Deployment": {
                    "type": "object",
                    "properties": {
                        "spec": {"$ref": "#/definitions/io.k8s.api.apps.v1.DeploymentSpec"},
                        "metadata": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                                     "properties": {"name": {"type": "string"}}}
                    },
                    "x-kubernetes-group-version-kind": [{"group": "apps", "version": "v1", "kind": "Deployment"}]
                },
                "io.k8s.api.apps.v1.DeploymentSpec": {
                    "type": "object",
                    "properties": {
                        "replicas": {"type": "integer"},
                        "maxUnavailable": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.util.intstr.IntOrString"},
                        "cpu": {"$ref": "#/definitions/io.k8s.apimachinery.pkg.api.resource.Quantity"}
                    }
                },
                "io.k8s.apimachinery.pkg.util.intstr.IntOrString": {"type": "string", "format": "int-or-string"},
                "io.k8s.apimachinery.pkg.api.resource.Quantity": {"type": "string"},
                "io.k8s.api.core.v1.Unrelated": {"type": "object"},
                "io.k8s.api.core.v1.Secret": {
                    "type": "object",
                    "x-kubernetes-group-version-kind": [{"group": "", "version": "v1", "kind": "Secret"}]
                }
            }
        })
    }

    fn find<'a>(schemas: &'a [KindSchema], kind: &str) -> &'a KindSchema {
        schemas
            .iter()
            .find(|s| s.kind == kind)
            .unwrap_or_else(|| panic!("no schema for {kind}"))
    }

    #[test]
    fn paths_follow_kubeconforms_group_rule() {
        assert_eq!(
            relative_path("apps", "v1", "Deployment"),
            PathBuf::from("apps/v1/deployment.json")
        );
        assert_eq!(
            relative_path("", "v1", "Secret"),
            PathBuf::from("v1/v1/secret.json")
        );
        assert_eq!(
            relative_path("confidentialcontainers.org", "v1alpha1", "PeerPod"),
            PathBuf::from("confidentialcontainers.org/v1alpha1/peerpod.json")
        );
    }

    #[test]
    fn each_kind_carries_exactly_the_definitions_it_reaches() {
        let schemas = from_openapi_v2(&document(), false).unwrap();
        assert_eq!(schemas.len(), 2);
        let deployment = find(&schemas, "Deployment");
        let included: Vec<&String> = deployment.schema["definitions"]
            .as_object()
            .unwrap()
            .keys()
            .collect();
        assert_eq!(
            included,
            [
                "io.k8s.api.apps.v1.Deployment",
                "io.k8s.api.apps.v1.DeploymentSpec",
                "io.k8s.apimachinery.pkg.api.resource.Quantity",
                "io.k8s.apimachinery.pkg.util.intstr.IntOrString",
            ]
        );
        assert_eq!(
            deployment.schema["allOf"][0]["$ref"],
            "#/definitions/io.k8s.api.apps.v1.Deployment"
        );
        assert_eq!(find(&schemas, "Secret").group, "");
    }

    #[test]
    fn kubernetes_formats_become_json_schema() {
        let schemas = from_openapi_v2(&document(), false).unwrap();
        let defs = &find(&schemas, "Deployment").schema["definitions"];
        assert_eq!(
            defs["io.k8s.apimachinery.pkg.util.intstr.IntOrString"]["type"],
            json!(["string", "integer"])
        );
        assert_eq!(
            defs["io.k8s.apimachinery.pkg.api.resource.Quantity"]["type"],
            json!(["string", "number"])
        );
        assert!(defs["io.k8s.api.apps.v1.Deployment"]["additionalProperties"].is_null());
    }

    #[test]
    fn strict_refuses_undeclared_fields_but_keeps_open_objects_open() {
        let schemas = from_openapi_v2(&document(), true).unwrap();
        let defs = &find(&schemas, "Deployment").schema["definitions"];
        assert_eq!(
            defs["io.k8s.api.apps.v1.DeploymentSpec"]["additionalProperties"],
            false
        );
        let metadata = &defs["io.k8s.api.apps.v1.Deployment"]["properties"]["metadata"];
        assert!(metadata["additionalProperties"].is_null());
    }

    #[test]
    fn dangling_references_and_other_documents_are_errors() {
        let mut doc = document();
        doc["definitions"]["io.k8s.api.apps.v1.DeploymentSpec"]["properties"]["x"] =
            json!({"$ref": "#/definitions/nowhere"});
        let err = from_openapi_v2(&doc, false).unwrap_err();
        assert_eq!(err.reason(), "MissingDefinition");
        assert_eq!(
            from_openapi_v2(&json!({"openapi": "3.0.0"}), false)
                .unwrap_err()
                .reason(),
            "NotOpenApi"
        );
    }

    #[test]
    fn counts_group_versions() {
        let schemas = from_openapi_v2(&document(), false).unwrap();
        let counts = count_by_group_version(&schemas);
        assert_eq!(counts.get("apps/v1"), Some(&1));
        assert_eq!(counts.get("/v1"), Some(&1));
    }
}
