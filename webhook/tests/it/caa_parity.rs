//! peerpods-webhook side by side with cloud-api-adaptor's webhook (v0.22, the Go reference in
//! `tests/caa-reference`): the same AdmissionReviews go to both, ours over its real HTTPS endpoint, and what each
//! answer leaves in the API server is compared.
//!
//! - `every_realistic_pod_is_mutated_identically`: generated pod shapes (a fixed seed, so a failure names a
//!   reproducible shape) under three settings of the environment both read. Each pod first takes the form the API
//!   server sends (Go's encoding of its v1.Pod). For each, both answers must agree on allowed or refused (and the
//!   code), and the pods their patches produce, stored as the API server stores them, must be equal.
//! - `deliberate_differences`: the inputs on which the two differ on purpose, each with its reason, asserted to
//!   differ exactly as `docs/webhook.md` says, so the list cannot go stale.

use crate::support::caa::{CaaReference, patch_of, patched};
use crate::support::{Pair, Webhook, post, post_tls};
use peerpods_webhook::mutation::Target;
use peerpods_webhook::server::WEBHOOK_PATH;
use serde_json::{Map, Value, json};

/// A small deterministic generator (xorshift64*): the same seed, the same shapes.
struct Shapes(u64);

impl Shapes {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).unwrap()
    }

    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
}

/// CPU quantities people write, canonical or not (the API server canonicalizes them before webhooks see them),
/// with a few odd ones: sub-milli, exponents, zero, large.
const CPU: &[&str] = &[
    "100m", "250m", "500m", "1", "2", "1500m", "0.5", "1.5", "3", "4", "8", "16", "64", "0", "1m",
    "999m", "2001m", "0.001", "1e3", "12345m", "1k", "100", "100u", "1n", "0.25", "7.5", "33m",
];
/// Memory quantities, binary and decimal suffixes, plain bytes, fractions, and sizes whose MiB do not fit in
/// an int64 (upstream writes 0 for those).
const MEMORY: &[&str] = &[
    "64Mi",
    "128Mi",
    "256Mi",
    "512Mi",
    "1Gi",
    "2Gi",
    "1.5Gi",
    "100M",
    "1G",
    "123456789",
    "1000",
    "0",
    "1Ki",
    "3Gi",
    "8Gi",
    "64Gi",
    "1Ti",
    "2.5Gi",
    "500Mi",
    "1e9",
    "129M",
    "4096Ki",
    "1",
    "1.1Mi",
    "7Ei",
    "8Ei",
    "1Pi",
    "300m",
];
const GPU: &[&str] = &["1", "2", "4", "8"];
/// Resources other than CPU, memory and GPUs, which both webhooks drop without counting.
const OTHER: &[(&str, &str)] = &[
    ("ephemeral-storage", "1Gi"),
    ("hugepages-2Mi", "128Mi"),
    ("example.com/fpga", "3"),
    ("kata.peerpods.io/vm", "1"),
];

fn container_resources(g: &mut Shapes) -> Option<Value> {
    match g.below(10) {
        0 => return None,
        1 => return Some(json!({})),
        _ => {}
    }
    let (mut requests, mut limits) = (Map::new(), Map::new());
    for (name, pool) in [("cpu", CPU), ("memory", MEMORY)] {
        match g.below(4) {
            0 => {}
            1 => {
                requests.insert(name.into(), g.pick(pool).into());
            }
            2 => {
                limits.insert(name.into(), g.pick(pool).into());
            }
            _ => {
                requests.insert(name.into(), g.pick(pool).into());
                limits.insert(name.into(), g.pick(pool).into());
            }
        }
    }
    if g.chance(12) {
        let gpus = g.pick(GPU);
        requests.insert("nvidia.com/gpu".into(), gpus.into());
        limits.insert("nvidia.com/gpu".into(), gpus.into());
    }
    if g.chance(15) {
        let (name, value) = g.pick(OTHER);
        requests.insert(name.into(), value.into());
        limits.insert(name.into(), value.into());
    }
    let mut resources = Map::new();
    if !requests.is_empty() {
        resources.insert("requests".into(), Value::Object(requests));
    }
    if !limits.is_empty() {
        resources.insert("limits".into(), Value::Object(limits));
    }
    if g.chance(4) {
        resources.insert("claims".into(), json!([{"name": "accelerator"}]));
    }
    Some(Value::Object(resources))
}

fn container(g: &mut Shapes, name: String) -> Value {
    let mut c = json!({"name": name, "image": "registry.example/app:1"});
    if let Some(resources) = container_resources(g) {
        c["resources"] = resources;
    }
    if g.chance(10) {
        c["ports"] = json!([{"containerPort": 8080, "protocol": "TCP"}]);
    }
    c
}

/// One pod shape: its runtime class from `classes` (None: no runtimeClassName), 1 to 20 containers, maybe init
/// containers (some of them sidecars), an ephemeral container, annotations (none, empty, others, stale VM-size
/// ones), node selector, tolerations, overhead, affinity, priority.
fn pod(g: &mut Shapes, index: usize, classes: &[Option<&str>]) -> Value {
    let count = g.pick(&[1, 1, 1, 1, 2, 2, 3, 4, 8, 20]);
    let containers: Vec<Value> = (0..count).map(|i| container(g, format!("c{i}"))).collect();
    let mut spec = json!({"containers": containers});
    if let Some(class) = g.pick(classes) {
        spec["runtimeClassName"] = class.into();
    }
    let inits = g.pick(&[0, 0, 0, 1, 1, 2, 3]);
    if inits > 0 {
        let init: Vec<Value> = (0..inits)
            .map(|i| {
                let mut c = container(g, format!("init{i}"));
                if g.chance(30) {
                    c["restartPolicy"] = "Always".into();
                }
                c
            })
            .collect();
        spec["initContainers"] = Value::Array(init);
    }
    if g.chance(8) {
        spec["ephemeralContainers"] =
            json!([{"name": "debug", "image": "busybox", "targetContainerName": "c0"}]);
    }
    if g.chance(30) {
        spec["nodeSelector"] = json!({"kubernetes.io/arch": "amd64", "peerpods": "true"});
    }
    if g.chance(30) {
        spec["tolerations"] =
            json!([{"key": "kata", "operator": "Exists", "effect": "NoSchedule"}]);
    }
    if g.chance(30) {
        spec["overhead"] = json!({"cpu": "250m", "memory": "120Mi"});
    }
    if g.chance(10) {
        spec["affinity"] = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node.kubernetes.io/instance-type", "operator": "In", "values": ["m5.large"]}]}]}}});
    }
    if g.chance(10) {
        spec["priorityClassName"] = "high".into();
        spec["priority"] = 1000.into();
    }
    let mut metadata = json!({"namespace": "apps"});
    if g.chance(50) {
        metadata["name"] = format!("shape-{index}").into();
    } else {
        metadata["generateName"] = "shape-".into();
    }
    if g.chance(40) {
        metadata["labels"] = json!({"app": "shape", "index": index.to_string()});
    }
    match g.below(10) {
        0..=3 => {}
        4 => metadata["annotations"] = json!({}),
        5..=7 => {
            metadata["annotations"] =
                json!({"team": "payments", "sidecar.istio.io/inject": "false"})
        }
        _ => {
            metadata["annotations"] = json!({
                "io.katacontainers.config.hypervisor.default_vcpus": "16",
                "io.katacontainers.config.hypervisor.default_memory": "",
                "io.katacontainers.config.hypervisor.default_gpus": "9",
            })
        }
    }
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
}

fn review(uid: &str, operation: &str, object: &Value) -> Value {
    json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": "apps",
            "operation": operation,
            "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
            "object": object,
            "oldObject": null,
            "dryRun": false,
            "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"}
        }
    })
}

/// What one webhook's answer does to a request's object.
#[derive(Debug, Clone, PartialEq)]
enum Verdict {
    /// Allowed; the pod as the API server stores it after the patch (if any).
    Allowed(Value),
    /// Refused with this code.
    Refused(i64),
}

/// The two webhooks and the reference's canonical form.
struct SideBySide {
    caa: CaaReference,
    ours: Webhook,
    ca: String,
}

impl SideBySide {
    async fn start(env: &[(&str, &str)], target: Target) -> SideBySide {
        let pair = Pair::issue();
        let ours = Webhook::start(target, Some(&pair)).await;
        SideBySide {
            caa: CaaReference::start(env),
            ours,
            ca: pair.ca,
        }
    }

    /// Both answers to `review` (the `response` objects), each checked to be an AdmissionReview for its uid.
    async fn answers(&self, review: &Value) -> (Value, Value) {
        let body = serde_json::to_vec(review).unwrap();
        let caa = post(self.caa.addr, WEBHOOK_PATH, &body).await;
        let ours = post_tls(self.ours.webhook_addr, &self.ca, WEBHOOK_PATH, &body)
            .await
            .unwrap();
        assert_eq!(ours.status, 200, "{}", ours.text());
        assert_eq!(caa.status, 200, "{}", caa.text());
        let (caa, ours) = (caa.json(), ours.json());
        assert_eq!(ours["kind"], "AdmissionReview", "{ours}");
        (caa["response"].clone(), ours["response"].clone())
    }

    async fn verdict(&self, object: &Value, response: &Value) -> Verdict {
        if response["allowed"] == true {
            Verdict::Allowed(self.caa.canonical(&patched(object, response)).await)
        } else {
            Verdict::Refused(response["status"]["code"].as_i64().unwrap_or_default())
        }
    }

    /// Both verdicts on a CREATE of `object`.
    async fn create(&self, uid: &str, object: &Value) -> (Verdict, Verdict) {
        let (caa, ours) = self.answers(&review(uid, "CREATE", object)).await;
        assert_eq!(ours["uid"], uid, "{ours}");
        assert_eq!(caa["uid"], uid, "{caa}");
        (
            self.verdict(object, &caa).await,
            self.verdict(object, &ours).await,
        )
    }
}

struct Tally {
    shapes: usize,
    mutated: usize,
    unchanged: usize,
    refused: usize,
}

/// Sends `count` shapes from `seed` through both; returns what happened, panics listing every shape on which the
/// two disagree.
async fn compare(
    sides: &SideBySide,
    seed: u64,
    count: usize,
    classes: &[Option<&str>],
    extra: Vec<Value>,
) -> Tally {
    let mut g = Shapes(seed);
    let mut shapes: Vec<Value> = (0..count).map(|i| pod(&mut g, i, classes)).collect();
    shapes.extend(extra);
    let mut tally = Tally {
        shapes: shapes.len(),
        mutated: 0,
        unchanged: 0,
        refused: 0,
    };
    let mut differences = Vec::new();
    for (index, shape) in shapes.iter().enumerate() {
        // What the API server sends: its decoded v1.Pod, encoded again.
        let object = sides.caa.canonical(shape).await;
        let uid = format!("00000000-0000-4000-8000-{index:012}");
        let (caa, ours) = sides.create(&uid, &object).await;
        if caa != ours {
            differences.push(format!(
                "shape {index} (seed {seed}):\n  pod:  {object}\n  CAA:  {caa:?}\n  ours: {ours:?}"
            ));
            continue;
        }
        match ours {
            Verdict::Allowed(pod) if pod != object => tally.mutated += 1,
            Verdict::Allowed(_) => tally.unchanged += 1,
            Verdict::Refused(_) => tally.refused += 1,
        }
    }
    assert!(
        differences.is_empty(),
        "{} of {} shapes differ:\n{}",
        differences.len(),
        shapes.len(),
        differences.join("\n")
    );
    tally
}

/// Pods picked by hand beside the generated ones: sizes at the edges of upstream's arithmetic.
fn edge_pods() -> Vec<Value> {
    let peer = |containers: Value, init: Value| {
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "edge", "namespace": "apps"},
               "spec": {"runtimeClassName": "kata-remote", "containers": containers, "initContainers": init}})
    };
    let c = |name: &str, resources: Value| json!({"name": name, "image": "app", "resources": resources});
    vec![
        // Memory at 2^63 bytes and above: upstream's conversion fails and it writes 0.
        peer(
            json!([c(
                "a",
                json!({"limits": {"memory": "8Ei"}, "requests": {"memory": "1Ei"}})
            )]),
            json!([]),
        ),
        // A total past int64 from twenty containers of 1Ei each.
        peer(
            Value::Array(
                (0..20)
                    .map(|i| c(&format!("c{i}"), json!({"requests": {"memory": "1Ei"}})))
                    .collect(),
            ),
            json!([]),
        ),
        // Limits below requests: the request wins; a limit without request: no annotation.
        peer(
            json!([
                c(
                    "a",
                    json!({"requests": {"cpu": "3", "memory": "3Gi"}, "limits": {"cpu": "2", "memory": "1Gi"}})
                ),
                c("b", json!({"limits": {"cpu": "64", "memory": "64Gi"}}))
            ]),
            json!([]),
        ),
        // Init containers count in full (not Kubernetes' max-of-init rule).
        peer(
            json!([c("a", json!({"requests": {"cpu": "1"}}))]),
            json!([
                c("i1", json!({"requests": {"cpu": "4", "memory": "4Gi"}})),
                c("i2", json!({"requests": {"cpu": "4"}}))
            ]),
        ),
        // Fractions of a CPU that round up, fractions of a MiB that round up.
        peer(
            json!([
                c("a", json!({"requests": {"cpu": "1n", "memory": "1"}})),
                c(
                    "b",
                    json!({"requests": {"cpu": "1001m", "memory": "1049089"}})
                )
            ]),
            json!([]),
        ),
        // Nothing requested anywhere.
        peer(json!([c("a", json!({})), c("b", json!({}))]), json!([])),
        // Already a peer pod (a reinvocation): nothing left to change.
        json!({"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "again", "namespace": "apps", "annotations": {
                   "io.katacontainers.config.hypervisor.default_vcpus": "2"}},
               "spec": {"runtimeClassName": "kata-remote", "containers": [
                   c("a", json!({"requests": {"kata.peerpods.io/vm": "1"}, "limits": {"kata.peerpods.io/vm": "1"}}))]}}),
    ]
}

/// One setting of the environment both webhooks read: (environment, our Target for it, the runtime classes the
/// shapes draw from, how many shapes, the generator's seed).
type Setting = (
    &'static [(&'static str, &'static str)],
    Target,
    &'static [Option<&'static str>],
    usize,
    u64,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_realistic_pod_is_mutated_identically() {
    let (mut total, mut mutated) = (0, 0);
    // Upstream's defaults (nothing set), the runtime class and resource set, and both set empty (the default).
    let settings: [Setting; 3] = [
        (
            &[],
            Target::default(),
            &[
                Some("kata-remote"),
                Some("kata-remote"),
                Some("kata-remote"),
                Some("kata-remote"),
                Some("runc"),
                None,
                Some("kata-remote-snp"),
                Some("Kata-Remote"),
            ],
            130,
            0x5eed_0001,
        ),
        (
            &[
                ("TARGET_RUNTIMECLASS", "kata-remote-snp"),
                ("POD_VM_EXTENDED_RESOURCE", "example.com/pod-vm"),
                ("POD_VM_INSTANCE_TYPE", "t3.small"),
            ],
            Target::new("kata-remote-snp", "example.com/pod-vm"),
            &[
                Some("kata-remote-snp"),
                Some("kata-remote-snp"),
                Some("kata-remote"),
                None,
            ],
            40,
            0x5eed_0002,
        ),
        (
            &[
                ("TARGET_RUNTIMECLASS", ""),
                ("POD_VM_EXTENDED_RESOURCE", ""),
            ],
            Target::new("", ""),
            &[Some("kata-remote"), Some("runc")],
            15,
            0x5eed_0003,
        ),
    ];
    for (index, (env, target, classes, count, seed)) in settings.into_iter().enumerate() {
        let sides = SideBySide::start(env, target).await;
        let extra = if index == 0 { edge_pods() } else { Vec::new() };
        let tally = compare(&sides, seed, count, classes, extra).await;
        println!(
            "settings {env:?}: {} shapes identical ({} mutated, {} left unchanged, {} refused by both)",
            tally.shapes, tally.mutated, tally.unchanged, tally.refused
        );
        // Each setting must exercise both paths, or "identical" says little.
        assert!(tally.mutated > 0 && tally.unchanged > 0, "one-sided shapes");
        total += tally.shapes;
        mutated += tally.mutated;
        sides.ours.stop().await;
    }
    assert!(
        total > 100 && mutated > 80,
        "{total} shapes, {mutated} mutated"
    );
}

fn peer_pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web", "namespace": "apps"},
        "spec": {"runtimeClassName": "kata-remote", "containers": [{"name": "web", "image": "nginx",
            "resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}}}]}})
}

/// How one webhook treats an input, as `docs/webhook.md` lists it.
#[derive(Debug, PartialEq)]
enum Treats {
    /// Allowed with a patch that changes the stored pod.
    Mutates,
    /// Allowed, the stored pod as it was.
    LeavesAlone,
    /// Refused with this code, the message containing this text.
    Refuses(i64, &'static str),
}

async fn treats(sides: &SideBySide, object: &Value, response: &Value) -> Treats {
    if response["allowed"] != true {
        let code = response["status"]["code"].as_i64().unwrap_or_default();
        let message = response["status"]["message"].as_str().unwrap_or_default();
        for known in [
            "there is no content to decode",
            "panic: runtime error: index out of range",
            "malformed admission request",
            "into *v1.Pod",
        ] {
            if message.contains(known) {
                return Treats::Refuses(code, known);
            }
        }
        panic!("unlisted refusal {response}");
    }
    if object.is_null() || object["kind"] != "Pod" {
        assert!(patch_of(response).is_none(), "{response}");
        return Treats::LeavesAlone;
    }
    let before = sides.caa.canonical(object).await;
    let after = sides.caa.canonical(&patched(object, response)).await;
    if before == after {
        Treats::LeavesAlone
    } else {
        Treats::Mutates
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliberate_differences() {
    let sides = SideBySide::start(&[], Target::default()).await;
    let uid = "7f0b2d7e-5c1e-4d8a-9b43-2f6f0c1d9e11";

    let mut update = review(uid, "UPDATE", &peer_pod());
    update["request"]["oldObject"] = peer_pod();
    let mut delete = review(uid, "DELETE", &Value::Null);
    delete["request"]["oldObject"] = peer_pod();
    let mut no_uid = review(uid, "CREATE", &peer_pod());
    no_uid["request"].as_object_mut().unwrap().remove("uid");
    let mut no_containers = peer_pod();
    no_containers["spec"]["containers"] = json!([]);
    let mut other_version = review(uid, "CREATE", &peer_pod());
    other_version["apiVersion"] = "admission.k8s.io/v2".into();
    let mut config_map = review(
        uid,
        "CREATE",
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {"a": "b"}}),
    );
    config_map["request"]["kind"] = json!({"group": "", "version": "v1", "kind": "ConfigMap"});
    config_map["request"]["resource"] =
        json!({"group": "", "version": "v1", "resource": "configmaps"});

    // (what, why, request, upstream's treatment, ours)
    let cases = [
        (
            "UPDATE of a peer pod",
            "upstream's handler does not look at the operation; a pod's containers' resources cannot change \
             after creation (the API server refuses the patched update), so ours mutates creations only",
            update,
            Treats::Mutates,
            Treats::LeavesAlone,
        ),
        (
            "DELETE of a peer pod",
            "upstream decodes the (absent) object and refuses, which blocks the deletion when a configuration \
             sends DELETE; ours allows everything it does not mutate",
            delete,
            Treats::Refuses(400, "there is no content to decode"),
            Treats::LeavesAlone,
        ),
        (
            "a request without uid",
            "the API server always sends one and rejects an answer whose uid differs; upstream answers with an \
             empty uid as if it were valid, ours says the request is malformed",
            no_uid,
            Treats::Mutates,
            Treats::Refuses(400, "malformed admission request"),
        ),
        (
            "a peer pod without containers",
            "upstream indexes the first container and panics (controller-runtime turns it into a 500); ours \
             leaves the pod to the API server's validation, which refuses it as spec.containers: Required value",
            review(uid, "CREATE", &no_containers),
            Treats::Refuses(500, "panic: runtime error: index out of range"),
            Treats::LeavesAlone,
        ),
        (
            "an AdmissionReview of a version the API server does not send",
            "the answer echoes the request's apiVersion; ours refuses rather than guess",
            other_version,
            Treats::Mutates,
            Treats::Refuses(400, "malformed admission request"),
        ),
        (
            "another kind than Pod",
            "upstream cannot decode it as a Pod and refuses; only a Pod's creation is the webhook's business, \
             ours allows the rest",
            config_map,
            Treats::Refuses(400, "into *v1.Pod"),
            Treats::LeavesAlone,
        ),
    ];
    let mut listed = Vec::new();
    for (what, why, request, upstream, expected) in cases {
        let (caa, ours) = sides.answers(&request).await;
        let object = &request["request"]["object"];
        let (caa, ours) = (
            treats(&sides, object, &caa).await,
            treats(&sides, object, &ours).await,
        );
        assert_eq!(caa, upstream, "upstream on {what}");
        assert_eq!(ours, expected, "ours on {what}");
        listed.push(format!("{what}: upstream {caa:?}, ours {ours:?} ({why})"));
    }

    // Fields newer than the webhook's Kubernetes types (an API server newer than its k8s.io/api): upstream's
    // patch is the difference between the object and its own typed re-encoding, so it removes them; ours
    // patches only what it changes, and they reach the API server as they were.
    let mut future = peer_pod();
    future["spec"]["futureField"] = json!({"enabled": true});
    future["spec"]["containers"][0]["futureField"] = json!("x");
    let (caa, ours) = sides.answers(&review(uid, "CREATE", &future)).await;
    let (caa, ours) = (patched(&future, &caa), patched(&future, &ours));
    assert!(caa["spec"].get("futureField").is_none(), "{caa}");
    assert!(caa["spec"]["containers"][0].get("futureField").is_none());
    assert_eq!(ours["spec"]["futureField"], json!({"enabled": true}));
    assert_eq!(ours["spec"]["containers"][0]["futureField"], "x");
    // Apart from those fields both store the same pod.
    assert_eq!(
        sides.caa.canonical(&caa).await,
        sides.caa.canonical(&ours).await
    );
    listed.push(
        "fields unknown to k8s.io/api v0.36: upstream's patch removes them, ours keeps them".into(),
    );

    // A pod of another runtime class: both leave it alone; upstream still answers with a patch (its re-encoding
    // adds empty fields such as status: {}), ours with none. No difference in the stored pod.
    let mut other = peer_pod();
    other["spec"]["runtimeClassName"] = "runc".into();
    let (caa, ours) = sides.answers(&review(uid, "CREATE", &other)).await;
    assert!(patch_of(&ours).is_none(), "{ours}");
    assert_eq!(treats(&sides, &other, &caa).await, Treats::LeavesAlone);

    println!("deliberate differences:\n  {}", listed.join("\n  "));
    sides.ours.stop().await;
}
