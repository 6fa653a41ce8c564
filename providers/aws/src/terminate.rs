//! Turning `TerminateInstances` answers into one answer per instance id (pure).
//!
//! EC2 fails a whole batched call when any one id is unknown or malformed. These rules decide
//! how to recover so that every caller still gets the answer a call for its id alone would give.
//! An answer only says what EC2 did with the request: whether the instance is gone is the
//! deletion engine's to decide, from a later lookup.

use std::collections::BTreeSet;

use super::failure::{Failure, ids_named_not_found, is_transitional_state};
use peerpods_provider_core::deletion::DeleteAnswer;

/// Splits a successful call's answer (the ids EC2 says it is terminating) into the ids of the
/// batch it accepted and those it did not mention, to be asked again one by one.
pub fn resolve_success(batch: &[String], terminating: &[String]) -> (Vec<String>, Vec<String>) {
    let mentioned: BTreeSet<&str> = terminating.iter().map(String::as_str).collect();
    batch
        .iter()
        .cloned()
        .partition(|id| mentioned.contains(id.as_str()))
}

/// What a failure of a call for one instance alone answers for it: unknown is
/// [`DeleteAnswer::NotFound`] (which proves nothing by itself), a state in transition
/// [`DeleteAnswer::WrongState`]; anything else is the failure.
pub fn single_answer(failure: Failure) -> Result<DeleteAnswer, Failure> {
    match failure {
        Failure::InstanceNotFound { .. } => Ok(DeleteAnswer::NotFound),
        Failure::Refused { ref code, .. } if is_transitional_state(code) => {
            Ok(DeleteAnswer::WrongState)
        }
        failure => Err(failure),
    }
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
    fn success_is_matched_per_id_and_unmentioned_ids_are_set_apart() {
        let batch = ids(&["i-0000000a", "i-0000000b", "i-0000000c"]);
        let (accepted, unmentioned) =
            resolve_success(&batch, &ids(&["i-0000000b", "i-0000000a", "i-0000000f"]));
        assert_eq!(accepted, ids(&["i-0000000a", "i-0000000b"]));
        assert_eq!(unmentioned, ids(&["i-0000000c"]));
    }

    #[test]
    fn a_single_call_s_failure_is_translated_not_judged() {
        assert_eq!(
            single_answer(Failure::InstanceNotFound {
                message: "gone?".into()
            }),
            Ok(DeleteAnswer::NotFound)
        );
        assert_eq!(
            single_answer(Failure::Refused {
                code: "IncorrectInstanceState".into(),
                message: "pending".into()
            }),
            Ok(DeleteAnswer::WrongState)
        );
        let protected = Failure::Refused {
            code: "OperationNotPermitted".into(),
            message: "protected".into(),
        };
        assert_eq!(single_answer(protected.clone()), Err(protected));
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
