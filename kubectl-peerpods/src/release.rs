//! `release`: sets peerpod-ctrl's `peerpods.io/release` annotation on one PeerPod being deleted, after asking.
//! [`decide`] is what to do and what to ask (pure); [`read`] and [`set`] are the only API calls.

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use peerpods_api::peerpod::{FINALIZER, PeerPod};
use peerpods_api::peerpod::{RELEASE, ReleaseAsk};

use crate::Error;

/// What [`decide`] needs to know of the PeerPod.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    pub namespace: String,
    pub name: String,
    pub provider: String,
    pub instance_id: String,
    /// It carries a deletion timestamp.
    pub deleting: bool,
    /// peerpod-ctrl's (cloud-api-adaptor's) finalizer still holds it.
    pub held: bool,
    /// What its release annotation asks for now, if it carries one.
    pub current: Option<ReleaseAsk>,
}

/// What to do before setting the annotation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Set it now (`--yes`).
    Set,
    /// Ask this on the terminal first, and set it only on a yes.
    Confirm(String),
}

/// Whether to set `ask` on `target`, and what to ask first. A PeerPod that is not being deleted, or that nothing
/// holds any more, is refused: peerpod-ctrl would ignore the annotation (or never see it), so writing it would
/// only leave a surprise for a later delete. Without `--yes` the question needs a terminal to answer it: a
/// script must say `--yes` rather than release by accident.
pub fn decide(target: &Target, ask: &ReleaseAsk, yes: bool, terminal: bool) -> Result<Step, Error> {
    let (namespace, name) = (target.namespace.clone(), target.name.clone());
    if !target.deleting {
        return Err(Error::NotBeingDeleted { namespace, name });
    }
    if !target.held {
        return Err(Error::AlreadyReleased { namespace, name });
    }
    if yes {
        return Ok(Step::Set);
    }
    if !terminal {
        return Err(Error::NoTerminal { namespace, name });
    }
    Ok(Step::Confirm(prompt(target, ask)))
}

/// Only an explicit yes releases.
pub fn confirmed(answer: &str) -> bool {
    matches!(answer.trim().to_ascii_lowercase().as_str(), "y" | "yes")
}

fn vm(target: &Target) -> String {
    match (target.provider.trim(), target.instance_id.trim()) {
        (_, "") => "no VM recorded (spec.instanceID is empty)".to_string(),
        ("", id) => format!("VM {id}"),
        (provider, id) => format!("{provider} VM {id}"),
    }
}

fn prompt(target: &Target, ask: &ReleaseAsk) -> String {
    let vm = vm(target);
    let meaning = match ask {
        ReleaseAsk::Operator => format!(
            "peerpod-ctrl releases its finalizer at once and deletes nothing: {vm} is left as it is and is \
             yours to delete (a Warning Event records your choice)."
        ),
        ReleaseAsk::InstanceGone => format!(
            "peerpod-ctrl releases its finalizer only once provider-service no longer lists {vm} and its delete \
             answers already gone; while the cloud lists the VM, the finalizer stays."
        ),
        ReleaseAsk::Unknown(_) => "peerpod-ctrl releases nothing for this value.".to_string(),
    };
    let replaces = match &target.current {
        Some(current) if current != ask => format!(" (replacing {RELEASE}={})", current.value()),
        _ => String::new(),
    };
    format!(
        "PeerPod {}/{} ({vm}) is to be annotated {RELEASE}={}{replaces}.\n{meaning}\nRelease it? [y/N] ",
        target.namespace,
        target.name,
        ask.value(),
    )
}

/// Reads the PeerPod into a [`Target`].
pub async fn read(client: &Client, namespace: &str, name: &str) -> Result<Target, Error> {
    let pp = crate::gather::read_peerpod(client, namespace, name).await?;
    Ok(Target {
        namespace: namespace.to_string(),
        name: name.to_string(),
        provider: pp.spec.cloud_provider.clone(),
        instance_id: pp.spec.instance_id.clone(),
        deleting: pp.metadata.deletion_timestamp.is_some(),
        held: pp.finalizers().iter().any(|f| f == FINALIZER),
        current: pp.release_ask(),
    })
}

/// Sets the annotation: a merge patch of that one annotation, so nothing else of the PeerPod is touched.
pub async fn set(client: &Client, target: &Target, ask: &ReleaseAsk) -> Result<(), Error> {
    let api: Api<PeerPod> = Api::namespaced(client.clone(), &target.namespace);
    let patch = serde_json::json!({ "metadata": { "annotations": { RELEASE: ask.value() } } });
    api.patch(&target.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(Error::PatchPeerPod)?;
    Ok(())
}

/// What `release` prints once the annotation is set.
pub fn done(target: &Target, ask: &ReleaseAsk) -> String {
    format!(
        "PeerPod {}/{} annotated {RELEASE}={}; `kubectl peerpods describe {}/{}` shows what peerpod-ctrl does\n",
        target.namespace,
        target.name,
        ask.value(),
        target.namespace,
        target.name,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target() -> Target {
        Target {
            namespace: "ns".into(),
            name: "pp".into(),
            provider: "aws".into(),
            instance_id: "i-123".into(),
            deleting: true,
            held: true,
            current: None,
        }
    }

    #[test]
    fn a_live_peerpod_is_refused_whatever_else_is_said() {
        let live = Target {
            deleting: false,
            ..target()
        };
        for (yes, terminal) in [(true, true), (true, false), (false, true), (false, false)] {
            for ask in [ReleaseAsk::InstanceGone, ReleaseAsk::Operator] {
                let refused = decide(&live, &ask, yes, terminal).unwrap_err();
                assert!(matches!(refused, Error::NotBeingDeleted { .. }));
                assert!(refused.to_string().contains("ns/pp is not being deleted"));
            }
        }
    }

    #[test]
    fn a_peerpod_nothing_holds_is_refused() {
        let released = Target {
            held: false,
            ..target()
        };
        let refused = decide(&released, &ReleaseAsk::Operator, true, true).unwrap_err();
        assert!(matches!(refused, Error::AlreadyReleased { .. }));
    }

    #[test]
    fn yes_sets_without_asking_terminal_or_not() {
        for terminal in [true, false] {
            assert_eq!(
                decide(&target(), &ReleaseAsk::Operator, true, terminal).unwrap(),
                Step::Set
            );
        }
    }

    #[test]
    fn without_yes_and_without_a_terminal_nothing_is_set() {
        let refused = decide(&target(), &ReleaseAsk::InstanceGone, false, false).unwrap_err();
        assert!(matches!(refused, Error::NoTerminal { .. }));
        assert!(refused.to_string().contains("--yes"));
    }

    #[test]
    fn the_question_names_the_peerpod_the_vm_and_what_the_choice_means() {
        let Step::Confirm(gone) =
            decide(&target(), &ReleaseAsk::InstanceGone, false, true).unwrap()
        else {
            panic!("no question")
        };
        assert!(gone.contains("PeerPod ns/pp (aws VM i-123)"), "{gone}");
        assert!(gone.contains("peerpods.io/release=instance-gone"), "{gone}");
        assert!(gone.contains("no longer lists"), "{gone}");
        assert!(gone.ends_with("[y/N] "), "{gone}");

        let Step::Confirm(operator) =
            decide(&target(), &ReleaseAsk::Operator, false, true).unwrap()
        else {
            panic!("no question")
        };
        assert!(
            operator.contains("peerpods.io/release=operator"),
            "{operator}"
        );
        assert!(operator.contains("deletes nothing"), "{operator}");
        assert!(operator.contains("yours to delete"), "{operator}");
    }

    #[test]
    fn the_question_says_what_it_replaces_and_when_no_vm_is_recorded() {
        let other = Target {
            instance_id: String::new(),
            current: Some(ReleaseAsk::InstanceGone),
            ..target()
        };
        let Step::Confirm(text) = decide(&other, &ReleaseAsk::Operator, false, true).unwrap()
        else {
            panic!("no question")
        };
        assert!(
            text.contains("replacing peerpods.io/release=instance-gone"),
            "{text}"
        );
        assert!(text.contains("no VM recorded"), "{text}");
        let same = Target {
            current: Some(ReleaseAsk::Operator),
            ..target()
        };
        let Step::Confirm(text) = decide(&same, &ReleaseAsk::Operator, false, true).unwrap() else {
            panic!("no question")
        };
        assert!(!text.contains("replacing"), "{text}");
    }

    #[test]
    fn only_an_explicit_yes_confirms() {
        for yes in ["y", "Y", "yes", " YES\n"] {
            assert!(confirmed(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yess", "ok"] {
            assert!(!confirmed(no), "{no:?}");
        }
    }
}
