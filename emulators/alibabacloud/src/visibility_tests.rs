//! The fault layer's visibility and flapping, through the ECS RPC API over plain HTTP with V3
//! signatures: `DescribeInstances` (by `InstanceIds`, or by tag: both lists; ECS has no lookup of
//! one instance) and `DeleteInstance`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde_json::Value;
use test_support::cloud::CloudEmulator;
use test_support::faults::{CallKind, Faults, Visibility};
use test_support::visibility_checks::{self, Probe};

use crate::account::{ACCESS_KEY_ID, ACCESS_KEY_SECRET, REGION};
use crate::emulator::AlibabaCloudEmulator;
use crate::signature::{expected_signature, sha256_hex};

struct Http<'a> {
    emulator: &'a AlibabaCloudEmulator,
    client: reqwest::Client,
}

/// RFC 3986 percent-encoding (everything but unreserved characters), as V3 signing wants.
fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

impl<'a> Http<'a> {
    fn new(emulator: &'a AlibabaCloudEmulator) -> Self {
        let tls = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
        let client = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .build()
            .expect("client");
        Http { emulator, client }
    }

    /// One signed ECS call: its status and body.
    async fn call(&self, action: &str, params: &[(&str, &str)]) -> (u16, Value) {
        static NONCE: AtomicU64 = AtomicU64::new(0);
        let endpoint = self.emulator.endpoint();
        let host = endpoint.trim_start_matches("http://").to_owned();
        let mut params: Vec<(String, String)> = params
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        params.push(("RegionId".into(), REGION.into()));
        let payload = sha256_hex(b"");
        let headers: Vec<(String, String)> = [
            ("host", host.as_str()),
            ("x-acs-action", action),
            ("x-acs-content-sha256", payload.as_str()),
            ("x-acs-date", "2026-01-01T00:00:00Z"),
            (
                "x-acs-signature-nonce",
                &format!("nonce-{}", NONCE.fetch_add(1, Ordering::Relaxed)),
            ),
            ("x-acs-version", "2014-05-26"),
        ]
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
        let signature = expected_signature("POST", &params, &headers, &payload, ACCESS_KEY_SECRET);
        let names: Vec<&str> = headers.iter().map(|(k, _)| k.as_str()).collect();
        let query: Vec<String> = params
            .iter()
            .map(|(k, v)| format!("{}={}", encode(k), encode(v)))
            .collect();
        let mut request = self
            .client
            .post(format!("{endpoint}/?{}", query.join("&")))
            .header(
                "authorization",
                format!(
                    "ACS3-HMAC-SHA256 Credential={ACCESS_KEY_ID},SignedHeaders={},Signature={signature}",
                    names.join(";")
                ),
            );
        for (name, value) in &headers {
            request = request.header(name.as_str(), value.as_str());
        }
        let response = request.send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    fn listed(status: u16, body: &Value, id: &str) -> bool {
        assert_eq!(status, 200, "{body}");
        body["Instances"]["Instance"]
            .as_array()
            .is_some_and(|listed| listed.iter().any(|i| i["InstanceId"] == id))
    }

    /// `DescribeInstances` by tag `owner=peerpods`: whether it lists `id`.
    async fn listed_by_tag(&self, id: &str) -> bool {
        let (status, body) = self
            .call(
                "DescribeInstances",
                &[
                    ("Tag.1.Key", "owner"),
                    ("Tag.1.Value", "peerpods"),
                    ("MaxResults", "100"),
                ],
            )
            .await;
        Self::listed(status, &body, id)
    }
}

impl Probe for Http<'_> {
    /// How long ago the instance was created, by its `CreationTime` (seconds; negative: in the
    /// future): ECS writes it to the minute (`2017-12-10T04:04Z`), read as the minute's start.
    async fn age(&self, id: &str) -> f64 {
        let ids = format!("[\"{id}\"]");
        let (status, body) = self
            .call("DescribeInstances", &[("InstanceIds", ids.as_str())])
            .await;
        assert_eq!(status, 200, "{body}");
        let created = body["Instances"]["Instance"][0]["CreationTime"]
            .as_str()
            .expect("CreationTime");
        assert_eq!(created.len(), "2017-12-10T04:04Z".len(), "{created}");
        let minute = created.strip_suffix('Z').expect("UTC");
        let start: jiff::Timestamp = format!("{minute}:00Z").parse().expect("time");
        jiff::Timestamp::now().duration_since(start).as_secs_f64()
    }

    fn kinds(&self) -> &'static [CallKind] {
        &[CallKind::List, CallKind::Delete]
    }

    async fn get(&self, _id: &str) -> bool {
        unreachable!("ECS has no lookup of one instance")
    }

    async fn list(&self, id: &str) -> bool {
        let ids = format!("[\"{id}\"]");
        let (status, body) = self
            .call("DescribeInstances", &[("InstanceIds", ids.as_str())])
            .await;
        Self::listed(status, &body, id)
    }

    async fn delete(&self, id: &str) -> bool {
        let (status, body) = self
            .call("DeleteInstance", &[("InstanceId", id), ("Force", "true")])
            .await;
        if status == 200 {
            return true;
        }
        assert_eq!(status, 404, "{body}");
        assert_eq!(body["Code"], "InvalidInstanceId.NotFound", "{body}");
        false
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn defaults_hide_nothing() {
    let emulator = AlibabaCloudEmulator::start();
    visibility_checks::defaults_hide_nothing(&emulator, &Http::new(&emulator), "podvm-seen").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_kind_of_call_misses_a_new_instance_alone() {
    for kind in [CallKind::List, CallKind::Delete] {
        let emulator = AlibabaCloudEmulator::start();
        let name = format!("podvm-hidden-{}", kind.name());
        visibility_checks::a_kind_misses_a_new_vm_alone(
            &emulator,
            &Http::new(&emulator),
            &name,
            kind,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lists_flap() {
    let emulator = AlibabaCloudEmulator::start();
    visibility_checks::answers_of_a_kind_flap(
        &emulator,
        &Http::new(&emulator),
        "podvm-flapping",
        CallKind::List,
    )
    .await;
}

/// A list by tag misses what a list by id misses; a deletion still finds it.
#[tokio::test(flavor = "multi_thread")]
async fn a_list_by_tag_misses_a_new_instance_too() {
    let emulator = AlibabaCloudEmulator::start();
    let http = Http::new(&emulator);
    emulator.set_faults(Faults {
        invisible: Visibility::only(&[CallKind::List], Duration::from_secs(3600)),
        ..Faults::default()
    });
    let id = emulator.create_vm("podvm-untagged-yet", &[("owner", "peerpods")]);
    assert!(!http.listed_by_tag(&id).await);
    assert!(!http.list(&id).await);
    assert_eq!(emulator.injected().not_found, 2);
    emulator.set_faults(Faults::default());
    assert!(http.listed_by_tag(&id).await);
    assert!(http.delete(&id).await);
}

/// An instance's `CreationTime` agrees with how the emulator lags (the shared check), to the
/// minute, so up to a minute more; an instance seeded with its own helper is an hour old too.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_is_created_an_hour_old_unless_new_instances_lag() {
    let emulator = AlibabaCloudEmulator::start();
    let http = Http::new(&emulator);
    visibility_checks::creation_times_follow_the_lag(&emulator, &http, CallKind::Delete, 60.0)
        .await;
    let seeded = emulator.create_instance("podvm-seeded", &[], false);
    let age = http.age(&seeded).await;
    assert!((3590.0..3670.0).contains(&age), "{age}");
}

#[test]
fn creation_time_is_written_to_the_minute_as_ecs_writes_it() {
    let at: jiff::Timestamp = "2017-12-10T04:04:59.9Z".parse().expect("time");
    assert_eq!(crate::state::creation_time(at), "2017-12-10T04:04Z");
    let fixture: Value =
        serde_json::from_str(include_str!("../fixtures/describe_instances.json")).expect("json");
    let written = fixture.pointer("/Instances/Instance/0/CreationTime");
    assert_eq!(
        written,
        Some(&Value::from("2017-12-10T04:04Z")),
        "{fixture}"
    );
}
