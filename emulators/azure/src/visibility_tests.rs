//! The fault layer's visibility and flapping, through Azure Resource Manager over HTTPS with a
//! plain client (a VM's `GET`, the resource group's VM list, the VM's `DELETE`), with a token
//! from the emulated Entra ID.

use std::sync::Arc;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use serde_json::Value;
use test_support::faults::CallKind;
use test_support::visibility_checks::{self, Probe};

use crate::cloud::{
    CLIENT_ID, CLIENT_SECRET, RESOURCE_GROUP, SUBSCRIPTION_ID, TENANT_ID, VmOptions,
};
use crate::emulator::AzureEmulator;

const API_VERSION: &str = "2024-07-01";

struct Http<'a> {
    emulator: &'a AzureEmulator,
    client: reqwest::Client,
    token: String,
}

impl<'a> Http<'a> {
    async fn new(emulator: &'a AzureEmulator) -> Self {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for certificate in CertificateDer::pem_slice_iter(emulator.ca_pem().as_bytes()) {
            roots.add(certificate.expect("CA PEM")).expect("CA");
        }
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("protocol versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .build()
            .expect("client");
        let answer = client
            .post(format!(
                "{}/{TENANT_ID}/oauth2/v2.0/token",
                emulator.endpoint()
            ))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&client_id={CLIENT_ID}&client_secret={}&scope={}",
                form(CLIENT_SECRET),
                form("https://management.azure.com/.default"),
            ))
            .send()
            .await
            .expect("token request");
        let body: Value = serde_json::from_str(&answer.text().await.expect("token")).expect("json");
        let token = body["access_token"]
            .as_str()
            .expect("access_token")
            .to_owned();
        Http {
            emulator,
            client,
            token,
        }
    }

    fn vms(&self) -> String {
        format!(
            "{}/subscriptions/{SUBSCRIPTION_ID}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines",
            self.emulator.endpoint()
        )
    }

    /// The VM's name in its ARM id.
    fn name(id: &str) -> &str {
        id.rsplit('/').next().unwrap_or(id)
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let response = request.bearer_auth(&self.token).send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn found(status: u16, body: &Value, found: u16) -> bool {
        if status == found {
            return true;
        }
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["error"]["code"], "ResourceNotFound", "{body}");
        false
    }
}

/// `application/x-www-form-urlencoded` of a value.
fn form(value: &str) -> String {
    form_urlencoded::byte_serialize(value.as_bytes()).collect()
}

impl Probe for Http<'_> {
    /// How long ago the VM was created, by its `timeCreated` (seconds; negative: in the future).
    async fn age(&self, id: &str) -> f64 {
        let url = format!(
            "{}/{}?api-version={API_VERSION}",
            self.vms(),
            Self::name(id)
        );
        let (status, body) = self.send(self.client.get(url)).await;
        assert_eq!(status, 200, "{body}");
        let created = body["properties"]["timeCreated"]
            .as_str()
            .expect("timeCreated");
        let created: jiff::Timestamp = created.parse().expect("RFC 3339");
        jiff::Timestamp::now().duration_since(created).as_secs_f64()
    }

    async fn get(&self, id: &str) -> bool {
        let url = format!(
            "{}/{}?api-version={API_VERSION}",
            self.vms(),
            Self::name(id)
        );
        let (status, body) = self.send(self.client.get(url)).await;
        Self::found(status, &body, 200)
    }

    async fn list(&self, id: &str) -> bool {
        let url = format!("{}?api-version={API_VERSION}", self.vms());
        let (status, body) = self.send(self.client.get(url)).await;
        assert_eq!(status, 200, "{body}");
        body["value"]
            .as_array()
            .is_some_and(|vms| vms.iter().any(|vm| vm["id"] == id))
    }

    async fn delete(&self, id: &str) -> bool {
        let url = format!(
            "{}/{}?api-version={API_VERSION}",
            self.vms(),
            Self::name(id)
        );
        let (status, body) = self.send(self.client.delete(url)).await;
        Self::found(status, &body, 202)
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn defaults_hide_nothing() {
    let emulator = AzureEmulator::start();
    let probe = Http::new(&emulator).await;
    visibility_checks::defaults_hide_nothing(&emulator, &probe, "podvm-seen").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_kind_of_call_misses_a_new_vm_alone() {
    for kind in CallKind::ALL {
        let emulator = AzureEmulator::start();
        let probe = Http::new(&emulator).await;
        let name = format!("podvm-hidden-{}", kind.name());
        visibility_checks::a_kind_misses_a_new_vm_alone(&emulator, &probe, &name, kind).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_and_lists_flap() {
    for kind in [CallKind::Get, CallKind::List] {
        let emulator = AzureEmulator::start();
        let probe = Http::new(&emulator).await;
        let name = format!("podvm-flapping-{}", kind.name());
        visibility_checks::answers_of_a_kind_flap(&emulator, &probe, &name, kind).await;
    }
}

/// A VM's `timeCreated` agrees with how the emulator lags (the shared check), and a VM seeded
/// with options is an hour old like any other.
#[tokio::test(flavor = "multi_thread")]
async fn a_vm_is_created_an_hour_old_unless_new_vms_lag() {
    let emulator = AzureEmulator::start();
    let probe = Http::new(&emulator).await;
    visibility_checks::creation_times_follow_the_lag(&emulator, &probe, CallKind::List, 0.0).await;
    let seeded = emulator.create_vm_with("podvm-seeded", &[], VmOptions::default());
    let age = probe.age(&seeded).await;
    assert!((3590.0..3610.0).contains(&age), "{age}");
}
