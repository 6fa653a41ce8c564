//! A real node for a control plane of one's own: containerd (runc, the CNI bridge plugins), kubelet, kube-proxy
//! and kube-scheduler, with CoreDNS as cluster DNS, so that Deployments' pods actually run.
//!
//! The node lives in namespaces of its own, made by [`isolated`]: a network namespace (only loopback, where the
//! node address [`NODE_IP`] is local, the pods' bridge and kube-proxy's rules live, and nothing is reachable from
//! outside), a mount namespace (containerd's and kubelet's mounts vanish with it) and a PID namespace (every
//! process, containerd's shims included, ends with the test). The API server serves on [`NODE_IP`] inside it.
//!
//! What the node runs comes from `make node` (`.testenv/node`): the binaries, built from the Kubernetes release
//! of the control plane and from containerd's, runc's and CoreDNS's Go modules, and the `pause` and CoreDNS
//! images. A test imports further images (the services') with [`NodeOptions::images`].
//!
//! Host facts the node handles: cgroup v1 (kubelet's `failCgroupV1: false`, cgroupfs driver), no
//! CAP_SYS_RESOURCE (nothing lowers an OOM score: containerd's `restrict_oom_score_adj`, kubelet's and
//! kube-proxy's `oomScoreAdj: 0`), no swap accounting (`failSwapOn: false`), and no image registry (images are
//! imported, pods use `imagePullPolicy: Never`).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Node as NodeObject;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::pinned_kind;
use kube::{Client, ResourceExt};

use crate::helpers::repo_root;
use crate::{ControlPlane, Error};

/// The node's address: the API server, kubelet and the `kubernetes` Service's endpoint are on it.
pub const NODE_IP: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 99, 0, 1));
/// The Node object's name.
pub const NODE_NAME: &str = "peerpods-node";
/// Pod addresses (the CNI bridge's range).
pub const POD_CIDR: &str = "10.88.0.0/16";
/// The control plane's Service range.
pub const SERVICE_CIDR: &str = "10.0.0.0/24";
/// The cluster DNS Service's address.
pub const CLUSTER_DNS: &str = "10.0.0.10";

/// Set in the environment of a test re-run inside the node's namespaces.
const ISOLATED_ENV: &str = "TESTENV_NODE_ISOLATED";
/// The cgroup (in every v1 hierarchy) the node's pods go under; the outer run removes it.
const CGROUP_ENV: &str = "TESTENV_NODE_CGROUP";
/// Kernel settings kubelet changes at start (its "kernel tunables"): the outer run puts them back.
const KUBELET_SYSCTLS: [&str; 3] = [
    "vm/overcommit_memory",
    "kernel/panic",
    "kernel/panic_on_oops",
];

/// How long the node (containerd up, Node Ready, CoreDNS ready) may take to start.
const START_TIMEOUT: Duration = Duration::from_secs(180);

/// Runs the test `test_name` (of the calling test binary) again inside the node's namespaces, and returns
/// `true` when called there (with loopback up and [`NODE_IP`] on it). Outside, it waits for that run, restores what kubelet changed on the host (kernel
/// settings, cgroups) and returns `false` after asserting it passed. Use it first thing in the test:
///
/// ```ignore
/// if !testenv::node::isolated("the_chart_runs_on_a_node") { return; }
/// ```
///
/// # Panics
/// Outside: when the isolated run fails or cannot start (needs root and `unshare` from util-linux).
pub fn isolated(test_name: &str) -> bool {
    if std::env::var_os(ISOLATED_ENV).is_some() {
        // Before anything listens: the control plane serves on the node address.
        setup_network().expect("loopback and the node address in the test's network namespace");
        private_run_dir().expect("a run directory of the namespace's own");
        return true;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let cgroup = format!("testenv-node-{}", std::process::id());
    let sysctls: Vec<(PathBuf, String)> = KUBELET_SYSCTLS
        .iter()
        .map(|name| Path::new("/proc/sys").join(name))
        .filter_map(|path| std::fs::read_to_string(&path).ok().map(|v| (path, v)))
        .collect();
    let status = Command::new("unshare")
        .args([
            "--net",
            "--mount",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            "--",
        ])
        .arg(&exe)
        .args([
            test_name,
            "--exact",
            "--include-ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(ISOLATED_ENV, "1")
        .env(CGROUP_ENV, &cgroup)
        .status()
        .expect("running the test in namespaces of its own with `unshare` (needs root)");
    for (path, value) in &sysctls {
        let _ = std::fs::write(path, value);
    }
    remove_cgroup(&cgroup);
    assert!(
        status.success(),
        "{test_name} failed inside the node's namespaces ({status})"
    );
    false
}

/// What the node runs besides its own images.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// OCI archives (e.g. `buildah push IMAGE oci-archive:FILE:IMAGE`) imported into containerd before kubelet
    /// starts; pods use them with `imagePullPolicy: Never`.
    pub images: Vec<PathBuf>,
}

/// A running node. Its processes stop when it is dropped (and, at the latest, when the isolated test ends).
pub struct Node {
    dir: PathBuf,
    processes: Vec<(&'static str, Child)>,
}

/// Where `make node` puts the node's binaries and images.
pub fn node_dir() -> PathBuf {
    repo_root().join(".testenv/node")
}

impl Node {
    /// Brings the node up against `control_plane` (started with [`crate::Options::node_ip`] = [`NODE_IP`]) and
    /// waits until the Node is Ready and cluster DNS answers. Only inside [`isolated`].
    pub async fn start(control_plane: &ControlPlane, options: NodeOptions) -> Result<Self, Error> {
        let bin = node_dir().join("bin");
        let images = node_dir().join("images");
        for needed in [
            "containerd",
            "containerd-shim-runc-v2",
            "ctr",
            "runc",
            "kubelet",
            "kube-proxy",
            "kube-scheduler",
        ] {
            if !bin.join(needed).exists() {
                return Err(Error::Node(format!(
                    "{} is missing: run `make node`",
                    bin.join(needed).display()
                )));
            }
        }
        let cgroup = std::env::var(CGROUP_ENV).map_err(|_| {
            Error::Node("Node::start runs only inside testenv::node::isolated".into())
        })?;
        create_cgroup(&cgroup)?;

        // In the namespace's own run directory (see `private_run_dir`): gone with the namespace.
        let dir = repo_root().join(".testenv/run/node");
        std::fs::create_dir_all(dir.join("cni"))?;
        let mut node = Self {
            dir: dir.clone(),
            processes: Vec::new(),
        };
        let path = format!(
            "{}:{}",
            bin.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let socket = dir.join("containerd.sock");
        let kubeconfig = control_plane.kubeconfig_path();

        std::fs::write(dir.join("containerd.toml"), containerd_config(&dir, &bin))?;
        std::fs::write(dir.join("cni/10-pods.conflist"), cni_config(&dir))?;
        node.spawn(
            "containerd",
            &path,
            bin.join("containerd"),
            &["--config", &arg(&dir.join("containerd.toml"))],
        )?;
        wait_until(
            "containerd answering on its socket",
            Duration::from_secs(30),
            || std::os::unix::net::UnixStream::connect(&socket).is_ok(),
        )?;

        let mut archives = vec![images.join("pause.oci.tar"), images.join("coredns.oci.tar")];
        archives.extend(options.images);
        for archive in &archives {
            import_image(&bin, &socket, archive)?;
        }

        let ca = dir.join("ca.crt");
        std::fs::write(&ca, control_plane_ca(kubeconfig)?)?;
        std::fs::write(
            dir.join("kubelet.yaml"),
            kubelet_config(&socket, &ca, &cgroup),
        )?;
        node.spawn(
            "kubelet",
            &path,
            bin.join("kubelet"),
            &[
                "--config",
                &arg(&dir.join("kubelet.yaml")),
                "--kubeconfig",
                &arg(kubeconfig),
                "--hostname-override",
                NODE_NAME,
                "--node-ip",
                &NODE_IP.to_string(),
                "--root-dir",
                &arg(&dir.join("kubelet")),
                "--cert-dir",
                &arg(&dir.join("kubelet-pki")),
                "--oom-score-adj",
                "0",
            ],
        )?;
        std::fs::write(dir.join("kube-proxy.yaml"), kube_proxy_config(kubeconfig))?;
        node.spawn(
            "kube-proxy",
            &path,
            bin.join("kube-proxy"),
            &["--config", &arg(&dir.join("kube-proxy.yaml"))],
        )?;
        node.spawn(
            "kube-scheduler",
            &path,
            bin.join("kube-scheduler"),
            &[
                "--kubeconfig",
                &arg(kubeconfig),
                "--leader-elect=false",
                "--secure-port=0",
            ],
        )?;

        let client = control_plane.client().await;
        node.wait_ready(&client).await?;
        apply_manifest(
            &client,
            &std::fs::read_to_string(repo_root().join("testenv/node/manifests/coredns.yaml"))?,
        )
        .await?;
        wait_available(&client, "kube-system", "coredns", START_TIMEOUT).await?;
        Ok(node)
    }

    /// A component's log file (`containerd`, `kubelet`, `kube-proxy`, `kube-scheduler`).
    pub fn log_path(&self, component: &str) -> PathBuf {
        self.dir.join(format!("{component}.log"))
    }

    fn spawn(
        &mut self,
        name: &'static str,
        path: &str,
        program: PathBuf,
        args: &[&str],
    ) -> Result<(), Error> {
        let log = std::fs::File::create(self.log_path(name))?;
        let child = Command::new(&program)
            .args(args)
            .env("PATH", path)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|source| Error::Spawn {
                path: program,
                source,
            })?;
        self.processes.push((name, child));
        Ok(())
    }

    /// Waits for the Node to be Ready, failing early (with its log) when a component exits.
    async fn wait_ready(&mut self, client: &Client) -> Result<(), Error> {
        let nodes: Api<NodeObject> = Api::all(client.clone());
        let start = Instant::now();
        loop {
            if let Some((name, status)) = self.exited() {
                return Err(Error::Node(format!(
                    "{name} exited ({status}); last lines of its log:\n{}",
                    crate::controlplane::tail(&self.log_path(name))
                )));
            }
            if let Ok(Some(node)) = nodes.get_opt(NODE_NAME).await
                && is_ready(&node)
            {
                return Ok(());
            }
            if start.elapsed() > START_TIMEOUT {
                return Err(Error::Node(format!(
                    "Node {NODE_NAME} not Ready within {START_TIMEOUT:?}; last lines of kubelet's log:\n{}",
                    crate::controlplane::tail(&self.log_path("kubelet"))
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn exited(&mut self) -> Option<(&'static str, std::process::ExitStatus)> {
        self.processes.iter_mut().find_map(|(name, child)| {
            child
                .try_wait()
                .ok()
                .flatten()
                .map(|status| (*name, status))
        })
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        for (_, child) in self.processes.iter_mut().rev() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The address of the node's image registry ([`Registry`]).
pub const REGISTRY: &str = "localhost:5000";

/// An image registry (the CNCF distribution registry, plain HTTP on 127.0.0.1:5000 in the node's namespace),
/// announced to tools as the cluster's local registry (KEP-1755's `kube-public/local-registry-hosting`), as kind
/// and k3d clusters do: Tilt pushes what it builds there and containerd pulls from it.
pub struct Registry {
    child: Child,
}

impl Registry {
    /// Starts the registry and publishes it in the cluster. Only inside [`isolated`].
    pub async fn start(client: &Client) -> Result<Self, Error> {
        let binary = node_dir().join("bin/registry");
        if !binary.exists() {
            return Err(Error::Node(format!(
                "{} is missing: run `make node`",
                binary.display()
            )));
        }
        let dir = repo_root().join(".testenv/run/registry");
        std::fs::create_dir_all(&dir)?;
        let config = dir.join("config.yml");
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:5000\n",
                dir.join("data").display()
            ),
        )?;
        let log = std::fs::File::create(dir.join("registry.log"))?;
        let child = Command::new(&binary)
            .arg("serve")
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .map_err(|source| Error::Spawn {
                path: binary,
                source,
            })?;
        let registry = Self { child };
        wait_until("the registry listening", Duration::from_secs(30), || {
            std::net::TcpStream::connect("127.0.0.1:5000").is_ok()
        })?;
        apply_manifest(
            client,
            &format!(
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: local-registry-hosting\n  namespace: kube-public\n\
                 data:\n  localRegistryHosting.v1: |\n    host: \"{REGISTRY}\"\n"
            ),
        )
        .await?;
        Ok(registry)
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn is_ready(node: &NodeObject) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the Deployment has all its replicas available.
pub async fn wait_available(
    client: &Client,
    namespace: &str,
    name: &str,
    timeout: Duration,
) -> Result<(), Error> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), namespace);
    let start = Instant::now();
    loop {
        if let Ok(Some(d)) = deployments.get_opt(name).await {
            let want = d.spec.replicas.unwrap_or(1);
            let available = d
                .status
                .as_ref()
                .and_then(|s| s.available_replicas)
                .unwrap_or(0);
            if available >= want {
                return Ok(());
            }
        }
        if start.elapsed() > timeout {
            return Err(Error::Node(format!(
                "Deployment {namespace}/{name} not available within {timeout:?}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Server-side applies every object of a multi-document YAML manifest.
pub async fn apply_manifest(client: &Client, manifest: &str) -> Result<(), Error> {
    let params = PatchParams::apply("testenv").force();
    for document in manifest
        .split("\n---")
        .filter(|d| d.lines().any(|l| l.starts_with("kind:")))
    {
        let object: DynamicObject =
            serde_saphyr::from_str(document).map_err(|e| Error::NodeStep {
                context: "manifest document",
                source: Box::new(e),
            })?;
        let types = object
            .types
            .clone()
            .ok_or_else(|| Error::Node("manifest object without kind".into()))?;
        let gvk = kube::api::GroupVersionKind::try_from(&types).map_err(|e| Error::NodeStep {
            context: "",
            source: Box::new(e),
        })?;
        let (resource, capabilities) = pinned_kind(client, &gvk).await?;
        let api: Api<DynamicObject> = match (capabilities.scope, object.namespace()) {
            (kube::discovery::Scope::Namespaced, Some(ns)) => {
                Api::namespaced_with(client.clone(), &ns, &resource)
            }
            _ => Api::all_with(client.clone(), &resource),
        };
        api.patch(&object.name_any(), &params, &Patch::Apply(&object))
            .await?;
    }
    Ok(())
}

/// Loopback up, with the node address on it: local to every process of the namespace, and the pods reach it
/// through their bridge's gateway. Connections the node's own processes (the API server calling a webhook) open
/// to a Service address need a route before kube-proxy's rules rewrite them to a pod: the Service range goes to
/// loopback (a real node has its default route for that).
fn setup_network() -> Result<(), Error> {
    run("ip", &["link", "set", "lo", "up"])?;
    run(
        "ip",
        &["addr", "add", &format!("{NODE_IP}/32"), "dev", "lo"],
    )?;
    run("ip", &["route", "add", SERVICE_CIDR, "dev", "lo"])
}

/// Control planes keep their data under `.testenv/run/<pid>-<n>` and remove directories whose pid is gone; pids
/// of this PID namespace mean nothing outside it (and the other way round), so it gets a run directory of its own:
/// a tmpfs over that path, seen only in its mount namespace.
fn private_run_dir() -> Result<(), Error> {
    let dir = repo_root().join(".testenv/run");
    std::fs::create_dir_all(&dir)?;
    run("mount", &["-t", "tmpfs", "testenv-node-run", &arg(&dir)])
}

fn run(program: &str, args: &[&str]) -> Result<(), Error> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|source| Error::Spawn {
            path: program.into(),
            source,
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Node(format!(
            "{program} {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

fn import_image(bin: &Path, socket: &Path, archive: &Path) -> Result<(), Error> {
    if !archive.exists() {
        return Err(Error::Node(format!(
            "image archive {} is missing",
            archive.display()
        )));
    }
    let ctr = bin.join("ctr");
    run(
        &arg(&ctr),
        &[
            "--address",
            &arg(socket),
            "--namespace",
            "k8s.io",
            "images",
            "import",
            &arg(archive),
        ],
    )
}

/// The v1 hierarchies kubelet uses for its pods (`cgroupRoot`), made under each mounted controller.
fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "unified"))
                .collect()
        })
        .unwrap_or_default()
}

fn create_cgroup(name: &str) -> Result<(), Error> {
    for hierarchy in cgroup_hierarchies() {
        std::fs::create_dir_all(hierarchy.join(name))?;
        if hierarchy.ends_with("cpuset") {
            // A v1 cpuset takes no task until its CPUs and memory nodes are set: the parent's.
            for file in ["cpuset.cpus", "cpuset.mems"] {
                std::fs::write(
                    hierarchy.join(name).join(file),
                    std::fs::read(hierarchy.join(file))?,
                )?;
            }
        }
    }
    Ok(())
}

/// Removes the node's cgroups, deepest first (best effort: they are empty once the namespace's processes end).
fn remove_cgroup(name: &str) {
    fn remove(dir: &Path) {
        if let Ok(entries) = std::fs::read_dir(dir) {
            for entry in entries.filter_map(Result::ok) {
                if entry.path().is_dir() {
                    remove(&entry.path());
                }
            }
        }
        let _ = std::fs::remove_dir(dir);
    }
    for hierarchy in cgroup_hierarchies() {
        remove(&hierarchy.join(name));
    }
}

fn wait_until(what: &str, timeout: Duration, check: impl Fn() -> bool) -> Result<(), Error> {
    let start = Instant::now();
    while !check() {
        if start.elapsed() > timeout {
            return Err(Error::Node(format!("{what} not there within {timeout:?}")));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

/// The control plane's CA (kubelet checks client certificates against it).
fn control_plane_ca(kubeconfig: &Path) -> Result<Vec<u8>, Error> {
    let config = kube::config::Kubeconfig::read_from(kubeconfig)?;
    config
        .clusters
        .iter()
        .find_map(|c| c.cluster.as_ref()?.certificate_authority_data.clone())
        .and_then(|data| base64_decode(&data))
        .ok_or_else(|| Error::Node("the kubeconfig carries no CA".into()))
}

fn base64_decode(data: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .ok()
}

fn arg(path: &Path) -> String {
    path.display().to_string()
}

fn containerd_config(dir: &Path, bin: &Path) -> String {
    let dir = dir.display();
    let runc = bin.join("runc");
    let runc = runc.display();
    format!(
        r#"version = 3
root = "{dir}/containerd/root"
state = "{dir}/containerd/state"
[grpc]
  address = "{dir}/containerd.sock"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "localhost/peerpods-node/pause:test"
[plugins."io.containerd.cri.v1.runtime"]
  # Without CAP_SYS_RESOURCE no process may lower its OOM score; kubelet asks for -998 for sandboxes.
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["/usr/lib/cni"]
  conf_dir = "{dir}/cni"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "{runc}"
  SystemdCgroup = false
"#
    )
}

fn cni_config(dir: &Path) -> String {
    format!(
        r#"{{"cniVersion": "1.0.0", "name": "pods", "plugins": [
  {{"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
   "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "{POD_CIDR}"}}]], "routes": [{{"dst": "0.0.0.0/0"}}],
            "dataDir": "{}"}}}},
  {{"type": "portmap", "capabilities": {{"portMappings": true}}}}
]}}
"#,
        dir.join("cni-ipam").display()
    )
}

fn kubelet_config(socket: &Path, ca: &Path, cgroup: &str) -> String {
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
failSwapOn: false
containerRuntimeEndpoint: unix://{socket}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: true}}
  x509: {{clientCAFile: {ca}}}
authorization: {{mode: Webhook}}
address: {NODE_IP}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
clusterDNS: [{CLUSTER_DNS}]
clusterDomain: cluster.local
resolvConf: ""
evictionHard: {{memory.available: "1Mi", nodefs.available: "1%", imagefs.available: "1%", nodefs.inodesFree: "1%"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
"#,
        socket = socket.display(),
        ca = ca.display(),
    )
}

fn kube_proxy_config(kubeconfig: &Path) -> String {
    format!(
        r#"apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {{kubeconfig: {}}}
clusterCIDR: {POD_CIDR}
hostnameOverride: {NODE_NAME}
oomScoreAdj: 0
# Conntrack table sizes are host-wide: leave them alone.
conntrack: {{maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}}
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
"#,
        kubeconfig.display()
    )
}
