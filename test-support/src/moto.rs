//! moto, the EC2 emulator from PyPI, for the tests of any crate: one server per test binary, on
//! 127.0.0.1 and a port the OS picks, and helpers that drive it with the real AWS SDK.
//!
//! moto runs inside a small Python wrapper that reads its stdin until EOF and then stops the
//! server. The test process holds the write end of that pipe for its whole life, so the server
//! goes away whenever the test binary ends, also when it panics or is killed.
#![allow(clippy::unwrap_used)] // test support: a failed setup ends the test with its message

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};

pub const ACCESS_KEY_ID: &str = "AKIDTESTPEERPODS";
/// Dummy, but treated as a secret by the provider: tests check it never shows up in errors.
pub const SECRET_ACCESS_KEY: &str = "test-secret-9f8e7d6c5b4a";
pub const REGION: &str = "us-east-1";
/// An AMI that moto knows in every region.
pub const IMAGE_ID: &str = "ami-12c6146b";

const WRAPPER: &str = r#"
import sys
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
print(server.get_host_and_port()[1], flush=True)
sys.stdin.read()
server.stop()
"#;

pub struct Moto {
    pub endpoint: String,
    port: u16,
    // Held, never used: closing it (at process exit) stops the server.
    _stdin: Mutex<ChildStdin>,
    _child: Mutex<Child>,
}

/// The Python interpreter of the venv that `make test` installs moto into.
fn python() -> PathBuf {
    if let Some(python) = std::env::var_os("MOTO_PYTHON") {
        return PathBuf::from(python);
    }
    // This crate sits at the repository's top level, beside `.tools/`.
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.tools/venv/bin/python")
}

/// The moto server of this test binary, started on first use with `env` set for it.
pub fn moto_with_env(env: &[(&str, &str)]) -> &'static Moto {
    static MOTO: OnceLock<Moto> = OnceLock::new();
    MOTO.get_or_init(|| start(env))
}

/// The moto server of this test binary.
pub fn moto() -> &'static Moto {
    moto_with_env(&[])
}

fn start(env: &[(&str, &str)]) -> Moto {
    let python = python();
    let log_path = std::env::temp_dir().join(format!("moto-{}.log", std::process::id()));
    let log = std::fs::File::create(&log_path).expect("create moto log file");
    let mut child = Command::new(&python)
        .args(["-c", WRAPPER])
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run {} ({e}); `make moto` installs moto[ec2,server] into the venv",
                python.display()
            )
        });
    let stdout = child.stdout.take().expect("moto stdout");
    let mut first_line = String::new();
    BufReader::new(stdout)
        .read_line(&mut first_line)
        .expect("read moto port");
    let port: u16 = first_line.trim().parse().unwrap_or_else(|_| {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        panic!("moto did not start (printed {first_line:?}); its log:\n{log}")
    });
    let stdin = child.stdin.take().expect("moto stdin");
    Moto {
        endpoint: format!("http://127.0.0.1:{port}"),
        port,
        _stdin: Mutex::new(stdin),
        _child: Mutex::new(child),
    }
}

impl Moto {
    /// Forgets every resource (`POST /moto-api/reset`). Plain HTTP/1.0 over a socket: this one
    /// request does not justify an HTTP client dependency.
    pub fn reset(&self) {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).expect("connect to moto");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .expect("set timeout");
        stream
            .write_all(
                b"POST /moto-api/reset HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n",
            )
            .expect("send reset");
        let mut answer = String::new();
        stream
            .read_to_string(&mut answer)
            .expect("read reset answer");
        assert!(
            answer.starts_with("HTTP/1.0 200") || answer.starts_with("HTTP/1.1 200"),
            "moto reset failed: {answer}"
        );
    }

    /// provider-service configuration keys pointing at this server with dummy static credentials.
    pub fn config(&self, extra: &[(&str, &str)]) -> Vec<(String, String)> {
        config_for(&self.endpoint, extra)
    }

    /// A plain SDK client for arranging and inspecting moto's state.
    pub fn client(&self) -> aws_sdk_ec2::Client {
        let config = aws_sdk_ec2::Config::builder()
            .behavior_version(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .endpoint_url(&self.endpoint)
            .credentials_provider(Credentials::new(
                ACCESS_KEY_ID,
                SECRET_ACCESS_KEY,
                None,
                None,
                "test",
            ))
            .http_client(
                aws_smithy_http_client::Builder::new()
                    .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                        aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
                    ))
                    .build_https(),
            )
            .build();
        aws_sdk_ec2::Client::from_conf(config)
    }
}

/// provider-service configuration keys for the AWS provider against `endpoint`; `extra` adds or
/// overrides keys.
pub fn config_for(endpoint: &str, extra: &[(&str, &str)]) -> Vec<(String, String)> {
    let mut pairs: Vec<(String, String)> = [
        ("CLOUD_PROVIDER", "aws"),
        ("AWS_REGION", REGION),
        ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY),
        ("AWS_ENDPOINT_URL", endpoint),
    ]
    .into_iter()
    .filter(|(key, _)| !extra.iter().any(|(k, _)| k == key))
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    pairs.extend(
        extra
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned())),
    );
    pairs
}

/// Tests of one binary share one moto server; each takes this lock and resets moto first, so
/// no test sees another's instances.
pub static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Launches `count` running instances with `tags` and returns their ids.
pub async fn run_instances(
    client: &aws_sdk_ec2::Client,
    count: i32,
    tags: &[(&str, &str)],
) -> Vec<String> {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut request = client
        .run_instances()
        .image_id(IMAGE_ID)
        .instance_type(aws_sdk_ec2::types::InstanceType::T3Micro)
        .min_count(count)
        .max_count(count);
    if !tags.is_empty() {
        let mut spec = TagSpecification::builder().resource_type(ResourceType::Instance);
        for (key, value) in tags {
            spec = spec.tags(Tag::builder().key(*key).value(*value).build());
        }
        request = request.tag_specifications(spec.build());
    }
    let output = request.send().await.expect("RunInstances");
    output
        .instances()
        .iter()
        .map(|i| i.instance_id().expect("instance id").to_owned())
        .collect()
}

/// The state name of an instance as moto reports it now.
pub async fn state_of(client: &aws_sdk_ec2::Client, instance_id: &str) -> String {
    let output = client
        .describe_instances()
        .instance_ids(instance_id)
        .send()
        .await
        .expect("DescribeInstances");
    output
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find_map(|i| i.state()?.name().map(|n| n.as_str().to_owned()))
        .expect("instance state")
}

/// A well-formed id that no instance has (moto makes 17-digit ids from random hex).
pub fn unknown_id(n: usize) -> String {
    format!("i-{n:017x}")
}

/// A port on 127.0.0.1 where nothing listens.
pub fn closed_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}
