//! The byom delete through provider-core's deletion engine, against the local control plane: a
//! release is answered only once a later read of the ConfigMap shows the allocation gone, the
//! engine's guard judges the allocation's fields as `list_instances` shows them, and one delete
//! releases only the allocation it saw, never the next pod's.

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use peerpods_provider_byom::{ByomProvider, GET_CONFIGMAP, REPLACE_CONFIGMAP, STATE_KEY};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider};

use crate::byom_support::api_faults::{object_path, step, trace};
use crate::byom_support::{CONFIGMAP, Pool, Tap, caa_allocate, config};

const IPS: [&str; 3] = ["10.0.0.1", "10.0.0.2", "10.0.0.3"];

fn count(calls: &CloudCalls, operation: &'static str) -> u64 {
    calls.count("byom", operation, "ok")
}

/// The ConfigMap's `allocation-state` text as stored now.
async fn state_text(api: &Api<ConfigMap>) -> String {
    let configmap = api.get(CONFIGMAP).await.expect("get pool ConfigMap");
    configmap.data.expect("data")[STATE_KEY].clone()
}

/// Writes `text` back as the pool state, over whatever is stored: what CAA's `updateState` does
/// after a conflict (it re-reads only the resourceVersion and writes the state of its first read),
/// undoing a release made in between.
async fn put_back(api: &Api<ConfigMap>, text: &str) {
    let mut configmap = api.get(CONFIGMAP).await.expect("get pool ConfigMap");
    configmap
        .data
        .get_or_insert_default()
        .insert(STATE_KEY.to_owned(), text.to_owned());
    api.replace(CONFIGMAP, &PostParams::default(), &configmap)
        .await
        .expect("stale write");
}

/// The provider reaching the control plane through `tap`, with `extra` configuration.
fn provider_through(
    pool: &Pool,
    tap: &Tap,
    extra: &[(&str, &str)],
    calls: &CloudCalls,
) -> ByomProvider {
    ByomProvider::with_client(&config(pool, extra), tap.client(&pool.ns), calls.clone())
        .expect("provider")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_is_answered_deleted_only_once_a_later_read_shows_it_gone() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("10.0.0.2", "web-1", "worker-0").await;
    let calls = CloudCalls::default();
    let (provider, faults) = crate::byom_support::provider_behind_faults(&pool, &[], &calls).await;
    let path = object_path::<ConfigMap>(&pool.ns, CONFIGMAP);

    let outcome = provider.delete_instance("10.0.0.2").await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(
        trace(&faults.seen()),
        [
            step("GET", 200, true),
            step("PUT", 200, true),
            // The read that confirms the release, after it.
            step("GET", 200, true),
        ]
    );
    assert!(faults.seen().iter().all(|s| s.path == path));
    assert!(pool.allocated().await.is_empty());
    assert_eq!(pool.available().await, IPS);

    // The next delete reads it free: already gone, nothing written.
    let before = faults.requests();
    assert_eq!(
        provider.delete_instance("10.0.0.2").await.unwrap(),
        DeleteOutcome::AlreadyGone
    );
    assert_eq!(trace(&faults.seen()[before..]), [step("GET", 200, true)]);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_release_another_writer_undoes_is_seen_by_the_confirming_read_and_released_again() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("10.0.0.2", "web-1", "worker-0").await;
    // CAA read the state before the release and writes it back right after it.
    let stale = state_text(&pool.api()).await;
    let tap = Tap::new(pool.client.clone());
    let caa = pool.api();
    tap.after_puts(1, move || {
        let (caa, stale) = (caa.clone(), stale.clone());
        async move { put_back(&caa, &stale).await }
    });
    let calls = CloudCalls::default();
    let provider = provider_through(&pool, &tap, &[], &calls);

    let outcome = provider.delete_instance("10.0.0.2").await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(
        pool.allocated().await.is_empty(),
        "the allocation put back is released again"
    );
    assert_eq!(pool.available().await, IPS, "listed once");
    assert_eq!(count(&calls, REPLACE_CONFIGMAP), 2);
    // The lookup, the read that found it back, the read that confirmed the second release.
    assert_eq!(count(&calls, GET_CONFIGMAP), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_writer_that_keeps_putting_the_allocation_back_is_reported_not_outwritten() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("10.0.0.2", "web-1", "worker-0").await;
    let stale = state_text(&pool.api()).await;
    let tap = Tap::new(pool.client.clone());
    let caa = pool.api();
    tap.after_puts(usize::MAX, move || {
        let (caa, stale) = (caa.clone(), stale.clone());
        async move { put_back(&caa, &stale).await }
    });
    let calls = CloudCalls::default();
    let provider = provider_through(&pool, &tap, &[], &calls);

    let error = provider.delete_instance("10.0.0.2").await.unwrap_err();

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(error.to_string().contains("3 times"), "{error}");
    assert_eq!(count(&calls, REPLACE_CONFIGMAP), 3, "released three times");
    assert_eq!(
        pool.allocated().await.len(),
        1,
        "as the other writer left it"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_machine_caa_hands_out_again_right_after_the_release_stays_with_its_new_pod() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("10.0.0.2", "web-1", "worker-0").await;
    // CAA allocates the returned machine to the next pod before the confirming read.
    let tap = Tap::new(pool.client.clone());
    let caa = pool.api();
    tap.after_puts(1, move || {
        let caa = caa.clone();
        async move {
            caa_allocate(&caa, "10.0.0.2", "web-2", "worker-1").await;
        }
    });
    let calls = CloudCalls::default();
    let provider = provider_through(&pool, &tap, &[], &calls);

    let outcome = provider.delete_instance("10.0.0.2").await.expect("delete");

    // web-1's allocation is gone; web-2's is another instance, not to be released.
    assert_eq!(outcome, DeleteOutcome::Deleted);
    let allocated = pool.allocated().await;
    assert_eq!(allocated.len(), 1);
    assert!(allocated[0].0.starts_with("web-2-"), "{allocated:?}");
    assert_eq!(allocated[0].1, "10.0.0.2");
    assert_eq!(pool.available().await, ["10.0.0.1", "10.0.0.3"]);
    assert_eq!(count(&calls, REPLACE_CONFIGMAP), 1, "released once");
}

/// A machine carries no cloud's tags: the pool is what this cluster owns, so a cluster tag set for the
/// configuration's clouds with tags never refuses a pool machine (and a machine outside the pool is refused
/// whatever the tags).
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_tag_set_for_other_clouds_never_refuses_a_pool_machine() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("10.0.0.1", "web-1", "worker-0").await;
    let tap = Tap::new(pool.client.clone());
    let calls = CloudCalls::default();
    let tagged = provider_through(
        &pool,
        &tap,
        &[("CLUSTER_TAG", "peerpods.io/cluster=c1")],
        &calls,
    );

    assert_eq!(
        tagged.delete_instance("10.0.0.1").await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(pool.allocated().await.is_empty());
    let outside = tagged.delete_instance("10.9.9.9").await.unwrap_err();
    assert!(
        matches!(outside, Error::NotOwnedByCluster { .. }),
        "{outside:?}"
    );
}
