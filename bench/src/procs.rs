//! The services of a run as child processes of the release builds. Each is killed when its [`Service`] is
//! dropped (also when a scenario fails half-way), so nothing outlives the run.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::Error;

/// How long a service may take to answer `/readyz`.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Where util-linux's setpriv may be.
const SETPRIV: [&str; 2] = ["/usr/bin/setpriv", "/bin/setpriv"];

/// A running service with an admin port (`/readyz`, `/metrics`).
pub struct Service {
    pub name: String,
    pub admin: SocketAddr,
    log: PathBuf,
    child: Child,
}

/// What to start.
pub struct Spec<'a> {
    pub name: &'a str,
    /// The scenario it serves; names the log file (`<scenario>-<name>.log`).
    pub scenario: &'a str,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub admin: SocketAddr,
    pub log_dir: &'a Path,
}

/// A free port on 127.0.0.1 (the OS picks it; it is released for the child to bind).
pub fn free_addr() -> Result<SocketAddr, Error> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")
        .map_err(|e| Error::io("binding a free port on 127.0.0.1", e))?;
    listener
        .local_addr()
        .map_err(|e| Error::io("reading a bound address", e))
}

impl Service {
    /// Starts the program and waits until its `/readyz` answers 200.
    pub async fn start(spec: Spec<'_>) -> Result<Service, Error> {
        if !spec.program.is_file() {
            return Err(Error::Missing {
                what: format!("{} binary {}", spec.name, spec.program.display()),
                hint: "make bench builds it with cargo build --release".into(),
                source: None,
            });
        }
        std::fs::create_dir_all(spec.log_dir)
            .map_err(|e| Error::io(format!("creating {}", spec.log_dir.display()), e))?;
        let log = spec
            .log_dir
            .join(format!("{}-{}.log", spec.scenario, spec.name));
        let out = std::fs::File::create(&log)
            .map_err(|e| Error::io(format!("creating {}", log.display()), e))?;
        let err = out
            .try_clone()
            .map_err(|e| Error::io(format!("opening {}", log.display()), e))?;
        let mut command = match SETPRIV.iter().find(|p| Path::new(p).is_file()) {
            // The child also dies when this process is killed outright (no chance to drop it): util-linux's
            // setpriv sets the parent-death signal and then execs the service under the same pid.
            Some(setpriv) => {
                let mut command = Command::new(setpriv);
                command.arg("--pdeathsig=KILL").arg("--").arg(&spec.program);
                command
            }
            None => Command::new(&spec.program),
        };
        let child = command
            .args(&spec.args)
            .envs(spec.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| Error::Start {
                name: spec.name.into(),
                message: spec.program.display().to_string(),
                source: Some(e.into()),
            })?;
        let mut service = Service {
            name: spec.name.into(),
            admin: spec.admin,
            log,
            child,
        };
        service.wait_ready().await?;
        Ok(service)
    }

    async fn wait_ready(&mut self) -> Result<(), Error> {
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(Error::Exited {
                    name: self.name.clone(),
                    status: status.to_string(),
                    tail: tail(&self.log),
                    log: self.log.clone(),
                });
            }
            if let Ok((200, _)) = http_get(self.admin, "/readyz").await {
                return Ok(());
            }
            if started.elapsed() > READY_TIMEOUT {
                return Err(Error::Timeout {
                    what: format!("{} to be ready on {}", self.name, self.admin),
                    seconds: READY_TIMEOUT.as_secs(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The service's Prometheus metrics now.
    pub async fn metrics(&self) -> Result<String, Error> {
        match http_get(self.admin, "/metrics").await? {
            (200, body) => Ok(body),
            (code, body) => Err(Error::setup(format!(
                "{} /metrics answered {code}: {body}",
                self.name
            ))),
        }
    }

    /// Peak resident set size (`VmHWM`) so far, in KiB.
    pub fn peak_rss_kib(&self) -> Result<u64, Error> {
        self.status_kib("VmHWM", crate::stats::peak_rss_kib)
    }

    /// The service's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// Resident set size now (`VmRSS`), in KiB.
    pub fn rss_kib(&self) -> Result<u64, Error> {
        self.status_kib("VmRSS", crate::stats::rss_kib)
    }

    fn status_kib(&self, field: &str, read: fn(&str) -> Option<u64>) -> Result<u64, Error> {
        let pid = self.child.id().ok_or_else(|| Error::Exited {
            name: self.name.clone(),
            status: "gone".into(),
            tail: tail(&self.log),
            log: self.log.clone(),
        })?;
        let path = format!("/proc/{pid}/status");
        let status =
            std::fs::read_to_string(&path).map_err(|e| Error::io(format!("reading {path}"), e))?;
        read(&status).ok_or_else(|| Error::setup(format!("no {field} in {path}")))
    }

    /// Stops the service as Kubernetes would (SIGTERM, then SIGKILL after a grace period).
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            // The `kill` command sends SIGTERM without unsafe libc calls in this crate.
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
            if tokio::time::timeout(Duration::from_secs(10), self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// `GET path` on a local admin port: status code and body.
// Hand-written HTTP/1.0: two endpoints on loopback do not justify an HTTP client dependency, and HTTP/1.0 makes
// the server close the connection after the body, so reading to the end is the whole protocol.
pub async fn http_get(addr: SocketAddr, path: &str) -> Result<(u16, String), Error> {
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&answer).into_owned())
    };
    let answer = tokio::time::timeout(Duration::from_secs(30), exchange)
        .await
        .map_err(|_| Error::Timeout {
            what: format!("GET http://{addr}{path}"),
            seconds: 30,
        })?
        .map_err(|e| Error::io(format!("GET http://{addr}{path}"), e))?;
    let code = answer
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_owned())
        .unwrap_or_default();
    Ok((code, body))
}

fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
