//! The byom provider against the local control plane, through the `Provider` trait: the pool
//! ConfigMap is written as cloud-api-adaptor writes it, and read back after every step.

use std::collections::BTreeMap;

use crate::byom_support::{CONFIGMAP, Pool, Tap, caa_allocate};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use kube::config::AuthInfo;
use peerpods_provider_byom::{ByomProvider, GET_CONFIGMAP, REPLACE_CONFIGMAP};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider, TagSelector};

const IPS: [&str; 4] = [
    "192.168.122.10",
    "192.168.122.11",
    "192.168.122.12",
    "192.168.122.13",
];

fn count(calls: &CloudCalls, operation: &'static str, result: &'static str) -> u64 {
    calls.count("byom", operation, result)
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_returns_the_machine_to_the_pool_and_keeps_other_allocations() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("192.168.122.11", "web-1", "worker-0")
        .await;
    let kept = pool
        .caa_allocate("192.168.122.12", "db-0", "worker-1")
        .await;
    let (before, _) = pool.state().await;
    let calls = CloudCalls::default();
    let provider = crate::byom_support::provider(&pool, &calls).await;

    let outcome = provider
        .delete_instance("192.168.122.11")
        .await
        .expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(
        pool.available().await,
        ["192.168.122.10", "192.168.122.11", "192.168.122.13"]
    );
    assert_eq!(
        pool.allocated().await,
        [(kept, "192.168.122.12".to_owned())]
    );
    let (after, _) = pool.state().await;
    assert_eq!(after["version"], before["version"].as_i64().unwrap() + 1);
    // CAA's labels and other data survive the update.
    let configmap = pool.api().get(CONFIGMAP).await.unwrap();
    assert_eq!(
        configmap.metadata.labels.unwrap()["app.kubernetes.io/component"],
        "byom-ip-pool-state"
    );
    // The lookup, and the later read that confirms the release.
    assert_eq!(count(&calls, GET_CONFIGMAP, "ok"), 2);
    assert_eq!(count(&calls, REPLACE_CONFIGMAP, "ok"), 1);

    // CAA can allocate the returned machine again.
    pool.caa_allocate("192.168.122.11", "web-2", "worker-0")
        .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_free_machine_is_already_gone_and_nothing_is_written() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("192.168.122.10", "web-1", "worker-0")
        .await;
    let calls = CloudCalls::default();
    let provider = crate::byom_support::provider(&pool, &calls).await;

    assert_eq!(
        provider.delete_instance("192.168.122.10").await.unwrap(),
        DeleteOutcome::Deleted
    );
    let (_, version) = pool.state().await;
    assert_eq!(
        provider.delete_instance("192.168.122.10").await.unwrap(),
        DeleteOutcome::AlreadyGone
    );
    assert_eq!(
        provider.delete_instance("192.168.122.13").await.unwrap(),
        DeleteOutcome::AlreadyGone
    );
    assert_eq!(
        pool.state().await.1,
        version,
        "an already free machine costs no write"
    );
    assert_eq!(count(&calls, REPLACE_CONFIGMAP, "ok"), 1);
    // Two reads for the release (lookup, confirmation), one for each free machine.
    assert_eq!(count(&calls, GET_CONFIGMAP, "ok"), 4);
    assert_eq!(pool.available().await, IPS);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_write_between_read_and_update_is_retried_and_both_changes_survive() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("192.168.122.10", "web-1", "worker-0")
        .await;
    // CAA on another node allocates .13 after the provider read the ConfigMap and before its
    // update reaches the API server.
    let tap = Tap::new(pool.client.clone());
    let caa = pool.api();
    tap.before_first_put(async move {
        caa_allocate(&caa, "192.168.122.13", "batch-7", "worker-2").await;
    });
    let calls = CloudCalls::default();
    let provider = ByomProvider::with_client(
        &crate::byom_support::config(&pool, &[]),
        tap.client(&pool.ns),
        calls.clone(),
    )
    .unwrap();

    let outcome = provider
        .delete_instance("192.168.122.10")
        .await
        .expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(
        count(&calls, REPLACE_CONFIGMAP, "error"),
        1,
        "the first update conflicted"
    );
    assert_eq!(count(&calls, REPLACE_CONFIGMAP, "ok"), 1);
    assert_eq!(
        count(&calls, GET_CONFIGMAP, "ok"),
        3,
        "the lookup, read again after the conflict, the confirming read"
    );
    let allocated: Vec<String> = pool
        .allocated()
        .await
        .into_iter()
        .map(|(_, ip)| ip)
        .collect();
    assert_eq!(
        allocated,
        ["192.168.122.13"],
        "the competing allocation survived"
    );
    assert_eq!(
        pool.available().await,
        ["192.168.122.10", "192.168.122.11", "192.168.122.12"]
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_is_the_pool_size_and_the_allocated_machines() {
    let pool = Pool::start(&IPS).await;
    let calls = CloudCalls::default();
    let provider = crate::byom_support::provider(&pool, &calls).await;
    let empty = provider.capacity().await.unwrap();
    assert_eq!(
        (empty.instances.limit, empty.instances.in_use),
        (Some(4), Some(0))
    );

    pool.caa_allocate("192.168.122.10", "web-1", "worker-0")
        .await;
    pool.caa_allocate("192.168.122.13", "web-2", "worker-1")
        .await;
    let capacity = provider.capacity().await.unwrap();

    assert_eq!(capacity.instances.limit, Some(4));
    assert_eq!(capacity.instances.in_use, Some(2));
    assert_eq!((capacity.vcpus.limit, capacity.vcpus.in_use), (None, None));
    assert_eq!(
        (capacity.memory_mib.limit, capacity.memory_mib.in_use),
        (None, None)
    );
    assert_eq!(count(&calls, GET_CONFIGMAP, "ok"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn list_shows_this_pools_allocated_machines_filtered_by_allocation_tags() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("192.168.122.12", "web-1", "worker-0")
        .await;
    pool.caa_allocate("192.168.122.10", "db-0", "worker-1")
        .await;
    // Another cluster's pool in another namespace: never listed.
    let other = Pool::start(&["192.168.122.11", "10.1.0.1"]).await;
    other.caa_allocate("10.1.0.1", "theirs", "worker-0").await;
    // A machine CAA allocated that this pool's VM_POOL_IPS does not list: not ours to report.
    let narrow =
        crate::byom_support::config(&pool, &[("VM_POOL_IPS", "192.168.122.10,192.168.122.11")]);
    let calls = CloudCalls::default();
    let provider = crate::byom_support::provider(&pool, &calls).await;

    let all = provider.list_instances(&TagSelector::new()).await.unwrap();
    let ids: Vec<&str> = all.iter().map(|i| i.id.as_str()).collect();
    assert_eq!(ids, ["192.168.122.10", "192.168.122.12"]);
    let web = &all[1];
    assert_eq!(web.tags["podName"], "web-1");
    assert_eq!(web.tags["nodeName"], "worker-0");
    assert!(web.tags["allocationID"].starts_with("web-1-"));
    let created = web.created.expect("allocatedAt");
    assert!((jiff::Timestamp::now() - created).get_seconds().abs() < 120);

    let on_worker_0 = provider
        .list_instances(&TagSelector::from([("nodeName".into(), "worker-0".into())]))
        .await
        .unwrap();
    assert_eq!(on_worker_0.len(), 1);
    assert_eq!(on_worker_0[0].id, "192.168.122.12");
    // Pool machines carry no cloud tags: a cluster-tag selector matches none of them.
    let cluster = TagSelector::from([("peerpods.io/cluster".into(), "c1".into())]);
    assert!(provider.list_instances(&cluster).await.unwrap().is_empty());

    let kube_config = testenv::shared().config().await.unwrap();
    let narrow =
        ByomProvider::with_kube_config(&narrow, kube_config, CloudCalls::default()).unwrap();
    let ids: Vec<String> = narrow
        .list_instances(&TagSelector::new())
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert_eq!(ids, ["192.168.122.10"]);
    let capacity = narrow.capacity().await.unwrap();
    assert_eq!(
        (capacity.instances.limit, capacity.instances.in_use),
        (Some(2), Some(1))
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_ids_and_machines_outside_the_pool_cost_no_api_call() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("192.168.122.10", "web-1", "worker-0")
        .await;
    let tap = Tap::new(pool.client.clone());
    let calls = CloudCalls::default();
    let provider = ByomProvider::with_client(
        &crate::byom_support::config(&pool, &[]),
        tap.client(&pool.ns),
        calls.clone(),
    )
    .unwrap();

    for id in [
        "",
        "i-0123456789abcdef0",
        "192.168.122",
        "192.168.122.010",
        "10.0.0.1%eth0",
    ] {
        let validated = provider.validate_instance_id(id).unwrap_err();
        assert!(
            matches!(
                validated,
                Error::InvalidArgument {
                    field: "instance_id",
                    ..
                }
            ),
            "{id:?}: {validated:?}"
        );
        let deleted = provider.delete_instance(id).await.unwrap_err();
        assert_eq!(deleted.reason(), "InvalidArgument", "{id:?}");
    }
    // A well-formed address this pool does not list is never freed, even if the ConfigMap
    // were to list it.
    let outside = provider
        .delete_instance("192.168.122.99")
        .await
        .unwrap_err();
    assert!(
        matches!(outside, Error::NotOwnedByCluster { .. }),
        "{outside:?}"
    );
    assert!(outside.to_string().contains("192.168.122.99"));

    assert_eq!(tap.requests(), 0);
    assert_eq!(
        count(&calls, GET_CONFIGMAP, "ok") + count(&calls, GET_CONFIGMAP, "error"),
        0
    );
    assert!(provider.validate_instance_id("192.168.122.10").is_ok());
    assert!(provider.validate_instance_id("fd00::1").is_ok());
    assert_eq!(
        provider.delete_instance("192.168.122.10").await.unwrap(),
        DeleteOutcome::Deleted
    );
    // Read, update, the confirming read.
    assert_eq!(tap.requests(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_missing_pool_configmap_is_a_clear_error() {
    let pool = Pool::empty_namespace(&IPS).await;
    let calls = CloudCalls::default();
    let provider = crate::byom_support::provider(&pool, &calls).await;

    let error = provider
        .delete_instance("192.168.122.10")
        .await
        .unwrap_err();

    let Error::Config { key, message, .. } = &error else {
        panic!("expected a config error, got {error:?}");
    };
    assert_eq!(key, "POOL_CONFIGMAP_NAME");
    assert!(
        message.contains(&format!("ConfigMap {}/{CONFIGMAP} does not exist", pool.ns)),
        "{message}"
    );
    assert_eq!(
        provider.capacity().await.unwrap_err().reason(),
        "InvalidConfig"
    );
    assert_eq!(
        provider
            .list_instances(&TagSelector::new())
            .await
            .unwrap_err()
            .reason(),
        "InvalidConfig"
    );
    let health = provider.health().await;
    assert!(!health.healthy);
    assert!(
        health.message.contains("does not exist"),
        "{}",
        health.message
    );
    assert_eq!(count(&calls, GET_CONFIGMAP, "error"), 4);

    // Once CAA created it, the same provider works.
    let started = Pool::start(&IPS).await;
    let provider = crate::byom_support::provider(&started, &calls).await;
    let health = provider.health().await;
    assert!(health.healthy, "{}", health.message);
    assert!(
        health.message.contains("0 of 4 machines allocated"),
        "{}",
        health.message
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn rejected_credentials_are_unauthenticated_and_never_shown() {
    const TOKEN: &str = "byom-test-bearer-token-0d9f8e7c6b5a";
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("192.168.122.10", "web-1", "worker-0")
        .await;
    let mut kube_config = testenv::shared().config().await.unwrap();
    kube_config.auth_info = AuthInfo {
        token: Some(TOKEN.to_owned().into()),
        ..AuthInfo::default()
    };
    let calls = CloudCalls::default();
    let provider = ByomProvider::with_kube_config(
        &crate::byom_support::config(&pool, &[]),
        kube_config,
        calls.clone(),
    )
    .unwrap();

    let error = provider
        .delete_instance("192.168.122.10")
        .await
        .unwrap_err();

    assert!(
        matches!(error, Error::CloudUnauthenticated { .. }),
        "{error:?}"
    );
    let shown = format!(
        "{error} {error:?} {provider:?} {}",
        provider.health().await.message
    );
    assert!(!shown.contains(TOKEN), "{shown}");
    assert!(shown.contains("HTTP 401"), "{shown}");
    assert_eq!(count(&calls, GET_CONFIGMAP, "error"), 2);
    assert_eq!(pool.allocated().await.len(), 1, "nothing was freed");
}

/// provider-service's RBAC on the pool: `get` and `update` on that one ConfigMap, nothing else.
#[tokio::test(flavor = "multi_thread")]
async fn get_and_update_on_the_pool_configmap_are_all_the_rbac_it_needs() {
    let pool = Pool::start(&IPS).await;
    pool.caa_allocate("192.168.122.10", "web-1", "worker-0")
        .await;
    pool.caa_allocate("192.168.122.11", "web-2", "worker-0")
        .await;
    let accounts: Api<ServiceAccount> = Api::namespaced(pool.client.clone(), &pool.ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some("provider-service".into()),
            ..ObjectMeta::default()
        },
        ..ServiceAccount::default()
    };
    accounts.create(&PostParams::default(), &sa).await.unwrap();
    let token =
        testenv::service_account_token(&pool.client, &pool.ns, "provider-service", &[]).await;
    let calls = CloudCalls::default();
    let as_service = |calls: &CloudCalls| {
        let calls = calls.clone();
        let config = crate::byom_support::config(&pool, &[]);
        let token = token.clone();
        async move {
            let mut kube_config = testenv::shared().config().await.unwrap();
            kube_config.auth_info = AuthInfo {
                token: Some(token.into()),
                ..AuthInfo::default()
            };
            ByomProvider::with_kube_config(&config, kube_config, calls).unwrap()
        }
    };

    // Without RBAC: refused, as a permission problem of the service.
    let provider = as_service(&calls).await;
    let error = provider
        .delete_instance("192.168.122.10")
        .await
        .unwrap_err();
    assert!(
        matches!(error, Error::CloudPermissionDenied { .. }),
        "{error:?}"
    );

    let roles: Api<Role> = Api::namespaced(pool.client.clone(), &pool.ns);
    let role = Role {
        metadata: ObjectMeta {
            name: Some("provider-service-byom".into()),
            ..ObjectMeta::default()
        },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["configmaps".into()]),
            resource_names: Some(vec![CONFIGMAP.into()]),
            verbs: vec!["get".into(), "update".into()],
            ..PolicyRule::default()
        }]),
    };
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<RoleBinding> = Api::namespaced(pool.client.clone(), &pool.ns);
    let binding = RoleBinding {
        metadata: ObjectMeta {
            name: Some("provider-service-byom".into()),
            ..ObjectMeta::default()
        },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "provider-service-byom".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "provider-service".into(),
            namespace: Some(pool.ns.clone()),
            ..Subject::default()
        }]),
    };
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // RBAC is effective at once on a real API server (no cache): retry briefly anyway.
    let provider = as_service(&calls).await;
    let outcome = testenv::wait_for("RBAC in effect", std::time::Duration::from_secs(10), || {
        let provider = &provider;
        async move { provider.delete_instance("192.168.122.10").await.ok() }
    })
    .await;
    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(provider.capacity().await.is_ok());
    assert_eq!(
        provider
            .list_instances(&BTreeMap::new())
            .await
            .unwrap()
            .len(),
        1
    );
    assert!(provider.health().await.healthy);

    // The role reaches nothing else: deleting the ConfigMap is still refused.
    let client = testenv::shared().client_with_token(&token).await;
    let own: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, &pool.ns);
    let refused = own
        .delete(CONFIGMAP, &DeleteParams::default())
        .await
        .unwrap_err();
    assert!(matches!(refused, kube::Error::Api(s) if s.code == 403));
}
