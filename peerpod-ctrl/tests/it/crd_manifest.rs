//! The committed CRD must be exactly what the Rust types generate (`make manifests` rewrites it).

#[test]
fn committed_crd_matches_the_types() {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds/peerpods.yaml");
    let committed = std::fs::read_to_string(&path).expect("deploy/crds/peerpods.yaml exists");
    let generated = peerpod_ctrl::crd::crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "deploy/crds/peerpods.yaml is stale: run `make manifests` and commit the result"
    );
}
