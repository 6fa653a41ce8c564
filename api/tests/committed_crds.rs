//! The committed CRDs (`deploy/crds`, which the charts link to) must be exactly what the Rust types generate
//! (`make manifests` rewrites them).

use std::path::{Path, PathBuf};

fn committed(name: &str) -> (PathBuf, String) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/crds")
        .join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (path, text)
}

#[test]
fn committed_peerpod_crd_matches_the_types() {
    let (path, committed) = committed("peerpods.yaml");
    let generated = peerpods_api::peerpod::crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "{} is stale: run `make manifests` and commit the result",
        path.display()
    );
}

#[test]
fn committed_peerpodconfig_crd_matches_the_types() {
    let (path, committed) = committed("peerpodconfigs.yaml");
    let generated = peerpods_api::peerpodconfig::crd_yaml().expect("CRD renders");
    assert!(
        committed == generated,
        "{} is stale: run `make manifests` and commit the result",
        path.display()
    );
}

/// `kubectl apply -f deploy/crds` warns about every format the API server does not know; schemars gives unsigned
/// fields `uint32`/`uint64`. No committed CRD may carry one.
#[test]
fn committed_crds_carry_no_unsigned_format() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    let mut checked = 0;
    for entry in std::fs::read_dir(&dir).expect("deploy/crds") {
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
