//! PeerPods for the unit tests of the rules.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};

use peerpods_api::peerpod::{DO_NOT_DELETE, FINALIZER, PeerPod, PeerPodSpec};

pub fn time(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(1_700_000_000 + secs).expect("valid"))
}

pub fn peerpod(name: &str, created: i64) -> PeerPod {
    let mut p = PeerPod::new(
        name,
        PeerPodSpec {
            cloud_provider: "libvirt".into(),
            instance_id: format!("id-{name}"),
        },
    );
    p.metadata.uid = Some(format!("uid-{name}"));
    p.metadata.creation_timestamp = Some(time(created));
    p.metadata.finalizers = Some(vec![FINALIZER.into()]);
    p
}

pub fn owned_by(mut p: PeerPod, uid: &str, controller: Option<bool>) -> PeerPod {
    p.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "Pod".into(),
        name: "pod".into(),
        uid: uid.into(),
        controller,
        block_owner_deletion: Some(true),
    }]);
    p
}

pub fn deleting(mut p: PeerPod) -> PeerPod {
    p.metadata.deletion_timestamp = Some(time(100));
    p
}

pub fn named(mut p: PeerPod, provider: &str, instance_id: &str) -> PeerPod {
    p.metadata.namespace = Some("ns".into());
    p.spec.cloud_provider = provider.into();
    p.spec.instance_id = instance_id.into();
    p
}

pub fn annotated(mut p: PeerPod, value: &str) -> PeerPod {
    p.metadata.annotations = Some(std::collections::BTreeMap::from([(
        DO_NOT_DELETE.to_string(),
        value.to_string(),
    )]));
    p
}
