//! The CAA DaemonSet a PeerPodConfig renders, compared field for field with the one cloud-api-adaptor v0.22's own
//! Helm chart renders for each of the eight clouds (`tests/fixtures/caa-chart/<cloud>.yaml`, see the README
//! there). Only the deliberate differences listed in docs/caa-daemonset.md are allowed; anything else fails.
//! Pure: no cluster involved.

use std::collections::BTreeMap;
use std::path::PathBuf;

use peer_pod_config_ctrl::objects::{self, CaaCloud, ProviderServiceWiring};
use peerpods_api::peerpodconfig::{PeerPodConfig, PeerPodConfigSpec};
use serde_json::{Value, json};

const CLOUDS: [&str; 8] = [
    "alibabacloud",
    "aws",
    "azure",
    "byom",
    "gcp",
    "ibmcloud",
    "ibmcloudpowervs",
    "libvirt",
];
const NAMESPACE: &str = "confidential-containers-system";

/// Environment variables the controller adds on purpose: CAA must not advertise capacity, and it calls
/// provider-service.
const DELIBERATE_ENV: [&str; 5] = [
    "PEERPODS_LIMIT_PER_NODE",
    objects::ENV_PROVIDER_ENDPOINT,
    objects::ENV_PROVIDER_TOKEN_FILE,
    objects::ENV_PROVIDER_CA_FILE,
    objects::ENV_PROVIDER_SERVER_NAME,
];
/// The volume (and mount) that carries provider-service's token and CA.
const DELIBERATE_VOLUME: &str = "provider-service";

fn fixture(cloud: &str) -> Vec<Value> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/caa-chart")
        .join(format!("{cloud}.yaml"));
    let text = std::fs::read_to_string(&path).expect("fixture");
    serde_saphyr::from_multiple::<Value>(&text)
        .expect("fixture YAML")
        .into_iter()
        .filter(|doc| !doc.is_null())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the fixture"))
}

fn peerpodconfig() -> PeerPodConfig {
    let spec: PeerPodConfigSpec = serde_json::from_value(json!({"limit": "10"})).expect("spec");
    let mut config = PeerPodConfig::new("peerpodconfig", spec);
    config.metadata.namespace = Some(NAMESPACE.into());
    config.metadata.uid = Some("0f5e3a1c-0000-4000-8000-000000000001".into());
    config
}

fn wiring() -> ProviderServiceWiring {
    ProviderServiceWiring {
        endpoint: format!("https://provider-service.{NAMESPACE}.svc:50051"),
        ca_secret: Some("provider-service-tls".into()),
        audience: "provider-service".into(),
        server_name: None,
    }
}

/// Paths where `ours` and `theirs` differ, for a readable failure.
fn differences(path: &str, ours: &Value, theirs: &Value, out: &mut Vec<String>) {
    match (ours, theirs) {
        (Value::Object(a), Value::Object(b)) => {
            for key in a.keys().chain(b.keys().filter(|k| !a.contains_key(*k))) {
                let (x, y) = (
                    a.get(key).unwrap_or(&Value::Null),
                    b.get(key).unwrap_or(&Value::Null),
                );
                differences(&format!("{path}.{key}"), x, y, out);
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(&format!("{path}[{i}]"), x, y, out);
            }
        }
        _ if ours != theirs => out.push(format!("{path}: ours {ours}, chart {theirs}")),
        _ => {}
    }
}

/// Takes out of `ours` and `theirs` exactly the deliberate differences, after checking each is what it should be.
fn set_aside_deliberate_differences(ours: &mut Value, theirs: &mut Value, wired: bool) {
    // Name, namespace, labels and the owner reference to the PeerPodConfig: ours, on purpose.
    let meta = ours["metadata"].take();
    assert_eq!(meta["name"], objects::CAA_DAEMONSET);
    assert_eq!(meta["ownerReferences"][0]["controller"], true);
    theirs["metadata"].take();
    // The selector of the operator that once rendered this DaemonSet (immutable, kept so it can be adopted).
    assert_eq!(
        ours["spec"]["selector"].take(),
        json!({"matchLabels": {"name": "caa-daemonset"}})
    );
    theirs["spec"]["selector"].take();
    // Pod labels: the chart's, plus our selector and owner labels.
    let our_labels = ours["spec"]["template"]["metadata"]["labels"].take();
    let their_labels = theirs["spec"]["template"]["metadata"]["labels"].take();
    for (key, value) in their_labels.as_object().expect("chart pod labels") {
        assert_eq!(&our_labels[key], value, "pod label {key}");
    }
    // The image pulled if not present (the chart's Always re-pulls a moving tag on every restart), under the
    // runtime's default seccomp profile (the chart sets none).
    // The image pinned to the release (the chart's default is :latest).
    let their_container = &mut theirs["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        their_container["image"].take(),
        json!("quay.io/confidential-containers/cloud-api-adaptor:latest")
    );
    assert_eq!(their_container["imagePullPolicy"].take(), json!("Always"));
    assert_eq!(
        their_container["securityContext"].get("seccompProfile"),
        None
    );
    let pod = &mut ours["spec"]["template"]["spec"];
    let container = &mut pod["containers"][0];
    assert_eq!(
        container["image"].take(),
        json!("quay.io/confidential-containers/cloud-api-adaptor:v0.22.0")
    );
    assert_eq!(container["imagePullPolicy"].take(), json!("IfNotPresent"));
    assert_eq!(
        container["securityContext"]
            .as_object_mut()
            .expect("securityContext")
            .remove("seccompProfile"),
        Some(json!({"type": "RuntimeDefault"}))
    );
    let env = container["env"].as_array_mut().expect("env");
    let before = env.len();
    env.retain(|e| !DELIBERATE_ENV.contains(&e["name"].as_str().unwrap_or_default()));
    assert_eq!(before - env.len(), if wired { 4 } else { 1 });
    let mounts = container["volumeMounts"].as_array_mut().expect("mounts");
    mounts.retain(|m| m["name"] != DELIBERATE_VOLUME);
    let volumes = pod["volumes"].as_array_mut().expect("volumes");
    let before = volumes.len();
    volumes.retain(|v| v["name"] != DELIBERATE_VOLUME);
    assert_eq!(before - volumes.len(), usize::from(wired));
}

fn compare(cloud: &str, wired: bool) -> Vec<String> {
    let docs = fixture(cloud);
    let chart_cm = find(&docs, "ConfigMap", "peer-pods-cm");
    let data: BTreeMap<String, String> =
        serde_json::from_value(chart_cm["data"].clone()).expect("ConfigMap data");
    let mut theirs = find(&docs, "DaemonSet", "cloud-api-adaptor-daemonset").clone();
    // The controller reads the cloud from the same ConfigMap the chart renders.
    let cloud_of = CaaCloud::resolve(None, Some(&data));
    assert!(cloud_of.provider.is_some(), "{cloud}: cloud not recognised");
    let wiring = wiring();
    let ours = objects::caa_daemonset(
        &peerpodconfig(),
        NAMESPACE,
        wired.then_some(&wiring),
        &cloud_of,
    )
    .expect("render");
    let mut ours = serde_json::to_value(&ours).expect("JSON");
    set_aside_deliberate_differences(&mut ours, &mut theirs, wired);
    let mut out = Vec::new();
    differences(cloud, &ours, &theirs, &mut out);
    out
}

#[test]
fn the_caa_daemonset_matches_cloud_api_adaptor_s_chart_for_every_cloud() {
    let mut all = Vec::new();
    for cloud in CLOUDS {
        for wired in [true, false] {
            all.extend(compare(cloud, wired));
        }
    }
    assert!(
        all.is_empty(),
        "differences from CAA v0.22's chart:\n{}",
        all.join("\n")
    );
}

#[test]
fn the_comparison_sees_a_difference() {
    // The comparison itself must be able to fail: one changed field shows up by its path.
    let docs = fixture("aws");
    let theirs = find(&docs, "DaemonSet", "cloud-api-adaptor-daemonset").clone();
    let mut changed = theirs.clone();
    changed["spec"]["template"]["spec"]["dnsPolicy"] = json!("ClusterFirst");
    let mut out = Vec::new();
    differences("aws", &changed, &theirs, &mut out);
    assert_eq!(
        out,
        vec![
            "aws.spec.template.spec.dnsPolicy: ours \"ClusterFirst\", chart \"ClusterFirstWithHostNet\""
        ]
    );
}
