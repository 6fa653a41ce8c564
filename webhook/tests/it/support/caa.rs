//! cloud-api-adaptor's webhook beside ours: the Go reference program in `tests/caa-reference` (upstream v0.22's
//! pod mutation on the controller-runtime admission handler it runs on), built with `go build` into Cargo's
//! target directory, started on 127.0.0.1 and stopped when dropped (it also ends when its standard input closes,
//! so it never outlives the test process). Plus what both comparison tests read from an AdmissionReview answer.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;

use k8s_openapi::ByteString;
use serde_json::Value;

/// The reference binary, built once per test process (Go's build cache makes a rebuild of unchanged sources a
/// matter of a second).
fn binary() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/caa-reference");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("caa-reference");
        let go = std::env::var("GO").unwrap_or_else(|_| "go".to_owned());
        let status = Command::new(&go)
            .args(["build", "-o"])
            .arg(&out)
            .arg(".")
            .current_dir(&source)
            .status()
            .unwrap_or_else(|e| panic!("{go} build in {}: {e}", source.display()));
        assert!(status.success(), "go build of the CAA reference failed");
        out
    })
}

/// The settings upstream's webhook reads from its environment.
pub const SETTINGS: [&str; 3] = [
    "TARGET_RUNTIMECLASS",
    "POD_VM_EXTENDED_RESOURCE",
    "POD_VM_INSTANCE_TYPE",
];

/// The running reference webhook (plain HTTP on 127.0.0.1).
pub struct CaaReference {
    child: Child,
    pub addr: SocketAddr,
}

impl CaaReference {
    /// Starts it with `env` (name, value) as its settings; the others unset.
    pub fn start(env: &[(&str, &str)]) -> CaaReference {
        let mut command = Command::new(binary());
        for name in SETTINGS {
            command.env_remove(name);
        }
        let mut child = command
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let addr = line
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("address {line:?}: {e}"));
        CaaReference { child, addr }
    }

    /// The Pod as the API server stores it: decoded into k8s.io/api's v1.Pod and encoded again.
    pub async fn canonical(&self, pod: &Value) -> Value {
        let answer = super::post(self.addr, "/canonical", &serde_json::to_vec(pod).unwrap()).await;
        assert_eq!(answer.status, 200, "{}", answer.text());
        answer.json()
    }
}

impl Drop for CaaReference {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The JSON patch of an AdmissionReview answer, either as upstream writes it (base64, Go's []byte) or as ours
/// (a JSON array of bytes; the API server's decoder takes both).
pub fn patch_of(response: &Value) -> Option<json_patch::Patch> {
    let bytes: Vec<u8> = match response.get("patch")? {
        Value::String(_) => {
            serde_json::from_value::<ByteString>(response["patch"].clone())
                .unwrap()
                .0
        }
        other => serde_json::from_value(other.clone()).unwrap(),
    };
    Some(serde_json::from_slice(&bytes).unwrap())
}

/// `object` with the answer's patch applied, as the API server applies it.
pub fn patched(object: &Value, response: &Value) -> Value {
    let mut out = object.clone();
    if let Some(patch) = patch_of(response) {
        json_patch::patch(&mut out, &patch)
            .unwrap_or_else(|e| panic!("patch {patch:?} does not apply to {object}: {e}"));
    }
    out
}
