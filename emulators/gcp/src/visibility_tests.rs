//! The fault layer's visibility and flapping, through Compute Engine's API over plain HTTP
//! (`instances.get`, `instances.list` with a label filter, `instances.delete`), signed as a
//! service-account key signs.

use std::sync::Arc;

use base64::prelude::{BASE64_STANDARD, BASE64_URL_SAFE_NO_PAD, Engine as _};
use ring::signature::RsaKeyPair;
use serde_json::{Value, json};
use test_support::cloud::CloudEmulator;
use test_support::faults::{self, CallKind};
use test_support::visibility_checks::{self, Probe};

use crate::emulator::GcpEmulator;
use crate::fixtures::SERVICE_ACCOUNT_KEY;
use crate::project::{PROJECT, ZONE};

/// A self-signed RS256 JWT of the trusted service-account key, valid for an hour.
fn bearer() -> String {
    let key: Value = serde_json::from_str(SERVICE_ACCOUNT_KEY).expect("key file");
    let der: String = key["private_key"]
        .as_str()
        .expect("private_key")
        .lines()
        .filter(|line| !line.starts_with("-----"))
        .collect();
    let signer =
        RsaKeyPair::from_pkcs8(&BASE64_STANDARD.decode(der).expect("base64")).expect("key");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs();
    let header = json!({"alg": "RS256", "typ": "JWT", "kid": key["private_key_id"]});
    let claims = json!({
        "iss": key["client_email"],
        "sub": key["client_email"],
        "scope": "https://www.googleapis.com/auth/compute",
        "iat": now,
        "exp": now + 3600,
    });
    let signed = format!(
        "{}.{}",
        BASE64_URL_SAFE_NO_PAD.encode(header.to_string()),
        BASE64_URL_SAFE_NO_PAD.encode(claims.to_string())
    );
    let mut signature = vec![0; signer.public().modulus_len()];
    signer
        .sign(
            &ring::signature::RSA_PKCS1_SHA256,
            &ring::rand::SystemRandom::new(),
            signed.as_bytes(),
            &mut signature,
        )
        .expect("sign");
    format!("{signed}.{}", BASE64_URL_SAFE_NO_PAD.encode(signature))
}

/// A plain reqwest client (the emulator speaks HTTP; rustls is configured only because reqwest
/// wants a TLS backend).
fn client() -> reqwest::Client {
    let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("protocol versions")
    .with_root_certificates(rustls::RootCertStore::empty())
    .with_no_client_auth();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .expect("client")
}

struct Http<'a> {
    emulator: &'a GcpEmulator,
    client: reqwest::Client,
    token: String,
}

impl Http<'_> {
    fn instances(&self) -> String {
        format!(
            "{}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances",
            self.emulator.url()
        )
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.bearer_auth(&self.token).send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn found(status: u16, body: &Value) -> bool {
        match status {
            200 => true,
            404 => {
                assert_eq!(body["error"]["errors"][0]["reason"], "notFound", "{body}");
                false
            }
            other => panic!("answered {other}: {body}"),
        }
    }
}

impl Probe for Http<'_> {
    /// How long ago the instance was created, by its `creationTimestamp` (seconds; negative: in
    /// the future), checked to be written as Compute Engine writes it.
    async fn age(&self, id: &str) -> f64 {
        let url = format!("{}/{id}", self.instances());
        let (status, body) = self.send(self.client.get(url)).await;
        assert_eq!(status, 200, "{body}");
        let created = body["creationTimestamp"]
            .as_str()
            .expect("creationTimestamp");
        // `2026-11-22T09:58:12.345-08:00`, as in the fixture.
        assert_eq!(created.len(), 29, "{created}");
        assert_eq!(&created[19..20], ".", "{created}");
        assert!(created.ends_with("-08:00"), "{created}");
        faults::seconds_ago(created).expect("RFC 3339")
    }

    async fn get(&self, id: &str) -> bool {
        let url = format!("{}/{id}", self.instances());
        let (status, body) = self.send(self.client.get(url)).await;
        Self::found(status, &body)
    }

    async fn list(&self, id: &str) -> bool {
        // The filter a backend lists its VMs with: a label.
        let url = format!(
            "{}?filter=labels.owner%3D%22peerpods%22&maxResults=500",
            self.instances()
        );
        let request = self.client.get(url);
        let (status, body) = self.send(request).await;
        assert_eq!(status, 200, "{body}");
        body["items"]
            .as_array()
            .is_some_and(|items| items.iter().any(|item| item["name"] == id))
    }

    async fn delete(&self, id: &str) -> bool {
        let url = format!("{}/{id}", self.instances());
        let (status, body) = self.send(self.client.delete(url)).await;
        Self::found(status, &body)
    }
}

/// A started emulator whose VMs all carry the label the probe's list filters on.
struct Labelled(GcpEmulator);

impl CloudEmulator for Labelled {
    fn provider(&self) -> &'static str {
        self.0.provider()
    }
    fn config(&self) -> Vec<(String, String)> {
        self.0.config()
    }
    fn create_vm(&self, name: &str, tags: &[(&str, &str)]) -> String {
        let mut tags = tags.to_vec();
        tags.push(("owner", "peerpods"));
        self.0.create_vm(name, &tags)
    }
    fn vm_or_parts_exist(&self, instance_id: &str) -> bool {
        self.0.vm_or_parts_exist(instance_id)
    }
    fn fault_layer(&self) -> &test_support::faults::FaultLayer {
        self.0.fault_layer()
    }
}

fn start() -> Labelled {
    Labelled(GcpEmulator::start().expect("emulator"))
}

fn probe(emulator: &Labelled) -> Http<'_> {
    Http {
        emulator: &emulator.0,
        client: client(),
        token: bearer(),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn defaults_hide_nothing() {
    let emulator = start();
    visibility_checks::defaults_hide_nothing(&emulator, &probe(&emulator), "podvm-seen").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_kind_of_call_misses_a_new_instance_alone() {
    for kind in CallKind::ALL {
        let emulator = start();
        let name = format!("podvm-hidden-{}", kind.name());
        visibility_checks::a_kind_misses_a_new_vm_alone(&emulator, &probe(&emulator), &name, kind)
            .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_and_lists_flap() {
    for kind in [CallKind::Get, CallKind::List] {
        let emulator = start();
        let name = format!("podvm-flapping-{}", kind.name());
        visibility_checks::answers_of_a_kind_flap(&emulator, &probe(&emulator), &name, kind).await;
    }
}

/// An instance's `creationTimestamp` agrees with how the emulator lags (the shared check), and a
/// list answers the same times.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_is_created_an_hour_old_unless_new_instances_lag() {
    let emulator = start();
    let probe = probe(&emulator);
    visibility_checks::creation_times_follow_the_lag(&emulator, &probe, CallKind::Delete, 0.0)
        .await;

    // A list answers the same times.
    let url = format!(
        "{}?filter=labels.owner%3D%22peerpods%22&maxResults=500",
        probe.instances()
    );
    let (status, body) = probe.send(probe.client.get(url)).await;
    assert_eq!(status, 200, "{body}");
    let ages: Vec<f64> = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .map(|item| {
            faults::seconds_ago(item["creationTimestamp"].as_str().expect("time")).expect("time")
        })
        .collect();
    assert_eq!(ages.len(), 3, "{body}");
    assert_eq!(
        ages.iter()
            .filter(|age| (3590.0..3610.0).contains(*age))
            .count(),
        1,
        "{ages:?}"
    );
}
