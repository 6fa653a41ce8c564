//! One PeerPodConfig applied: the owned objects and the webhook's entry in the chart's webhook configuration,
//! node capacity (patched at the configured pace, its progress in the status) or in capacityMode dra the pool,
//! then the status, Events and metrics.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment};
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use peerpods_protocol::decide::DeveloperMode;
use tracing::{info, warn};

use super::owned::{current, ensure, ensure_cluster, remember_nodes};
use super::pool::{publish_pool, withdraw_pool};
use super::record::{
    capacity_applied, developer_mode_changed, pool_metrics, publish, write_status,
};
use super::{Context, node_cache_ready};
use crate::capacity::free_instances;
use crate::cert::{self, ServingCert};
use crate::nodes::Node;
use crate::plan;
use crate::status::{self, Observed};
use crate::validate::{self, InvalidReason};
use crate::{Error, caches, dra, nodes, objects};
use peerpods_api::peerpodconfig::{CapacityMode, EventReason, PeerPodConfig, PeerPodConfigStatus};

/// How often a PeerPodConfig that waits for another one (duplicate) looks again.
const DUPLICATE_RECHECK: Duration = Duration::from_secs(30);

/// One PeerPodConfig applied (the finalizer's Apply). An invalid one gets only its status. A valid one gets its
/// owned objects and the webhook's entry, then capacity (node patches, or in capacityMode dra the pool), Events,
/// metrics and status; a missing webhook configuration is returned as the error last, so the retry backs off.
pub(super) async fn apply_config(
    config: Arc<PeerPodConfig>,
    ctx: &Context,
) -> Result<Action, Error> {
    // An empty cache would mean "no nodes" and strip capacity from every node: wait for the first list.
    node_cache_ready(ctx).await?;
    let mut observed = Observed {
        generation: config.metadata.generation,
        ..Observed::default()
    };
    let active = ctx.active_config();
    if let Some(invalid) = validate::validate(
        &config,
        &ctx.namespace,
        active.as_deref(),
        &ctx.service_accounts,
    ) {
        let recheck = invalid.reason == InvalidReason::DuplicateConfig;
        observed.invalid = Some(invalid);
        write_status(&config, config.status.as_ref(), &observed, ctx).await?;
        return Ok(if recheck {
            Action::requeue(DUPLICATE_RECHECK)
        } else {
            Action::await_change()
        });
    }
    let limit = config.spec.parsed_limit().map_err(Error::InvalidSpec)?;
    let ns = ctx.namespace.as_str();

    let mut written = Vec::new();
    let OwnedApplied {
        cloud,
        rendered,
        daemonset,
        webhook,
        missing,
    } = apply_owned(&config, ctx, &mut written).await?;

    // Capacity: the plan decides the total in both modes.
    // As last patched by this controller where the cache has not caught up yet: a reconcile right after a
    // patch never plans (and writes) the same value again.
    let all_nodes: Vec<Node> = ctx
        .nodes
        .state()
        .iter()
        .map(|node| ctx.written_nodes.newest(node))
        .collect();
    let (provider_free, provider_problem) = provider_free(&config, ctx).await;
    let planned = plan::capacity(
        limit,
        &config.spec.node_selector,
        all_nodes.iter(),
        provider_free,
        cloud.developer_mode,
    );
    developer_mode_changed(
        ctx,
        &config,
        rendered,
        cloud.developer_mode,
        planned.ceiling,
    )
    .await;
    if !planned.invalid_overrides.is_empty() {
        warn!(
            nodes = ?planned.invalid_overrides,
            label = crate::spread::VM_LIMIT_LABEL,
            "node label is not a count; those nodes get a spread share"
        );
    }
    let mut capacity = planned.status();
    // In dra mode the pool replaces node capacity: the nodes lose what this controller advertised (a node that
    // still advertises the resource would be served from its own allocatable, never from the pool); in node mode
    // the pool's objects go.
    let node_changes = match config.spec.capacity_mode {
        CapacityMode::Node => {
            if let dra::PluginWithdrawal::Drain { claims } =
                withdraw_pool(ctx, &mut written).await?
            {
                observed.dra_plugin = Some(status::DraPlugin::Draining { claims });
            }
            planned.changes.clone()
        }
        CapacityMode::Dra => {
            let (pool, plugin) =
                publish_pool(ctx, &config, ns, planned.effective, &mut written).await?;
            observed.dra_plugin = Some(status::DraPlugin::Serving(Some(Box::new(plugin))));
            capacity.per_node_min = None;
            capacity.per_node_max = None;
            capacity.pool = Some(pool);
            plan::removal(all_nodes.iter())
        }
    };
    pool_metrics(ctx, capacity.pool.unwrap_or_default());
    if !written.is_empty() {
        publish(
            ctx,
            &config,
            EventType::Normal,
            EventReason::Applied.as_str(),
            format!("applied {}", written.join(", ")),
        )
        .await;
    }
    observed.capacity = Some(capacity);
    observed.provider_problem = provider_problem;
    observed.objects_applied = missing.is_none();
    observed.daemonset = Some(daemonset);
    observed.webhook = Some(webhook);
    observed.webhook_configuration_problem = missing
        .as_ref()
        .map(|e| (e.failure_reason(), e.to_string()));
    let node_api: Api<Node> = Api::all(ctx.client.clone());
    let (patched, shown) = apply_nodes(ctx, &config, &node_api, &node_changes, &observed).await;
    let patched = patched.map(|live| remember_nodes(ctx, live));
    let patched_count = match &patched {
        Ok(n) => *n,
        Err(_) => 0,
    };
    ctx.metrics
        .node_writes
        .inc_by(u64::try_from(patched_count).unwrap_or(0));
    let patched = patched?;
    capacity_applied(ctx, &config, &planned, patched).await;

    write_status(&config, shown.as_ref(), &observed, ctx).await?;

    match missing {
        // An error, so the retry backs off per object (error_policy), never a hot loop.
        Some(missing) => Err(missing),
        None => Ok(Action::requeue(plan::next_check(&config))),
    }
}

/// The owned objects as one reconcile applied them.
struct OwnedApplied {
    /// The cloud, agent TLS and developer mode the CAA DaemonSet is rendered for.
    cloud: objects::CaaCloud,
    /// The developer mode the CAA DaemonSet was rendered for before this reconcile (`None`: not rendered yet).
    rendered: Option<DeveloperMode>,
    daemonset: DaemonSet,
    webhook: Deployment,
    /// Why the webhook's entry could not be added to the chart's webhook configuration.
    missing: Option<Error>,
}

/// Applies the owned objects (CAA DaemonSet, webhook serving certificate, Service and Deployment) and the
/// webhook's entry in the chart's webhook configuration, naming each written kind in `written`.
async fn apply_owned(
    config: &PeerPodConfig,
    ctx: &Context,
    written: &mut Vec<&'static str>,
) -> Result<OwnedApplied, Error> {
    let ns = ctx.namespace.as_str();
    let cloud = caa_cloud(config, ctx).await;
    let rendered = current::<DaemonSet>(ctx, Some(ns), objects::CAA_DAEMONSET)
        .filter(|ds| objects::labelled_for(&ds.metadata, config))
        .map(|ds| objects::rendered_developer_mode(&ds));
    let daemonset = ensure(
        ctx,
        written,
        objects::caa_daemonset(config, ns, ctx.caa_provider_service.as_ref(), &cloud)?,
    )
    .await?;
    let existing = current::<Secret>(ctx, Some(ns), objects::WEBHOOK_CERT_SECRET)
        .filter(|s| objects::labelled_for(&s.metadata, config))
        .as_ref()
        .and_then(ServingCert::from_secret);
    let (serving, renewed) = cert::ensure(
        existing,
        &objects::webhook_dns_names(ns),
        jiff::Timestamp::now(),
    )?;
    if let Some(why) = &renewed {
        info!(reason = %why, "issuing a new webhook serving certificate");
    }
    ensure(ctx, written, serving.to_secret(config, ns)?).await?;
    ensure(ctx, written, objects::webhook_service(config, ns)?).await?;
    let webhook = ensure(ctx, written, objects::webhook_deployment(config, ns)?).await?;
    // The chart creates the webhook configuration; this controller adds its webhook to it and never creates it:
    // absent (an install without the chart), the PeerPodConfig says so and the reconcile is retried with backoff
    // (the watch on the configuration also triggers one as soon as it is created).
    let chart_configuration =
        current::<MutatingWebhookConfiguration>(ctx, None, objects::WEBHOOK_CONFIGURATION);
    let missing = match chart_configuration.and_then(|c| c.metadata.uid) {
        Some(uid) => {
            ensure_cluster(
                ctx,
                written,
                objects::webhook_configuration(config, ns, serving.ca_pem.as_bytes(), &uid),
            )
            .await?;
            None
        }
        None => Some(Error::WebhookConfigurationMissing {
            name: objects::WEBHOOK_CONFIGURATION,
        }),
    };
    if let Some(missing) = &missing
        && !webhook_condition_is(config, missing.reason())
    {
        warn!(error = %missing, "the webhook configuration is missing");
        publish(
            ctx,
            config,
            EventType::Warning,
            missing.reason(),
            missing.to_string(),
        )
        .await;
    }
    Ok(OwnedApplied {
        cloud,
        rendered,
        daemonset,
        webhook,
        missing,
    })
}

/// Whether the stored WebhookReady condition already has `reason` (its Warning Event was published then).
fn webhook_condition_is(config: &PeerPodConfig, reason: &str) -> bool {
    config.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == status::WEBHOOK_READY && c.reason == reason)
    })
}

/// The cloud the CAA DaemonSet is rendered for: `spec.caa.provider`, else the `CLOUD_PROVIDER` of CAA's ConfigMap
/// (whose `CACERT_FILE` also decides the agent TLS mount, and `PODVM_DEVELOPER_MODE` CAA's developer mode). A
/// ConfigMap that cannot be read leaves the per-cloud parts out, with a warning naming why, rather than blocking
/// the rest of the setup; its developer mode is then unknown, which caps node capacity as developer mode does.
async fn caa_cloud(config: &PeerPodConfig, ctx: &Context) -> objects::CaaCloud {
    let name = &config.spec.config_map_name;
    let read = if name == caches::CAA_CONFIG_MAP {
        // Watched (the RBAC grants only this name): from the cache.
        Ok(current::<ConfigMap>(ctx, Some(&ctx.namespace), name))
    } else {
        let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &ctx.namespace);
        api.get_opt(name).await
    };
    // Absent is an empty ConfigMap (developer mode off, CAA's default); unreadable is `None` (the mode unknown).
    let (data, exists) = match read {
        Ok(Some(cm)) => (Some(cm.data.unwrap_or_default()), true),
        Ok(None) => {
            warn!(configmap = %name, "CAA's ConfigMap does not exist; the DaemonSet gets no per-cloud parts");
            (Some(Default::default()), false)
        }
        Err(e) => {
            warn!(configmap = %name, error = %e, "reading CAA's ConfigMap failed; the DaemonSet gets no per-cloud parts and developer mode is assumed");
            (None, false)
        }
    };
    let cloud = objects::CaaCloud::resolve(config.spec.caa.provider, data.as_ref());
    if cloud.provider.is_none() && exists {
        warn!(configmap = %name, "CAA's ConfigMap names no known CLOUD_PROVIDER and spec.caa.provider is unset; the DaemonSet gets no per-cloud parts");
    }
    cloud
}

/// Free capacity for `capacityFromProvider`, or why it is unknown (then the limit alone decides).
async fn provider_free(config: &PeerPodConfig, ctx: &Context) -> (Option<u64>, Option<String>) {
    let Some(source) = &config.spec.capacity_from_provider else {
        return (None, None);
    };
    let Some(provider) = &ctx.provider else {
        return (
            None,
            Some("the controller runs without --provider-endpoint".into()),
        );
    };
    let max_age = Duration::from_secs(u64::from(source.refresh_seconds));
    match provider.figures(source.cloud_provider.as_str(), max_age).await {
        Ok(figures) => match free_instances(&figures, source) {
            Some(free) => (Some(free), None),
            None => (None, Some("the provider reports no usable figure (set vcpusPerInstance or memoryMiBPerInstance)".into())),
        },
        Err(e) => {
            warn!(error = %e, "provider capacity unknown; using the limit alone");
            (None, Some(e.to_string()))
        }
    }
}

/// How often the status shows how far node patches that are still going are. A rebalance done sooner (at the
/// default pace, one of up to about 150 nodes) writes no progress, only its outcome.
pub const PROGRESS_EVERY: Duration = Duration::from_secs(1);

/// Patches the nodes (`nodes::apply`, at the configured pace), and while they go writes every [`PROGRESS_EVERY`]
/// a status saying "applying capacity: n of m nodes". Returns the patched nodes and the status as stored now
/// (the one read, or the last progress written), which the final status write compares against.
async fn apply_nodes(
    ctx: &Context,
    config: &PeerPodConfig,
    api: &Api<Node>,
    changes: &[(String, nodes::CapacityChange)],
    observed: &Observed,
) -> (Result<Vec<Node>, Error>, Option<PeerPodConfigStatus>) {
    let (done, mut progress) = tokio::sync::watch::channel(0);
    let of = u32::try_from(changes.len()).unwrap_or(u32::MAX);
    let patches = async move {
        let result = nodes::apply(api, changes, &ctx.node_patches, &done).await;
        // Dropping the sender ends the progress reports.
        drop(done);
        result
    };
    let report = async {
        let mut shown = config.status.clone();
        loop {
            // A progress write in flight is finished, never cancelled: it must not land after the final one.
            tokio::select! {
                () = tokio::time::sleep(PROGRESS_EVERY) => {}
                () = async { while progress.changed().await.is_ok() {} } => return shown,
            }
            let applying = status::Applying {
                done: u32::try_from(*progress.borrow_and_update()).unwrap_or(u32::MAX),
                of,
            };
            let now = Observed {
                applying: Some(applying),
                ..observed.clone()
            };
            match write_status(config, shown.as_ref(), &now, ctx).await {
                Ok(status) => shown = Some(status),
                // The final write after the patches tells the outcome; a lost report only delays the news.
                Err(e) => warn!(error = %e, "could not show the progress of node patches"),
            }
        }
    };
    tokio::join!(patches, report)
}
