//! The fault layer's visibility and flapping, through the VPC and Power Cloud APIs over plain
//! HTTP with an IAM token: an instance's `GET`, the instance list (VPC: `GET /v1/instances`, and
//! Global Search; Power: `GET .../pvm-instances`) and the instance's `DELETE`.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use test_support::cloud::CloudEmulator;
use test_support::faults::{self, CallKind, Faults, Visibility};
use test_support::visibility_checks::{self, Probe};

use crate::{ACCOUNT_ID, API_KEY, POWERVS_ZONE, PowerVsEmulator, VpcEmulator, WORKSPACE_ID};

/// Which API the probe asks.
enum Api {
    Vpc,
    Power,
}

struct Http {
    api: Api,
    url: String,
    client: reqwest::Client,
    token: String,
}

impl Http {
    async fn new(api: Api, url: String) -> Self {
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
        let answer = client
            .post(format!("{url}/identity/token"))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=urn%3Aibm%3Aparams%3Aoauth%3Agrant-type%3Aapikey&apikey={API_KEY}"
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
            api,
            url,
            client,
            token,
        }
    }

    fn instances(&self) -> String {
        match self.api {
            Api::Vpc => format!("{}/v1/instances", self.url),
            Api::Power => format!(
                "{}/pcloud/v1/cloud-instances/{WORKSPACE_ID}/pvm-instances",
                self.url
            ),
        }
    }

    /// `path` under the API, with the VPC API's `version` and `generation`.
    fn url(&self, path: &str) -> String {
        match self.api {
            Api::Vpc => format!("{path}?version=2022-09-13&generation=2"),
            Api::Power => format!("{path}?"),
        }
    }

    async fn send(&self, request: reqwest::RequestBuilder) -> (u16, Value) {
        let request = match self.api {
            Api::Vpc => request,
            Api::Power => request.header(
                "crn",
                format!("crn:v1:bluemix:public:power-iaas:{POWERVS_ZONE}:a/{ACCOUNT_ID}:{WORKSPACE_ID}::"),
            ),
        };
        let response = request.bearer_auth(&self.token).send().await.expect("send");
        let status = response.status().as_u16();
        let text = response.text().await.expect("body");
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    /// Found (`found`), or the API's not-found answer.
    fn found(&self, status: u16, body: &Value, found: u16) -> bool {
        if status == found {
            return true;
        }
        assert_eq!(status, 404, "{body}");
        match self.api {
            Api::Vpc => assert_eq!(body["errors"][0]["code"], "not_found", "{body}"),
            Api::Power => assert_eq!(body["error"], "pvm-instance not found", "{body}"),
        }
        false
    }

    /// Global Search's CRNs of the account (one page is all the tests make).
    async fn searched_crns(&self) -> Vec<String> {
        let request = self
            .client
            .post(format!("{}/v3/resources/search", self.url))
            .json_body(&json!({"query": "*", "fields": ["crn"]}));
        let (status, body) = self.send(request).await;
        assert_eq!(status, 200, "{body}");
        body["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|item| item["crn"].as_str().map(str::to_owned))
            .collect()
    }
}

/// A JSON body without reqwest's `json` feature.
trait JsonBody {
    fn json_body(self, body: &Value) -> Self;
}

impl JsonBody for reqwest::RequestBuilder {
    fn json_body(self, body: &Value) -> Self {
        self.header("content-type", "application/json")
            .body(body.to_string())
    }
}

impl Probe for Http {
    /// How long ago the instance was created, by its `created_at` (VPC) or `creationDate`
    /// (Power), in seconds (negative: in the future), checked to be written as the APIs write
    /// it (`2025-03-31T12:24:40.000Z`).
    async fn age(&self, id: &str) -> f64 {
        let url = self.url(&format!("{}/{id}", self.instances()));
        let (status, body) = self.send(self.client.get(url)).await;
        assert_eq!(status, 200, "{body}");
        let field = match self.api {
            Api::Vpc => "created_at",
            Api::Power => "creationDate",
        };
        let created = body[field].as_str().expect(field);
        assert_eq!(created.len(), 24, "{created}");
        assert!(
            created.ends_with('Z') && &created[19..20] == ".",
            "{created}"
        );
        faults::seconds_ago(created).expect("RFC 3339")
    }

    async fn get(&self, id: &str) -> bool {
        let url = self.url(&format!("{}/{id}", self.instances()));
        let (status, body) = self.send(self.client.get(url)).await;
        self.found(status, &body, 200)
    }

    async fn list(&self, id: &str) -> bool {
        let (status, body) = self
            .send(self.client.get(self.url(&self.instances()) + "&limit=100"))
            .await;
        assert_eq!(status, 200, "{body}");
        let (items, key) = match self.api {
            Api::Vpc => (&body["instances"], "id"),
            Api::Power => (&body["pvmInstances"], "pvmInstanceID"),
        };
        items
            .as_array()
            .is_some_and(|items| items.iter().any(|item| item[key] == id))
    }

    async fn delete(&self, id: &str) -> bool {
        let url = self.url(&format!("{}/{id}", self.instances()));
        let (status, body) = self.send(self.client.delete(url)).await;
        let accepted = match self.api {
            Api::Vpc => 204,
            Api::Power => 200,
        };
        self.found(status, &body, accepted)
    }
}

async fn vpc() -> (VpcEmulator, Http) {
    let emulator = VpcEmulator::start().expect("emulator");
    let probe = Http::new(Api::Vpc, emulator.url()).await;
    (emulator, probe)
}

async fn power() -> (PowerVsEmulator, Http) {
    let emulator = PowerVsEmulator::start().expect("emulator");
    let probe = Http::new(Api::Power, emulator.url()).await;
    (emulator, probe)
}

#[tokio::test(flavor = "multi_thread")]
async fn defaults_hide_nothing() {
    let (emulator, probe) = vpc().await;
    visibility_checks::defaults_hide_nothing(&emulator, &probe, "podvm-seen").await;
    let (emulator, probe) = power().await;
    visibility_checks::defaults_hide_nothing(&emulator, &probe, "podvm-seen").await;
}

#[tokio::test(flavor = "multi_thread")]
async fn each_kind_of_call_misses_a_new_instance_alone() {
    for kind in CallKind::ALL {
        let name = format!("podvm-hidden-{}", kind.name());
        let (emulator, probe) = vpc().await;
        visibility_checks::a_kind_misses_a_new_vm_alone(&emulator, &probe, &name, kind).await;
        let (emulator, probe) = power().await;
        visibility_checks::a_kind_misses_a_new_vm_alone(&emulator, &probe, &name, kind).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_and_lists_flap() {
    for kind in [CallKind::Get, CallKind::List] {
        let name = format!("podvm-flapping-{}", kind.name());
        let (emulator, probe) = vpc().await;
        visibility_checks::answers_of_a_kind_flap(&emulator, &probe, &name, kind).await;
        let (emulator, probe) = power().await;
        visibility_checks::answers_of_a_kind_flap(&emulator, &probe, &name, kind).await;
    }
}

/// Global Search is a list too: an instance lists hide is not found by a search either, while a
/// lookup finds it; once lists see it, the search finds it.
#[tokio::test(flavor = "multi_thread")]
async fn a_search_misses_what_lists_miss() {
    let (emulator, probe) = vpc().await;
    emulator.set_faults(Faults {
        invisible: Visibility::only(&[CallKind::List], Duration::from_secs(3600)),
        ..Faults::default()
    });
    let id = emulator.create_vm("podvm-unsearched", &[("owner", "peerpods")]);
    let (status, instance) = probe
        .send(
            probe
                .client
                .get(probe.url(&format!("{}/{id}", probe.instances()))),
        )
        .await;
    assert_eq!(status, 200, "{instance}");
    let crn = instance["crn"].as_str().expect("crn").to_owned();
    assert!(!probe.searched_crns().await.contains(&crn));
    assert_eq!(emulator.injected().not_found, 1);
    emulator.set_faults(Faults::default());
    assert!(probe.searched_crns().await.contains(&crn));
    assert_eq!(emulator.injected().not_found, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn an_instance_is_created_an_hour_old_unless_new_instances_lag_vpc_and_power() {
    let (emulator, probe) = vpc().await;
    visibility_checks::creation_times_follow_the_lag(&emulator, &probe, CallKind::Delete, 0.0)
        .await;
    let (emulator, probe) = power().await;
    visibility_checks::creation_times_follow_the_lag(&emulator, &probe, CallKind::Delete, 0.0)
        .await;
}

/// Global Search's indexing lag is a lag too: a new instance is born new while it is on; the
/// search's `creation_date` is the instance's `created_at`.
#[tokio::test(flavor = "multi_thread")]
async fn an_instance_the_search_lags_for_is_born_new() {
    let (emulator, probe) = vpc().await;
    emulator.set_search_lag(Duration::from_millis(1));
    let new = emulator.create_vm("podvm-new", &[]);
    let age = probe.age(&new).await;
    assert!((-1.0..10.0).contains(&age), "{age}");
    emulator.set_search_lag(Duration::ZERO);
    let old = emulator.create_vm("podvm-old", &[]);
    let age = probe.age(&old).await;
    assert!((3590.0..3610.0).contains(&age), "{age}");

    let url = probe.url(&format!("{}/{old}", probe.instances()));
    let (_, instance) = probe.send(probe.client.get(url)).await;
    let request = probe
        .client
        .post(format!("{}/v3/resources/search", probe.url))
        .json_body(&json!({"query": "type:instance", "fields": ["crn", "creation_date"]}));
    let (status, body) = probe.send(request).await;
    assert_eq!(status, 200, "{body}");
    let searched = body["items"]
        .as_array()
        .expect("items")
        .iter()
        .find(|item| item["crn"] == instance["crn"])
        .unwrap_or_else(|| panic!("{old} not searched: {body}"));
    assert_eq!(searched["creation_date"], instance["created_at"], "{body}");
}
