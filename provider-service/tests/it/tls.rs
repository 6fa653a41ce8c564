//! TLS on the gRPC port: the runtime client verifies the server against a CA file, plaintext
//! clients are refused, and a rotated certificate is served to new connections without restart.

use peerpods_proto::v1 as pb;
use peerpods_provider_client::{ProviderClientConfig, connect};
use provider_service::metrics::ResultLabels;

/// A self-signed certificate for `localhost`, written as cert.pem/key.pem into `dir`; returns
/// the certificate PEM (the client's CA file).
fn issue(dir: &std::path::Path) -> String {
    let key = rcgen::KeyPair::generate().unwrap();
    let params = rcgen::CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
    let cert = params.self_signed(&key).unwrap();
    std::fs::write(dir.join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(dir.join("key.pem"), key.serialize_pem()).unwrap();
    cert.pem()
}

async fn list_with_ca(url: &str, ca: &str, dir: &std::path::Path) -> Result<(), tonic::Status> {
    let ca_file = dir.join(format!("ca-{}.pem", uuid::Uuid::new_v4()));
    std::fs::write(&ca_file, ca).unwrap();
    let mut client = connect(&ProviderClientConfig {
        endpoint: url.to_owned(),
        ca_file: Some(ca_file),
        tls_server_name: Some("localhost".into()),
        ..Default::default()
    })
    .unwrap();
    client
        .list_providers(pb::ListProvidersRequest {})
        .await
        .map(|_| ())
}

/// Returns once the service has read its files again, the TLS pair included, since this was
/// called. Each poll reloads the configuration, then the TLS pair: once two configuration changes
/// made one after the other are applied, the poll that applied the first has finished reading the
/// TLS pair, after this call began. Fails if the service stops polling.
async fn files_reread(server: &crate::common::TestServer, config_dir: &std::path::Path) {
    let applied = || {
        server
            .metrics
            .config_reloads
            .get_or_create(&ResultLabels { result: "applied" })
            .get()
    };
    for _ in 0..2 {
        let before = applied();
        let mark = uuid::Uuid::new_v4().to_string();
        crate::common::write_config(config_dir, &[("TEST_RELOAD_MARK", &mark)]);
        crate::common::eventually("a poll to apply the changed configuration", || async {
            (applied() > before).then_some(())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn tls_with_certificate_rotation() {
    let certs = tempfile::tempdir().unwrap();
    let first_ca = issue(certs.path());
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(
        dir.path(),
        crate::common::Options {
            tls: Some((certs.path().join("cert.pem"), certs.path().join("key.pem"))),
            ..crate::common::Options::development()
        },
    )
    .await;
    let url = format!("https://{}", server.addr);

    list_with_ca(&url, &first_ca, certs.path()).await.unwrap();

    // Plaintext against the TLS port fails.
    let mut plain = peerpods_proto::v1::provider_service_client::ProviderServiceClient::new(
        tonic::transport::Channel::from_shared(server.url())
            .unwrap()
            .connect_lazy(),
    );
    assert!(
        plain
            .list_providers(pb::ListProvidersRequest {})
            .await
            .is_err()
    );

    // A broken key file is rejected and the old pair keeps being served: checked once the service
    // has read the broken files.
    std::fs::write(certs.path().join("key.pem"), "not a key").unwrap();
    files_reread(&server, dir.path()).await;
    list_with_ca(&url, &first_ca, certs.path()).await.unwrap();

    // Rotate: new connections get the new certificate, which the old CA does not trust.
    let second_ca = issue(certs.path());
    crate::common::eventually("the rotated certificate to be served", || async {
        list_with_ca(&url, &second_ca, certs.path()).await.ok()
    })
    .await;
    assert!(list_with_ca(&url, &first_ca, certs.path()).await.is_err());
}
