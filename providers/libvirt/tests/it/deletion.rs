//! Deletes by the deletion engine's rules, through the real libvirt client library against its
//! in-memory `test:///default` driver: a domain marked do-not-delete (in its tags metadata) is
//! refused and kept, only the volumes cloud-api-adaptor created for the domain are deleted with
//! it (a shared base image or any other volume it uses stays), and what a confirmed delete costs.
//! Every domain and volume here has a name of its own: the test driver's state is shared by every
//! connection of the process, and the tests run side by side.

use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider, ProviderConfig};
use peerpods_provider_libvirt::LibvirtProvider;
use virt::connect::Connect;
use virt::error::ErrorNumber;
use virt::storage_vol::StorageVol;

/// The test driver's storage pool.
const POOL: &str = "default-pool";

fn provider(extra: &[(&str, &str)]) -> (LibvirtProvider, CloudCalls) {
    let mut pairs = vec![("LIBVIRT_URI", "test:///default")];
    pairs.extend_from_slice(extra);
    let calls = CloudCalls::default();
    let config = ProviderConfig::from_pairs(pairs).for_development(true);
    (
        LibvirtProvider::from_config(&config, calls.clone()).unwrap(),
        calls,
    )
}

fn connect() -> Connect {
    Connect::open(Some("test:///default")).unwrap()
}

/// A volume `name` in the test pool; returns its path.
fn volume(conn: &Connect, name: &str) -> String {
    let pool = conn.lookup_storage_pool_by_name(POOL).unwrap();
    let xml = format!(
        "<volume><name>{name}</name><capacity unit='MiB'>1</capacity>\
         <target><format type='raw'/></target></volume>"
    );
    StorageVol::create_xml(&pool, &xml, 0)
        .unwrap()
        .path()
        .unwrap()
}

fn volume_exists(conn: &Connect, path: &str) -> bool {
    match conn.lookup_storage_vol_by_path(path) {
        Ok(_) => true,
        Err(e) if e.code().is(ErrorNumber::NoStorageVolume) => false,
        Err(e) => panic!("{path}: {e}"),
    }
}

fn domain_exists(conn: &Connect, uuid: &str) -> bool {
    match conn.lookup_domain_by_uuid_string(uuid) {
        Ok(_) => true,
        Err(e) if e.code().is(ErrorNumber::NoDomain) => false,
        Err(e) => panic!("{uuid}: {e}"),
    }
}

/// A domain as cloud-api-adaptor creates one, named `podvm-<uuid>`: its root disk
/// `<name>-root.qcow2` and cloud-init disk `<name>-cloudinit.iso`, plus `extra` disk files
/// (paths), with `tags` in its tags metadata; defined and running. Returns its UUID, name and the
/// paths of its two own volumes.
fn caa_domain(
    conn: &Connect,
    tags: &[(&str, &str)],
    extra: &[&str],
) -> (String, String, [String; 2]) {
    let uuid = uuid::Uuid::new_v4().to_string();
    let name = format!("podvm-{uuid}");
    let root = volume(conn, &format!("{name}-root.qcow2"));
    let cloudinit = volume(conn, &format!("{name}-cloudinit.iso"));
    let tag_xml: String = tags
        .iter()
        .map(|(k, v)| format!("<peerpods:tag key='{k}'>{v}</peerpods:tag>"))
        .collect();
    let extra_xml: String = extra
        .iter()
        .zip(["vdb", "vdc", "vdd"])
        .map(|(path, dev)| {
            format!(
                "<disk type='file' device='disk'><source file='{path}'/>\
                 <target dev='{dev}' bus='virtio'/></disk>"
            )
        })
        .collect();
    let xml = format!(
        "<domain type='test'><name>{name}</name><uuid>{uuid}</uuid>\
         <memory unit='MiB'>128</memory><vcpu>2</vcpu><os><type arch='i686'>hvm</type></os>\
         <metadata><peerpods:tags xmlns:peerpods='urn:peerpods:tags:v1'>{tag_xml}</peerpods:tags></metadata>\
         <devices><disk type='file' device='disk'><source file='{root}'/>\
         <target dev='vda' bus='virtio'/></disk>\
         <disk type='file' device='cdrom'><source file='{cloudinit}'/>\
         <target dev='hda' bus='ide'/><readonly/></disk>{extra_xml}</devices></domain>"
    );
    let domain = conn.define_domain_xml(&xml).unwrap();
    domain.create().unwrap();
    (uuid, name, [root, cloudinit])
}

/// A domain tagged do-not-delete (either key, any value but `false`) is refused with
/// `DoNotDelete` before anything is touched: it still runs, its volumes are all there. The same
/// backend call serves cloud-api-adaptor's DeleteInstance and peerpod-ctrl's cleanup (both are
/// provider-service's DeleteInstance). `false` does not protect.
#[tokio::test(flavor = "multi_thread")]
async fn a_domain_marked_do_not_delete_survives_and_keeps_its_volumes() {
    let conn = connect();
    let (provider, _) = provider(&[]);
    for key in ["peerpods.io/do-not-delete", "peerpods-do-not-delete"] {
        let (uuid, _, volumes) = caa_domain(&conn, &[(key, "true")], &[]);

        let answer = provider.delete_instance(&uuid).await;

        assert!(
            matches!(&answer, Err(Error::DoNotDelete { tag, .. }) if *tag == key),
            "{key}: {answer:?}"
        );
        let domain = conn.lookup_domain_by_uuid_string(&uuid).unwrap();
        assert!(domain.is_active().unwrap(), "{key}: the domain was stopped");
        for path in &volumes {
            assert!(volume_exists(&conn, path), "{key}: {path} was deleted");
        }
    }
    let (uuid, _, volumes) = caa_domain(&conn, &[("peerpods-do-not-delete", "false")], &[]);
    assert_eq!(
        provider.delete_instance(&uuid).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(!domain_exists(&conn, &uuid));
    assert!(volumes.iter().all(|path| !volume_exists(&conn, path)));
}

/// The domain's own volumes (named for it by cloud-api-adaptor) go with it; a shared base image
/// it uses, a volume named for another domain and a disk file no pool manages stay.
#[tokio::test(flavor = "multi_thread")]
async fn only_the_volumes_created_for_the_domain_are_deleted() {
    let conn = connect();
    let (provider, _) = provider(&[]);
    let run = uuid::Uuid::new_v4();
    let base = volume(&conn, &format!("podvm-base-{run}.qcow2"));
    let others = volume(&conn, &format!("podvm-{run}-root.qcow2"));
    let (uuid, name, own) = caa_domain(&conn, &[], &[&base, &others, "/not/in/a/pool.img"]);
    assert!(!others.contains(&name));

    assert_eq!(
        provider.delete_instance(&uuid).await.unwrap(),
        DeleteOutcome::Deleted
    );

    assert!(!domain_exists(&conn, &uuid));
    for path in &own {
        assert!(!volume_exists(&conn, path), "{path} leaked");
    }
    assert!(
        volume_exists(&conn, &base),
        "the shared base image was deleted"
    );
    assert!(
        volume_exists(&conn, &others),
        "another domain's volume was deleted"
    );
    // Gone is confirmed, and stays so.
    assert_eq!(
        provider.delete_instance(&uuid).await.unwrap(),
        DeleteOutcome::AlreadyGone
    );
}

/// libvirt has no cluster tags, so by default only do-not-delete guards a domain; with a
/// `CLUSTER_TAG` set, a domain must carry it in its tags metadata, and its volumes are its.
#[tokio::test(flavor = "multi_thread")]
async fn with_a_cluster_tag_only_the_clusters_domains_are_deleted() {
    let conn = connect();
    let (guarded, _) = provider(&[("CLUSTER_TAG", "cluster=c1")]);
    let (theirs, _, their_volumes) = caa_domain(&conn, &[("cluster", "c2")], &[]);
    let (ours, _, our_volumes) = caa_domain(&conn, &[("cluster", "c1")], &[]);

    let answer = guarded.delete_instance(&theirs).await;

    assert!(
        matches!(answer, Err(Error::NotOwnedByCluster { .. })),
        "{answer:?}"
    );
    assert!(domain_exists(&conn, &theirs));
    assert!(their_volumes.iter().all(|path| volume_exists(&conn, path)));
    assert_eq!(
        guarded.delete_instance(&ours).await.unwrap(),
        DeleteOutcome::Deleted
    );
    assert!(our_volumes.iter().all(|path| !volume_exists(&conn, path)));
    // Without a cluster tag, an untagged domain is deleted.
    let (provider, _) = provider(&[]);
    assert_eq!(
        provider.delete_instance(&theirs).await.unwrap(),
        DeleteOutcome::Deleted
    );
}

/// libvirt is strongly consistent: by default an unknown UUID is gone at once
/// (`LIBVIRT_NOT_FOUND_WINDOW_SECS` is 0); a window set makes it a wait naming the key.
#[tokio::test(flavor = "multi_thread")]
async fn an_unknown_domain_is_gone_at_once_unless_a_window_is_set() {
    let unknown = uuid::Uuid::new_v4().to_string();
    let (strict, _) = provider(&[]);
    assert_eq!(
        strict.delete_instance(&unknown).await.unwrap(),
        DeleteOutcome::AlreadyGone
    );
    let (waiting, _) = provider(&[("LIBVIRT_NOT_FOUND_WINDOW_SECS", "60")]);
    let answer = waiting.delete_instance(&unknown).await;
    assert!(
        matches!(&answer, Ok(DeleteOutcome::NotYetVisible { setting, .. }) if *setting == "LIBVIRT_NOT_FOUND_WINDOW_SECS"),
        "{answer:?}"
    );
}

/// What one confirmed delete of a domain with its two volumes costs, in counted libvirt calls
/// (each a blocking call on the connection): the lookup, the destroy and undefine, the lookup
/// that confirms it gone, and per volume a lookup, the delete and the lookup that confirms it.
#[tokio::test(flavor = "multi_thread")]
async fn one_confirmed_delete_costs_these_calls() {
    let conn = connect();
    let (provider, calls) = provider(&[]);
    let (uuid, _, _) = caa_domain(&conn, &[], &[]);

    assert_eq!(
        provider.delete_instance(&uuid).await.unwrap(),
        DeleteOutcome::Deleted
    );

    let counted: Vec<(&str, u64)> = [
        "look_up_domain",
        "delete_domain",
        "look_up_volume",
        "delete_volume",
    ]
    .into_iter()
    .map(|op| (op, calls.count("libvirt", op, "ok")))
    .collect();
    assert_eq!(
        counted,
        [
            ("look_up_domain", 2),
            ("delete_domain", 1),
            ("look_up_volume", 4),
            ("delete_volume", 2),
        ]
    );
}
