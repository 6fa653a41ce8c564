//! Turning `TerminateInstances` answers into one true answer per instance id (pure).
//!
//! EC2 fails a whole batched call when any one id is unknown or malformed. These rules decide
//! how to recover so that every caller still gets the answer a call for its id alone would give.

use std::collections::{BTreeSet, HashMap};

use super::failure::{Failure, ids_named_not_found};
use peerpods_provider_core::DeleteOutcome;

/// The answer for an instance that `TerminateInstances` accepted, from its state before the call.
/// An instance already terminated or shutting down was deleted by someone else.
pub fn outcome_from_previous_state(previous_state: Option<&str>) -> DeleteOutcome {
    match previous_state {
        Some("terminated" | "shutting-down") => DeleteOutcome::AlreadyGone,
        _ => DeleteOutcome::Deleted,
    }
}

/// Answers for a successful call: `(id, previous state)` pairs from EC2, matched to the batch.
/// Ids of the batch that EC2 did not mention are returned apart, to be asked again one by one.
pub fn resolve_success(
    batch: &[String],
    terminating: &[(String, Option<String>)],
) -> (Vec<(String, DeleteOutcome)>, Vec<String>) {
    let by_id: HashMap<&str, Option<&str>> = terminating
        .iter()
        .map(|(id, state)| (id.as_str(), state.as_deref()))
        .collect();
    let mut answered = Vec::with_capacity(batch.len());
    let mut unmentioned = Vec::new();
    for id in batch {
        match by_id.get(id.as_str()) {
            Some(state) => answered.push((id.clone(), outcome_from_previous_state(*state))),
            None => unmentioned.push(id.clone()),
        }
    }
    (answered, unmentioned)
}

/// What to do after a `TerminateInstances` call for `batch` failed.
#[derive(Debug, PartialEq, Eq)]
pub enum NextStep {
    /// EC2 named these ids as unknown (gone, or not yet visible: see `visibility`); `retry` the
    /// others as one batch.
    DropUnknown {
        unknown: Vec<String>,
        retry: Vec<String>,
    },
    /// The failure comes from some id but does not say which: ask EC2 about each id alone.
    PerId,
    /// The failure is every id's answer (throttling, outage, credentials, or a single-id call).
    FailAll,
}

pub fn after_failure(batch: &[String], failure: &Failure) -> NextStep {
    let single = batch.len() == 1;
    match failure {
        Failure::InstanceNotFound { .. } if single => NextStep::DropUnknown {
            unknown: batch.to_vec(),
            retry: Vec::new(),
        },
        Failure::InstanceNotFound { message } => {
            let named: BTreeSet<String> = ids_named_not_found(message).into_iter().collect();
            let (unknown, retry): (Vec<String>, Vec<String>) =
                batch.iter().cloned().partition(|id| named.contains(id));
            if unknown.is_empty() {
                NextStep::PerId
            } else {
                NextStep::DropUnknown { unknown, retry }
            }
        }
        // Id-specific failures of a batch: only a call per id tells whose they are.
        Failure::InstanceMalformed { .. }
        | Failure::Refused { .. }
        | Failure::ResourceNotFound { .. }
        | Failure::Internal { .. }
            if !single =>
        {
            NextStep::PerId
        }
        _ => NextStep::FailAll,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::failure::THROTTLE_RETRY_AFTER;

    fn ids(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn previous_state_decides_deleted_or_already_gone() {
        assert_eq!(
            outcome_from_previous_state(Some("running")),
            DeleteOutcome::Deleted
        );
        assert_eq!(
            outcome_from_previous_state(Some("stopped")),
            DeleteOutcome::Deleted
        );
        assert_eq!(outcome_from_previous_state(None), DeleteOutcome::Deleted);
        assert_eq!(
            outcome_from_previous_state(Some("terminated")),
            DeleteOutcome::AlreadyGone
        );
        assert_eq!(
            outcome_from_previous_state(Some("shutting-down")),
            DeleteOutcome::AlreadyGone
        );
    }

    #[test]
    fn success_is_matched_per_id_and_unmentioned_ids_are_set_apart() {
        let batch = ids(&["i-0000000a", "i-0000000b", "i-0000000c"]);
        let (answered, unmentioned) = resolve_success(
            &batch,
            &[
                ("i-0000000b".into(), Some("terminated".into())),
                ("i-0000000a".into(), Some("running".into())),
            ],
        );
        assert_eq!(
            answered,
            vec![
                ("i-0000000a".into(), DeleteOutcome::Deleted),
                ("i-0000000b".into(), DeleteOutcome::AlreadyGone)
            ]
        );
        assert_eq!(unmentioned, ids(&["i-0000000c"]));
    }

    #[test]
    fn unknown_ids_named_by_ec2_are_dropped_and_the_rest_retried() {
        let batch = ids(&["i-0000000a", "i-0000000b", "i-0000000c"]);
        let failure = Failure::InstanceNotFound {
            message: "The instance IDs 'i-0000000c, i-0000000a' do not exist".into(),
        };
        assert_eq!(
            after_failure(&batch, &failure),
            NextStep::DropUnknown {
                unknown: ids(&["i-0000000a", "i-0000000c"]),
                retry: ids(&["i-0000000b"]),
            }
        );
    }

    #[test]
    fn not_found_naming_none_of_the_batch_falls_back_to_per_id() {
        let batch = ids(&["i-0000000a", "i-0000000b"]);
        for message in [
            "The instance ID 'i-0000000f' does not exist",
            "no ids in this text",
        ] {
            let failure = Failure::InstanceNotFound {
                message: message.into(),
            };
            assert_eq!(
                after_failure(&batch, &failure),
                NextStep::PerId,
                "{message}"
            );
        }
    }

    #[test]
    fn single_unknown_id_is_unknown_whatever_the_message() {
        let batch = ids(&["i-0000000a"]);
        let failure = Failure::InstanceNotFound {
            message: "something else".into(),
        };
        assert_eq!(
            after_failure(&batch, &failure),
            NextStep::DropUnknown {
                unknown: batch.clone(),
                retry: vec![]
            }
        );
    }

    #[test]
    fn id_specific_failures_split_batches_but_not_single_calls() {
        let batch = ids(&["i-0000000a", "i-0000000b"]);
        let malformed = Failure::InstanceMalformed {
            message: "bad".into(),
        };
        assert_eq!(after_failure(&batch, &malformed), NextStep::PerId);
        assert_eq!(after_failure(&batch[..1], &malformed), NextStep::FailAll);
    }

    #[test]
    fn call_wide_failures_answer_every_id() {
        let batch = ids(&["i-0000000a", "i-0000000b"]);
        for failure in [
            Failure::Throttled {
                retry_after: THROTTLE_RETRY_AFTER,
            },
            Failure::Unavailable {
                detail: "refused".into(),
                cause: None,
            },
            Failure::PermissionDenied {
                code: "AuthFailure".into(),
                message: "no".into(),
            },
        ] {
            assert_eq!(after_failure(&batch, &failure), NextStep::FailAll);
        }
    }
}
