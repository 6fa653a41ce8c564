//! What the plugin answers for the claims of one NodePrepareResources or NodeUnprepareResources request, as a
//! pure function of the claims.
//!
//! A slot of the VM pool needs nothing on the node: every well-formed claim is prepared (and unprepared) with no
//! device to inject, every time it is asked (the kubelet retries, and calls unprepare after its own restart for
//! claims it prepared before: both must succeed without any memory of earlier calls). The kubelet keys its answer
//! by claim UID and treats a claim missing from the answer as not done, so every claim with a UID gets an entry;
//! a claim without one cannot be answered at all, and the whole request is refused.

use std::collections::BTreeMap;

/// One claim of a request, as the kubelet names it (all three fields are required by the API).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Claim<'a> {
    pub namespace: &'a str,
    pub uid: &'a str,
    pub name: &'a str,
}

/// Why one claim is answered with an error (the request's other claims are still answered). The text is what
/// the kubelet reports for the pod.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimProblem {
    #[error("claim {uid} has no namespace")]
    NoNamespace { uid: String },
    #[error("claim {uid} has no name")]
    NoName { uid: String },
}

/// Why a whole request is refused: no answer can name a claim without a UID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error("claim {index} of the request has no uid")]
    NoUid { index: usize },
}

/// The answer to a request: per claim UID, done (`Ok`) or the problem. A UID listed twice gets one entry; a
/// problem with any of its listings wins.
pub type Answer = BTreeMap<String, Result<(), ClaimProblem>>;

/// Answers the claims of a prepare or an unprepare request (the same for both: there is nothing to do either
/// way but to check what the kubelet sent).
pub fn answer<'a>(claims: impl IntoIterator<Item = Claim<'a>>) -> Result<Answer, Refusal> {
    let mut answer = Answer::new();
    for (index, claim) in claims.into_iter().enumerate() {
        if claim.uid.is_empty() {
            return Err(Refusal::NoUid { index });
        }
        let outcome = if claim.namespace.is_empty() {
            Err(ClaimProblem::NoNamespace {
                uid: claim.uid.to_owned(),
            })
        } else if claim.name.is_empty() {
            Err(ClaimProblem::NoName {
                uid: claim.uid.to_owned(),
            })
        } else {
            Ok(())
        };
        match answer.get(claim.uid) {
            Some(Err(_)) => {}
            _ => {
                answer.insert(claim.uid.to_owned(), outcome);
            }
        }
    }
    Ok(answer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim<'a>(namespace: &'a str, uid: &'a str, name: &'a str) -> Claim<'a> {
        Claim {
            namespace,
            uid,
            name,
        }
    }

    #[test]
    fn every_claim_is_done_with_nothing_to_inject() {
        let answer = answer([claim("ns", "u1", "a"), claim("ns", "u2", "b")]).unwrap();
        assert_eq!(
            answer,
            Answer::from([("u1".into(), Ok(())), ("u2".into(), Ok(()))])
        );
        assert_eq!(answer_of(&[]), Answer::new());
    }

    fn answer_of(claims: &[Claim<'_>]) -> Answer {
        answer(claims.iter().copied()).unwrap()
    }

    #[test]
    fn a_claim_without_namespace_or_name_gets_its_own_error() {
        let answer = answer_of(&[
            claim("", "u1", "a"),
            claim("ns", "u2", ""),
            claim("ns", "u3", "c"),
        ]);
        let text = |uid: &str| answer[uid].as_ref().unwrap_err().to_string();
        assert_eq!(text("u1"), "claim u1 has no namespace");
        assert_eq!(text("u2"), "claim u2 has no name");
        assert_eq!(answer["u3"], Ok(()));
    }

    #[test]
    fn a_claim_without_uid_refuses_the_request() {
        assert_eq!(
            answer([claim("ns", "u1", "a"), claim("ns", "", "b")]),
            Err(Refusal::NoUid { index: 1 })
        );
    }

    #[test]
    fn a_uid_listed_twice_is_answered_once_and_a_problem_wins() {
        let answer = answer_of(&[
            claim("ns", "u1", "a"),
            claim("ns", "u1", ""),
            claim("ns", "u1", "a"),
        ]);
        assert_eq!(answer.len(), 1);
        assert_eq!(answer["u1"], Err(ClaimProblem::NoName { uid: "u1".into() }));
    }
}
