//! The committed CRD must be what the Rust types generate (`make manifests` regenerates it).

#[test]
fn committed_crd_matches_the_types() {
    let generated = peer_pod_config_ctrl::crd::crd_yaml().expect("CRD serializes");
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/crds/peerpodconfigs.yaml"
    );
    let committed = std::fs::read_to_string(path).expect("deploy/crds/peerpodconfigs.yaml exists");
    assert!(
        committed == generated,
        "deploy/crds/peerpodconfigs.yaml is stale: run `make manifests` and commit the result"
    );
}
