//! capacityMode dra against the real control plane: the pool's DeviceClass and ResourceSlices follow the limit,
//! never drop a device a ResourceClaim holds, and switching modes either way leaves nothing of the other behind.

use std::collections::BTreeSet;
use std::sync::Arc;

use crate::support::{ProviderService, Scenario, TIMEOUT};
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use peer_pod_config_ctrl::controller::reconcile;
use peer_pod_config_ctrl::dra::{DEVICE_CLASS, DRIVER, PLUGIN_DAEMONSET, POOL};
use peer_pod_config_ctrl::objects::{EXTENDED_RESOURCE, OWNER_NAMESPACE_LABEL};
use peerpods_api::peerpodconfig::{PeerPodConfig, PeerPodConfigStatus};

const NAME: &str = "peerpodconfig";

/// The pool as published for this scenario: (generation, slice count, device names), once every slice of the
/// highest generation is there.
async fn pool(s: &Scenario) -> Option<(i64, usize, BTreeSet<String>)> {
    let slices: Api<ResourceSlice> = Api::all(s.client.clone());
    let list = slices
        .list(&ListParams::default().labels(&format!("{OWNER_NAMESPACE_LABEL}={}", s.ns)))
        .await
        .ok()?;
    let generation = list.items.iter().map(|s| s.spec.pool.generation).max()?;
    let current: Vec<&ResourceSlice> = list
        .items
        .iter()
        .filter(|s| s.spec.pool.generation == generation)
        .collect();
    let count = usize::try_from(current.first()?.spec.pool.resource_slice_count).ok()?;
    if current.len() != count || list.items.len() != count {
        return None;
    }
    for slice in &current {
        assert_eq!(slice.spec.driver, DRIVER);
        assert_eq!(slice.spec.pool.name, POOL);
        assert!(slice.spec.devices.iter().flatten().count() <= 128);
    }
    let devices = current
        .iter()
        .flat_map(|s| s.spec.devices.iter().flatten())
        .map(|d| d.name.clone())
        .collect();
    Some((generation, count, devices))
}

async fn wait_pool(
    s: &Scenario,
    what: &str,
    want: impl Fn(&BTreeSet<String>) -> bool,
) -> (i64, usize, BTreeSet<String>) {
    testenv::wait_for(what, TIMEOUT, || async {
        pool(s).await.filter(|(_, _, devices)| want(devices))
    })
    .await
}

fn vms(range: std::ops::Range<u32>) -> BTreeSet<String> {
    range.map(|i| format!("vm-{i}")).collect()
}

async fn wait_status(
    s: &Scenario,
    what: &str,
    check: impl Fn(&PeerPodConfigStatus) -> bool,
) -> PeerPodConfigStatus {
    let api = s.configs();
    testenv::wait_for(what, TIMEOUT, || async {
        api.get_opt(NAME)
            .await
            .ok()
            .flatten()
            .and_then(|c| c.status)
            .filter(|st| check(st))
    })
    .await
}

async fn set_limit(s: &Scenario, limit: u32) {
    s.configs()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"limit": limit}})),
        )
        .await
        .expect("patch limit");
}

async fn set_mode(s: &Scenario, mode: &str) {
    s.configs()
        .patch(
            NAME,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"capacityMode": mode}})),
        )
        .await
        .expect("patch capacityMode");
}

async fn device_class(s: &Scenario) -> Option<DeviceClass> {
    Api::<DeviceClass>::all(s.client.clone())
        .get_opt(DEVICE_CLASS)
        .await
        .expect("get DeviceClass")
}

async fn plugin(s: &Scenario) -> Option<DaemonSet> {
    Api::<DaemonSet>::namespaced(s.client.clone(), &s.ns)
        .get_opt(PLUGIN_DAEMONSET)
        .await
        .expect("get DaemonSet")
}

/// Waits until nothing of the pool is left: no ResourceSlice of this scenario, no DeviceClass, no plugin
/// DaemonSet (gone, or being deleted by the garbage collector).
async fn wait_no_pool(s: &Scenario, what: &str) {
    testenv::wait_for(what, TIMEOUT, || async {
        let slices: Api<ResourceSlice> = Api::all(s.client.clone());
        let left = slices
            .list(&ListParams::default().labels(&format!("{OWNER_NAMESPACE_LABEL}={}", s.ns)))
            .await
            .ok()?;
        let plugin_gone = plugin(s)
            .await
            .is_none_or(|d| d.metadata.deletion_timestamp.is_some());
        (left.items.is_empty() && device_class(s).await.is_none() && plugin_gone).then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dra_mode_publishes_a_pool_of_the_limit_that_follows_it_and_writes_no_node() {
    let s = Scenario::start("ppc-dra-pool").await;
    s.create_nodes(0..3, |i| i < 2).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 5, "capacityMode": "dra", "nodeSelector": s.selector(),
            "dra": {"kubeletDir": "/srv/kubelet", "pluginImage": "example.org/dra-plugin:1"}}),
    )
    .await;

    let (generation, count, devices) = wait_pool(&s, "a pool of 5", |d| d.len() == 5).await;
    assert_eq!((count, devices), (1, vms(0..5)));
    let class = device_class(&s).await.expect("DeviceClass");
    let spec = class.spec.expect("DeviceClass spec");
    assert_eq!(
        spec.extended_resource_name.as_deref(),
        Some(EXTENDED_RESOURCE)
    );
    let slice = Api::<ResourceSlice>::all(s.client.clone())
        .get("peerpods-vm-0")
        .await
        .expect("slice");
    let term = &slice
        .spec
        .node_selector
        .expect("nodeSelector")
        .node_selector_terms[0];
    let requirement = &term.match_expressions.as_ref().expect("expressions")[0];
    assert_eq!(
        (requirement.key.as_str(), requirement.values.as_deref()),
        (s.label.as_str(), Some(&["yes".to_owned()][..]))
    );
    let ds = plugin(&s).await.expect("plugin DaemonSet");
    let container = &ds.spec.template.spec.expect("pod").containers[0];
    assert_eq!(container.image.as_deref(), Some("example.org/dra-plugin:1"));
    assert!(container.args.iter().flatten().any(|a| a == "/srv/kubelet"));
    let status = wait_status(&s, "pool figures", |st| st.pool_size == Some(5)).await;
    assert_eq!(
        (status.allocated_slots, status.free_slots),
        (Some(0), Some(5))
    );
    let state = s.node_state().await;
    assert!(
        state.values().all(|(v, _)| v.is_none()),
        "node capacity in dra mode: {state:?}"
    );

    // Steady: with the loop stopped, reconciles settle, and then one more writes nothing (the generation stays).
    let mut s = s;
    let ctx = s.stop_controller().await;
    let configs = s.configs();
    testenv::wait_for("a reconcile that writes nothing", TIMEOUT, || async {
        let before = ctx.metrics.writes();
        let config = configs.get(NAME).await.ok()?;
        reconcile(Arc::new(config), ctx.clone()).await.ok()?;
        (ctx.metrics.writes() == before).then_some(())
    })
    .await;
    let config = configs.get(NAME).await.expect("PeerPodConfig");
    let before = ctx.metrics.writes();
    reconcile(Arc::new(config), ctx.clone())
        .await
        .expect("reconcile");
    assert_eq!(ctx.metrics.writes(), before, "a steady dra reconcile wrote");
    assert_eq!(pool(&s).await.map(|(g, _, _)| g), Some(generation));
    s.run_controller(None);

    // Grows past one slice: two slices of a newer generation.
    set_limit(&s, 200).await;
    let (grown, count, devices) = wait_pool(&s, "a pool of 200", |d| d.len() == 200).await;
    assert_eq!((count, devices), (2, vms(0..200)));
    assert!(grown > generation, "{grown} after {generation}");
    // Shrinks: one slice again, the second one deleted.
    set_limit(&s, 3).await;
    let (_, count, devices) = wait_pool(&s, "a pool of 3", |d| d.len() == 3).await;
    assert_eq!((count, devices), (1, vms(0..3)));
    wait_status(&s, "pool of 3 in status", |st| st.pool_size == Some(3)).await;

    // Deleting the PeerPodConfig takes the cluster-scoped pool with it (finalizer).
    s.configs()
        .delete(NAME, &DeleteParams::default())
        .await
        .expect("delete PeerPodConfig");
    wait_no_pool(&s, "nothing of the pool left after deletion").await;
    s.finish().await;
}

/// A ResourceClaim holding `device` of the pool, allocated as the scheduler writes it (status subresource).
async fn allocated_claim(s: &Scenario, name: &str, device: &str) {
    let claims: Api<ResourceClaim> = Api::namespaced(s.client.clone(), &s.ns);
    let claim: ResourceClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"devices": {"requests": [
            {"name": "vm", "exactly": {"deviceClassName": DEVICE_CLASS}}
        ]}}
    }))
    .expect("ResourceClaim");
    claims
        .create(&PostParams::default(), &claim)
        .await
        .expect("create ResourceClaim");
    claims
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"status": {"allocation": {"devices": {"results": [
                    {"request": "vm", "driver": DRIVER, "pool": POOL, "device": device}
                ]}}}}),
            ),
        )
        .await
        .expect("allocate the claim through its status");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allocated_device_stays_in_the_pool_when_the_limit_drops_below_it() {
    let s = Scenario::start("ppc-dra-claim").await;
    s.create_nodes(0..2, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 5, "capacityMode": "dra", "nodeSelector": s.selector()}),
    )
    .await;
    wait_pool(&s, "a pool of 5", |d| d == &vms(0..5)).await;

    allocated_claim(&s, "peer-pod-vm", "vm-3").await;
    let status = wait_status(&s, "one slot allocated", |st| st.allocated_slots == Some(1)).await;
    assert_eq!((status.pool_size, status.free_slots), (Some(5), Some(4)));

    // The limit drops below the allocated device: vm-3 stays, the rest is the lowest free.
    set_limit(&s, 2).await;
    let (_, _, devices) = wait_pool(&s, "a pool of 2 keeping vm-3", |d| d.len() == 2).await;
    assert_eq!(devices, ["vm-0", "vm-3"].map(str::to_owned).into());
    let status = wait_status(&s, "pool of 2, 1 allocated", |st| st.pool_size == Some(2)).await;
    assert_eq!(
        (status.allocated_slots, status.free_slots),
        (Some(1), Some(1))
    );

    // Released: the pool is the limit's again.
    Api::<ResourceClaim>::namespaced(s.client.clone(), &s.ns)
        .delete("peer-pod-vm", &DeleteParams::default())
        .await
        .expect("delete claim");
    wait_pool(&s, "vm-0 and vm-1 once released", |d| d == &vms(0..2)).await;
    let status = wait_status(&s, "nothing allocated", |st| st.allocated_slots == Some(0)).await;
    assert_eq!(status.free_slots, Some(2));

    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn switching_modes_either_way_leaves_nothing_of_the_other_behind() {
    let s = Scenario::start("ppc-dra-switch").await;
    s.create_nodes(0..3, |i| i < 2).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 4, "nodeSelector": s.selector()}),
    )
    .await;
    s.wait_spread(4).await;
    assert!(pool(&s).await.is_none(), "a pool in node mode");

    // node → dra: the nodes lose the capacity, the pool appears.
    set_mode(&s, "dra").await;
    wait_pool(&s, "a pool of 4", |d| d == &vms(0..4)).await;
    testenv::wait_for("no node capacity left", TIMEOUT, || async {
        s.node_state()
            .await
            .values()
            .all(|(v, _)| v.is_none())
            .then_some(())
    })
    .await;
    assert!(device_class(&s).await.is_some());
    assert!(plugin(&s).await.is_some());

    // dra → node: the pool goes, the nodes get their share again.
    set_mode(&s, "node").await;
    wait_no_pool(&s, "no pool left in node mode").await;
    s.wait_spread(4).await;
    let status = wait_status(&s, "no pool figures in node mode", |st| {
        st.pool_size.is_none()
    })
    .await;
    assert_eq!(status.effective_limit, Some(4));

    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_node_limit_in_dra_mode_is_refused_and_nothing_is_published() {
    let s = Scenario::start("ppc-dra-per-node").await;
    s.create_nodes(0..2, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limitPerNode": 2, "capacityMode": "dra", "nodeSelector": s.selector()}),
    )
    .await;
    let api = s.configs();
    let invalid = testenv::wait_for("the Invalid condition", TIMEOUT, || async {
        let config: PeerPodConfig = api.get_opt(NAME).await.ok()??;
        config
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == "Invalid" && c.status == "True")
    })
    .await;
    assert_eq!(invalid.reason, "PerNodeLimitInDraMode");
    assert!(
        invalid.message.contains("limitPerNode"),
        "{}",
        invalid.message
    );
    assert!(pool(&s).await.is_none(), "a pool was published");
    assert!(
        device_class(&s).await.is_none(),
        "a DeviceClass was published"
    );
    let state = s.node_state().await;
    assert!(
        state.values().all(|(v, _)| v.is_none()),
        "node capacity: {state:?}"
    );

    s.finish().await;
}

/// The cloud's quota, as GetCapacity reports it, drops below what the pool holds: the pool shrinks to the free
/// capacity, but never below the devices ResourceClaims hold. libvirt's test driver is the cloud: the host's vCPUs
/// are its quota, and a domain defined behind the controller's back takes them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_drop_shrinks_the_pool_to_no_less_than_what_is_allocated() {
    let provider = ProviderService::start().await;
    let s = Scenario::start_with("ppc-dra-quota", Some(provider.url())).await;
    // Only now, in the scenario (scenarios run one at a time), is the host's free capacity this test's to change.
    let libvirt =
        virt::connect::Connect::open(Some("test:///default")).expect("libvirt test driver");
    let free = provider.free_vcpus().await;
    assert!(
        (4..128).contains(&free),
        "the test driver's host has a few vCPUs free: {free}"
    );
    s.create_nodes(0..2, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({
            "limit": 1000,
            "capacityMode": "dra",
            "nodeSelector": s.selector(),
            "capacityFromProvider": {"cloudProvider": "libvirt", "vcpusPerInstance": 1, "refreshSeconds": 10},
        }),
    )
    .await;
    let highest = free - 1;
    wait_pool(&s, "a pool of the free vCPUs", |d| {
        d == &vms(0..u32::try_from(free).expect("small"))
    })
    .await;
    allocated_claim(&s, "peer-pod-vm", &format!("vm-{highest}")).await;
    wait_status(&s, "one slot allocated", |st| st.allocated_slots == Some(1)).await;

    // The quota drops to two free: the allocated device stays, one free device beside it.
    let domain = libvirt
        .define_domain_xml(&format!(
            "<domain type='test'><name>{}-quota</name><memory unit='MiB'>128</memory><vcpu>{}</vcpu>\
             <os><type arch='i686'>hvm</type></os></domain>",
            s.ns,
            free - 2
        ))
        .expect("define a domain taking the host's vCPUs");
    let (_, _, devices) = wait_pool(&s, "a pool of 2 keeping the allocated device", |d| {
        d.len() == 2
    })
    .await;
    assert_eq!(
        devices,
        BTreeSet::from(["vm-0".to_owned(), format!("vm-{highest}")])
    );
    let status = wait_status(&s, "pool of 2, 1 allocated", |st| st.pool_size == Some(2)).await;
    assert_eq!(
        (
            status.provider_free_capacity,
            status.allocated_slots,
            status.free_slots
        ),
        (Some(2), Some(1), Some(1))
    );

    // Below what is allocated: the claim's device alone.
    let more = libvirt
        .define_domain_xml(&format!(
            "<domain type='test'><name>{}-quota-2</name><memory unit='MiB'>128</memory><vcpu>2</vcpu>\
             <os><type arch='i686'>hvm</type></os></domain>",
            s.ns
        ))
        .expect("define a second domain");
    let (_, _, devices) = wait_pool(&s, "the allocated device alone", |d| d.len() == 1).await;
    assert_eq!(devices, BTreeSet::from([format!("vm-{highest}")]));

    for d in [domain, more] {
        d.undefine().expect("undefine");
    }
    // Claims are read cluster-wide: one left allocated would hold a device in the next scenario's pool.
    Api::<ResourceClaim>::namespaced(s.client.clone(), &s.ns)
        .delete("peer-pod-vm", &DeleteParams::default())
        .await
        .expect("delete claim");
    s.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn back_in_node_mode_the_plugin_stays_until_no_claim_is_allocated() {
    let s = Scenario::start("ppc-dra-drain").await;
    s.create_nodes(0..2, |_| true).await;
    s.create_config(
        NAME,
        serde_json::json!({"limit": 2, "capacityMode": "dra", "nodeSelector": s.selector()}),
    )
    .await;
    wait_pool(&s, "a pool of 2", |d| d == &vms(0..2)).await;
    allocated_claim(&s, "running-peer-pod", "vm-1").await;
    wait_status(&s, "one slot allocated", |st| st.allocated_slots == Some(1)).await;

    // node mode with a claim allocated: the pool goes, the plugin stays and the status says why.
    set_mode(&s, "node").await;
    let status = wait_status(&s, "the plugin draining", |st| {
        st.conditions
            .iter()
            .any(|c| c.type_ == "DraPluginReady" && c.reason == "DraPluginDraining")
    })
    .await;
    let draining = status
        .conditions
        .iter()
        .find(|c| c.type_ == "DraPluginReady")
        .expect("condition");
    assert!(
        draining.message.contains("1 ResourceClaim(s)"),
        "{}",
        draining.message
    );
    s.wait_spread(2).await;
    assert!(pool(&s).await.is_none(), "slices left in node mode");
    assert!(device_class(&s).await.is_none(), "DeviceClass left");
    let kept = plugin(&s)
        .await
        .expect("plugin kept while a claim is allocated");
    assert!(kept.metadata.deletion_timestamp.is_none());

    // The kubelet unprepared the claim and it was deallocated: the plugin goes, and so does the condition.
    Api::<ResourceClaim>::namespaced(s.client.clone(), &s.ns)
        .patch_status(
            "running-peer-pod",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"status": {"allocation": null}})),
        )
        .await
        .expect("deallocate the claim");
    wait_no_pool(&s, "the plugin gone once nothing is allocated").await;
    wait_status(&s, "no plugin condition", |st| {
        !st.conditions.iter().any(|c| c.type_ == "DraPluginReady")
    })
    .await;

    s.finish().await;
}
