//! The status computed from what a reconcile observed: one verdict per condition, then the conditions and
//! figures of [`PeerPodConfigStatus`]. Pure.

use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use peerpods_protocol::decide::DeveloperMode;

use super::{
    Applying, CAPACITY_ADVERTISED, DAEMONSET_READY, DRA_PLUGIN_READY, DraPlugin, INVALID,
    NodeCeiling, Observed, READY, WEBHOOK_READY,
};
use peerpods_api::peerpodconfig::{ConditionReason, FailureReason, PeerPodConfigStatus};

/// The note of a [`DeveloperModeChanged`](peerpods_api::peerpodconfig::EventReason::DeveloperModeChanged) Event when CAA's pods were rendered
/// for developer mode `was` and are now for `now`; `None` when it did not change.
pub fn developer_mode_change(was: DeveloperMode, now: DeveloperMode) -> Option<String> {
    let what = match now {
        _ if was == now => return None,
        DeveloperMode::Off => {
            "off: CAA's pods restart without it and node capacity follows the limit again"
        }
        DeveloperMode::On => {
            "on: CAA's pods restart with it (failed pods' VMs are kept) and each selected node takes at most 1 VM"
        }
        DeveloperMode::Unknown => {
            "unknown (PODVM_DEVELOPER_MODE is not a boolean, or CAA's ConfigMap cannot be read): CAA's pods restart \
             and each selected node takes at most 1 VM, as in developer mode"
        }
    };
    Some(format!("cloud-api-adaptor's developer mode is now {what}"))
}

impl NodeCeiling {
    /// What the CapacityAdvertised message adds.
    fn note(self) -> String {
        let why = match self {
            Self::DeveloperMode => "cloud-api-adaptor runs in developer mode",
            Self::DeveloperModeUnknown => {
                "cloud-api-adaptor's developer mode is unknown (PODVM_DEVELOPER_MODE is not a boolean, or its \
                 ConfigMap cannot be read)"
            }
        };
        format!(", at most {} per node: {why}", Self::PER_NODE)
    }
}

struct Verdict {
    ok: bool,
    reason: ConditionReason,
    message: String,
}

fn daemonset_verdict(ds: Option<&DaemonSet>) -> Verdict {
    let Some(status) = ds.and_then(|d| d.status.as_ref()) else {
        return Verdict {
            ok: false,
            reason: ConditionReason::NotCreated,
            message: "the CAA DaemonSet does not exist yet".into(),
        };
    };
    let generation = ds.and_then(|d| d.metadata.generation);
    let desired = status.desired_number_scheduled;
    let updated = status.updated_number_scheduled.unwrap_or(0);
    if status.observed_generation < generation {
        Verdict {
            ok: false,
            reason: ConditionReason::Progressing,
            message: "the DaemonSet controller has not seen the latest spec".into(),
        }
    } else if desired == 0 {
        Verdict {
            ok: false,
            reason: ConditionReason::NoNodes,
            message: "no node matches nodeSelector".into(),
        }
    } else if status.number_ready < desired || updated < desired {
        Verdict {
            ok: false,
            reason: ConditionReason::PodsNotReady,
            message: format!(
                "{}/{desired} CAA pods ready, {updated}/{desired} updated",
                status.number_ready
            ),
        }
    } else {
        Verdict {
            ok: true,
            reason: ConditionReason::PodsReady,
            message: format!("{desired}/{desired} CAA pods ready"),
        }
    }
}

/// Whether the kubelet plugin runs on the selected nodes (desiredNumberScheduled against numberReady), or why it
/// is kept in node mode.
pub fn dra_plugin_verdict(plugin: &DraPlugin) -> (bool, ConditionReason, String) {
    let ds = match plugin {
        DraPlugin::Draining { claims } => {
            return (
                false,
                ConditionReason::DraPluginDraining,
                format!(
                    "capacityMode node: the kubelet plugin stays until {claims} ResourceClaim(s) allocated by the \
                     driver are released"
                ),
            );
        }
        DraPlugin::Serving(ds) => ds.as_deref(),
    };
    let Some(status) = ds.and_then(|d| d.status.as_ref()) else {
        return (
            false,
            ConditionReason::NotCreated,
            "the kubelet plugin DaemonSet has no status yet".into(),
        );
    };
    let desired = status.desired_number_scheduled;
    if status.observed_generation < ds.and_then(|d| d.metadata.generation) {
        (
            false,
            ConditionReason::Progressing,
            "the DaemonSet controller has not seen the latest spec".into(),
        )
    } else if desired == 0 {
        (
            false,
            ConditionReason::NoNodes,
            "no node matches nodeSelector".into(),
        )
    } else if status.number_ready < desired {
        (
            false,
            ConditionReason::PodsNotReady,
            format!(
                "{}/{desired} kubelet plugin pods ready",
                status.number_ready
            ),
        )
    } else {
        (
            true,
            ConditionReason::PodsReady,
            format!("{desired}/{desired} kubelet plugin pods ready"),
        )
    }
}

fn webhook_verdict(
    deployment: Option<&Deployment>,
    configuration_problem: Option<&(FailureReason, String)>,
) -> Verdict {
    if let Some((reason, message)) = configuration_problem {
        return Verdict {
            ok: false,
            reason: ConditionReason::Failed(*reason),
            message: message.clone(),
        };
    }
    let Some(d) = deployment else {
        return Verdict {
            ok: false,
            reason: ConditionReason::NotCreated,
            message: "the webhook Deployment does not exist yet".into(),
        };
    };
    let wanted = d.spec.replicas.unwrap_or(1);
    let available = d
        .status
        .as_ref()
        .and_then(|s| s.available_replicas)
        .unwrap_or(0);
    if available >= 1 {
        Verdict {
            ok: true,
            reason: ConditionReason::Available,
            message: format!("{available}/{wanted} webhook replicas available"),
        }
    } else {
        Verdict {
            ok: false,
            reason: ConditionReason::Unavailable,
            message: format!("0/{wanted} webhook replicas available"),
        }
    }
}

fn capacity_verdict(observed: &Observed) -> Verdict {
    match &observed.capacity {
        None => Verdict {
            ok: false,
            reason: ConditionReason::NotAdvertised,
            message: "capacity has not been advertised".into(),
        },
        Some(c) if c.selected_nodes == 0 => Verdict {
            ok: false,
            reason: ConditionReason::NoNodesSelected,
            message: "no node matches nodeSelector".into(),
        },
        // The nodes are being patched at the configured pace: say how far, so a long rebalance is visibly one.
        Some(c) if observed.applying.is_some_and(|a| a.done < a.of) => {
            let Applying { done, of } = observed.applying.unwrap_or_default();
            Verdict {
                ok: false,
                reason: ConditionReason::Applying,
                message: format!(
                    "applying capacity: {done} of {of} nodes (kata.peerpods.io/vm {} over {} nodes)",
                    c.effective, c.selected_nodes
                ),
            }
        }
        Some(c) if c.pool.is_some() => {
            let pool = c.pool.unwrap_or_default();
            let capped = match (c.provider_free, &observed.provider_problem) {
                (Some(free), _) if free < c.requested => {
                    format!(", capped by {free} free in the provider")
                }
                (_, Some(problem)) => format!(", provider capacity unknown: {problem}"),
                _ => String::new(),
            };
            let kept = if pool.size > c.effective {
                format!(
                    ", {} above the limit kept while allocated",
                    pool.size - c.effective
                )
            } else {
                String::new()
            };
            let ceiling = c.ceiling.map(NodeCeiling::note).unwrap_or_default();
            Verdict {
                ok: true,
                reason: ConditionReason::Published,
                message: format!(
                    "kata.peerpods.io/vm pool of {} devices ({} allocated, {} free) for {} nodes{kept}{capped}{ceiling}",
                    pool.size,
                    pool.allocated,
                    pool.size.saturating_sub(pool.allocated),
                    c.selected_nodes
                ),
            }
        }
        Some(c) => {
            let range = match (c.per_node_min, c.per_node_max) {
                (Some(lo), Some(hi)) if lo != hi => format!("{lo}-{hi}"),
                (Some(lo), _) => lo.to_string(),
                _ => "0".into(),
            };
            let capped = match (c.provider_free, &observed.provider_problem) {
                (Some(free), _) if free < c.requested => {
                    format!(", capped by {free} free in the provider")
                }
                (_, Some(problem)) => format!(", provider capacity unknown: {problem}"),
                _ => String::new(),
            };
            let ceiling = c.ceiling.map(NodeCeiling::note).unwrap_or_default();
            Verdict {
                ok: true,
                reason: ConditionReason::Advertised,
                message: format!(
                    "kata.peerpods.io/vm {} over {} nodes ({range} each){capped}{ceiling}",
                    c.effective, c.selected_nodes
                ),
            }
        }
    }
}

fn condition(
    type_: &str,
    ok: bool,
    reason: ConditionReason,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    Condition {
        type_: type_.into(),
        status: if ok { "True" } else { "False" }.into(),
        reason: reason.as_str().into(),
        message,
        observed_generation: generation,
        last_transition_time: now.clone(),
    }
}

/// The status for `observed`. Conditions whose status did not change keep their lastTransitionTime, so an
/// unchanged cluster yields an identical status and no write.
pub fn compute(
    previous: Option<&PeerPodConfigStatus>,
    observed: &Observed,
    now: Time,
) -> PeerPodConfigStatus {
    let generation = observed.generation;
    let mut conditions = Vec::new();
    let invalid = observed.invalid.as_ref();
    conditions.push(match invalid {
        Some(i) => condition(
            INVALID,
            true,
            ConditionReason::InvalidSpec(i.reason),
            i.message.clone(),
            generation,
            &now,
        ),
        None => condition(
            INVALID,
            false,
            ConditionReason::Valid,
            "spec is valid".into(),
            generation,
            &now,
        ),
    });
    let (ds, hook, cap) = if let Some(i) = invalid {
        let blocked = || Verdict {
            ok: false,
            reason: ConditionReason::Invalid,
            message: i.message.clone(),
        };
        (blocked(), blocked(), blocked())
    } else {
        (
            daemonset_verdict(observed.daemonset.as_ref()),
            webhook_verdict(
                observed.webhook.as_ref(),
                observed.webhook_configuration_problem.as_ref(),
            ),
            capacity_verdict(observed),
        )
    };
    let all_ok = invalid.is_none() && ds.ok && hook.ok && cap.ok;
    let not_ready: Vec<&str> = [
        (DAEMONSET_READY, &ds),
        (WEBHOOK_READY, &hook),
        (CAPACITY_ADVERTISED, &cap),
    ]
    .iter()
    .filter(|(_, v)| !v.ok)
    .map(|(t, _)| *t)
    .collect();
    let ready = if let Some(i) = invalid {
        condition(
            READY,
            false,
            ConditionReason::InvalidSpec(i.reason),
            i.message.clone(),
            generation,
            &now,
        )
    } else if all_ok {
        condition(
            READY,
            true,
            ConditionReason::Ready,
            "peer pods are ready on this cluster".into(),
            generation,
            &now,
        )
    } else {
        condition(
            READY,
            false,
            ConditionReason::NotReady,
            format!("waiting for {}", not_ready.join(", ")),
            generation,
            &now,
        )
    };
    conditions.insert(0, ready);
    for (type_, v) in [
        (DAEMONSET_READY, ds),
        (WEBHOOK_READY, hook),
        (CAPACITY_ADVERTISED, cap),
    ] {
        conditions.push(condition(
            type_, v.ok, v.reason, v.message, generation, &now,
        ));
    }
    if let Some(plugin) = observed.dra_plugin.as_ref().filter(|_| invalid.is_none()) {
        let (ok, reason, message) = dra_plugin_verdict(plugin);
        conditions.push(condition(
            DRA_PLUGIN_READY,
            ok,
            reason,
            message,
            generation,
            &now,
        ));
    }
    // Keep the transition time of conditions whose status stayed the same.
    if let Some(prev) = previous {
        for c in &mut conditions {
            if let Some(old) = prev
                .conditions
                .iter()
                .find(|o| o.type_ == c.type_ && o.status == c.status)
            {
                c.last_transition_time = old.last_transition_time.clone();
            }
        }
    }
    let capacity = observed.capacity.clone().filter(|_| invalid.is_none());
    PeerPodConfigStatus {
        setup_completed: invalid.is_none()
            && observed.objects_applied
            && capacity.as_ref().is_some_and(|c| c.selected_nodes > 0),
        observed_generation: generation,
        requested_limit: capacity.as_ref().map(|c| c.requested),
        provider_free_capacity: capacity.as_ref().and_then(|c| c.provider_free),
        effective_limit: capacity.as_ref().map(|c| c.effective),
        selected_nodes: capacity.as_ref().map(|c| c.selected_nodes),
        per_node_min: capacity.as_ref().and_then(|c| c.per_node_min),
        per_node_max: capacity.as_ref().and_then(|c| c.per_node_max),
        pool_size: capacity.as_ref().and_then(|c| c.pool).map(|p| p.size),
        allocated_slots: capacity.as_ref().and_then(|c| c.pool).map(|p| p.allocated),
        free_slots: capacity
            .as_ref()
            .and_then(|c| c.pool)
            .map(|p| p.size.saturating_sub(p.allocated)),
        conditions,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::status::{Capacity, Pool};
    use crate::validate::{Invalid, InvalidReason};
    use k8s_openapi::api::apps::v1::DaemonSetStatus;

    fn at(seconds: i64) -> Time {
        Time(jiff::Timestamp::from_second(seconds).unwrap())
    }

    fn find<'a>(s: &'a PeerPodConfigStatus, t: &str) -> &'a Condition {
        s.conditions.iter().find(|c| c.type_ == t).unwrap()
    }

    fn ready_daemonset() -> DaemonSet {
        DaemonSet {
            status: Some(DaemonSetStatus {
                desired_number_scheduled: 3,
                number_ready: 3,
                updated_number_scheduled: Some(3),
                ..DaemonSetStatus::default()
            }),
            ..DaemonSet::default()
        }
    }

    fn advertised() -> Observed {
        Observed {
            generation: Some(2),
            capacity: Some(Capacity {
                requested: 10,
                provider_free: None,
                effective: 10,
                selected_nodes: 3,
                per_node_min: Some(3),
                per_node_max: Some(4),
                pool: None,
                ceiling: None,
            }),
            objects_applied: true,
            daemonset: Some(ready_daemonset()),
            ..Observed::default()
        }
    }

    #[test]
    fn invalid_blocks_everything() {
        let observed = Observed {
            invalid: Some(Invalid {
                reason: InvalidReason::InvalidLimit,
                message: "limit \"x\" is not an integer".into(),
            }),
            ..advertised()
        };
        let s = compute(None, &observed, at(1));
        assert_eq!(find(&s, INVALID).status, "True");
        assert_eq!(find(&s, READY).reason, "InvalidLimit");
        assert!(!s.setup_completed);
        assert_eq!(s.effective_limit, None);
    }

    #[test]
    fn setup_completes_before_pods_are_ready() {
        let s = compute(None, &advertised(), at(1));
        assert!(s.setup_completed);
        assert_eq!(
            find(&s, CAPACITY_ADVERTISED).message,
            "kata.peerpods.io/vm 10 over 3 nodes (3-4 each)"
        );
        assert_eq!(find(&s, DAEMONSET_READY).status, "True");
        assert_eq!(find(&s, WEBHOOK_READY).reason, "NotCreated");
        assert_eq!(find(&s, READY).message, "waiting for WebhookReady");
        assert_eq!(s.observed_generation, Some(2));
    }

    #[test]
    fn a_missing_webhook_configuration_is_the_webhook_condition() {
        let observed = Observed {
            webhook_configuration_problem: Some((
                FailureReason::WebhookConfigurationMissing,
                "the chart creates it".into(),
            )),
            ..advertised()
        };
        let s = compute(None, &observed, at(1));
        let webhook = find(&s, WEBHOOK_READY);
        assert_eq!(
            (webhook.status.as_str(), webhook.reason.as_str()),
            ("False", "WebhookConfigurationMissing")
        );
        assert_eq!(webhook.message, "the chart creates it");
        assert_eq!(find(&s, READY).status, "False");
    }

    #[test]
    fn a_dra_pool_shows_its_size_allocated_and_free_slots() {
        let mut observed = advertised();
        if let Some(c) = observed.capacity.as_mut() {
            c.effective = 2;
            c.per_node_min = None;
            c.per_node_max = None;
            c.pool = Some(Pool {
                size: 3,
                allocated: 3,
            });
        }
        let s = compute(None, &observed, at(1));
        assert_eq!(
            (s.pool_size, s.allocated_slots, s.free_slots),
            (Some(3), Some(3), Some(0))
        );
        let capacity = find(&s, CAPACITY_ADVERTISED);
        assert_eq!(capacity.reason, "Published");
        assert_eq!(
            capacity.message,
            "kata.peerpods.io/vm pool of 3 devices (3 allocated, 0 free) for 3 nodes, 1 above the limit kept while allocated"
        );
        // Node mode shows no pool figures.
        let node = compute(None, &advertised(), at(1));
        assert_eq!((node.pool_size, node.free_slots), (None, None));
    }

    #[test]
    fn unchanged_observation_gives_identical_status() {
        let first = compute(None, &advertised(), at(1));
        let second = compute(Some(&first), &advertised(), at(100));
        assert_eq!(first, second);
        let mut changed = advertised();
        changed.daemonset = None;
        let third = compute(Some(&second), &changed, at(200));
        assert_eq!(find(&third, DAEMONSET_READY).last_transition_time, at(200));
        assert_eq!(
            find(&third, CAPACITY_ADVERTISED).last_transition_time,
            at(1)
        );
    }

    #[test]
    fn provider_cap_is_explained() {
        let mut observed = advertised();
        if let Some(c) = observed.capacity.as_mut() {
            c.provider_free = Some(4);
            c.effective = 4;
        }
        let s = compute(None, &observed, at(1));
        assert!(
            find(&s, CAPACITY_ADVERTISED)
                .message
                .contains("capped by 4 free")
        );
        assert_eq!(
            (
                s.requested_limit,
                s.provider_free_capacity,
                s.effective_limit
            ),
            (Some(10), Some(4), Some(4))
        );
    }

    #[test]
    fn the_developer_mode_ceiling_is_explained_in_both_modes() {
        let ceiling = |ceiling, pool| {
            let mut observed = advertised();
            if let Some(c) = observed.capacity.as_mut() {
                c.effective = 3;
                c.per_node_min = Some(1);
                c.per_node_max = Some(1);
                c.pool = pool;
                c.ceiling = ceiling;
            }
            let s = compute(None, &observed, at(1));
            assert_eq!((s.requested_limit, s.effective_limit), (Some(10), Some(3)));
            let c = find(&s, CAPACITY_ADVERTISED).clone();
            (c.status, c.reason, c.message)
        };
        assert_eq!(
            ceiling(Some(NodeCeiling::DeveloperMode), None),
            (
                "True".into(),
                "Advertised".into(),
                "kata.peerpods.io/vm 3 over 3 nodes (1 each), at most 1 per node: cloud-api-adaptor runs in \
                 developer mode"
                    .into()
            )
        );
        let (_, _, unknown) = ceiling(Some(NodeCeiling::DeveloperModeUnknown), None);
        assert!(
            unknown.ends_with(
                ", at most 1 per node: cloud-api-adaptor's developer mode is unknown (PODVM_DEVELOPER_MODE is \
                 not a boolean, or its ConfigMap cannot be read)"
            ),
            "{unknown}"
        );
        let pool = Some(Pool {
            size: 3,
            allocated: 0,
        });
        let (_, reason, message) = ceiling(Some(NodeCeiling::DeveloperMode), pool);
        assert_eq!(reason, "Published");
        assert!(
            message.ends_with(
                "for 3 nodes, at most 1 per node: cloud-api-adaptor runs in developer mode"
            ),
            "{message}"
        );
        let (_, _, off) = ceiling(None, None);
        assert_eq!(off, "kata.peerpods.io/vm 3 over 3 nodes (1 each)");
    }

    #[test]
    fn a_developer_mode_change_is_told_once_for_each_new_mode() {
        use DeveloperMode::{Off, On, Unknown};
        for mode in [Off, On, Unknown] {
            assert_eq!(developer_mode_change(mode, mode), None, "{mode:?}");
        }
        let note = |was, now| developer_mode_change(was, now).unwrap();
        assert!(note(Off, On).starts_with("cloud-api-adaptor's developer mode is now on:"));
        assert!(note(Unknown, Off).starts_with("cloud-api-adaptor's developer mode is now off:"));
        assert!(note(On, Unknown).starts_with("cloud-api-adaptor's developer mode is now unknown"));
        assert_eq!(note(Unknown, On), note(Off, On));
    }

    #[test]
    fn a_paced_rebalance_says_how_far_it_is() {
        let applying = |done, of| Observed {
            applying: Some(Applying { done, of }),
            ..advertised()
        };
        let s = compute(None, &applying(2, 5), at(1));
        let capacity = find(&s, CAPACITY_ADVERTISED);
        assert_eq!(
            (capacity.status.as_str(), capacity.reason.as_str()),
            ("False", "Applying")
        );
        assert_eq!(
            capacity.message,
            "applying capacity: 2 of 5 nodes (kata.peerpods.io/vm 10 over 3 nodes)"
        );
        assert!(find(&s, READY).message.contains(CAPACITY_ADVERTISED));
        assert_eq!(s.effective_limit, Some(10), "the target is shown meanwhile");
        // Every node patched: advertised, as without a rebalance.
        let done = compute(None, &applying(5, 5), at(1));
        assert_eq!(done, compute(None, &advertised(), at(1)));
    }

    #[test]
    fn the_dra_plugin_condition_tells_readiness_and_why_it_drains() {
        let verdict = |plugin: DraPlugin| {
            let (ok, reason, message) = dra_plugin_verdict(&plugin);
            (ok, reason, message)
        };
        assert_eq!(
            verdict(DraPlugin::Serving(Some(Box::new(ready_daemonset())))).1,
            ConditionReason::PodsReady
        );
        let mut half = ready_daemonset();
        if let Some(st) = half.status.as_mut() {
            st.number_ready = 1;
        }
        let (ok, reason, message) = verdict(DraPlugin::Serving(Some(Box::new(half))));
        assert!(!ok);
        assert_eq!(reason, ConditionReason::PodsNotReady);
        assert_eq!(message, "1/3 kubelet plugin pods ready");
        assert_eq!(
            verdict(DraPlugin::Serving(None)).1,
            ConditionReason::NotCreated
        );
        let (ok, reason, message) = verdict(DraPlugin::Draining { claims: 2 });
        assert!(!ok);
        assert_eq!(reason, ConditionReason::DraPluginDraining);
        assert!(message.contains("2 ResourceClaim(s)"), "{message}");
        // Shown only where a plugin is kept, and outside Ready.
        let shown = compute(None, &advertised(), at(1));
        assert!(!shown.conditions.iter().any(|c| c.type_ == DRA_PLUGIN_READY));
        let draining = Observed {
            dra_plugin: Some(DraPlugin::Draining { claims: 1 }),
            ..advertised()
        };
        let status = compute(None, &draining, at(1));
        let c = status
            .conditions
            .iter()
            .find(|c| c.type_ == DRA_PLUGIN_READY)
            .unwrap();
        assert_eq!(c.reason, "DraPluginDraining");
        assert_eq!(status.conditions[0].status, shown.conditions[0].status);
    }
}
