//! provider-service's CA rotates under a running peerpod-ctrl (cert-manager re-issues it; the
//! mounted CA file changes in place): cleanups go on without restarting the controller.

use std::path::Path;
use std::time::Duration;

use crate::support::{Controller, ControllerOptions, ProviderService, Scenario, unused_addr};
use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

const MINUTE: Duration = Duration::from_secs(60);
const SERVER_NAME: &str = "provider-service.peerpods.svc";

/// A new CA and a serving certificate it signs for [`SERVER_NAME`]: the certificate and key go to
/// `tls.crt`/`tls.key` in `dir`, the CA to `ca.crt` (each replaced by a rename, as the kubelet
/// updates a mounted Secret).
fn rotate(dir: &Path, generation: u32) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.distinguished_name.push(
        rcgen::DnType::CommonName,
        format!("peerpods CA {generation}"),
    );
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca_params, ca_key);
    let leaf_key = KeyPair::generate().unwrap();
    let leaf = CertificateParams::new(vec![SERVER_NAME.to_owned()])
        .unwrap()
        .signed_by(&leaf_key, &issuer)
        .unwrap();
    for (name, pem) in [
        ("tls.crt", leaf.pem()),
        ("tls.key", leaf_key.serialize_pem()),
        ("ca.crt", ca.pem()),
    ] {
        let staged = dir.join(format!(".{name}.new"));
        std::fs::write(&staged, pem).unwrap();
        std::fs::rename(&staged, dir.join(name)).unwrap();
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rotated_ca_is_trusted_without_a_restart() {
    let s = Scenario::start("ca-rotation").await;
    let tls = tempfile::tempdir().unwrap();
    rotate(tls.path(), 1);
    let (cert, key) = (tls.path().join("tls.crt"), tls.path().join("tls.key"));
    let addr = unused_addr();
    let provider = ProviderService::start_with_tls(Some(addr), Some((&cert, &key))).await;
    let mut options = ControllerOptions::new(addr);
    options.provider_tls = Some((tls.path().join("ca.crt"), SERVER_NAME.to_owned()));
    let ctrl = Controller::start(s.client.clone(), options).await;

    let before = s.define_domain(false);
    s.create_peerpod("before", None, "libvirt", &before).await;
    s.delete_peerpod("before").await;
    s.wait_peerpod_gone("before", MINUTE).await;
    assert!(!s.domain_exists(&before));

    // A new CA: provider-service restarts with a certificate only the new CA vouches for, so the
    // controller's old connection is gone and a new one must trust the new CA.
    provider.stop();
    rotate(tls.path(), 2);
    let provider = ProviderService::start_with_tls(Some(addr), Some((&cert, &key))).await;

    let after = s.define_domain(false);
    s.create_peerpod("after", None, "libvirt", &after).await;
    s.delete_peerpod("after").await;
    s.wait_peerpod_gone("after", MINUTE).await;
    assert!(!s.domain_exists(&after));
    assert_eq!(provider.delete_calls("libvirt"), 1);
    ctrl.stop().await;
    s.cleanup().await;
}
