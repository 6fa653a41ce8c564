//! What may be deleted: never anything marked do-not-delete, and, where a cluster tag is
//! required, only what carries it. The same rule guards the instance and each of its parts.

use std::collections::BTreeMap;
use std::fmt;

/// Tags (labels, user tags, libvirt metadata) of an instance or a part.
pub type Tags = BTreeMap<String, String>;

/// Tag (label) key of a VM that must not be deleted, whatever asks: any value except `false`.
/// The same key is the PeerPod annotation peerpod-ctrl honours.
pub const DO_NOT_DELETE: &str = "peerpods.io/do-not-delete";

/// [`DO_NOT_DELETE`] spelled so that every cloud can carry it: GCP label keys, Azure tag names and
/// IBM Cloud user tags (`peerpods-do-not-delete:true`) allow no `/`. Either key protects.
pub const DO_NOT_DELETE_PORTABLE: &str = "peerpods-do-not-delete";

/// Whether a do-not-delete value says "do not delete": any value (even empty) except `false` in
/// any letter case, the one way to say "no" without removing the mark.
pub fn marks_do_not_delete(value: &str) -> bool {
    !value.trim().eq_ignore_ascii_case("false")
}

/// The key and value of the do-not-delete mark when `tags` carry one ([`DO_NOT_DELETE`] or
/// [`DO_NOT_DELETE_PORTABLE`]). A key set to `false` does not cancel the other.
pub fn do_not_delete(tags: &Tags) -> Option<(&'static str, &str)> {
    [DO_NOT_DELETE, DO_NOT_DELETE_PORTABLE]
        .into_iter()
        .find_map(|key| {
            tags.get(key)
                .map(String::as_str)
                .filter(|v| marks_do_not_delete(v))
                .map(|value| (key, value))
        })
}

/// Why something is not deleted.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Refusal {
    /// It carries the do-not-delete mark `tag` with `value`.
    DoNotDelete { tag: &'static str, value: String },
    /// It lacks this cluster's tag `key=value`.
    NotOwnedByCluster { key: String, value: String },
    /// A part that is not the VM's: the cloud does not delete it with the VM and nothing says
    /// it was created for this VM.
    NotTheVms,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Refusal::DoNotDelete { tag, value } => {
                write!(f, "it is marked {tag}={value:?}")
            }
            Refusal::NotOwnedByCluster { key, value } => write!(
                f,
                "it does not carry tag {key}={value} (set DELETE_UNTAGGED=allow to delete untagged instances)"
            ),
            Refusal::NotTheVms => f.write_str("it is not the VM's own"),
        }
    }
}

/// The tag a deletable thing must carry; `None` when deletes are not restricted to a cluster's.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Guard {
    cluster_tag: Option<(String, String)>,
}

impl Guard {
    /// Deletes restricted to what carries `cluster_tag` (`None`: not restricted, except by the
    /// do-not-delete mark).
    pub fn new(cluster_tag: Option<(String, String)>) -> Self {
        Guard { cluster_tag }
    }

    /// The required tag, if deletes are restricted.
    pub fn cluster_tag(&self) -> Option<(&str, &str)> {
        self.cluster_tag
            .as_ref()
            .map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Refuses what is marked do-not-delete (first: it wins over every other rule) or lacks
    /// this cluster's tag.
    pub fn check(&self, tags: &Tags) -> Result<(), Refusal> {
        if let Some((tag, value)) = do_not_delete(tags) {
            return Err(Refusal::DoNotDelete {
                tag,
                value: value.to_owned(),
            });
        }
        match &self.cluster_tag {
            Some((key, value)) if tags.get(key) != Some(value) => Err(Refusal::NotOwnedByCluster {
                key: key.clone(),
                value: value.clone(),
            }),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tags(pairs: &[(&str, &str)]) -> Tags {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn the_cluster_tag_must_be_carried_with_its_value() {
        let guard = Guard::new(Some(("cluster".into(), "prod".into())));
        assert_eq!(guard.cluster_tag(), Some(("cluster", "prod")));
        assert_eq!(guard.check(&tags(&[("cluster", "prod")])), Ok(()));
        let refused = Err(Refusal::NotOwnedByCluster {
            key: "cluster".into(),
            value: "prod".into(),
        });
        assert_eq!(guard.check(&tags(&[("cluster", "test")])), refused);
        assert_eq!(guard.check(&tags(&[])), refused);
        assert_eq!(Guard::default().check(&tags(&[])), Ok(()));
        assert_eq!(Guard::default().cluster_tag(), None);
    }

    #[test]
    fn do_not_delete_wins_and_only_false_says_no() {
        for guard in [Guard::default(), Guard::new(Some(("c".into(), "p".into())))] {
            for key in [DO_NOT_DELETE, DO_NOT_DELETE_PORTABLE] {
                for value in ["true", "", "yes", " FALSE-ish"] {
                    assert_eq!(
                        guard.check(&tags(&[("c", "p"), (key, value)])),
                        Err(Refusal::DoNotDelete {
                            tag: key,
                            value: value.into()
                        }),
                        "{key}={value:?}"
                    );
                }
                for value in ["false", " False "] {
                    assert_eq!(guard.check(&tags(&[("c", "p"), (key, value)])), Ok(()));
                }
            }
            // `false` on one key does not cancel the other.
            let both = tags(&[
                ("c", "p"),
                (DO_NOT_DELETE, "false"),
                (DO_NOT_DELETE_PORTABLE, "1"),
            ]);
            assert!(matches!(
                guard.check(&both),
                Err(Refusal::DoNotDelete {
                    tag: DO_NOT_DELETE_PORTABLE,
                    ..
                })
            ));
        }
        assert_eq!(DO_NOT_DELETE, "peerpods.io/do-not-delete");
        assert_eq!(DO_NOT_DELETE_PORTABLE, "peerpods-do-not-delete");
    }

    #[test]
    fn refusals_say_why() {
        let text = Refusal::NotOwnedByCluster {
            key: "k".into(),
            value: "v".into(),
        }
        .to_string();
        assert!(
            text.contains("k=v") && text.contains("DELETE_UNTAGGED=allow"),
            "{text}"
        );
        let text = Refusal::DoNotDelete {
            tag: DO_NOT_DELETE,
            value: "true".into(),
        }
        .to_string();
        assert!(
            text.contains("peerpods.io/do-not-delete=\"true\""),
            "{text}"
        );
        assert!(Refusal::NotTheVms.to_string().contains("not the VM's"));
    }
}
