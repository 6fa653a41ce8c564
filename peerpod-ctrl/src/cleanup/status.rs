//! What the Cleaned condition and `status.cleand` say, as plain values. No I/O here.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::provider::Waiting;
use peerpods_api::peerpod::{
    CONDITION_CLEANED, CleanedReason, PeerPod, PeerPodState, PeerPodStatus,
};

/// What the Cleaned condition and `status.cleand` say.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Cleaned {
    /// The condition's status: the cleanup of this PeerPod is done.
    pub(crate) done: bool,
    /// `status.cleand`: the VM is confirmed gone.
    pub(crate) vm_gone: bool,
    pub(crate) reason: CleanedReason,
}

impl Cleaned {
    /// The cleanup waits for an operator: the VM stays, so does the finalizer.
    pub(crate) fn held(reason: CleanedReason) -> Self {
        Cleaned {
            done: false,
            vm_gone: false,
            reason,
        }
    }

    /// The VM is not confirmed gone yet, and nobody needs to act: the finalizer stays.
    pub(crate) fn pending(reason: CleanedReason) -> Self {
        Cleaned {
            done: false,
            vm_gone: false,
            reason,
        }
    }

    /// The cleanup is done, but the VM was deliberately not deleted.
    pub(crate) fn done_without_delete(reason: CleanedReason) -> Self {
        Cleaned {
            done: true,
            vm_gone: false,
            reason,
        }
    }
}

/// The condition and Event reason of a wait provider-service answered.
pub(crate) fn waiting_reason(waiting: Waiting) -> CleanedReason {
    match waiting {
        Waiting::CloudDeleting => CleanedReason::DeleteInProgress,
        Waiting::NotYetVisible { .. } => CleanedReason::InstanceNotYetVisible,
    }
}

/// The status the reconciler applies to `peerpod` for `state` and `message` at `now`: the Cleaned condition,
/// `status.cleand`, the state and its reason, since when the cleanup waits. `None` when the PeerPod already
/// says exactly that, so nothing is written.
pub(crate) fn cleaned_status(
    peerpod: &PeerPod,
    state: Cleaned,
    message: &str,
    now: jiff::Timestamp,
) -> Option<PeerPodStatus> {
    let Cleaned {
        done,
        vm_gone: cleaned,
        reason,
    } = state;
    let status_value = if done { "True" } else { "False" };
    let current = peerpod.cleaned_condition();
    let generation = peerpod.metadata.generation;
    let old_status = peerpod.status.clone().unwrap_or_default();
    if current.is_some_and(|c| {
        c.status == status_value && c.reason == reason.as_str() && c.message == message
    }) && old_status.cleand == cleaned
        && old_status.observed_generation == generation
        && old_status.state == PeerPodState::of_cleanup(done, reason)
        && old_status.waiting_since.is_some() != done
    {
        return None;
    }
    let last_transition_time = match current {
        Some(c) if c.status == status_value => c.last_transition_time.clone(),
        _ => Time(now),
    };
    // Only the Cleaned condition: the conditions are a map keyed by type, so the API server keeps every other
    // one (reverse collection's InstancePresent, another manager's) as the live object has it.
    let conditions = vec![Condition {
        type_: CONDITION_CLEANED.to_string(),
        status: status_value.to_string(),
        reason: reason.as_str().to_string(),
        message: message.to_string(),
        observed_generation: generation,
        last_transition_time,
    }];
    // Since when the cleanup waits: from the first write that found it not done, kept while the Cleaned
    // condition stays False (whatever the reason: held, failing, in progress), cleared once it is done.
    let waiting_since = match (done, current) {
        (true, _) => None,
        (false, Some(c)) if c.status == "False" => old_status.waiting_since.clone(),
        (false, _) => None,
    }
    .or_else(|| (!done).then_some(Time(now)));
    // The words `kubectl get` shows follow the condition, so every writer of it keeps them in step.
    let status = PeerPodStatus {
        waiting_since,
        cleand: cleaned,
        conditions,
        observed_generation: generation,
        state: PeerPodState::of_cleanup(done, reason),
        reason: Some(reason.as_str().to_string()),
        last_attempt_time: Some(Time(now)),
        // Reverse collection's, under its own field manager: not sent, so this apply leaves it alone.
        matched_instance: None,
    };
    Some(status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{deleting, peerpod, time};

    /// `peerpod` as the API server shows it after `status` was applied.
    fn applied(mut peerpod: PeerPod, status: PeerPodStatus) -> PeerPod {
        peerpod.status = Some(status);
        peerpod
    }

    fn condition(status: &PeerPodStatus) -> &Condition {
        status
            .conditions
            .iter()
            .find(|c| c.type_ == CONDITION_CLEANED)
            .expect("Cleaned condition")
    }

    #[test]
    fn a_first_wait_writes_the_condition_the_state_and_since_when() {
        let p = deleting(peerpod("a", 0));
        let status = cleaned_status(
            &p,
            Cleaned::pending(CleanedReason::DeleteInProgress),
            "deleting",
            time(10).0,
        )
        .expect("a first write");
        let c = condition(&status);
        assert_eq!(
            (c.status.as_str(), c.reason.as_str(), c.message.as_str()),
            ("False", "DeleteInProgress", "deleting")
        );
        assert_eq!(c.last_transition_time, time(10));
        assert!(!status.cleand);
        assert_eq!(status.state, PeerPodState::WaitingForCloud);
        assert_eq!(status.reason.as_deref(), Some("DeleteInProgress"));
        assert_eq!(status.waiting_since, Some(time(10)));
        assert_eq!(status.last_attempt_time, Some(time(10)));
        assert_eq!(status.matched_instance, None, "reverse collection's field");
    }

    #[test]
    fn the_same_words_again_write_nothing() {
        let p = deleting(peerpod("a", 0));
        let state = Cleaned::held(CleanedReason::DoNotDelete);
        let status = cleaned_status(&p, state, "held", time(10).0).expect("a first write");
        let p = applied(p, status);
        assert_eq!(cleaned_status(&p, state, "held", time(20).0), None);
        // Another message, or a new generation of the spec, is written.
        assert!(cleaned_status(&p, state, "held longer", time(20).0).is_some());
        let mut changed = p.clone();
        changed.metadata.generation = Some(2);
        assert!(cleaned_status(&changed, state, "held", time(20).0).is_some());
    }

    #[test]
    fn a_wait_keeps_since_when_through_changes_of_reason_and_done_clears_it() {
        let p = deleting(peerpod("a", 0));
        let first = cleaned_status(
            &p,
            Cleaned::pending(CleanedReason::InstanceNotYetVisible),
            "not shown",
            time(10).0,
        )
        .expect("a first write");
        let p = applied(p, first);
        let next = cleaned_status(
            &p,
            Cleaned::pending(CleanedReason::DeleteInProgress),
            "deleting",
            time(30).0,
        )
        .expect("another reason");
        assert_eq!(next.waiting_since, Some(time(10)), "still the same wait");
        assert_eq!(
            condition(&next).last_transition_time,
            time(10),
            "still False"
        );
        assert_eq!(next.last_attempt_time, Some(time(30)));
        let p = applied(p, next);
        let done = cleaned_status(
            &p,
            Cleaned {
                done: true,
                vm_gone: true,
                reason: CleanedReason::InstanceDeleted,
            },
            "deleted",
            time(40).0,
        )
        .expect("done");
        assert_eq!(done.waiting_since, None);
        assert!(done.cleand);
        assert_eq!(done.state, PeerPodState::Released);
        let c = condition(&done);
        assert_eq!(
            (c.status.as_str(), c.last_transition_time.clone()),
            ("True", time(40))
        );
    }

    #[test]
    fn done_without_a_delete_leaves_cleand_false() {
        let p = deleting(peerpod("a", 0));
        let status = cleaned_status(
            &p,
            Cleaned::done_without_delete(CleanedReason::ReleasedByOperator),
            "released",
            time(10).0,
        )
        .expect("a first write");
        assert_eq!(condition(&status).status, "True");
        assert!(!status.cleand);
        assert_eq!(status.waiting_since, None);
        assert_eq!(status.state, PeerPodState::Released);
    }
}
