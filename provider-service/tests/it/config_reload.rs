//! Config reload: a changed file is used without a restart; a broken one is rejected, the last
//! good config stays in use and the rejection is reported (metric, readiness detail).

use peerpods_proto::v1 as pb;

/// A libvirt test-driver node file with one domain of a known UUID, so the listed instances show
/// which LIBVIRT_URI is in use.
fn node_file(dir: &std::path::Path, uuid: &str) -> String {
    let path = dir.join("node.xml");
    std::fs::write(
        &path,
        format!(
            "<node><domain type='test'><name>from-file</name><uuid>{uuid}</uuid>\
             <memory>1048576</memory><vcpu>1</vcpu><os><type>hvm</type></os></domain></node>"
        ),
    )
    .unwrap();
    format!("test://{}", path.display())
}

async fn listed_ids(server: &crate::common::TestServer) -> Vec<String> {
    let mut client = server.client().await;
    client
        .list_instances(pb::ListInstancesRequest {
            cloud_provider: "libvirt".into(),
            tag_selector: Default::default(),
        })
        .await
        .unwrap()
        .into_inner()
        .instances
        .into_iter()
        .map(|i| i.instance_id)
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn changed_config_is_used_and_broken_config_is_rejected() {
    let config = tempfile::tempdir().unwrap();
    let nodes = tempfile::tempdir().unwrap();
    let file_uuid = "5d6f4c1e-3a57-4f0c-a1d3-0123456789ab";
    let file_uri = node_file(nodes.path(), file_uuid);
    // test:///default knows one domain, "test", with this UUID.
    let default_uuid = "6695eb01-f6a4-8304-79aa-97f2502e193f";
    crate::common::write_config(
        config.path(),
        &[
            ("CLOUD_PROVIDER", "libvirt"),
            ("LIBVIRT_URI", "test:///default"),
        ],
    );
    let server = crate::common::start(config.path(), crate::common::Options::development()).await;
    let metrics = server.metrics.clone();
    assert!(listed_ids(&server).await.contains(&default_uuid.to_owned()));

    // Change LIBVIRT_URI: the next calls go to the other driver instance, without a restart.
    crate::common::write_config(config.path(), &[("LIBVIRT_URI", &file_uri)]);
    let ids = crate::common::eventually("the new LIBVIRT_URI to be used", || async {
        let ids = listed_ids(&server).await;
        ids.contains(&file_uuid.to_owned()).then_some(ids)
    })
    .await;
    assert!(!ids.contains(&default_uuid.to_owned()), "{ids:?}");
    assert_eq!(metrics.config_valid.get(), 1);

    // Break it: the last good config stays, and the rejection shows in metric and readiness.
    crate::common::write_config(config.path(), &[("LIBVIRT_URI", "this is not a uri")]);
    crate::common::eventually("the bad config to be reported", || async {
        (metrics.config_valid.get() == 0).then_some(())
    })
    .await;
    let report = server.readiness.report();
    assert!(
        report.contains("new one rejected: config LIBVIRT_URI"),
        "{report}"
    );
    assert!(listed_ids(&server).await.contains(&file_uuid.to_owned()));

    // An unknown provider name is a bad config too.
    crate::common::write_config(
        config.path(),
        &[
            ("LIBVIRT_URI", &file_uri),
            ("CLOUD_PROVIDER", "libvirt,nimbus"),
        ],
    );
    crate::common::eventually("the unknown provider to be reported", || async {
        server
            .readiness
            .report()
            .contains("unknown provider \"nimbus\"")
            .then_some(())
    })
    .await;
    assert_eq!(metrics.config_valid.get(), 0);

    // Fixing it is picked up again.
    crate::common::write_config(config.path(), &[("CLOUD_PROVIDER", "libvirt")]);
    crate::common::eventually("the fixed config to be valid", || async {
        (metrics.config_valid.get() == 1).then_some(())
    })
    .await;
    assert!(listed_ids(&server).await.contains(&file_uuid.to_owned()));
}
