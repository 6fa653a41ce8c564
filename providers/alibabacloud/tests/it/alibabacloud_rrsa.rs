//! RRSA (ACK's RAM Roles for Service Accounts): with no static key, the backend exchanges the
//! projected OIDC token with the emulator's STS `AssumeRoleWithOIDC` and signs ECS and VPC calls
//! with the temporary key and its security token, which the emulator checks (token, expiry).

use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use peerpods_emulator_alibabacloud::{
    ACCESS_KEY_ID, AlibabaCloudEmulator, OIDC_PROVIDER_ARN, OIDC_TOKEN, ROLE_ARN,
};
use peerpods_provider_alibabacloud::{AlibabaCloudProvider, NAME, RrsaError, RrsaReason};
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider, ProviderConfig};
use test_support::cloud::CloudEmulator;
use test_support::fault_checks::with;

const EXCHANGE: &str = "AssumeRoleWithOIDC";

/// The token file the kubelet projects, in a directory of the test's own.
struct TokenFile {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TokenFile {
    fn holding(token: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("token");
        std::fs::write(&path, format!("{token}\n")).expect("token written");
        TokenFile { _dir: dir, path }
    }

    /// The kubelet rotates the token in place.
    fn rotate(&self, token: &str) {
        std::fs::write(&self.path, token).expect("token rewritten");
    }
}

/// The emulator's configuration without its static key pair, with RRSA's keys as ACK's webhook
/// injects them and the STS endpoint override.
fn rrsa_config(emulator: &AlibabaCloudEmulator, token_file: &Path) -> ProviderConfig {
    let pairs = emulator
        .config()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("ALIBABACLOUD_ACCESS_KEY"))
        .collect();
    let endpoint = emulator.endpoint();
    let token_file = token_file.display().to_string();
    ProviderConfig::from_pairs(with(
        pairs,
        &[
            ("ALIBABACLOUD_STS_ENDPOINT", &endpoint),
            ("ALIBABA_CLOUD_ROLE_ARN", ROLE_ARN),
            ("ALIBABA_CLOUD_OIDC_PROVIDER_ARN", OIDC_PROVIDER_ARN),
            ("ALIBABA_CLOUD_OIDC_TOKEN_FILE", &token_file),
        ],
    ))
}

fn rrsa_provider(
    emulator: &AlibabaCloudEmulator,
    token_file: &Path,
) -> (AlibabaCloudProvider, CloudCalls) {
    let calls = CloudCalls::default();
    let provider =
        AlibabaCloudProvider::from_config(&rrsa_config(emulator, token_file), calls.clone())
            .expect("an RRSA provider needs no static key");
    (provider, calls)
}

/// The RRSA cause behind a `CloudUnauthenticated`.
fn rrsa_cause(error: &Error) -> &RrsaError {
    assert!(
        matches!(error, Error::CloudUnauthenticated { .. }),
        "not the service's credential problem: {error:?}"
    );
    error
        .source()
        .and_then(|s| s.downcast_ref::<RrsaError>())
        .unwrap_or_else(|| panic!("no RRSA cause: {error:?}"))
}

#[tokio::test]
async fn a_delete_through_rrsa_with_no_static_key_is_confirmed() {
    let emulator = AlibabaCloudEmulator::start();
    let token = TokenFile::holding(OIDC_TOKEN);
    let (provider, calls) = rrsa_provider(&emulator, &token.path);
    let id = emulator.create_vm("pod-rrsa", &[]);

    let outcome = provider.delete_instance(&id).await.expect("deleted");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert!(!emulator.vm_or_parts_exist(&id), "instance or EIP left");
    // One exchange served the whole delete; every ECS and VPC call was signed by its key.
    assert_eq!(emulator.requests_of(EXCHANGE), 1);
    assert_eq!(calls.count(NAME, EXCHANGE, "ok"), 1);
    let keys = emulator.temporary_keys();
    let signers = emulator.signers();
    assert!(signers.len() >= 4, "{signers:?}");
    assert!(signers.iter().all(|s| *s == keys[0].0), "{signers:?}");
    assert!(!signers.iter().any(|s| s == ACCESS_KEY_ID));
    // The session name ActionTrail shows.
    let exchange = &emulator.params_of(EXCHANGE)[0];
    assert!(exchange.contains(&(
        "RoleSessionName".to_owned(),
        "peerpods-provider-service".to_owned()
    )));
}

#[tokio::test]
async fn a_wrong_or_missing_oidc_token_is_refused_naming_the_cause() {
    let emulator = AlibabaCloudEmulator::start();
    let id = emulator.create_vm("pod-kept", &[]);

    let token = TokenFile::holding("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzb21lb25lLWVsc2UifQ.Zm9yZ2Vk");
    let (provider, calls) = rrsa_provider(&emulator, &token.path);
    let error = provider.delete_instance(&id).await.expect_err("refused");
    let cause = rrsa_cause(&error);
    assert_eq!(cause.reason(), RrsaReason::StsRefused);
    let text = error.to_string();
    for part in [
        "AssumeRoleWithOIDC",
        ROLE_ARN,
        "HTTP 401",
        "AuthenticationFail.OIDCToken.InvalidSignature",
    ] {
        assert!(text.contains(part), "{part} not in {text}");
    }
    assert!(!text.contains("Zm9yZ2Vk"), "the token leaked: {text}");
    assert_eq!(calls.count(NAME, EXCHANGE, "error"), 1);
    // Refused before any ECS call.
    assert_eq!(emulator.requests_of("DeleteInstance"), 0);
    assert!(emulator.instance_exists(&id));

    let (provider, _) = rrsa_provider(&emulator, &token.path.with_file_name("not-mounted"));
    let error = provider.delete_instance(&id).await.expect_err("refused");
    assert_eq!(rrsa_cause(&error).reason(), RrsaReason::TokenFileUnreadable);
    assert!(error.to_string().contains("not-mounted"), "{error}");
    assert_eq!(
        emulator.requests_of(EXCHANGE),
        1,
        "nothing to send, nothing sent"
    );
}

/// The emulator takes a temporary key only with its own security token: the same key pair as
/// a static one (no token) is refused as Alibaba's gateway refuses it.
#[tokio::test]
async fn a_temporary_key_without_its_security_token_is_refused() {
    let emulator = AlibabaCloudEmulator::start();
    let token = TokenFile::holding(OIDC_TOKEN);
    let (provider, _) = rrsa_provider(&emulator, &token.path);
    provider
        .list_instances(&Default::default())
        .await
        .expect("listed with the token");
    let (key_id, key_secret, _) = emulator.temporary_keys().remove(0);

    let calls = CloudCalls::default();
    let without_token = AlibabaCloudProvider::from_config(
        &ProviderConfig::from_pairs(with(
            emulator.config(),
            &[
                ("ALIBABACLOUD_ACCESS_KEY_ID", &key_id),
                ("ALIBABACLOUD_ACCESS_KEY_SECRET", &key_secret),
            ],
        )),
        calls.clone(),
    )
    .expect("provider");
    let error = without_token
        .list_instances(&Default::default())
        .await
        .expect_err("refused");

    assert!(
        matches!(&error, Error::CloudUnauthenticated { message, .. }
            if message.contains("MissingSecurityToken")
                && message.contains("SecurityToken is mandatory for this action.")),
        "{error:?}"
    );
    assert_eq!(calls.count(NAME, "DescribeInstances", "error"), 1);
}

/// A key whose `Expiration` is within the refresh margin is exchanged again for the next call,
/// with the token read anew (the kubelet rotated it: the old one no longer passes).
#[tokio::test]
async fn a_key_about_to_expire_is_exchanged_again_with_the_rotated_token() {
    let emulator = AlibabaCloudEmulator::start();
    // Shorter than the three minutes before `Expiration` the backend exchanges again.
    emulator.set_temporary_key_lifetime(Duration::from_secs(60));
    let token = TokenFile::holding(OIDC_TOKEN);
    let (provider, calls) = rrsa_provider(&emulator, &token.path);

    provider
        .list_instances(&Default::default())
        .await
        .expect("first");
    token.rotate("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyb3RhdGVkIn0.bmV3");
    emulator.rotate_oidc_token("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJyb3RhdGVkIn0.bmV3");
    provider
        .list_instances(&Default::default())
        .await
        .expect("second");

    assert_eq!(calls.count(NAME, EXCHANGE, "ok"), 2);
    let keys: Vec<String> = emulator.temporary_keys().into_iter().map(|k| k.0).collect();
    assert_eq!(emulator.signers(), keys, "each call signed by a fresh key");
    assert_eq!(keys.len(), 2);
}

/// A key still fresh by our clock is reused; once the cloud's clock passed its `Expiration`
/// (answered `InvalidSecurityToken.Expired`, the gateway's real body), it is exchanged again and
/// the call repeated, once.
#[tokio::test]
async fn a_key_the_cloud_calls_expired_is_exchanged_again() {
    let emulator = AlibabaCloudEmulator::start();
    let token = TokenFile::holding(OIDC_TOKEN);
    let (provider, calls) = rrsa_provider(&emulator, &token.path);
    let id = emulator.create_vm("pod-late", &[]);

    provider
        .list_instances(&Default::default())
        .await
        .expect("first");
    provider
        .list_instances(&Default::default())
        .await
        .expect("second");
    assert_eq!(emulator.requests_of(EXCHANGE), 1, "an hour's key is reused");

    emulator.expire_temporary_keys();
    let outcome = provider.delete_instance(&id).await.expect("deleted");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(emulator.requests_of(EXCHANGE), 2);
    // The expired key was refused once, by the lookup that followed the expiry.
    assert_eq!(calls.count(NAME, "DescribeInstances", "error"), 1);
    let keys = emulator.temporary_keys();
    assert!(emulator.signers().iter().skip(2).all(|s| *s == keys[1].0));
}
