//! Which instances this service may delete: with `CLUSTER_TAG=key=value` set, only instances that
//! carry that tag (so clusters sharing one cloud account never delete each other's VMs), unless
//! `DELETE_UNTAGGED=allow` turns the check off. Shared by every cloud with tags or labels.
//! Also cloud-api-adaptor's `TAGS` syntax (`key=value` pairs separated by commas).

use std::collections::BTreeMap;

use crate::{Error, ProviderConfig};

/// The tag an instance must carry to be deleted; `None` when deletes are not restricted.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OwnerTag(Option<(String, String)>);

impl OwnerTag {
    /// From `CLUSTER_TAG` and `DELETE_UNTAGGED` (`allow` or `deny`, default `deny`).
    pub fn from_config(config: &ProviderConfig) -> Result<Self, Error> {
        Self::parse(config.get("CLUSTER_TAG"), config.get("DELETE_UNTAGGED"))
    }

    /// From the two values directly (blank counts as unset).
    pub fn parse(cluster_tag: Option<&str>, delete_untagged: Option<&str>) -> Result<Self, Error> {
        let allow = match delete_untagged.map(str::trim) {
            None | Some("") | Some("deny") => false,
            Some("allow") => true,
            Some(_) => return Err(config_error("DELETE_UNTAGGED", "must be allow or deny")),
        };
        let Some(text) = cluster_tag.map(str::trim).filter(|t| !t.is_empty()) else {
            return Ok(OwnerTag(None));
        };
        let tag = match text.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                (key.trim().to_owned(), value.trim().to_owned())
            }
            _ => return Err(config_error("CLUSTER_TAG", "must be key=value")),
        };
        Ok(OwnerTag((!allow).then_some(tag)))
    }

    /// The required tag, if deletes are restricted.
    pub fn required(&self) -> Option<(&str, &str)> {
        self.0.as_ref().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Refuses ([`Error::NotOwnedByCluster`]) to delete `instance_id` when it lacks the tag.
    pub fn check(&self, instance_id: &str, tags: &BTreeMap<String, String>) -> Result<(), Error> {
        match &self.0 {
            Some((key, value)) if tags.get(key) != Some(value) => Err(Error::NotOwnedByCluster {
                message: format!(
                    "instance {instance_id} does not carry tag {key}={value} (set DELETE_UNTAGGED=allow to delete untagged instances)"
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// Parses cloud-api-adaptor's `TAGS` value: `key=value` pairs separated by commas.
pub fn parse_tags(value: &str) -> Result<BTreeMap<String, String>, Error> {
    let mut tags = BTreeMap::new();
    for pair in value.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                tags.insert(key.trim().to_owned(), value.trim().to_owned());
            }
            _ => {
                return Err(config_error(
                    "TAGS",
                    &format!("expected key=value pairs separated by commas, got {pair:?}"),
                ));
            }
        }
    }
    Ok(tags)
}

fn config_error(key: &str, message: &str) -> Error {
    Error::Config {
        key: key.to_owned(),
        message: message.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn cluster_tag_guards_deletes_unless_untagged_deletes_are_allowed() {
        let owner = OwnerTag::parse(Some("peerpods.io/cluster=prod"), None).expect("valid");
        assert_eq!(owner.required(), Some(("peerpods.io/cluster", "prod")));
        assert!(
            owner
                .check("vm-1", &tags(&[("peerpods.io/cluster", "prod")]))
                .is_ok()
        );
        let refused = owner
            .check("vm-2", &tags(&[("peerpods.io/cluster", "test")]))
            .expect_err("other cluster");
        assert_eq!(refused.reason(), "NotOwnedByCluster");
        assert!(refused.to_string().contains("vm-2"));
        assert!(owner.check("vm-3", &tags(&[])).is_err());

        let open = OwnerTag::parse(Some("peerpods.io/cluster=prod"), Some("allow")).expect("valid");
        assert_eq!(open.required(), None);
        assert!(open.check("vm-3", &tags(&[])).is_ok());
        assert!(
            OwnerTag::parse(None, None)
                .expect("valid")
                .check("x", &tags(&[]))
                .is_ok()
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        for (tag, untagged, key) in [
            (Some("nokey"), None, "CLUSTER_TAG"),
            (Some("=v"), None, "CLUSTER_TAG"),
            (None, Some("yes"), "DELETE_UNTAGGED"),
        ] {
            match OwnerTag::parse(tag, untagged) {
                Err(Error::Config { key: k, .. }) => assert_eq!(k, key),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn tags_parse_like_cloud_api_adaptor() {
        assert_eq!(
            parse_tags(" a=1, b = 2 ,,c=").expect("valid"),
            tags(&[("a", "1"), ("b", "2"), ("c", "")])
        );
        assert!(matches!(parse_tags("a=1,b"), Err(Error::Config { key, .. }) if key == "TAGS"));
    }
}
