//! The libvirt backend through real gRPC over loopback against libvirt's `test:///default`
//! driver (the real libvirt library, no daemon). All connections to `test:///default` in one
//! process share state, so these tests run one at a time.

use std::collections::HashMap;

use peerpods_proto::v1 as pb;
use tokio::sync::Mutex;
use virt::connect::Connect;
use virt::error::ErrorNumber;

pub(crate) static LIBVIRT: Mutex<()> = Mutex::const_new(());

const POOL: &str = "default-pool";

/// A persistent, running domain with one file-backed volume in the test pool (its root disk, named
/// `<domain>-root.qcow2` as cloud-api-adaptor names it) and the given tags.
/// Returns its UUID and the volume path.
fn define_domain(conn: &Connect, tags: &[(&str, &str)]) -> (String, String) {
    let uuid = uuid::Uuid::new_v4().to_string();
    let pool = conn.lookup_storage_pool_by_name(POOL).unwrap();
    let vol_xml = format!(
        "<volume><name>pp-{uuid}-root.qcow2</name><capacity unit='MiB'>1</capacity>\
         <target><format type='raw'/></target></volume>"
    );
    let vol = virt::storage_vol::StorageVol::create_xml(&pool, &vol_xml, 0).unwrap();
    let path = vol.path().unwrap();
    let tag_xml: String = tags
        .iter()
        .map(|(k, v)| format!("<peerpods:tag key='{k}'>{v}</peerpods:tag>"))
        .collect();
    let xml = format!(
        "<domain type='test'><name>pp-{uuid}</name><uuid>{uuid}</uuid>\
         <memory unit='MiB'>128</memory><vcpu>2</vcpu><os><type arch='i686'>hvm</type></os>\
         <metadata><peerpods:tags xmlns:peerpods='urn:peerpods:tags:v1'>{tag_xml}</peerpods:tags></metadata>\
         <devices><disk type='file' device='disk'><source file='{path}'/>\
         <target dev='vda' bus='virtio'/></disk></devices></domain>"
    );
    let domain = conn.define_domain_xml(&xml).unwrap();
    domain.create().unwrap();
    assert!(domain.is_active().unwrap());
    (uuid, path)
}

fn delete_request(provider: &str, id: &str) -> pb::DeleteInstanceRequest {
    pb::DeleteInstanceRequest {
        cloud_provider: provider.into(),
        instance_id: id.into(),
        requester: Some(pb::Requester {
            component: "test".into(),
            namespace: "ns".into(),
            name: "pod-resource-abcde".into(),
            reason: "PeerPodDeleted".into(),
        }),
        accept_in_progress: false,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn delete_running_domain_removes_volume_and_definition() {
    let _serial = LIBVIRT.lock().await;
    let conn = Connect::open(Some("test:///default")).unwrap();
    let (uuid, path) = define_domain(&conn, &[]);
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;

    let answer = client
        .delete_instance(delete_request("libvirt", &uuid))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.result(), pb::DeleteResult::Deleted);

    let lookup = conn.lookup_domain_by_uuid_string(&uuid);
    assert!(
        lookup
            .as_ref()
            .is_err_and(|e| e.code().is(ErrorNumber::NoDomain)),
        "domain still defined"
    );
    let vol = conn.lookup_storage_vol_by_path(&path);
    assert!(
        vol.as_ref()
            .is_err_and(|e| e.code().is(ErrorNumber::NoStorageVolume)),
        "volume {path} still there"
    );

    // A second delete of the same domain is a success too.
    let again = client
        .delete_instance(delete_request("libvirt", &uuid))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.result(), pb::DeleteResult::AlreadyGone);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_uuid_is_already_gone_and_malformed_is_invalid() {
    let _serial = LIBVIRT.lock().await;
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;

    let unknown = uuid::Uuid::new_v4().to_string();
    let answer = client
        .delete_instance(delete_request("libvirt", &unknown))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.result(), pb::DeleteResult::AlreadyGone);

    for malformed in [
        "not-a-uuid",
        "6695eb01f6a4830479aa97f2502e193f",
        "{6695eb01-f6a4-8304-79aa-97f2502e193f}",
    ] {
        let status = client
            .delete_instance(delete_request("libvirt", malformed))
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{malformed}");
        assert!(
            status.message().starts_with("instance_id:"),
            "{}",
            status.message()
        );
    }
    // The built-in domain of the test driver was not touched by any of this.
    let conn = Connect::open(Some("test:///default")).unwrap();
    assert!(conn.lookup_domain_by_name("test").is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn list_instances_matches_metadata_tags_only() {
    let _serial = LIBVIRT.lock().await;
    let conn = Connect::open(Some("test:///default")).unwrap();
    let cluster = uuid::Uuid::new_v4().to_string();
    let (tagged, _) = define_domain(&conn, &[("cluster", &cluster), ("role", "peerpod")]);
    let (other, _) = define_domain(&conn, &[("cluster", "someone-else")]);
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;

    let listed = client
        .list_instances(pb::ListInstancesRequest {
            cloud_provider: "libvirt".into(),
            tag_selector: HashMap::from([("cluster".to_owned(), cluster.clone())]),
        })
        .await
        .unwrap()
        .into_inner()
        .instances;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].instance_id, tagged);
    assert_eq!(
        listed[0].tags.get("role").map(String::as_str),
        Some("peerpod")
    );
    assert_eq!(
        listed[0].create_time, None,
        "libvirt does not know creation times"
    );

    // An empty selector sees every domain, including the test driver's own and untagged ones.
    let all = client
        .list_instances(pb::ListInstancesRequest {
            cloud_provider: "libvirt".into(),
            tag_selector: HashMap::new(),
        })
        .await
        .unwrap()
        .into_inner()
        .instances;
    let ids: Vec<&str> = all.iter().map(|i| i.instance_id.as_str()).collect();
    assert!(
        ids.contains(&tagged.as_str()) && ids.contains(&other.as_str()),
        "{ids:?}"
    );
    assert!(
        ids.windows(2).all(|w| w[0] <= w[1]),
        "ordered by id: {ids:?}"
    );

    for id in [tagged, other] {
        let r = client
            .delete_instance(delete_request("libvirt", &id))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.result(), pb::DeleteResult::Deleted);
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_comes_from_the_host_and_defined_domains() {
    let _serial = LIBVIRT.lock().await;
    let conn = Connect::open(Some("test:///default")).unwrap();
    let node = conn.node_info().unwrap();
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;
    let ask = || pb::GetCapacityRequest {
        cloud_provider: "libvirt".into(),
    };

    let before = client.get_capacity(ask()).await.unwrap().into_inner();
    let vcpus = before.vcpus.unwrap();
    assert_eq!(vcpus.limit, Some(u64::from(node.cpus)));
    assert_eq!(before.memory_mib.unwrap().limit, Some(node.memory / 1024));
    assert_eq!(
        before.instances.unwrap().limit,
        None,
        "libvirt has no instance quota"
    );

    let (uuid, _) = define_domain(&conn, &[]);
    // Capacity answers are cached for a few seconds (one cloud call per few seconds, however
    // many pollers): the new domain shows once the cached answer expires.
    let in_use_before = before.instances.and_then(|f| f.in_use);
    let after = crate::common::eventually("the new domain counted", || {
        let mut client = client.clone();
        async move {
            let now = client.get_capacity(ask()).await.unwrap().into_inner();
            (now.instances.and_then(|f| f.in_use) != in_use_before).then_some(now)
        }
    })
    .await;
    assert_eq!(
        after.instances.unwrap().in_use,
        before.instances.unwrap().in_use.map(|n| n + 1)
    );
    assert_eq!(after.vcpus.unwrap().in_use, vcpus.in_use.map(|n| n + 2));
    assert_eq!(
        after.memory_mib.unwrap().in_use,
        before.memory_mib.unwrap().in_use.map(|n| n + 128)
    );
    client
        .delete_instance(delete_request("libvirt", &uuid))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn list_providers_reports_libvirt_healthy() {
    let _serial = LIBVIRT.lock().await;
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;
    let providers = client
        .list_providers(pb::ListProvidersRequest {})
        .await
        .unwrap()
        .into_inner()
        .providers;
    assert_eq!(providers.len(), 1);
    assert_eq!(providers[0].name, "libvirt");
    assert!(providers[0].healthy, "{}", providers[0].message);
}

/// A domain libvirt does not know while a not-found window is set (as for a cloud whose API shows a new
/// instance late): inside the window the answer is a wait, never an outage. A caller that accepts IN_PROGRESS
/// hears it waiting for NOT_YET_VISIBLE, with how long the cloud has not shown the instance and advice to ask
/// again no later than the window's end; any other caller hears UNAVAILABLE with a reason of its own,
/// `NotYetVisible` (not `CloudUnavailable`), and RetryInfo. Once the window has passed, the same call answers
/// ALREADY_GONE.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_domain_inside_the_not_found_window_is_a_wait_then_already_gone() {
    use std::time::Duration;
    use tonic_types::StatusExt;

    const WINDOW: Duration = Duration::from_secs(3);
    let dir = crate::common::config_dir(&[
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", "test:///default"),
        ("LIBVIRT_NOT_FOUND_WINDOW_SECS", "3"),
    ]);
    let server = crate::common::start(dir.path(), crate::common::Options::development()).await;
    let mut client = server.client().await;
    let unknown = uuid::Uuid::new_v4().to_string();
    let request = |accept_in_progress| pb::DeleteInstanceRequest {
        accept_in_progress,
        ..delete_request("libvirt", &unknown)
    };

    let answer = client
        .delete_instance(request(true))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(answer.result(), pb::DeleteResult::InProgress, "{answer:?}");
    assert_eq!(
        answer.waiting(),
        pb::DeleteWait::NotYetVisible,
        "{answer:?}"
    );
    let unknown_for = Duration::try_from(answer.unknown_for.unwrap()).unwrap();
    let advice = Duration::try_from(answer.retry_after.unwrap()).unwrap();
    assert!(unknown_for < WINDOW, "{answer:?}");
    assert!(
        advice > Duration::ZERO && unknown_for + advice <= WINDOW,
        "ask again by the window's end: {answer:?}"
    );

    let status = client.delete_instance(request(false)).await.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let details = status.get_error_details();
    assert_eq!(
        details.error_info().map(|i| i.reason.as_str()),
        Some("NotYetVisible"),
        "{status:?}"
    );
    assert!(
        details.retry_info().and_then(|r| r.retry_delay).is_some(),
        "{status:?}"
    );
    assert!(
        status.message().contains("LIBVIRT_NOT_FOUND_WINDOW_SECS"),
        "the answer names the window's setting: {status:?}"
    );

    let gone = crate::common::eventually("the window to pass", || {
        let mut client = client.clone();
        let request = request(true);
        async move {
            let answer = client.delete_instance(request).await.unwrap().into_inner();
            match answer.result() {
                pb::DeleteResult::InProgress => {
                    assert_eq!(
                        answer.waiting(),
                        pb::DeleteWait::NotYetVisible,
                        "{answer:?}"
                    );
                    None
                }
                _ => Some(answer),
            }
        }
    })
    .await;
    assert_eq!(gone.result(), pb::DeleteResult::AlreadyGone, "{gone:?}");
    assert_eq!(gone.waiting(), pb::DeleteWait::Unspecified, "{gone:?}");
    assert!(
        gone.retry_after.is_none() && gone.unknown_for.is_none(),
        "{gone:?}"
    );

    let calls = |result: &str| {
        server
            .metrics
            .calls
            .get_or_create(&provider_service::metrics::CallLabels {
                method: "DeleteInstance",
                provider: "libvirt".into(),
                result: result.into(),
            })
            .get()
    };
    assert!(calls("not_yet_visible") >= 1);
    assert_eq!(calls("NotYetVisible"), 1);
    assert_eq!(calls("CloudUnavailable"), 0);
}
