//! Which instances this service may delete: with `CLUSTER_TAG=key=value` set, only instances that
//! carry that tag (so clusters sharing one cloud account never delete each other's VMs), unless
//! `DELETE_UNTAGGED=allow` turns the check off; and never one tagged [`DO_NOT_DELETE_TAG`] or
//! [`DO_NOT_DELETE_PORTABLE_TAG`].
//! The rule itself is the deletion engine's guard ([`OwnerTag::guard`]): the one place every
//! delete path asks, for the instance and for each of its parts. Also cloud-api-adaptor's `TAGS` syntax (`key=value` pairs separated by commas).

use std::collections::BTreeMap;

use crate::{Error, ProviderConfig, ProviderName};

/// Tag (label) key of a VM that must not be deleted, whatever asks: any value except `false`.
/// The same key is the PeerPod annotation peerpod-ctrl honours.
pub const DO_NOT_DELETE_TAG: &str = peerpods_proto::DO_NOT_DELETE;

/// The same mark spelled so that every cloud can carry it: GCP label keys, Azure tag names and
/// IBM Cloud user tags (`peerpods-do-not-delete:true`) do not allow the `/` of
/// [`DO_NOT_DELETE_TAG`]. Either key protects an instance, on every cloud.
pub const DO_NOT_DELETE_PORTABLE_TAG: &str = peerpods_proto::DO_NOT_DELETE_PORTABLE;

/// Refuses to serve `cloud`, a cloud with tags ([`ProviderName::has_tags`]), when the configuration leaves its deletes
/// unrestricted by accident: neither `CLUSTER_TAG` nor an explicit `DELETE_UNTAGGED=allow` is set,
/// so any VM the credentials reach could be deleted. Clouds without tags pass.
pub fn require_owner_choice(cloud: ProviderName, config: &ProviderConfig) -> Result<(), Error> {
    if !cloud.has_tags() {
        return Ok(());
    }
    // Also validates both values.
    OwnerTag::from_config(config)?;
    let tag_set = config.get("CLUSTER_TAG").is_some();
    let allowed = config.get("DELETE_UNTAGGED") == Some("allow");
    if tag_set || allowed {
        return Ok(());
    }
    Err(config_error(
        "CLUSTER_TAG",
        &format!(
            "{cloud} would delete any VM its credentials reach: set CLUSTER_TAG=key=value (the tag \
             this cluster's VMs carry), or DELETE_UNTAGGED=allow to delete VMs without it"
        ),
    ))
}

/// The key and value of the do-not-delete mark when `tags` carry one ([`DO_NOT_DELETE_TAG`] or
/// [`DO_NOT_DELETE_PORTABLE_TAG`]): any value (even empty) except `false` in any letter case, the
/// one way to say "no" without removing the tag. A key set to `false` does not cancel the other.
pub fn do_not_delete(tags: &BTreeMap<String, String>) -> Option<(&'static str, &str)> {
    peerpods_protocol::guard::do_not_delete(tags)
}

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

    /// Deletes restricted to instances carrying `tag` (`None`: not restricted).
    pub fn requiring(tag: Option<(String, String)>) -> Self {
        OwnerTag(tag)
    }

    /// The deletion engine's guard for this tag.
    pub fn guard(&self) -> peerpods_protocol::Guard {
        peerpods_protocol::Guard::new(self.0.clone())
    }

    /// The required tag, if deletes are restricted.
    pub fn required(&self) -> Option<(&str, &str)> {
        self.0.as_ref().map(|(k, v)| (k.as_str(), v.as_str()))
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
    Error::config(key.to_owned(), message.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    impl OwnerTag {
        /// The engine's guard for this tag, answered as provider-service answers a refused delete.
        fn check(&self, instance_id: &str, tags: &BTreeMap<String, String>) -> Result<(), Error> {
            use peerpods_protocol::Refusal;
            self.guard().check(tags).map_err(|refusal| match refusal {
                Refusal::DoNotDelete { tag, value } => Error::DoNotDelete {
                    instance_id: instance_id.to_owned(),
                    tag,
                    value,
                },
                refusal => Error::NotOwnedByCluster {
                    message: format!("instance {instance_id}: {refusal}"),
                },
            })
        }
    }

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
    fn do_not_delete_wins_over_every_other_rule() {
        let guarded = OwnerTag::parse(Some("peerpods.io/cluster=prod"), None).expect("valid");
        let open = OwnerTag::parse(None, None).expect("valid");
        let allowed =
            OwnerTag::parse(Some("peerpods.io/cluster=prod"), Some("allow")).expect("valid");
        for owner in [&guarded, &open, &allowed] {
            for value in ["true", "", "yes", "FALSE-ish"] {
                let marked = tags(&[("peerpods.io/cluster", "prod"), (DO_NOT_DELETE_TAG, value)]);
                let refused = owner.check("vm-9", &marked).expect_err(value);
                assert_eq!(refused.reason(), "DoNotDelete");
                assert!(refused.to_string().contains("vm-9"), "{refused}");
            }
            let unmarked = tags(&[
                ("peerpods.io/cluster", "prod"),
                (DO_NOT_DELETE_TAG, "False"),
            ]);
            assert!(owner.check("vm-8", &unmarked).is_ok());
        }
        assert_eq!(DO_NOT_DELETE_TAG, "peerpods.io/do-not-delete");
    }

    #[test]
    fn the_portable_key_protects_like_the_original_one() {
        let allowed =
            OwnerTag::parse(Some("peerpods.io/cluster=prod"), Some("allow")).expect("valid");
        let guarded = OwnerTag::parse(Some("peerpods.io/cluster=prod"), None).expect("valid");
        for owner in [&allowed, &guarded] {
            for value in ["true", "", "yes"] {
                let marked = tags(&[
                    ("peerpods.io/cluster", "prod"),
                    (DO_NOT_DELETE_PORTABLE_TAG, value),
                ]);
                match owner.check("vm-7", &marked) {
                    Err(Error::DoNotDelete { tag, value: v, .. }) => {
                        assert_eq!(tag, DO_NOT_DELETE_PORTABLE_TAG);
                        assert_eq!(v, value);
                    }
                    other => panic!("{value:?}: {other:?}"),
                }
            }
            // `false` on one key does not cancel the other.
            for (first, second) in [("false", "true"), ("true", "FALSE")] {
                let both = tags(&[
                    ("peerpods.io/cluster", "prod"),
                    (DO_NOT_DELETE_TAG, first),
                    (DO_NOT_DELETE_PORTABLE_TAG, second),
                ]);
                let refused = owner.check("vm-6", &both).expect_err("one key says so");
                assert_eq!(refused.reason(), "DoNotDelete");
            }
            let unmarked = tags(&[
                ("peerpods.io/cluster", "prod"),
                (DO_NOT_DELETE_TAG, "false"),
                (DO_NOT_DELETE_PORTABLE_TAG, "False"),
            ]);
            assert!(owner.check("vm-5", &unmarked).is_ok());
        }
        // Valid on every cloud: a GCP label key, an Azure tag name, an IBM user tag key.
        assert_eq!(DO_NOT_DELETE_PORTABLE_TAG, "peerpods-do-not-delete");
        assert!(
            DO_NOT_DELETE_PORTABLE_TAG
                .chars()
                .all(|c| c.is_ascii_lowercase() || c == '-')
        );
        assert_eq!(do_not_delete(&tags(&[("other", "true")])), None);
    }

    #[test]
    fn clouds_with_tags_need_a_cluster_tag_or_an_explicit_allow() {
        let config = |pairs: &[(&str, &str)]| ProviderConfig::from_pairs(pairs.iter().copied());
        for cloud in ProviderName::ALL.into_iter().filter(|c| c.has_tags()) {
            let refused = require_owner_choice(cloud, &config(&[])).expect_err("no choice");
            assert!(
                matches!(&refused, Error::Config { key, message, .. } if key == "CLUSTER_TAG" && message.contains("DELETE_UNTAGGED=allow")),
                "{refused}"
            );
            assert!(require_owner_choice(cloud, &config(&[("CLUSTER_TAG", "k=v")])).is_ok());
            assert!(require_owner_choice(cloud, &config(&[("DELETE_UNTAGGED", "allow")])).is_ok());
            assert!(require_owner_choice(cloud, &config(&[("DELETE_UNTAGGED", "deny")])).is_err());
            assert!(require_owner_choice(cloud, &config(&[("CLUSTER_TAG", "nokey")])).is_err());
        }
        for cloud in [ProviderName::Libvirt, ProviderName::Byom] {
            assert!(require_owner_choice(cloud, &config(&[])).is_ok());
        }
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
