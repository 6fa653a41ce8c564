//! moto server (an EC2 emulator) on 127.0.0.1, from the project's venv (`make moto`).
//!
//! moto runs inside a small Python wrapper that reads its stdin until EOF and then stops the server: this process
//! holds the write end, so the server goes away with the run however it ends.

use std::path::Path;
use std::process::Stdio;

use aws_sdk_ec2::config::{BehaviorVersion, Credentials, Region};
use aws_sdk_ec2::types::InstanceType;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::Error;

/// Dummy credentials moto accepts; provider-service gets the same through its configuration.
pub const ACCESS_KEY_ID: &str = "AKIDBENCHPEERPODS";
pub const SECRET_ACCESS_KEY: &str = "bench-secret-not-a-real-key";
pub const REGION: &str = "us-east-1";
/// An AMI moto knows in every region.
const IMAGE_ID: &str = "ami-12c6146b";
/// Instances per RunInstances call while arranging a storm.
const LAUNCH_CHUNK: usize = 100;

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
    // Held, never written: dropping it (closing the pipe) stops the server.
    _stdin: ChildStdin,
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
                message: format!("{}: {e}", python.display()),
            })?;
        let (Some(stdout), Some(stdin)) = (child.stdout.take(), child.stdin.take()) else {
            return Err(Error::Setup("moto started without pipes".into()));
        };
        let mut first = String::new();
        BufReader::new(stdout)
            .read_line(&mut first)
            .await
            .map_err(|e| Error::io("reading moto's port", e))?;
        let port: u16 = first.trim().parse().map_err(|_| Error::Exited {
            name: "moto".into(),
            status: format!("printed {first:?} instead of its port"),
            tail: std::fs::read_to_string(&log_path).unwrap_or_default(),
            log: log_path.clone(),
        })?;
        Ok(Moto {
            endpoint: format!("http://127.0.0.1:{port}"),
            _stdin: stdin,
            _child: child,
        })
    }

    /// provider-service's configuration keys for this server (cloud-api-adaptor's names).
    pub fn provider_config(&self) -> Vec<(&'static str, String)> {
        vec![
            ("CLOUD_PROVIDER", "aws".into()),
            ("AWS_REGION", REGION.into()),
            ("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID.into()),
            ("AWS_SECRET_ACCESS_KEY", SECRET_ACCESS_KEY.into()),
            ("AWS_ENDPOINT_URL", self.endpoint.clone()),
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
            .map_err(|e| {
                Error::Ec2(format!(
                    "RunInstances: {}",
                    aws_sdk_ec2::error::DisplayErrorContext(&e)
                ))
            })?;
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
            .map_err(|e| {
                Error::Ec2(format!(
                    "DescribeInstances: {}",
                    aws_sdk_ec2::error::DisplayErrorContext(&e)
                ))
            })?;
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
