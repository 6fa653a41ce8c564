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

/// `kubectl apply -f deploy/crds` warns about every format the API server does not know; schemars gives unsigned
/// fields `uint32`/`uint64`. No committed CRD may carry one.
#[test]
fn committed_crds_carry_no_unsigned_format() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/crds");
    let mut checked = 0;
    for entry in std::fs::read_dir(dir).expect("deploy/crds") {
        let path = entry.expect("entry").path();
        if path.extension().is_some_and(|e| e == "yaml") {
            let text = std::fs::read_to_string(&path).expect("CRD");
            let unknown: Vec<&str> = text
                .lines()
                .filter(|l| l.trim_start().starts_with("format: uint"))
                .collect();
            assert!(unknown.is_empty(), "{}: {unknown:?}", path.display());
            checked += 1;
        }
    }
    assert!(checked >= 2, "both CRDs checked");
}
