//! `release` on the local control plane: the binary sets peerpods.io/release as peerpod-ctrl reads it (the API's
//! reader, `PeerPod::release_ask`) on a PeerPod being deleted, `instance-gone` by default and `operator` when asked, and
//! writes nothing on a live PeerPod or when nobody said yes.

use std::process::Output;

use kube::api::{Api, DeleteParams, PostParams};
use peerpods_api::peerpod::ReleaseAsk;
use peerpods_api::peerpod::{FINALIZER, PeerPod, PeerPodSpec};

#[tokio::test]
async fn release_sets_the_annotation_only_on_a_peerpod_being_deleted() {
    let cp = testenv::shared();
    let client = cp.client().await;
    testenv::apply_crds(&client, "deploy/crds/peerpods.yaml").await;
    let ns = testenv::namespace(&client, "plugin-release").await;
    let peerpods: Api<PeerPod> = Api::namespaced(client.clone(), &ns);
    for (name, instance) in [("gone", "i-gone"), ("mine", "i-mine"), ("live", "i-live")] {
        let mut pp = PeerPod::new(
            name,
            PeerPodSpec {
                cloud_provider: "aws".into(),
                instance_id: instance.into(),
            },
        );
        pp.metadata.finalizers = Some(vec![FINALIZER.to_string()]);
        peerpods.create(&PostParams::default(), &pp).await.unwrap();
    }
    for name in ["gone", "mine"] {
        peerpods
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    let run = |args: &[&str]| -> Output {
        // `output()` gives the child no stdin: it is not on a terminal.
        std::process::Command::new(env!("CARGO_BIN_EXE_kubectl-peerpods"))
            .arg("release")
            .args(args)
            .env("KUBECONFIG", cp.kubeconfig_path())
            .output()
            .unwrap()
    };
    let ok = |out: &Output| {
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        )
    };

    ok(&run(&[&format!("{ns}/gone"), "--yes"]));
    let gone = peerpods.get("gone").await.unwrap();
    assert_eq!(gone.release_ask(), Some(ReleaseAsk::InstanceGone));

    // Without --yes and without a terminal nobody said yes: refused, nothing written.
    let unasked = run(&[&format!("{ns}/mine"), "--operator"]);
    assert!(!unasked.status.success());
    assert!(String::from_utf8_lossy(&unasked.stderr).contains("--yes"));
    assert_eq!(peerpods.get("mine").await.unwrap().release_ask(), None);

    ok(&run(&[&format!("{ns}/mine"), "--operator", "--yes"]));
    let mine = peerpods.get("mine").await.unwrap();
    assert_eq!(mine.release_ask(), Some(ReleaseAsk::Operator));
    // A merge patch of the annotation only: the finalizer and the spec are as they were.
    assert_eq!(mine.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    assert_eq!(mine.spec.instance_id, "i-mine");

    let before = peerpods.get("live").await.unwrap();
    let refused = run(&[&format!("{ns}/live"), "--operator", "--yes"]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("is not being deleted"), "{stderr}");
    let after = peerpods.get("live").await.unwrap();
    assert_eq!(after.release_ask(), None);
    assert_eq!(
        after.metadata.resource_version,
        before.metadata.resource_version
    );
}
