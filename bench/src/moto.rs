//! moto server (an EC2 emulator) on 127.0.0.1, from the project's venv (`make moto`).
//!
//! moto runs inside a small Python wrapper that reads its stdin until EOF and then stops the server: this process
//! holds the write end, so the server goes away with the run however it ends.
//!
//! Cloud calls are counted on the cloud's side: the wrapper serves moto's own WSGI application behind a layer that
//! counts every HTTP request by EC2 `Action` and by the access key that signed it (so SDK retries count, and the
//! bench's own arranging and polling, signed with another key, does not). `counts` asks the wrapper over its stdin.

use std::path::Path;
use std::process::Stdio;

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::InstanceType;
use std::collections::BTreeMap;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

use crate::Error;

/// Dummy credentials moto accepts for the bench's own calls (arranging and checking moto's state).
pub const ACCESS_KEY_ID: &str = "AKIDBENCHPEERPODS";
pub const SECRET_ACCESS_KEY: &str = "bench-secret-not-a-real-key";
/// provider-service's credentials: requests signed with this key are the ones the cloud-call figure counts.
pub const PROVIDER_ACCESS_KEY_ID: &str = "AKIDPROVIDERSERVICE";
const PROVIDER_SECRET_ACCESS_KEY: &str = "provider-secret-not-a-real-key";
pub const REGION: &str = "us-east-1";
/// An AMI moto knows in every region.
const IMAGE_ID: &str = "ami-12c6146b";
/// Instances per RunInstances call while arranging a storm.
const LAUNCH_CHUNK: usize = 100;

// moto's server application behind a counting layer, served as moto's ThreadedMotoServer serves it. Each stdin line
// `counts` prints one JSON line {access_key: {action: requests}}; EOF stops the server.
const WRAPPER: &str = r#"
import collections, io, json, re, sys, threading, urllib.parse
from werkzeug.serving import make_server
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app

counts = collections.defaultdict(collections.Counter)
lock = threading.Lock()
credential = re.compile(r"Credential=([^/]+)/")

def counting(app):
    def handle(environ, start_response):
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        query = urllib.parse.parse_qs(body.decode("utf-8", "replace"))
        query.update(urllib.parse.parse_qs(environ.get("QUERY_STRING", "")))
        action = query.get("Action", [environ.get("PATH_INFO", "?")])[0]
        key = credential.search(environ.get("HTTP_AUTHORIZATION", ""))
        with lock:
            counts[key.group(1) if key else "-"][action] += 1
        return app(environ, start_response)
    return handle

server = make_server("127.0.0.1", 0, counting(DomainDispatcherApplication(create_backend_app)), threaded=True)
threading.Thread(target=server.serve_forever, daemon=True).start()
print(server.server_port, flush=True)
for line in sys.stdin:
    if line.strip() == "counts":
        with lock:
            print(json.dumps(counts), flush=True)
server.shutdown()
"#;

pub struct Moto {
    pub endpoint: String,
    // Closing it (dropping the pipe) stops the server; lines on it ask for the request counts.
    stdin: tokio::sync::Mutex<(ChildStdin, Lines<BufReader<ChildStdout>>)>,
    _child: Child,
}

impl Moto {
    pub async fn start(python: &Path, log_dir: &Path) -> Result<Moto, Error> {
        if !python.is_file() {
            return Err(Error::Missing {
                what: format!("moto's Python {}", python.display()),
                hint: "make moto installs moto[ec2,server] into .tools/venv".into(),
            });
        }
        std::fs::create_dir_all(log_dir)
            .map_err(|e| Error::io(format!("creating {}", log_dir.display()), e))?;
        let log_path = log_dir.join("moto.log");
        let log = std::fs::File::create(&log_path)
            .map_err(|e| Error::io(format!("creating {}", log_path.display()), e))?;
        let mut child = Command::new(python)
            .args(["-c", WRAPPER])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Start {
                name: "moto".into(),
                message: python.display().to_string(),
                source: Some(e.into()),
            })?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(Error::setup("moto started without pipes"));
        };
        let mut lines = BufReader::new(stdout).lines();
        let first = lines
            .next_line()
            .await
            .map_err(|e| Error::io("reading moto's port", e))?
            .unwrap_or_default();
        let port: u16 = first.trim().parse().map_err(|_| Error::Exited {
            name: "moto".into(),
            status: format!("printed {first:?} instead of its port"),
            tail: std::fs::read_to_string(&log_path).unwrap_or_default(),
            log: log_path.clone(),
        })?;
        Ok(Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            stdin: tokio::sync::Mutex::new((stdin, lines)),
            _child: child,
        })
    }

    /// HTTP requests moto has received so far that provider-service signed, by EC2 action (retries included).
    pub async fn provider_requests(&self) -> Result<BTreeMap<String, u64>, Error> {
        let mut pipes = self.stdin.lock().await;
        let (stdin, stdout) = &mut *pipes;
        stdin
            .write_all(b"counts\n")
            .await
            .map_err(|e| Error::io("asking moto for its request counts", e))?;
        let line = stdout
            .next_line()
            .await
            .map_err(|e| Error::io("reading moto's request counts", e))?
            .ok_or_else(|| Error::setup("moto stopped before answering"))?;
        let mut by_key: BTreeMap<String, BTreeMap<String, u64>> = serde_json::from_str(&line)
            .map_err(|e| Error::setup_from(format!("moto's request counts {line:?}"), e))?;
        Ok(by_key.remove(PROVIDER_ACCESS_KEY_ID).unwrap_or_default())
    }

    /// provider-service's configuration keys for this server (cloud-api-adaptor's names).
    pub fn provider_config(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CLOUD_PROVIDER", "aws".into()),
            ("AWS_REGION", REGION.into()),
            ("AWS_ACCESS_KEY_ID", PROVIDER_ACCESS_KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY", PROVIDER_SECRET_ACCESS_KEY.into()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
            // The bench's instances carry no cluster tag: deleting them is allowed explicitly.
            ("DELETE_UNTAGGED", "allow".into()),
        ]
    }

    /// An EC2 client of the real AWS SDK for arranging and checking moto's state.
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
                "bench",
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

/// Launches `count` running instances; returns their ids.
pub async fn run_instances(
    client: &aws_sdk_ec2::Client,
    count: usize,
) -> Result<Vec<String>, Error> {
    let mut ids = Vec::with_capacity(count);
    while ids.len() < count {
        let chunk = i32::try_from((count - ids.len()).min(LAUNCH_CHUNK)).unwrap_or(1);
        let output = client
            .run_instances()
            .image_id(IMAGE_ID)
            .instance_type(InstanceType::T3Micro)
            .min_count(chunk)
            .max_count(chunk)
            .send()
            .await
            .map_err(|e| Error::ec2_from("RunInstances", e))?;
        ids.extend(
            output
                .instances()
                .iter()
                .filter_map(|i| i.instance_id().map(str::to_owned)),
        );
    }
    Ok(ids)
}

/// How many instances moto holds that are not terminated.
pub async fn live_instances(client: &aws_sdk_ec2::Client) -> Result<usize, Error> {
    let mut live = 0;
    let mut token = None;
    loop {
        let page = client
            .describe_instances()
            .set_next_token(token)
            .max_results(1000)
            .send()
            .await
            .map_err(|e| Error::ec2_from("DescribeInstances", e))?;
        live += page
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter(|i| i.state().and_then(|s| s.name()).map(|n| n.as_str()) != Some("terminated"))
            .count();
        token = page.next_token().map(str::to_owned);
        if token.is_none() {
            return Ok(live);
        }
    }
}
