use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::Duration;

use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

use crate::Error;
use crate::audit::{self, AuditEvent};
use crate::helpers::repo_root;

/// How long a start may take once the binary exists.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// A running control plane. It stops when the test process ends: the Go side watches its parent.
pub struct ControlPlane {
    kubeconfig_path: PathBuf,
    kubeconfig: Kubeconfig,
    server_url: String,
    tuning: Vec<String>,
    /// The audit log, read through a handle opened before the API server writes to it: the events stay readable
    /// even if the run directory is cleaned away meanwhile (the API server keeps appending to the same file).
    audit_log: Option<Mutex<std::fs::File>>,
    child: Mutex<Child>,
}

/// How to start a control plane of one's own ([`ControlPlane::start_with`]). The default is what [`shared`] runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Keep kube-apiserver's audit log (every request at Metadata level), read with
    /// [`ControlPlane::audit_events`]. Off by default: it costs a file write per request.
    pub audit: bool,
    /// Serve the API on this address instead of 127.0.0.1 and run the controllers a node needs: for a
    /// [`crate::node::Node`] whose kubelet and pods live in a network namespace where this address is local.
    pub node_ip: Option<std::net::IpAddr>,
    /// Admission plugins to enable besides kube-apiserver's defaults (`--enable-admission-plugins`), for what a
    /// distribution turns on: OpenShift's `OwnerReferencesPermissionEnforcement`, for one.
    pub admission_plugins: Vec<String>,
}

/// The control plane of this test process, started on first use. Blocking; safe from any thread.
///
/// # Panics
/// When the control plane cannot be built or started: no test can run without it, and the message says why.
pub fn shared() -> &'static ControlPlane {
    static SHARED: OnceLock<ControlPlane> = OnceLock::new();
    SHARED.get_or_init(|| match ControlPlane::start() {
        Ok(cp) => cp,
        Err(e) => panic!("local control plane: {e}"),
    })
}

/// The control plane of one group of tests in this process, started on first use. For a test binary of
/// several modules (`tests/it/`) whose modules were test binaries of their own: a module whose tests install
/// cluster-wide objects (CRDs, webhook configurations, cluster roles) passes `module_path!()`, and the other
/// modules' tests never meet those objects, as when each module was a process of its own.
///
/// # Panics
/// As [`shared`].
pub fn shared_for(group: &'static str) -> &'static ControlPlane {
    static GROUPS: Mutex<BTreeMap<&'static str, &'static OnceLock<ControlPlane>>> =
        Mutex::new(BTreeMap::new());
    // Only the lookup holds the lock: groups start their control planes side by side, and the OnceLock makes the
    // tests of one group wait for the one start.
    let cell: &'static OnceLock<ControlPlane> = GROUPS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .entry(group)
        .or_insert_with(|| Box::leak(Box::new(OnceLock::new())));
    cell.get_or_init(|| match ControlPlane::start() {
        Ok(cp) => cp,
        Err(e) => panic!("local control plane of {group}: {e}"),
    })
}

/// Where the control plane binary lives: `$TESTENV_CONTROLPLANE`, else `.testenv/bin/controlplane` in the repo.
pub fn binary_path() -> PathBuf {
    std::env::var_os("TESTENV_CONTROLPLANE")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".testenv/bin/controlplane"))
}

impl ControlPlane {
    /// Starts a control plane of its own (most tests want [`shared`]). It has its own ports, data and kubeconfig.
    pub fn start() -> Result<Self, Error> {
        Self::start_with(Options::default())
    }

    /// Like [`ControlPlane::start`], set up as `options` say.
    pub fn start_with(options: Options) -> Result<Self, Error> {
        let binary = binary_path();
        if !binary.exists() {
            build(&binary)?;
        }
        let run_dir = run_dir()?;
        let kubeconfig_path = run_dir.join("kubeconfig");
        let log_path = run_dir.join("controlplane.log");
        let log = std::fs::File::create(&log_path)?;
        let audit_path = options.audit.then(|| run_dir.join("audit.log"));
        let audit_log = match &audit_path {
            Some(path) => {
                std::fs::File::create(path)?;
                Some(Mutex::new(std::fs::File::open(path)?))
            }
            None => None,
        };
        let mut command = Command::new(&binary);
        command
            .arg("--kubeconfig")
            .arg(&kubeconfig_path)
            .arg("--parent-pid")
            .arg(std::process::id().to_string());
        if let Some(path) = &audit_path {
            command.arg("--audit-log").arg(path);
        }
        if !options.admission_plugins.is_empty() {
            command
                .arg("--enable-admission-plugins")
                .arg(options.admission_plugins.join(","));
        }
        if let Some(ip) = options.node_ip {
            command.arg("--node-ip").arg(ip.to_string());
        }
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .map_err(|source| Error::Spawn {
                path: binary.clone(),
                source,
            })?;
        let Ready { server_url, tuning } = match wait_ready(&mut child) {
            Ok(ready) => ready,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(match e {
                    Error::Exited { .. } => Error::Exited {
                        tail: tail(&log_path),
                        log: log_path,
                    },
                    other => other,
                });
            }
        };
        let kubeconfig = Kubeconfig::read_from(&kubeconfig_path)?;
        Ok(Self {
            kubeconfig_path,
            kubeconfig,
            server_url,
            tuning,
            audit_log,
            child: Mutex::new(child),
        })
    }

    /// A control plane of its own that keeps its audit log ([`Options::audit`]), for async code: the start takes
    /// seconds, so it runs on a blocking thread and the caller's runtime goes on meanwhile.
    ///
    /// # Panics
    /// When the start panicked.
    pub async fn start_audited() -> Result<Self, Error> {
        tokio::task::spawn_blocking(|| {
            Self::start_with(Options {
                audit: true,
                ..Options::default()
            })
        })
        .await
        .unwrap_or_else(|e| panic!("starting an audited control plane: {e}"))
    }

    /// Every request the API server has answered so far (and every watch it has started), from its audit log.
    /// Only for a control plane started with [`Options::audit`].
    pub fn audit_events(&self) -> Result<Vec<AuditEvent>, Error> {
        use std::io::{Read, Seek, SeekFrom};
        let file = self.audit_log.as_ref().ok_or(Error::AuditOff)?;
        let mut file = match file.lock() {
            Ok(f) => f,
            Err(poisoned) => poisoned.into_inner(),
        };
        file.seek(SeekFrom::Start(0))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        audit::parse(&text).map_err(Error::AuditLog)
    }

    /// The admin kubeconfig (user in `system:masters`).
    pub fn kubeconfig_path(&self) -> &Path {
        &self.kubeconfig_path
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// How this control plane is set up for speed rather than like a production cluster (no fsync in etcd,
    /// raised request limits, ...), as it announces itself: for benchmark results to record.
    pub fn tuning(&self) -> &[String] {
        &self.tuning
    }

    /// Client configuration for the admin user.
    pub async fn config(&self) -> Result<Config, Error> {
        Ok(
            Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await?,
        )
    }

    /// A new admin client. Make one per test: a client is bound to the Tokio runtime that created it.
    pub async fn client(&self) -> Client {
        self.try_client(None)
            .await
            .unwrap_or_else(|e| panic!("admin client for the local control plane: {e}"))
    }

    /// A client that authenticates with a bearer token only (e.g. a ServiceAccount token), trusting the CA.
    pub async fn client_with_token(&self, token: &str) -> Client {
        self.try_client(Some(token))
            .await
            .unwrap_or_else(|e| panic!("token client for the local control plane: {e}"))
    }

    async fn try_client(&self, token: Option<&str>) -> Result<Client, Error> {
        let mut config = self.config().await?;
        if let Some(token) = token {
            config.auth_info = AuthInfo {
                token: Some(token.to_owned().into()),
                ..AuthInfo::default()
            };
        }
        Ok(Client::try_from(config)?)
    }

    /// Stops this control plane (SIGTERM, then wait). [`shared`] instances stop with the test process instead.
    pub fn stop(&self) {
        let mut child = match self.child.lock() {
            Ok(c) => c,
            Err(poisoned) => poisoned.into_inner(),
        };
        // SAFETY-free signalling through the `kill` command keeps this crate free of libc bindings.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .status();
        let _ = child.wait();
    }
}

/// What the "ready" line says.
struct Ready {
    server_url: String,
    tuning: Vec<String>,
}

impl Ready {
    /// `ready server=URL kubeconfig=PATH pid=N startup=D tuning=A,B,...`
    fn parse(rest: &str) -> Ready {
        let field = |name: &str| {
            rest.split_whitespace()
                .find_map(|kv| kv.strip_prefix(name))
                .unwrap_or_default()
        };
        Ready {
            server_url: field("server=").to_owned(),
            tuning: field("tuning=")
                .split(',')
                .filter(|t| !t.is_empty())
                .map(str::to_owned)
                .collect(),
        }
    }
}

/// Reads the child's standard output until its "ready" line; returns what it says.
fn wait_ready(child: &mut Child) -> Result<Ready, Error> {
    let Some(stdout) = child.stdout.take() else {
        return Err(Error::Exited {
            log: PathBuf::new(),
            tail: String::new(),
        });
    };
    let (tx, rx) = mpsc::channel();
    // The reader thread keeps draining stdout after "ready", so the child never blocks on a full pipe.
    std::thread::spawn(move || {
        let mut sent = false;
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if !sent && let Some(rest) = line.strip_prefix("ready ") {
                sent = tx.send(Some(Ready::parse(rest))).is_ok();
            }
        }
        if !sent {
            let _ = tx.send(None);
        }
    });
    match rx.recv_timeout(START_TIMEOUT) {
        Ok(Some(ready)) => Ok(ready),
        Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => Err(Error::Exited {
            log: PathBuf::new(),
            tail: String::new(),
        }),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Error::Timeout(START_TIMEOUT)),
    }
}

/// Builds the Go binary into `binary` (atomically: build to a unique name, then rename, so concurrent test
/// processes never run a half-written file).
fn build(binary: &Path) -> Result<(), Error> {
    let source = repo_root().join("testenv/controlplane");
    let dir = binary.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir)?;
    let partial = dir.join(format!(".controlplane.{}.partial", std::process::id()));
    eprintln!("testenv: building the local control plane (the first build takes several minutes)");
    let output = Command::new(source.join("build.sh"))
        .arg(&partial)
        .output()
        .map_err(|source| Error::RunGo { source })?;
    if !output.status.success() {
        return Err(Error::Build(
            String::from_utf8_lossy(&output.stderr).into_owned(),
        ));
    }
    std::fs::rename(&partial, binary)?;
    Ok(())
}

/// A directory for one control plane's kubeconfig and log under `.testenv/run/<pid>-<n>`; directories of processes that
/// are gone are removed on the way.
fn run_dir() -> Result<PathBuf, Error> {
    let base = repo_root().join(".testenv/run");
    std::fs::create_dir_all(&base)?;
    for entry in std::fs::read_dir(&base)?.flatten() {
        let name = entry.file_name();
        let alive = name
            .to_str()
            .and_then(|n| n.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
            .is_some_and(|pid| Path::new(&format!("/proc/{pid}")).exists());
        if !alive {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let dir = base.join(format!("{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

pub(crate) fn tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
