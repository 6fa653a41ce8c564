//! watch → decide → act → record for PeerPods.
//!
//! - A PeerPod being deleted with `peer.pod/finalizer`: `DeleteInstance`, then record (Event, log, metric)
//!   and release exactly that finalizer. The success path costs two API writes (the Event and the finalizer
//!   patch): status is written only when the object outlives the release (another finalizer holds it).
//! - A live PeerPod: delete older PeerPods of the same Pod, which then come back here for cleanup.
//! - Failures keep the finalizer, say why on the object, and retry with per-object backoff.
//!
//! We never add a finalizer of our own: cloud-api-adaptor removes *all* finalizers when it releases a
//! PeerPod, so ours would be gone exactly when we would need it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::{FutureExt, StreamExt};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use peerpods_runtime::backoff::{self, Backoff, Failures};
use peerpods_runtime::health::{self, Health};
use peerpods_runtime::status::apply_status;
use peerpods_runtime::watch;
use tracing::{Instrument, debug, info, info_span, warn};

use crate::Error;
use crate::breaker::{self, Breakers};
use crate::cache::Cache;
use crate::crd::{
    CONDITION_CLEANED, CleanedReason, DO_NOT_DELETE, PeerPod, PeerPodState, PeerPodStatus,
};
use crate::decide::{self, Hold, InProgress, Plan, RELEASE};
use crate::developer_mode::{self, Mode};
use crate::index::OwnerIndex;
use crate::metrics::Metrics;
use crate::provider::{About, DeleteAnswer, Deleted, Provider, Waiting};

/// The field manager of the status the reconciler applies: `status.cleand`, the Cleaned condition, the state
/// and its reason. Reverse collection writes under a manager of its own ([`crate::reverse::FIELD_MANAGER`]).
pub const FIELD_MANAGER: &str = "peerpod-ctrl";

/// Everything a reconcile needs. One per leadership term: a new term starts with fresh watches.
pub struct Context {
    pub client: kube::Client,
    pub provider: Provider,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub backoff: Backoff,
    pub store: Store<PeerPod>,
    pub index: OwnerIndex,
    /// Consecutive failures per PeerPod, for the exponential backoff. Cleared on success and on deletion.
    failures: Failures<ObjectRef<PeerPod>>,
    /// When this controller first saw each PeerPod waiting for cleanup: the release latency is measured
    /// from here (deletionTimestamp has whole seconds only). Cleared when the object is gone.
    deletion_seen: Mutex<HashMap<ObjectRef<PeerPod>, Instant>>,
    /// Deletes provider-service answered "still in progress" for, per PeerPod: when to ask again. Cleared
    /// when the VM is confirmed gone and when the object is gone.
    in_progress: Mutex<HashMap<ObjectRef<PeerPod>, InProgress>>,
    /// Holds DeleteInstance calls back while provider-service or a cloud is down (see `breaker`).
    breakers: Breakers,
    /// When each failing PeerPod's Warning Event was last published.
    reminders: breaker::Reminders<ObjectRef<PeerPod>>,
    /// cloud-api-adaptor's developer mode as last read.
    developer_mode: Mode,
}

impl Context {
    fn deletion_seen(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<PeerPod>, Instant>> {
        self.deletion_seen.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn forget(&self, key: &ObjectRef<PeerPod>) {
        self.failures.forget(key);
    }

    fn in_progress(&self) -> std::sync::MutexGuard<'_, HashMap<ObjectRef<PeerPod>, InProgress>> {
        self.in_progress.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The object is gone: nothing of it is kept.
    fn forget_object(&self, key: &ObjectRef<PeerPod>) {
        self.failures.forget(key);
        self.deletion_seen().remove(key);
        self.in_progress().remove(key);
        self.reminders.retain(|k| k != key);
    }

    /// After a re-list: forgets every object the new list did not bring back. Its Delete event was missed (the
    /// watch was down meanwhile), so nothing else would ever forget it.
    fn forget_absent(&self, listed: impl Fn(&ObjectRef<PeerPod>) -> bool) {
        self.failures.retain(|key| listed(key));
        self.deletion_seen().retain(|key, _| listed(key));
        self.in_progress().retain(|key, _| listed(key));
        self.reminders.retain(|key| listed(key));
    }
}

/// Settings of the reconciler.
#[derive(Debug, Clone)]
pub struct ReconcilerSettings {
    /// Reconciles in flight at once.
    pub concurrency: u16,
    pub backoff: Backoff,
}

/// Watches PeerPods in all namespaces and reconciles them until the future is dropped (leadership lost), or
/// `drain` completes and the reconciles running then have finished.
#[expect(
    clippy::too_many_arguments,
    reason = "what one leadership term is made of, each passed on once by controller::run"
)]
pub async fn run(
    client: kube::Client,
    provider: Provider,
    recorder: Recorder,
    metrics: Metrics,
    settings: ReconcilerSettings,
    developer_mode: Mode,
    store_out: Option<tokio::sync::watch::Sender<Option<Store<PeerPod>>>>,
    health: Option<Health>,
    drain: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<PeerPod> = Api::all(client.clone());
    // Liveness and readiness follow this watch (peerpods_runtime::health); the heartbeat shows an idle one is
    // still connected.
    let progress = health.map(|h| h.track(WATCH));
    let heartbeat = match &progress {
        Some(p) => health::heartbeat(api.clone(), p.clone()).left_future(),
        None => std::future::pending().right_future(),
    };
    let mut cache = Cache::default();
    let store = cache.store();
    let ctx = Arc::new(Context {
        client,
        provider,
        recorder,
        metrics,
        backoff: settings.backoff,
        store: store.clone(),
        index: cache.index(),
        failures: Failures::default(),
        deletion_seen: Mutex::default(),
        in_progress: Mutex::default(),
        breakers: Breakers::default(),
        reminders: breaker::Reminders::default(),
        developer_mode: developer_mode.clone(),
    });
    if let Some(tx) = store_out {
        // The orphan scanner reads the same cache instead of keeping a second copy of every PeerPod.
        tx.send_replace(Some(store.clone()));
    }
    let forget = ctx.clone();
    let listed = store.clone();
    // A streaming list (watch with initial events) instead of paged LISTs: the objects arrive one by one, so
    // no page of hundreds of full PeerPods (managedFields included) is ever held at once. 10,000 PeerPods:
    // 43 MiB → 41.5 MiB peak RSS (make bench).
    // Backoff that only progress resets (an `Init` before a failing start is none: peerpods_runtime::watch).
    let trigger = watch::backoff(watcher(api, watcher::Config::default().streaming_lists()))
        .modify(decide::keep_what_is_read)
        .filter_map(move |event| {
            if let Some(p) = &progress {
                p.observe(&event);
            }
            let request = match event {
                Ok(event) => {
                    if let watcher::Event::Delete(p) = &event {
                        forget.forget_object(&ObjectRef::from_obj(p));
                    }
                    let request = cache.apply(&event).map(Ok);
                    if let watcher::Event::InitDone = &event {
                        // The cache now holds exactly the new list.
                        forget.forget_absent(|key| listed.get(key).is_some());
                    }
                    request
                }
                Err(error) => Some(Err(error)),
            };
            std::future::ready(request)
        });
    let controller = Controller::for_stream(trigger, store)
        .with_config(ControllerConfig::default().concurrency(settings.concurrency))
        // A change of developer mode changes the plan of every PeerPod being deleted: switched off, the held
        // cleanups resume; switched on, the ones failing meanwhile turn into holds.
        .reconcile_all_on(developer_mode.changes())
        // Once `drain` completes: no new reconcile starts, and the run ends when the running ones are done (a
        // DeleteInstance answered is then also recorded and its finalizer released, not abandoned).
        .graceful_shutdown_on(drain)
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            if let Err(error) = result {
                // Reconcile errors were recorded in reconcile(); these are watch/queue errors.
                debug!(%error, "controller stream");
            }
        });
    // The heartbeat never ends; the controller decides how long this runs.
    tokio::select! {
        () = controller => {}
        () = heartbeat => {}
    }
}

/// Name of the PeerPod watch on `/healthz` and `/readyz`.
pub const WATCH: &str = "watch/peerpods";

async fn reconcile(peerpod: Arc<PeerPod>, ctx: Arc<Context>) -> Result<Action, Error> {
    let span = info_span!(
        "reconcile",
        namespace = %peerpod.namespace().unwrap_or_default(),
        name = %peerpod.name_any(),
    );
    async move {
        ctx.metrics.reconciles.inc();
        let key = ObjectRef::from_obj(peerpod.as_ref());
        // The facts the plan is made of. Only a PeerPod being deleted is compared with the rest of the cache.
        let namesake = match peerpod.metadata.deletion_timestamp {
            Some(_) => ctx
                .store
                .find(|other| decide::is_live_namesake(&peerpod, other)),
            None => None,
        };
        let progress = ctx.in_progress().get(&key).cloned();
        let plan = decide::plan(
            &peerpod,
            namesake.as_deref(),
            progress.as_ref(),
            Instant::now(),
            ctx.developer_mode.current(),
        );
        let cleanup = plan.is_cleanup();
        let result = match plan {
            Plan::ReapStale => {
                if decide::release_ask(&peerpod).is_some() {
                    release_ignored(&peerpod, &ctx).await;
                }
                reap_stale(&peerpod, &ctx).await
            }
            Plan::Nothing => {
                debug!("released by cloud-api-adaptor; nothing to do");
                Ok(Action::await_change())
            }
            Plan::Hold(Hold::Invalid(why)) => Err(Error::InvalidInstance(why)),
            Plan::Hold(Hold::DoNotDelete) => hold(&peerpod, &ctx).await,
            Plan::Hold(Hold::DeveloperMode) => developer_hold(&peerpod, &ctx).await,
            Plan::Hold(Hold::DeveloperModeUnknown) => Err(Error::DeveloperModeUnknown),
            Plan::Hold(Hold::UnknownRelease(value)) => {
                let why = format!("{value:?} is not a value it knows (operator or instance-gone)");
                release_refused(&peerpod, &ctx, CleanedReason::UnknownReleaseValue, &why).await
            }
            Plan::ReleaseByOperator {
                provider,
                instance_id,
            } => release_by_operator(&peerpod, &ctx, &provider, &instance_id).await,
            Plan::Release {
                provider,
                instance_id,
                by,
            } => release_still_referenced(&peerpod, &ctx, &provider, &instance_id, &by).await,
            Plan::Wait { until, .. } => {
                debug!("provider-service is deleting the VM; asking again later");
                Ok(Action::requeue(
                    until.saturating_duration_since(Instant::now()),
                ))
            }
            Plan::ConfirmGone {
                provider,
                instance_id,
            } => match still_listed(&ctx, &provider, &instance_id).await {
                Err(error) => Err(error),
                Ok(true) => {
                    let why = "instance-gone, but provider-service still lists the instance";
                    release_refused(&peerpod, &ctx, CleanedReason::InstanceStillListed, why).await
                }
                // Not listed: provider-service's DeleteInstance is the judge of gone (it waits out the
                // cloud's consistency window), as for any cleanup.
                Ok(false) => {
                    planned_delete(
                        &peerpod,
                        &ctx,
                        &key,
                        progress,
                        (&provider, &instance_id, false),
                    )
                    .await
                }
            },
            Plan::Delete {
                provider,
                instance_id,
                in_progress,
            } => {
                planned_delete(
                    &peerpod,
                    &ctx,
                    &key,
                    progress,
                    (&provider, &instance_id, in_progress),
                )
                .await
            }
        };
        match result {
            Ok(action) => {
                ctx.forget(&key);
                Ok(action)
            }
            // Someone else changed the finalizers meanwhile: not a failure, nothing to record; re-read.
            Err(Error::FinalizerConflict) => {
                debug!("finalizers changed concurrently; re-reading");
                Err(Error::FinalizerConflict)
            }
            Err(error) => {
                record_failure(&peerpod, &ctx, &error, cleanup).await;
                Err(error)
            }
        }
    }
    .instrument(span)
    .await
}

/// Carries out [`Plan::Delete`] for `(provider, instance_id, in_progress)`.
async fn planned_delete(
    peerpod: &PeerPod,
    ctx: &Context,
    key: &ObjectRef<PeerPod>,
    progress: Option<InProgress>,
    (provider, instance_id, in_progress): (&str, &str, bool),
) -> Result<Action, Error> {
    // The cache may lag a restore that made a live copy of this PeerPod a moment ago. Before the
    // first delete request, a consistent read of the PeerPods naming the instance narrows that race
    // to the time between this read and the cloud's accepting the delete.
    if !in_progress && let Some(by) = live_namesake_by_quorum(peerpod, ctx, instance_id).await? {
        return release_still_referenced(peerpod, ctx, provider, instance_id, &by).await;
    }
    let seen = *ctx
        .deletion_seen()
        .entry(key.clone())
        .or_insert_with(Instant::now);
    let target = Target {
        provider,
        instance_id,
        in_progress: progress.filter(|_| in_progress),
        deletion_seen: seen,
    };
    delete_instance(peerpod, ctx, key, target).await
}

/// Whether provider-service lists `instance_id` among `provider`'s VMs (compared by [`decide::instance_key`]).
/// Only ever a reason to keep a VM: a VM not listed is not yet proven gone.
async fn still_listed(ctx: &Context, provider: &str, instance_id: &str) -> Result<bool, Error> {
    let wanted = decide::instance_key(provider, instance_id);
    let listed = ctx
        .provider
        .instances(provider, &std::collections::BTreeMap::new())
        .await?;
    Ok(listed
        .iter()
        .any(|vm| decide::instance_key(provider, &vm.instance_id) == wanted))
}

/// Per-object exponential backoff. Counting happens here because kube calls `error_policy` exactly once
/// per failed reconcile.
fn error_policy(peerpod: Arc<PeerPod>, error: &Error, ctx: Arc<Context>) -> Action {
    if matches!(error, Error::FinalizerConflict) {
        // Not a failure of anything (and not counted as one): re-read soon and decide again.
        return Action::requeue(Duration::from_millis(200));
    }
    if let Error::CircuitOpen { retry_in, .. } = error {
        // Held back, not failed: the PeerPod's own backoff does not grow, or it would come back minutes after
        // provider-service did. Spread over one more wait, so the held PeerPods do not return together.
        return Action::requeue(breaker::held_delay(*retry_in, backoff::jitter()));
    }
    let key = ObjectRef::from_obj(peerpod.as_ref());
    let failures = ctx.failures.record(key);
    // Full jitter from a fresh draw: PeerPods that failed together (an outage) retry spread over the window.
    let delay = ctx.backoff.delay(
        failures,
        error.is_permanent(),
        error.retry_after(),
        backoff::jitter(),
    );
    Action::requeue(delay)
}

/// The VM a [`Plan::Delete`] is about, and what this controller knows of its delete so far.
struct Target<'a> {
    provider: &'a str,
    instance_id: &'a str,
    /// provider-service answered in progress before: its delete runs on there.
    in_progress: Option<InProgress>,
    deletion_seen: Instant,
}

/// Carries out [`Plan::Delete`]: asks provider-service, then releases the finalizer once the VM is confirmed
/// gone, or, while provider-service is still deleting it, keeps the finalizer, says so on the object and asks
/// again after its advice (backing off while the answer stays the same).
async fn delete_instance(
    peerpod: &PeerPod,
    ctx: &Context,
    key: &ObjectRef<PeerPod>,
    target: Target<'_>,
) -> Result<Action, Error> {
    let Target {
        provider,
        instance_id,
        in_progress,
        deletion_seen,
    } = target;
    let namespace = peerpod.namespace().unwrap_or_default();
    let name = peerpod.name_any();
    let about = About {
        namespace: &namespace,
        name: &name,
        reason: "PeerPodDeleted",
    };
    let call = ctx.provider.delete_instance(provider, instance_id, about);
    let answer = match breaker::guarded(&ctx.breakers, provider, call).await {
        Ok(answer) => answer,
        Err(error) => {
            ctx.metrics.instance_delete(provider, error.reason());
            return Err(error);
        }
    };
    // What the last in-progress answer waited for, as the condition it wrote says: the cloud to show the VM,
    // or its delete.
    let waited_to_show = peerpod.cleaned_condition().is_some_and(|c| {
        CleanedReason::parse(&c.reason) == Some(CleanedReason::InstanceNotYetVisible)
    });
    let outcome = match answer {
        // Gone once the cloud's window passed without showing the VM: it was already gone, nothing deleted it.
        DeleteAnswer::Gone(outcome) => {
            decide::confirmed(outcome, in_progress.is_some() && !waited_to_show)
        }
        // A wait, whatever it waits for: counted as in progress, never as a failure (no Warning, and the
        // breaker saw an answer).
        DeleteAnswer::InProgress {
            retry_after,
            waiting,
        } => {
            ctx.metrics.instance_delete(provider, "in_progress");
            let now = Instant::now();
            let wall_clock = jiff::Timestamp::now();
            // The same wait goes on (its start, its backoff); another one starts afresh. Not yet visible, it
            // started when provider-service first missed the VM.
            let same = waited_to_show == matches!(waiting, Waiting::NotYetVisible { .. });
            let started = match waiting {
                Waiting::NotYetVisible {
                    unknown_for: Some(unknown_for),
                } => wall_clock.checked_sub(unknown_for).unwrap_or(wall_clock),
                _ => wall_clock,
            };
            let next = decide::after_in_progress(
                in_progress.as_ref().filter(|_| same),
                provider,
                instance_id,
                retry_after,
                &ctx.backoff,
                decide::seed(&namespace, &name),
                now,
                started,
            );
            let wait = next.ask_again_at.saturating_duration_since(now);
            let since = next.since;
            let asks = next.asks;
            ctx.in_progress().insert(key.clone(), next);
            let waited = Waited {
                waiting,
                since,
                asks,
            };
            return delete_in_progress(peerpod, ctx, provider, instance_id, waited, wait).await;
        }
    };
    ctx.in_progress().remove(key);
    ctx.metrics.instance_delete(provider, outcome.label());
    let message = match outcome {
        Deleted::Deleted => format!("Deleted {provider} instance {instance_id}"),
        Deleted::AlreadyGone => format!("{provider} instance {instance_id} was already gone"),
    };
    info!(
        provider,
        instance_id,
        result = outcome.label(),
        "instance confirmed gone; releasing finalizer"
    );
    let api: Api<PeerPod> = Api::namespaced(ctx.client.clone(), &namespace);
    // With only our finalizer the object vanishes once it is released: the Event and the log line carry
    // the outcome. Held by another finalizer, it stays, and its status says it is cleaned.
    if decide::outlives_release(peerpod.finalizers())
        && !set_cleaned(&api, peerpod, true, outcome.reason(), &message).await?
    {
        return Ok(Action::await_change());
    }
    publish(
        ctx,
        peerpod,
        EventType::Normal,
        outcome.reason().as_str(),
        "DeleteInstance",
        message,
    )
    .await;
    release_finalizer(&api, peerpod).await?;
    ctx.metrics
        .finalizer_release_seconds
        .observe(deletion_seen.elapsed().as_secs_f64());
    // The watch's Delete event forgets the object too; this covers one still held by another finalizer.
    ctx.deletion_seen().remove(&ObjectRef::from_obj(peerpod));
    Ok(Action::await_change())
}

/// What an in-progress delete waits for, since when (the first answer of this wait) and how many answers said so.
struct Waited {
    waiting: Waiting,
    since: jiff::Timestamp,
    asks: u32,
}

/// The VM is not confirmed gone and nothing failed: provider-service is still deleting it (its delete runs on
/// there, whatever this controller does), or the cloud does not show it yet, inside its consistency window. The
/// finalizer stays, the Cleaned condition says what it waits for and since when (DeleteInProgress or
/// InstanceNotYetVisible; written, and a Normal Event published, once when the wait begins: its message does not
/// change while it lasts), and the next ask comes after `wait`.
async fn delete_in_progress(
    peerpod: &PeerPod,
    ctx: &Context,
    provider: &str,
    instance_id: &str,
    waited: Waited,
    wait: Duration,
) -> Result<Action, Error> {
    let Waited {
        waiting,
        since,
        asks,
    } = waited;
    let reason = waiting_reason(waiting);
    let message = match waiting {
        Waiting::CloudDeleting => {
            info!(
                provider,
                instance_id,
                asks,
                wait_ms = wait.as_millis() as u64,
                "provider-service is still deleting the instance; finalizer kept, asking again later"
            );
            format!(
                "provider-service is deleting {provider} instance {instance_id} (since {since}); the finalizer \
                 stays until the VM is confirmed gone"
            )
        }
        Waiting::NotYetVisible { unknown_for } => {
            info!(
                provider,
                instance_id,
                asks,
                unknown_for_ms = unknown_for.map(|d| d.as_millis() as u64),
                wait_ms = wait.as_millis() as u64,
                "the cloud does not show the instance yet; finalizer kept, asking again later"
            );
            format!(
                "waiting for the cloud to show {provider} instance {instance_id}: not shown since {since}, within \
                 the cloud's consistency window (a new VM may not show everywhere at once); the finalizer stays \
                 until the VM is deleted, or confirmed gone once the window has passed"
            )
        }
    };
    let entering = peerpod
        .cleaned_condition()
        .is_none_or(|c| CleanedReason::parse(&c.reason) != Some(reason) || c.message != message);
    let api: Api<PeerPod> =
        Api::namespaced(ctx.client.clone(), &peerpod.namespace().unwrap_or_default());
    if !set_condition(&api, peerpod, Cleaned::pending(reason), &message).await? {
        return Ok(Action::await_change());
    }
    if entering {
        publish(
            ctx,
            peerpod,
            EventType::Normal,
            reason.as_str(),
            "DeleteInstance",
            message,
        )
        .await;
    }
    Ok(Action::requeue(wait))
}

/// A PeerPod annotated `peerpods.io/do-not-delete` is being deleted: its VM stays and so does the finalizer,
/// and the object says why. Nothing is retried: removing the annotation is a change that reconciles again.
async fn hold(peerpod: &PeerPod, ctx: &Context) -> Result<Action, Error> {
    let message = format!(
        "Annotation {DO_NOT_DELETE} is set: {} instance {} is not deleted and the finalizer stays; remove the \
         annotation (or set it to false) to let the cleanup proceed",
        peerpod.spec.cloud_provider, peerpod.spec.instance_id
    );
    warn!(
        provider = %peerpod.spec.cloud_provider,
        instance_id = %peerpod.spec.instance_id,
        "PeerPod marked do-not-delete; keeping its VM and finalizer"
    );
    let event = Some((EventType::Warning, "DeleteInstance"));
    keep_held(peerpod, ctx, CleanedReason::DoNotDelete, event, message).await
}

/// Keeps a PeerPod being deleted as it is, its VM and its finalizer, for `reason`: the condition says so and,
/// when `event` names its type and action, an Event too. Nothing is retried: what ends the hold is a change that
/// reconciles again.
async fn keep_held(
    peerpod: &PeerPod,
    ctx: &Context,
    reason: CleanedReason,
    event: Option<(EventType, &str)>,
    message: String,
) -> Result<Action, Error> {
    let namespace = peerpod.namespace().unwrap_or_default();
    let api: Api<PeerPod> = Api::namespaced(ctx.client.clone(), &namespace);
    if !set_condition(&api, peerpod, Cleaned::held(reason), &message).await? {
        return Ok(Action::await_change());
    }
    if let Some((event_type, action)) = event {
        publish(ctx, peerpod, event_type, reason.as_str(), action, message).await;
    }
    Ok(Action::await_change())
}

/// cloud-api-adaptor runs in developer mode: it keeps a failed pod's VM for debugging and holds the finalizer
/// on purpose. The VM and the finalizer stay; the condition (reason DeveloperMode, state Held) and a Normal Event
/// name the VM, the Event once when the hold begins. Nothing is retried: switching the mode off reconciles every
/// PeerPod (`developer_mode`), and this one's cleanup resumes.
async fn developer_hold(peerpod: &PeerPod, ctx: &Context) -> Result<Action, Error> {
    let (provider, instance_id) = (&peerpod.spec.cloud_provider, &peerpod.spec.instance_id);
    let message = format!(
        "cloud-api-adaptor runs in developer mode ({} in its ConfigMap): {provider} instance {instance_id} is \
         kept for debugging and the finalizer stays; switch the mode off to let the cleanup proceed",
        developer_mode::KEY
    );
    let entering = peerpod.cleaned_condition().is_none_or(|c| {
        CleanedReason::parse(&c.reason) != Some(CleanedReason::DeveloperMode)
            || c.message != message
    });
    if entering {
        info!(%provider, %instance_id, "developer mode: keeping the VM and the finalizer");
    }
    let event = entering.then_some((EventType::Normal, "DeleteInstance"));
    keep_held(peerpod, ctx, CleanedReason::DeveloperMode, event, message).await
}

/// Another PeerPod that is not being deleted names the same VM: deleting it would take the VM from under
/// that one. The PeerPod being deleted is released without a DeleteInstance call; the condition (written
/// first, so it is there while the object still is) and the Event name the live PeerPod.
/// A live PeerPod naming the same instance, read from the API server with a consistent read (never from
/// the cache): `namespace/name`, if any. The field selector is served by the CRD's selectable field
/// `spec.instanceID`; the kernel then compares by instance identity.
async fn live_namesake_by_quorum(
    peerpod: &PeerPod,
    ctx: &Context,
    instance_id: &str,
) -> Result<Option<String>, Error> {
    let api: Api<PeerPod> = Api::all(ctx.client.clone());
    // No resourceVersion: the API server answers from its latest state (a consistent read), not a cache.
    let params = kube::api::ListParams::default().fields(&format!("spec.instanceID={instance_id}"));
    let listed = api.list(&params).await?;
    let facts = decide::facts(peerpod);
    Ok(listed
        .items
        .iter()
        .map(decide::facts)
        .find(|other| peerpods_protocol::decide::is_live_namesake(&facts, other))
        .map(|other| other.name))
}

async fn release_still_referenced(
    peerpod: &PeerPod,
    ctx: &Context,
    provider: &str,
    instance_id: &str,
    by: &str,
) -> Result<Action, Error> {
    let message = format!(
        "{provider} instance {instance_id} is not deleted: PeerPod {by} still names it and is not being \
         deleted; releasing the finalizer without deleting the VM"
    );
    info!(
        provider,
        instance_id,
        referenced_by = by,
        "instance still referenced; releasing finalizer without deleting it"
    );
    release_without_delete(
        peerpod,
        ctx,
        CleanedReason::InstanceStillReferenced,
        EventType::Normal,
        message,
    )
    .await
}

/// The operator asked (annotation `peerpods.io/release: operator`) to release a PeerPod being deleted without
/// deleting its VM, and answers for the VM. The VM is left as it is; the condition (written first) and a Warning
/// Event name the operator's choice and the VM, and a log line records it.
async fn release_by_operator(
    peerpod: &PeerPod,
    ctx: &Context,
    provider: &str,
    instance_id: &str,
) -> Result<Action, Error> {
    let message = format!(
        "Annotation {RELEASE}: operator: releasing the finalizer WITHOUT deleting {provider} instance \
         {instance_id}; the operator answers for that VM"
    );
    warn!(
        provider,
        instance_id, "released by the operator; the VM is not deleted"
    );
    release_without_delete(
        peerpod,
        ctx,
        CleanedReason::ReleasedByOperator,
        EventType::Warning,
        message,
    )
    .await
}

/// Releases the finalizer of a PeerPod being deleted whose VM is deliberately not deleted (`reason`): the
/// condition first (so the reason outlives a failed release), then the Event, then the release.
async fn release_without_delete(
    peerpod: &PeerPod,
    ctx: &Context,
    reason: CleanedReason,
    event_type: EventType,
    message: String,
) -> Result<Action, Error> {
    let namespace = peerpod.namespace().unwrap_or_default();
    let api: Api<PeerPod> = Api::namespaced(ctx.client.clone(), &namespace);
    if !set_condition(
        &api,
        peerpod,
        Cleaned::done_without_delete(reason),
        &message,
    )
    .await?
    {
        return Ok(Action::await_change());
    }
    publish(
        ctx,
        peerpod,
        event_type,
        reason.as_str(),
        "ReleaseFinalizer",
        message,
    )
    .await;
    release_finalizer(&api, peerpod).await?;
    ctx.deletion_seen().remove(&ObjectRef::from_obj(peerpod));
    Ok(Action::await_change())
}

/// The `peerpods.io/release` annotation asks for what cannot be done safely (`reason`): nothing is deleted or
/// released, and the condition and a Warning Event say why. Nothing is retried: changing the annotation
/// reconciles again.
async fn release_refused(
    peerpod: &PeerPod,
    ctx: &Context,
    reason: CleanedReason,
    why: &str,
) -> Result<Action, Error> {
    let (provider, instance_id) = (&peerpod.spec.cloud_provider, &peerpod.spec.instance_id);
    let message = format!(
        "Annotation {RELEASE}: {why}: {provider} instance {instance_id} is neither deleted nor released and \
         the finalizer stays; set it to operator to release without a delete, or remove it"
    );
    warn!(%provider, %instance_id, reason = reason.as_str(), "release annotation not acted on");
    let event = Some((EventType::Warning, "ReleaseFinalizer"));
    keep_held(peerpod, ctx, reason, event, message).await
}

/// `peerpods.io/release` on a PeerPod that is not being deleted: ignored (it never deletes the PeerPod), said by
/// a Warning Event and a log line, so that a release asked too early is not mistaken for one done.
async fn release_ignored(peerpod: &PeerPod, ctx: &Context) {
    let message = format!(
        "Annotation {RELEASE} is ignored: the PeerPod is not being deleted; it takes effect once it is"
    );
    warn!("release annotation on a live PeerPod ignored");
    publish(
        ctx,
        peerpod,
        EventType::Warning,
        REASON_RELEASE_IGNORED,
        "ReleaseFinalizer",
        message,
    )
    .await;
}

/// Event reason of `peerpods.io/release` on a PeerPod that is not being deleted.
pub const REASON_RELEASE_IGNORED: &str = "ReleaseIgnored";
/// Condition reason (and Event reason) of a PeerPod the operator released without a delete.
pub const REASON_RELEASED_BY_OPERATOR: &str = CleanedReason::ReleasedByOperator.as_str();
/// Condition reason (and Event reason) of `peerpods.io/release: instance-gone` on a PeerPod whose VM provider-service
/// still lists: the VM is neither deleted nor released.
pub const REASON_INSTANCE_STILL_LISTED: &str = CleanedReason::InstanceStillListed.as_str();
/// Condition reason (and Event reason) of a `peerpods.io/release` value that is not known.
pub const REASON_RELEASE_UNKNOWN: &str = CleanedReason::UnknownReleaseValue.as_str();

/// Condition reason (and Event reason) of a PeerPod released without deleting its VM, because a live PeerPod
/// still names the VM.
pub const REASON_STILL_REFERENCED: &str = CleanedReason::InstanceStillReferenced.as_str();
/// Condition reason (and Event reason) of a PeerPod whose cleanup is held by the do-not-delete annotation.
pub const REASON_DO_NOT_DELETE: &str = CleanedReason::DoNotDelete.as_str();
/// Condition reason (and Event reason) of a PeerPod whose VM is kept because cloud-api-adaptor runs in developer
/// mode ([`Hold::DeveloperMode`]).
pub const REASON_DEVELOPER_MODE: &str = CleanedReason::DeveloperMode.as_str();
/// Condition reason (and Event reason) of a PeerPod whose VM provider-service is still deleting: the finalizer
/// stays and provider-service is asked again after its retry advice.
pub const REASON_DELETE_IN_PROGRESS: &str = CleanedReason::DeleteInProgress.as_str();
/// Condition reason (and Event reason) of a PeerPod whose VM the cloud does not show yet, inside its consistency
/// window: a wait, not a failure; the finalizer stays and provider-service is asked again after its retry advice.
pub const REASON_NOT_YET_VISIBLE: &str = CleanedReason::InstanceNotYetVisible.as_str();

/// The condition and Event reason of a wait provider-service answered.
fn waiting_reason(waiting: Waiting) -> CleanedReason {
    match waiting {
        Waiting::CloudDeleting => CleanedReason::DeleteInProgress,
        Waiting::NotYetVisible { .. } => CleanedReason::InstanceNotYetVisible,
    }
}

/// Removes exactly our finalizer, failing (not guessing) when the list changed since we read it.
async fn release_finalizer(api: &Api<PeerPod>, peerpod: &PeerPod) -> Result<(), Error> {
    let Some(patch) = decide::release_finalizer_patch(peerpod.finalizers()) else {
        return Ok(());
    };
    match api
        .patch(
            &peerpod.name_any(),
            &PatchParams::default(),
            &Patch::Json::<()>(patch),
        )
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(()),
        // A failed `test` op is 422 Invalid; a resourceVersion race is 409.
        Err(kube::Error::Api(status)) if status.is_invalid() || status.is_conflict() => {
            Err(Error::FinalizerConflict)
        }
        Err(e) => Err(e.into()),
    }
}

/// What the Cleaned condition and `status.cleand` say.
#[derive(Debug, Clone, Copy)]
struct Cleaned {
    /// The condition's status: the cleanup of this PeerPod is done.
    done: bool,
    /// `status.cleand`: the VM is confirmed gone.
    vm_gone: bool,
    reason: CleanedReason,
}

impl Cleaned {
    /// The cleanup waits for an operator: the VM stays, so does the finalizer.
    fn held(reason: CleanedReason) -> Self {
        Cleaned {
            done: false,
            vm_gone: false,
            reason,
        }
    }

    /// The VM is not confirmed gone yet, and nobody needs to act: the finalizer stays.
    fn pending(reason: CleanedReason) -> Self {
        Cleaned {
            done: false,
            vm_gone: false,
            reason,
        }
    }

    /// The cleanup is done, but the VM was deliberately not deleted.
    fn done_without_delete(reason: CleanedReason) -> Self {
        Cleaned {
            done: true,
            vm_gone: false,
            reason,
        }
    }
}

/// Writes `status.cleand` and the Cleaned condition when they differ from what is there. Returns false when
/// the PeerPod no longer exists.
async fn set_cleaned(
    api: &Api<PeerPod>,
    peerpod: &PeerPod,
    cleaned: bool,
    reason: CleanedReason,
    message: &str,
) -> Result<bool, Error> {
    let state = Cleaned {
        done: cleaned,
        vm_gone: cleaned,
        reason,
    };
    set_condition(api, peerpod, state, message).await
}

/// Writes `state` when it differs from what is there. Returns false when the PeerPod no longer exists.
async fn set_condition(
    api: &Api<PeerPod>,
    peerpod: &PeerPod,
    state: Cleaned,
    message: &str,
) -> Result<bool, Error> {
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
        return Ok(true);
    }
    let last_transition_time = match current {
        Some(c) if c.status == status_value => c.last_transition_time.clone(),
        _ => Time(jiff::Timestamp::now()),
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
    .or_else(|| (!done).then(|| Time(jiff::Timestamp::now())));
    // The words `kubectl get` shows follow the condition, so every writer of it keeps them in step.
    let status = PeerPodStatus {
        waiting_since,
        cleand: cleaned,
        conditions,
        observed_generation: generation,
        state: PeerPodState::of_cleanup(done, reason),
        reason: Some(reason.as_str().to_string()),
        last_attempt_time: Some(Time(jiff::Timestamp::now())),
        // Reverse collection's, under its own field manager: not sent, so this apply leaves it alone.
        matched_instance: None,
    };
    // Forced (see `apply_status`): state, reason and lastAttemptTime are shared with reverse collection's
    // field manager, the later write of the two wins by design, and PeerPods written by versions that
    // merge-patched their status have these fields under that older Update manager.
    match apply_status(api, &peerpod.name_any(), FIELD_MANAGER, &status, None).await {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(status)) if status.is_not_found() => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Makes a failure visible: metric always; condition and Event when the PeerPod is waiting for cleanup.
/// `cleanup`: the PeerPod waits for its cleanup (the plan said so).
async fn record_failure(peerpod: &PeerPod, ctx: &Context, error: &Error, cleanup: bool) {
    if let Error::CircuitOpen { .. } = error {
        // Not this PeerPod's failure: the breaker's opening was logged, counted and recorded on the PeerPod
        // whose call opened it. Writing it on every held PeerPod is the write storm the breaker prevents.
        debug!(%error, "held back while provider-service or its cloud is down");
        return;
    }
    ctx.metrics.reconcile_error(error.reason());
    warn!(reason = error.reason(), %error, "reconcile failed");
    if !cleanup {
        return;
    }
    // One status write and one Event per change of failure class, not per attempt: a retry that fails the same
    // way has nothing new to say (the metric and the log count the attempts).
    let key = ObjectRef::from_obj(peerpod);
    let message = format!("Instance not deleted yet, finalizer kept: {error}");
    if breaker::same_failure_recorded(peerpod, error.reason()) {
        // The Event repeats (a series update, kube's aggregation) at most every breaker::EVENT_REPEAT.
        if ctx.reminders.due(&key, Instant::now()) {
            publish(
                ctx,
                peerpod,
                EventType::Warning,
                error.reason(),
                "DeleteInstance",
                message,
            )
            .await;
        }
        return;
    }
    let api: Api<PeerPod> =
        Api::namespaced(ctx.client.clone(), &peerpod.namespace().unwrap_or_default());
    if let Err(e) = set_cleaned(&api, peerpod, false, error.cleaned_reason(), &message).await {
        warn!(error = %e, "cannot record the failure in status");
    }
    ctx.reminders.published(&key, Instant::now());
    publish(
        ctx,
        peerpod,
        EventType::Warning,
        error.reason(),
        "DeleteInstance",
        message,
    )
    .await;
}

/// Deletes PeerPods of the same Pod that are older than this one: they belong to a sandbox that is gone.
async fn reap_stale(peerpod: &PeerPod, ctx: &Context) -> Result<Action, Error> {
    let Some(owner) = decide::controlling_owner_uid(peerpod) else {
        info!("PeerPod has no controlling owner; not comparing it with other PeerPods");
        return Ok(Action::await_change());
    };
    let siblings: Vec<Arc<PeerPod>> = ctx
        .index
        .owned_by(owner)
        .iter()
        .filter_map(|key| ctx.store.get(key))
        .filter(|p| p.uid() != peerpod.uid())
        .collect();
    if siblings.is_empty() {
        return Ok(Action::await_change());
    }
    let mut group: Vec<&PeerPod> = siblings.iter().map(Arc::as_ref).collect();
    group.push(peerpod);
    for stale in decide::stale_peerpods(&group) {
        let api: Api<PeerPod> =
            Api::namespaced(ctx.client.clone(), &stale.namespace().unwrap_or_default());
        // The UID precondition makes sure we delete the object we compared, never a namesake created since.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: stale.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        match api.delete(&stale.name_any(), &params).await {
            Ok(_) => {
                ctx.metrics.stale_peerpods_deleted.inc();
                info!(stale = %stale.name_any(), "deleted older PeerPod of the same Pod");
                let note = format!(
                    "A newer PeerPod of the same Pod exists ({}); deleting this one so its VM is reaped",
                    peerpod.name_any()
                );
                publish(
                    ctx,
                    stale,
                    EventType::Normal,
                    "StalePeerPodDeleted",
                    "DeletePeerPod",
                    note,
                )
                .await;
            }
            Err(kube::Error::Api(status)) if status.is_not_found() || status.is_conflict() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Action::await_change())
}

async fn publish(
    ctx: &Context,
    peerpod: &PeerPod,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let event = Event {
        type_,
        reason: reason.to_string(),
        note: Some(note),
        action: action.to_string(),
        secondary: None,
    };
    if let Err(error) = ctx.recorder.publish(&event, &peerpod.object_ref(&())).await {
        // Events are best effort: the condition and the metric carry the same information.
        warn!(%error, reason, "cannot publish Event");
    }
}
