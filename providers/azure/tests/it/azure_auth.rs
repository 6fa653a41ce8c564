//! Configuration and credentials: missing keys, refused secrets, workload identity, the CA
//! bundle, against the emulator's Entra ID token endpoint.

use crate::azure_support::{config, provider, unknown_id};
use peerpods_emulator_azure::{AzureEmulator, CLIENT_SECRET, FEDERATED_TOKEN};
use peerpods_provider_azure::AzureProvider;
use peerpods_provider_core::{CloudCalls, Error, Provider, ProviderConfig};
use test_support::cloud::CloudEmulator;
use test_support::provider_checks;

const WRONG_SECRET: &str = "wrong-client-secret-0123456789";

#[tokio::test(flavor = "multi_thread")]
async fn refused_credentials_are_cloud_unauthenticated_and_never_show_the_secret() {
    let emulator = AzureEmulator::start();
    let id = emulator.create_vm("podvm-auth", &[]);
    let (provider, calls) = provider(&emulator, &[("AZURE_CLIENT_SECRET", WRONG_SECRET)]);

    let error = provider_checks::refused_credentials_are_unauthenticated_and_never_shown(
        &emulator,
        &provider,
        &id,
        &[WRONG_SECRET],
    )
    .await;

    assert!(error.to_string().contains("AADSTS7000215"), "{error}");
    assert!(emulator.vm_exists("podvm-auth"));
    assert!(
        emulator.arm_requests().is_empty(),
        "no ARM call without a token"
    );
    assert!(calls.count("azure", "AcquireToken", "error") >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_service_principal_is_cloud_unauthenticated() {
    let emulator = AzureEmulator::start();
    emulator.reject_credentials(true);
    let (provider, _) = provider(&emulator, &[]);

    let error = provider.capacity().await.expect_err("refused");

    assert!(
        matches!(error, Error::CloudUnauthenticated { .. }),
        "{error:?}"
    );
    assert!(!format!("{error} {error:?}").contains(CLIENT_SECRET));
}

#[tokio::test(flavor = "multi_thread")]
async fn workload_identity_exchanges_the_service_account_token() {
    let emulator = AzureEmulator::start();
    let dir = tempfile::tempdir().expect("dir");
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(&token_file, FEDERATED_TOKEN).expect("token file");
    let config = ProviderConfig::from_pairs(
        emulator.workload_identity_config(token_file.to_str().expect("utf-8 path")),
    );
    let provider = AzureProvider::from_config(&config, CloudCalls::default()).expect("provider");
    emulator.create_vm("podvm-wi", &[("cluster", "c1")]);

    let listed = provider
        .list_instances(&[("cluster".to_owned(), "c1".to_owned())].into())
        .await
        .expect("list");

    assert_eq!(listed.len(), 1);
    assert_eq!(emulator.token_requests(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_ca_bundle_the_emulator_is_not_trusted() {
    let emulator = AzureEmulator::start();
    let (provider, _) = provider(
        &emulator,
        &[("AZURE_CA_BUNDLE", ""), ("AZURE_MAX_RETRIES", "0")],
    );

    let error = provider
        .delete_instance(&unknown_id("podvm-tls"))
        .await
        .expect_err("untrusted");

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert_eq!(emulator.token_requests(), 0);
}

#[test]
fn each_missing_required_key_is_named_without_contacting_anything() {
    let emulator = AzureEmulator::start();
    for key in [
        "AZURE_SUBSCRIPTION_ID",
        "AZURE_RESOURCE_GROUP",
        "AZURE_REGION",
        "AZURE_TENANT_ID",
        "AZURE_CLIENT_ID",
        "AZURE_CLIENT_SECRET",
    ] {
        let error =
            AzureProvider::from_config(&config(&emulator, &[(key, "")]), CloudCalls::default())
                .expect_err(key);
        match &error {
            Error::Config { key: named, .. } => assert_eq!(named, key),
            other => panic!("{key}: {other:?}"),
        }
    }
    let error = AzureProvider::from_config(
        &config(
            &emulator,
            &[("AZURE_RESOURCE_MANAGER_ENDPOINT", "http://127.0.0.1:1")],
        ),
        CloudCalls::default(),
    )
    .expect_err("plain http");
    assert!(
        matches!(&error, Error::Config { key, .. } if key == "AZURE_RESOURCE_MANAGER_ENDPOINT"),
        "{error:?}"
    );
    let error = AzureProvider::from_config(
        &config(
            &emulator,
            &[(
                "AZURE_CA_BUNDLE",
                "-----BEGIN CERTIFICATE-----\nnot base64\n",
            )],
        ),
        CloudCalls::default(),
    )
    .expect_err("bad pem");
    assert!(
        matches!(&error, Error::Config { key, .. } if key == "AZURE_CA_BUNDLE"),
        "{error:?}"
    );
    // A valid configuration builds without a single request.
    AzureProvider::from_config(&config(&emulator, &[]), CloudCalls::default()).expect("valid");
    assert!(emulator.arm_requests().is_empty());
    assert_eq!(emulator.token_requests(), 0);
}
