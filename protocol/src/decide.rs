//! peerpod-ctrl's decision kernel: what one reconcile does for a PeerPod, from plain facts (no
//! Kubernetes types), so that the controller and the model checker run the same rules.
//!
//! Only `deletionTimestamp` set AND `peer.pod/finalizer` present means work; the do-not-delete
//! annotation turns that work into a hold; a live PeerPod naming the same instance (a restore or
//! a copy) means the VM is still in use: release without deleting it. cloud-api-adaptor's
//! developer mode (or not knowing whether it is on) turns a delete not yet asked for into a hold.

use crate::InstanceKey;
use crate::window::Moment;

/// What the kernel reads of a PeerPod. peerpod-ctrl builds it from the object; the model from
/// its state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PeerPodFacts {
    pub uid: Option<String>,
    /// `namespace/name`, for messages.
    pub name: String,
    /// `deletionTimestamp` is set.
    pub deleting: bool,
    /// `peer.pod/finalizer` is present.
    pub finalizer: bool,
    /// Annotated do-not-delete (any value but `false`).
    pub do_not_delete: bool,
    pub cloud_provider: String,
    pub instance_id: String,
}

impl PeerPodFacts {
    /// The instance this PeerPod names: a known provider and a non-empty id.
    pub fn instance(&self) -> Option<InstanceKey> {
        if self.instance_id.trim().is_empty() {
            return None;
        }
        InstanceKey::parse(&self.cloud_provider, &self.instance_id)
    }
}

/// What a PeerPod needs from the controller, from its own facts and the live namesake's.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Cleanup {
    /// Not being deleted.
    Live,
    /// Being deleted without the finalizer: cloud-api-adaptor deleted the VM and released it.
    AlreadyReleased,
    /// Being deleted with the finalizer: delete this VM, then release the finalizer.
    DeleteInstance {
        provider: String,
        instance_id: String,
    },
    /// Being deleted with the finalizer, but the live PeerPod `by` names the same VM: release
    /// the finalizer WITHOUT deleting the VM.
    StillReferenced {
        provider: String,
        instance_id: String,
        by: String,
    },
    /// Being deleted with the finalizer, but annotated do-not-delete: keep both.
    Held,
    /// Being deleted with the finalizer, but the spec does not say which VM: keep the finalizer.
    Invalid(String),
}

/// The cleanup a PeerPod needs from its own facts alone.
pub fn cleanup(peerpod: &PeerPodFacts) -> Cleanup {
    if !peerpod.deleting {
        return Cleanup::Live;
    }
    if !peerpod.finalizer {
        return Cleanup::AlreadyReleased;
    }
    if peerpod.do_not_delete {
        return Cleanup::Held;
    }
    let provider = peerpod.cloud_provider.trim();
    let instance_id = peerpod.instance_id.trim();
    match (provider.is_empty(), instance_id.is_empty()) {
        (true, true) => Cleanup::Invalid("spec.cloudProvider and spec.instanceID are empty".into()),
        (true, false) => Cleanup::Invalid("spec.cloudProvider is empty".into()),
        (false, true) => Cleanup::Invalid("spec.instanceID is empty".into()),
        (false, false) => Cleanup::DeleteInstance {
            provider: provider.to_owned(),
            instance_id: instance_id.to_owned(),
        },
    }
}

/// Whether `other` is another PeerPod, not being deleted, that names the same instance as
/// `peerpod` (by [`InstanceKey`]: the same provider and the cloud's canonical id).
pub fn is_live_namesake(peerpod: &PeerPodFacts, other: &PeerPodFacts) -> bool {
    !other.deleting
        && other.uid != peerpod.uid
        && other
            .instance()
            .is_some_and(|instance| peerpod.instance() == Some(instance))
}

/// [`cleanup`], refined by the live PeerPods that may name the same VM: a VM a live PeerPod
/// still names is never deleted.
pub fn cleanup_among<'a>(
    peerpod: &PeerPodFacts,
    live_namesakes: impl IntoIterator<Item = &'a PeerPodFacts>,
) -> Cleanup {
    match cleanup(peerpod) {
        Cleanup::DeleteInstance {
            provider,
            instance_id,
        } => match live_namesakes
            .into_iter()
            .find(|other| is_live_namesake(peerpod, other))
        {
            Some(other) => Cleanup::StillReferenced {
                provider,
                instance_id,
                by: other.name.clone(),
            },
            None => Cleanup::DeleteInstance {
                provider,
                instance_id,
            },
        },
        decision => decision,
    }
}

/// Why a cleanup waits for an operator.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Hold {
    /// The PeerPod is annotated do-not-delete.
    DoNotDelete,
    /// The spec does not say which VM: nothing could prove it gone.
    Invalid(String),
    /// cloud-api-adaptor runs in developer mode: it keeps a failed pod's VM for debugging and
    /// holds the finalizer on purpose, so the VM is kept until the mode is switched off.
    DeveloperMode,
    /// Whether cloud-api-adaptor runs in developer mode cannot be read: nothing is deleted that
    /// the mode might be keeping (fail closed) until it can.
    DeveloperModeUnknown,
    /// [`RELEASE`] carries a value that is neither `operator` nor `instance-gone`.
    UnknownRelease(String),
}

/// cloud-api-adaptor's developer mode, as the controller last read it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeveloperMode {
    /// Off (cloud-api-adaptor's default, also when its configuration does not set it).
    Off,
    /// On: failed pods' VMs are kept for debugging.
    On,
    /// Not known: the configuration cannot be read, or says something that is not a boolean.
    Unknown,
}

/// The key of cloud-api-adaptor's ConfigMap (`peer-pods-cm`) that turns its developer mode on.
pub const DEVELOPER_MODE_KEY: &str = "PODVM_DEVELOPER_MODE";

impl DeveloperMode {
    /// The mode a value of [`DEVELOPER_MODE_KEY`] sets, read as cloud-api-adaptor reads it (Go's
    /// `strconv.ParseBool`, blanks around it ignored). `None` (no such key, or no ConfigMap) and an
    /// empty value are off, CAA's default; any other value is unknown (CAA would not start with it).
    /// A ConfigMap that cannot be read at all is [`DeveloperMode::Unknown`] without asking this.
    pub fn from_setting(value: Option<&str>) -> Self {
        match value.map(str::trim) {
            None | Some("") => Self::Off,
            Some("1" | "t" | "T" | "TRUE" | "true" | "True") => Self::On,
            Some("0" | "f" | "F" | "FALSE" | "false" | "False") => Self::Off,
            Some(_) => Self::Unknown,
        }
    }
}

/// `plan` under cloud-api-adaptor's developer mode: a delete not asked for yet is held while
/// the mode is on ([`Hold::DeveloperMode`]) or unknown ([`Hold::DeveloperModeUnknown`]). A
/// delete provider-service already answered in progress for goes on (its VM is already going),
/// and every other plan (a release without a delete, the other holds) is the mode's business
/// neither way.
pub fn under_developer_mode<M>(plan: Plan<M>, mode: DeveloperMode) -> Plan<M> {
    match (plan, mode) {
        (
            Plan::Delete {
                in_progress: false, ..
            },
            DeveloperMode::On,
        ) => Plan::Hold(Hold::DeveloperMode),
        (
            Plan::Delete {
                in_progress: false, ..
            },
            DeveloperMode::Unknown,
        ) => Plan::Hold(Hold::DeveloperModeUnknown),
        (plan, _) => plan,
    }
}

/// Annotation on a PeerPod being deleted that asks for its finalizer to be released WITHOUT a
/// delete: the escape hatch when a cleanup cannot finish by itself (see [`ReleaseAsk`]).
pub const RELEASE: &str = "peerpods.io/release";

/// What the [`RELEASE`] annotation asks for, read from its value (blanks around it ignored).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ReleaseAsk {
    /// `operator`: release at once; the operator takes responsibility for the VM, which is left
    /// as it is.
    Operator,
    /// `instance-gone`: the operator says the VM is gone. Release only once provider-service
    /// confirms it, never deleting a VM the cloud still lists: provider.proto has no lookup of one
    /// instance, and its only trusted "gone" is DeleteInstance's answer (which waits out the
    /// cloud's consistency window), so a VM ListInstances does not show is asked for on the usual
    /// delete path, and one it shows keeps the finalizer.
    InstanceGone,
    /// Any other value: nothing is released (a typo must not release), and the condition says so.
    Unknown(String),
}

impl ReleaseAsk {
    /// The ask an annotation value spells.
    pub fn parse(value: &str) -> ReleaseAsk {
        match value.trim() {
            "operator" => ReleaseAsk::Operator,
            "instance-gone" => ReleaseAsk::InstanceGone,
            other => ReleaseAsk::Unknown(other.to_owned()),
        }
    }

    /// The annotation value that spells this ask (what [`ReleaseAsk::parse`] reads back), so that a
    /// tool setting the annotation never spells it by hand.
    pub fn value(&self) -> &str {
        match self {
            ReleaseAsk::Operator => "operator",
            ReleaseAsk::InstanceGone => "instance-gone",
            ReleaseAsk::Unknown(value) => value,
        }
    }
}

/// `plan` under the [`RELEASE`] annotation `ask`: only a cleanup is changed (a live PeerPod
/// ignores it, one already released needs nothing). `operator` releases without a delete at
/// once, whatever held or ran before; `instance-gone` turns a delete not yet asked for into
/// [`Plan::ConfirmGone`] and leaves the rest (a hold stays a hold); an unknown value holds
/// (nothing is deleted or released).
pub fn under_release_ask<M>(
    plan: Plan<M>,
    peerpod: &PeerPodFacts,
    ask: Option<&ReleaseAsk>,
) -> Plan<M> {
    match ask {
        Some(ask) if plan.is_cleanup() => match ask {
            ReleaseAsk::Operator => Plan::ReleaseByOperator {
                provider: peerpod.cloud_provider.trim().to_owned(),
                instance_id: peerpod.instance_id.trim().to_owned(),
            },
            ReleaseAsk::InstanceGone => match plan {
                Plan::Delete {
                    provider,
                    instance_id,
                    in_progress: false,
                } => Plan::ConfirmGone {
                    provider,
                    instance_id,
                },
                plan => plan,
            },
            ReleaseAsk::Unknown(value) => Plan::Hold(Hold::UnknownRelease(value.clone())),
        },
        _ => plan,
    }
}

/// The one thing a reconcile does for a PeerPod, decided once before it acts.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Plan<M> {
    /// Not being deleted: reap older PeerPods of the same Pod, if any.
    ReapStale,
    /// Released already (cloud-api-adaptor deleted the VM): nothing to do.
    Nothing,
    /// Ask provider-service to delete the VM; only its confirmed end releases the finalizer.
    Delete {
        provider: String,
        instance_id: String,
        /// provider-service answered in progress for this VM before: a later "already gone" is
        /// the end of that delete.
        in_progress: bool,
    },
    /// provider-service is deleting the VM and asked for time: ask again at `until`.
    Wait {
        provider: String,
        instance_id: String,
        until: M,
    },
    /// Release the finalizer WITHOUT deleting the VM: the live PeerPod `by` still names it.
    Release {
        provider: String,
        instance_id: String,
        by: String,
    },
    /// Release the finalizer WITHOUT deleting the VM: the operator asked for it ([`RELEASE`]
    /// `operator`) and answers for the VM.
    ReleaseByOperator {
        provider: String,
        instance_id: String,
    },
    /// The operator says the VM is gone ([`RELEASE`] `instance-gone`): if the cloud still lists
    /// it, keep it and the finalizer; if not, ask provider-service as [`Plan::Delete`] does, whose
    /// confirmed end releases the finalizer.
    ConfirmGone {
        provider: String,
        instance_id: String,
    },
    /// Keep the VM and the finalizer until an operator acts.
    Hold(Hold),
}

impl<M> Plan<M> {
    /// Whether the plan is about a PeerPod waiting for its cleanup.
    pub fn is_cleanup(&self) -> bool {
        !matches!(self, Plan::ReapStale | Plan::Nothing)
    }
}

/// A delete provider-service answered "in progress" for, as the controller remembers it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Progress<M> {
    pub provider: String,
    pub instance_id: String,
    /// Not before this is provider-service asked again.
    pub ask_again_at: M,
}

impl<M> Progress<M> {
    /// Whether this progress is about the instance `provider`/`instance_id` names.
    pub fn is_for(&self, provider: &str, instance_id: &str) -> bool {
        match (
            InstanceKey::parse(&self.provider, &self.instance_id),
            InstanceKey::parse(provider, instance_id),
        ) {
            (Some(remembered), Some(asked)) => remembered == asked,
            _ => self.provider == provider && self.instance_id == instance_id,
        }
    }
}

/// The plan for `peerpod`: `live_namesake` is a live PeerPod naming the same VM, if one is
/// known; `progress` what the controller remembers of a delete in progress.
pub fn plan<M: Moment>(
    peerpod: &PeerPodFacts,
    live_namesake: Option<&PeerPodFacts>,
    progress: Option<&Progress<M>>,
    now: M,
) -> Plan<M> {
    match cleanup_among(peerpod, live_namesake) {
        Cleanup::Live => Plan::ReapStale,
        Cleanup::AlreadyReleased => Plan::Nothing,
        Cleanup::Held => Plan::Hold(Hold::DoNotDelete),
        Cleanup::Invalid(why) => Plan::Hold(Hold::Invalid(why)),
        Cleanup::StillReferenced {
            provider,
            instance_id,
            by,
        } => Plan::Release {
            provider,
            instance_id,
            by,
        },
        Cleanup::DeleteInstance {
            provider,
            instance_id,
        } => match progress.filter(|p| p.is_for(&provider, &instance_id)) {
            Some(p) if now < p.ask_again_at => Plan::Wait {
                provider,
                instance_id,
                until: p.ask_again_at,
            },
            p => Plan::Delete {
                provider,
                instance_id,
                in_progress: p.is_some(),
            },
        },
    }
}

/// How a confirmed end is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Gone {
    Deleted,
    AlreadyGone,
}

/// "Already gone" after provider-service said it was deleting the VM is the end of that delete,
/// not a VM someone else removed.
pub fn confirmed(answer: Gone, in_progress: bool) -> Gone {
    match answer {
        Gone::AlreadyGone if in_progress => Gone::Deleted,
        answer => answer,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    fn facts(name: &str) -> PeerPodFacts {
        PeerPodFacts {
            uid: Some(format!("uid-{name}")),
            name: format!("ns/{name}"),
            deleting: false,
            finalizer: true,
            do_not_delete: false,
            cloud_provider: "libvirt".into(),
            instance_id: "1B4E28BA-2FA1-11D2-883F-0016D3CCA427".into(),
        }
    }

    fn deleting(name: &str) -> PeerPodFacts {
        PeerPodFacts {
            deleting: true,
            ..facts(name)
        }
    }

    fn delete(in_progress: bool) -> Plan<Instant> {
        Plan::Delete {
            provider: "libvirt".into(),
            instance_id: "1B4E28BA-2FA1-11D2-883F-0016D3CCA427".into(),
            in_progress,
        }
    }

    #[test]
    fn only_a_deleting_peerpod_with_the_finalizer_is_work() {
        assert_eq!(cleanup(&facts("a")), Cleanup::Live);
        let released = PeerPodFacts {
            finalizer: false,
            ..deleting("a")
        };
        assert_eq!(cleanup(&released), Cleanup::AlreadyReleased);
        let held = PeerPodFacts {
            do_not_delete: true,
            ..deleting("a")
        };
        assert_eq!(cleanup(&held), Cleanup::Held);
        let padded = PeerPodFacts {
            cloud_provider: " libvirt ".into(),
            instance_id: " id ".into(),
            ..deleting("a")
        };
        assert_eq!(
            cleanup(&padded),
            Cleanup::DeleteInstance {
                provider: "libvirt".into(),
                instance_id: "id".into()
            }
        );
    }

    #[test]
    fn an_incomplete_spec_is_invalid_and_names_what_is_missing() {
        for (provider, id, missing) in [
            ("", "", "spec.cloudProvider and spec.instanceID are empty"),
            (" ", "id", "spec.cloudProvider is empty"),
            ("aws", "  ", "spec.instanceID is empty"),
        ] {
            let p = PeerPodFacts {
                cloud_provider: provider.into(),
                instance_id: id.into(),
                ..deleting("a")
            };
            assert_eq!(cleanup(&p), Cleanup::Invalid(missing.into()));
            assert_eq!(
                plan::<Instant>(&p, None, None, Instant::now()),
                Plan::Hold(Hold::Invalid(missing.into()))
            );
        }
    }

    #[test]
    fn a_live_namesake_is_another_live_peerpod_naming_the_same_instance() {
        let gone = deleting("a");
        let copy = facts("b");
        assert!(is_live_namesake(&gone, &copy));
        // The same instance however its id is written.
        let lower = PeerPodFacts {
            instance_id: copy.instance_id.to_ascii_lowercase(),
            ..copy.clone()
        };
        assert!(is_live_namesake(&gone, &lower));
        // Not itself, not one being deleted, not another instance or provider, not an empty id.
        assert!(!is_live_namesake(
            &gone,
            &PeerPodFacts {
                name: "x".into(),
                ..facts("a")
            }
        ));
        assert!(!is_live_namesake(&gone, &deleting("b")));
        for other in [
            PeerPodFacts {
                instance_id: "other".into(),
                ..facts("b")
            },
            PeerPodFacts {
                cloud_provider: "azure".into(),
                ..facts("b")
            },
            PeerPodFacts {
                cloud_provider: "nimbus".into(),
                ..facts("b")
            },
        ] {
            assert!(!is_live_namesake(&gone, &other), "{other:?}");
        }
        let empty = PeerPodFacts {
            instance_id: " ".into(),
            ..deleting("a")
        };
        assert!(!is_live_namesake(
            &empty,
            &PeerPodFacts {
                instance_id: " ".into(),
                ..facts("b")
            }
        ));
        assert_eq!(empty.instance(), None);
        assert_eq!(
            facts("b").instance(),
            InstanceKey::parse("libvirt", "1b4e28ba-2fa1-11d2-883f-0016d3cca427")
        );
    }

    #[test]
    fn a_vm_a_live_peerpod_names_is_released_not_deleted() {
        let now = Instant::now();
        let gone = deleting("a");
        assert_eq!(
            plan(&gone, Some(&facts("b")), None, now),
            Plan::Release {
                provider: "libvirt".into(),
                instance_id: "1B4E28BA-2FA1-11D2-883F-0016D3CCA427".into(),
                by: "ns/b".into(),
            }
        );
        assert_eq!(plan(&gone, Some(&deleting("b")), None, now), delete(false));
        assert_eq!(
            cleanup_among(&gone, [&deleting("b"), &facts("c")]),
            Cleanup::StillReferenced {
                provider: "libvirt".into(),
                instance_id: "1B4E28BA-2FA1-11D2-883F-0016D3CCA427".into(),
                by: "ns/c".into(),
            }
        );
        // A live PeerPod is never cleaned up, whatever names its VM.
        assert_eq!(
            plan(&facts("a"), Some(&facts("b")), None, now),
            Plan::ReapStale
        );
    }

    #[test]
    fn the_plan_follows_the_cleanup() {
        let now = Instant::now();
        assert_eq!(
            plan::<Instant>(&facts("a"), None, None, now),
            Plan::ReapStale
        );
        let released = PeerPodFacts {
            finalizer: false,
            ..deleting("a")
        };
        assert_eq!(plan::<Instant>(&released, None, None, now), Plan::Nothing);
        let held = PeerPodFacts {
            do_not_delete: true,
            ..deleting("a")
        };
        assert_eq!(
            plan::<Instant>(&held, None, None, now),
            Plan::Hold(Hold::DoNotDelete)
        );
        assert_eq!(
            plan::<Instant>(&deleting("a"), None, None, now),
            delete(false)
        );
        assert!(!Plan::<Instant>::ReapStale.is_cleanup());
        assert!(!Plan::<Instant>::Nothing.is_cleanup());
        assert!(delete(false).is_cleanup());
        assert!(Plan::<Instant>::Hold(Hold::DoNotDelete).is_cleanup());
    }

    #[test]
    fn a_delete_in_progress_waits_until_its_time_then_asks_again() {
        let now = Instant::now();
        let later = now + Duration::from_secs(5);
        let progress = Progress {
            provider: "libvirt".into(),
            instance_id: "1b4e28ba-2fa1-11d2-883f-0016d3cca427".into(),
            ask_again_at: later,
        };
        assert_eq!(
            plan(&deleting("a"), None, Some(&progress), now),
            Plan::Wait {
                provider: "libvirt".into(),
                instance_id: "1B4E28BA-2FA1-11D2-883F-0016D3CCA427".into(),
                until: later,
            }
        );
        assert_eq!(
            plan(&deleting("a"), None, Some(&progress), later),
            delete(true)
        );
        // Progress of another instance is not this one's.
        let other = Progress {
            instance_id: "other".into(),
            ..progress.clone()
        };
        assert_eq!(plan(&deleting("a"), None, Some(&other), now), delete(false));
        // Unknown providers compare as written.
        let odd = Progress {
            provider: "nimbus".into(),
            instance_id: "X".into(),
            ask_again_at: later,
        };
        assert!(odd.is_for("nimbus", "X"));
        assert!(!odd.is_for("nimbus", "x"));
        assert!(!odd.is_for("nimbu", "X"));
        assert!(progress.is_for("libvirt", " 1B4E28BA-2FA1-11D2-883F-0016D3CCA427"));
        assert!(!progress.is_for("azure", "1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
    }

    #[test]
    fn developer_mode_holds_a_delete_not_yet_asked_for() {
        let now = Instant::now();
        let fresh = || plan::<Instant>(&deleting("a"), None, None, now);
        assert_eq!(
            under_developer_mode(fresh(), DeveloperMode::Off),
            delete(false)
        );
        assert_eq!(
            under_developer_mode(fresh(), DeveloperMode::On),
            Plan::Hold(Hold::DeveloperMode)
        );
        assert_eq!(
            under_developer_mode(fresh(), DeveloperMode::Unknown),
            Plan::Hold(Hold::DeveloperModeUnknown)
        );
        // A delete already running goes on, whatever the mode.
        for mode in [
            DeveloperMode::Off,
            DeveloperMode::On,
            DeveloperMode::Unknown,
        ] {
            assert_eq!(under_developer_mode(delete(true), mode), delete(true));
            let wait = Plan::Wait {
                provider: "libvirt".into(),
                instance_id: "id".into(),
                until: now,
            };
            assert_eq!(under_developer_mode(wait.clone(), mode), wait);
            // Plans that delete nothing are left as they are.
            let release = plan(&deleting("a"), Some(&facts("b")), None, now);
            assert!(matches!(release, Plan::Release { .. }));
            assert_eq!(under_developer_mode(release.clone(), mode), release);
            for other in [
                Plan::<Instant>::ReapStale,
                Plan::Nothing,
                Plan::Hold(Hold::DoNotDelete),
            ] {
                assert_eq!(under_developer_mode(other.clone(), mode), other);
            }
        }
    }

    #[test]
    fn the_developer_mode_setting_is_read_as_go_parses_a_bool() {
        assert_eq!(DEVELOPER_MODE_KEY, "PODVM_DEVELOPER_MODE");
        let read = DeveloperMode::from_setting;
        assert_eq!(read(None), DeveloperMode::Off, "no key");
        for off in [
            "", "  ", "0", "f", "F", "FALSE", "false", "False", " false\n",
        ] {
            assert_eq!(read(Some(off)), DeveloperMode::Off, "{off:?}");
        }
        for on in ["1", "t", "T", "TRUE", "true", "True", " true "] {
            assert_eq!(read(Some(on)), DeveloperMode::On, "{on:?}");
        }
        // Spellings Go refuses: CAA would not start, so whether it keeps VMs cannot be told.
        for odd in ["yes", "on", "tRUE", "fALSE", "2", "true true"] {
            assert_eq!(read(Some(odd)), DeveloperMode::Unknown, "{odd:?}");
        }
    }

    #[test]
    fn the_release_annotation_value_is_read_exactly() {
        assert_eq!(ReleaseAsk::parse(" operator "), ReleaseAsk::Operator);
        assert_eq!(ReleaseAsk::parse("instance-gone"), ReleaseAsk::InstanceGone);
        assert_eq!(
            ReleaseAsk::parse("Operator"),
            ReleaseAsk::Unknown("Operator".into())
        );
        assert_eq!(ReleaseAsk::parse(""), ReleaseAsk::Unknown(String::new()));
    }

    #[test]
    fn a_release_ask_reads_back_from_its_value() {
        assert_eq!(ReleaseAsk::Operator.value(), "operator");
        assert_eq!(ReleaseAsk::InstanceGone.value(), "instance-gone");
        for ask in [
            ReleaseAsk::Operator,
            ReleaseAsk::InstanceGone,
            ReleaseAsk::Unknown("later".into()),
        ] {
            assert_eq!(ReleaseAsk::parse(ask.value()), ask);
        }
    }

    #[test]
    fn the_release_annotation_changes_only_a_cleanup() {
        let now = Instant::now();
        let operator = Plan::<Instant>::ReleaseByOperator {
            provider: "libvirt".into(),
            instance_id: "1B4E28BA-2FA1-11D2-883F-0016D3CCA427".into(),
        };
        let padded = PeerPodFacts {
            cloud_provider: " libvirt ".into(),
            instance_id: " 1B4E28BA-2FA1-11D2-883F-0016D3CCA427 ".into(),
            ..deleting("a")
        };
        let wait = Plan::Wait {
            provider: "libvirt".into(),
            instance_id: "id".into(),
            until: now,
        };
        let release = plan(&deleting("a"), Some(&facts("b")), None, now);
        // Every cleanup, deleting, waiting, releasing or held, gives way to the operator's release.
        for cleanup in [
            delete(false),
            delete(true),
            wait,
            release,
            Plan::Hold(Hold::DoNotDelete),
            Plan::Hold(Hold::DeveloperMode),
        ] {
            assert_eq!(
                under_release_ask(cleanup.clone(), &padded, Some(&ReleaseAsk::Operator)),
                operator
            );
            assert_eq!(
                under_release_ask(
                    cleanup.clone(),
                    &padded,
                    Some(&ReleaseAsk::Unknown("yes".into()))
                ),
                Plan::Hold(Hold::UnknownRelease("yes".into()))
            );
            assert_eq!(under_release_ask(cleanup.clone(), &padded, None), cleanup);
        }
        // A live PeerPod and one already released are left as they are.
        for other in [Plan::<Instant>::ReapStale, Plan::Nothing] {
            for ask in [
                ReleaseAsk::Operator,
                ReleaseAsk::InstanceGone,
                ReleaseAsk::Unknown("x".into()),
            ] {
                assert_eq!(under_release_ask(other.clone(), &padded, Some(&ask)), other);
            }
        }
        assert!(operator.is_cleanup());
    }

    #[test]
    fn instance_gone_only_replaces_a_delete_not_yet_asked_for() {
        let now = Instant::now();
        let gone = Some(&ReleaseAsk::InstanceGone);
        let a = deleting("a");
        assert_eq!(
            under_release_ask(delete(false), &a, gone),
            Plan::<Instant>::ConfirmGone {
                provider: "libvirt".into(),
                instance_id: "1B4E28BA-2FA1-11D2-883F-0016D3CCA427".into(),
            }
        );
        let wait = Plan::Wait {
            provider: "libvirt".into(),
            instance_id: "id".into(),
            until: now,
        };
        let release = plan(&a, Some(&facts("b")), None, now);
        for other in [
            delete(true),
            wait,
            release,
            Plan::Hold(Hold::DoNotDelete),
            Plan::Hold(Hold::DeveloperMode),
            Plan::ReapStale,
            Plan::Nothing,
        ] {
            assert_eq!(under_release_ask(other.clone(), &a, gone), other);
        }
    }

    #[test]
    fn already_gone_after_in_progress_is_the_end_of_our_delete() {
        assert_eq!(confirmed(Gone::AlreadyGone, true), Gone::Deleted);
        assert_eq!(confirmed(Gone::AlreadyGone, false), Gone::AlreadyGone);
        assert_eq!(confirmed(Gone::Deleted, false), Gone::Deleted);
        assert_eq!(confirmed(Gone::Deleted, true), Gone::Deleted);
    }
}
