//! Real tools and real processes for the chart tests: helm, kubeconform and kubectl from `.tools/bin`, the
//! services' binaries from the workspace's target directory, the local control plane from testenv.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::OnceLock;
use std::time::Duration;

use deploy_tests::{rbac, schemas};
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, EnvVar, Pod, Secret, Volume};
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

pub const CHART: &str = "deploy/chart/peerpods";
/// The local control plane's version (testenv/controlplane), for `helm template` and kubeconform.
pub const KUBE_VERSION: &str = "1.37.1";

/// The control plane of the chart tests. It keeps the API server's audit log, which tells what the chart's
/// ServiceAccounts actually did (the RBAC check needs that); the other modules use the cheaper
/// [`testenv::shared_for`].
pub fn control_plane() -> &'static testenv::ControlPlane {
    static AUDITED: OnceLock<testenv::ControlPlane> = OnceLock::new();
    AUDITED.get_or_init(|| {
        match testenv::ControlPlane::start_with(testenv::Options {
            audit: true,
            ..Default::default()
        }) {
            Ok(cp) => cp,
            Err(e) => panic!("local control plane with an audit log: {e}"),
        }
    })
}

/// The RBAC objects (Roles, ClusterRoles and their bindings) of a rendered manifest.
pub fn rbac_of(manifest: &str) -> rbac::Rbac {
    fn parse<T: k8s_openapi::serde::de::DeserializeOwned>(doc: &str) -> T {
        serde_saphyr::from_str(doc)
            .unwrap_or_else(|e| panic!("{} in the manifest: {e}\n{doc}", kind_of(doc)))
    }
    let mut out = rbac::Rbac::default();
    for doc in documents(manifest) {
        match kind_of(&doc) {
            "Role" => out.roles.push(parse(&doc)),
            "ClusterRole" => out.cluster_roles.push(parse(&doc)),
            "RoleBinding" => out.role_bindings.push(parse(&doc)),
            "ClusterRoleBinding" => out.cluster_role_bindings.push(parse(&doc)),
            _ => {}
        }
    }
    out
}

/// A tool built into `.tools/bin` by `make test`'s prerequisites.
pub fn tool(name: &str) -> PathBuf {
    let path = testenv::repo_root().join(".tools/bin").join(name);
    assert!(
        path.exists(),
        "{} is missing: run `make helm kubeconform kubectl`",
        path.display()
    );
    path
}

/// A binary of the workspace, as `cargo test --workspace` builds it next to this test.
pub fn service_binary(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>/<name>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target directory");
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build it first (`cargo build --bins` or `cargo test --workspace`)",
        path.display()
    );
    path
}

/// Runs a command to completion; returns (success, stdout, stderr).
pub async fn run(program: &Path, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
    let mut command = Command::new(program);
    command
        .args(args)
        .current_dir(testenv::repo_root())
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let mut child = command
        .spawn()
        .unwrap_or_else(|e| panic!("starting {}: {e}", program.display()));
    if let Some(input) = stdin {
        let mut pipe = child.stdin.take().expect("stdin pipe");
        pipe.write_all(input.as_bytes())
            .await
            .expect("writing stdin");
        drop(pipe);
    }
    let out = child.wait_with_output().await.expect("waiting for command");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Like [`run`], but the command must succeed; returns stdout.
pub async fn run_ok(program: &Path, args: &[&str], stdin: Option<&str>) -> String {
    let (ok, stdout, stderr) = run(program, args, stdin).await;
    assert!(
        ok,
        "{} {} failed:\n{stderr}\n{stdout}",
        program.display(),
        args.join(" ")
    );
    stdout
}

/// `helm template` of the chart with its default values and `--set` each of `sets`, for the values the chart
/// must refuse or accept: (success, stdout, stderr).
pub async fn template_with(sets: &[&str]) -> (bool, String, String) {
    let mut args = vec!["template", "x", CHART, "--kube-version", KUBE_VERSION];
    for set in sets {
        args.extend(["--set", set]);
    }
    run(&tool("helm"), &args, None).await
}

/// `helm template` of the chart with the CRDs, as installed into `namespace`.
pub async fn render(release: &str, namespace: &str, values: &[&str]) -> String {
    let mut args = vec![
        "template",
        release,
        CHART,
        "--namespace",
        namespace,
        "--include-crds",
        "--kube-version",
        KUBE_VERSION,
    ];
    for v in values {
        args.extend(["-f", v]);
    }
    run_ok(&tool("helm"), &args, None).await
}

/// The YAML documents of a rendered manifest (Helm separates them with `---` lines).
pub fn documents(manifest: &str) -> Vec<String> {
    let mut docs = Vec::new();
    let mut current = String::new();
    for line in manifest.lines() {
        if line == "---" {
            docs.push(std::mem::take(&mut current));
        } else {
            current.push_str(line);
            current.push('\n');
        }
    }
    docs.push(current);
    docs.into_iter()
        .filter(|d| d.lines().any(|l| l.starts_with("kind: ")))
        .collect()
}

/// The top-level `kind` of one document.
pub fn kind_of(doc: &str) -> &str {
    doc.lines()
        .find_map(|l| l.strip_prefix("kind: "))
        .unwrap_or_default()
        .trim()
}

/// Writes kubeconform schemas for every kind the API server serves (CRDs included) under `dir`; returns the
/// `-schema-location` argument.
pub async fn write_schemas(client: &kube::Client, dir: &Path, strict: bool) -> String {
    let request = http::Request::get("/openapi/v2")
        .body(Vec::new())
        .expect("request");
    let text = client.request_text(request).await.expect("GET /openapi/v2");
    let document: serde_json::Value = serde_json::from_str(&text).expect("OpenAPI JSON");
    let kinds = schemas::from_openapi_v2(&document, strict).expect("schemas from OpenAPI");
    for kind in &kinds {
        let path = dir.join(kind.relative_path());
        std::fs::create_dir_all(path.parent().expect("parent")).expect("schema dir");
        std::fs::write(&path, kind.schema.to_string()).expect("writing schema");
    }
    format!("{}/{}", dir.display(), schemas::LOCATION_TEMPLATE)
}

/// Waits until the API server serves CRD `name` (its Established condition is True).
pub async fn wait_established(
    crds: &kube::Api<
        k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    >,
    name: &str,
) {
    testenv::wait_for(
        &format!("CRD {name} Established"),
        Duration::from_secs(30),
        || async {
            let crd = crds.get_opt(name).await.ok().flatten()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        },
    )
    .await;
}

/// Waits until the API server's OpenAPI document describes `kind` of `group` (CRD schemas are published a
/// moment after the CRD is Established).
pub async fn wait_for_openapi_kind(client: &kube::Client, group: &str, kind: &str) {
    let needle = format!("\"group\":\"{group}\",\"kind\":\"{kind}\"");
    testenv::wait_for(
        &format!("{group}/{kind} in /openapi/v2"),
        Duration::from_secs(60),
        || async {
            let request = http::Request::get("/openapi/v2").body(Vec::new()).ok()?;
            let text = client.request_text(request).await.ok()?;
            text.replace(' ', "").contains(&needle).then_some(())
        },
    )
    .await;
}

/// A kubeconfig for control plane `cp` that authenticates with `token` only.
pub fn token_kubeconfig(cp: &testenv::ControlPlane, path: &Path, token: &str) {
    let admin = std::fs::read_to_string(cp.kubeconfig_path()).expect("admin kubeconfig");
    let mut config: serde_json::Value = serde_saphyr::from_str(&admin).expect("kubeconfig YAML");
    let users = config["users"].as_array_mut().expect("users");
    for user in users.iter_mut() {
        user["user"] = serde_json::json!({ "token": token });
    }
    // JSON is YAML: every kubeconfig reader accepts it.
    std::fs::write(path, config.to_string()).expect("writing kubeconfig");
}

/// A free port on 127.0.0.1 (bound and released; the service binds it right after).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// GET `path` on `addr` (HTTP/1.0, so the body is neither chunked nor kept alive): status and body, if it
/// answers.
pub async fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).await.ok()?;
    let status = response.split_whitespace().nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n")?.1.to_owned();
    Some((status, body))
}

/// HTTP status of GET `path` on `addr`, if it answers.
pub async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    http_get(addr, path).await.map(|(status, _)| status)
}

/// A service binary running as a child process, stopped (and its log shown) when dropped.
pub struct Service {
    pub name: String,
    pub admin: SocketAddr,
    child: Child,
    log: PathBuf,
}

impl Service {
    /// Starts `binary` with exactly `env` (nothing inherited), logging to `<dir>/<name>.log`.
    pub fn start(
        name: &str,
        binary: &Path,
        env: &BTreeMap<String, String>,
        admin: SocketAddr,
        dir: &Path,
    ) -> Service {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).expect("log file");
        let child = Command::new(binary)
            .env_clear()
            .envs(env)
            .stdin(Stdio::null())
            .stdout(file.try_clone().expect("log file"))
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        Service {
            name: name.to_string(),
            admin,
            child,
            log,
        }
    }

    /// Waits until `/readyz` answers 200 (fails early if the process exits).
    pub async fn wait_ready(&mut self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("{} exited with {status}:\n{}", self.name, self.log_text());
            }
            if http_status(self.admin, "/readyz").await == Some(200) {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} not ready after 60s:\n{}",
                self.name,
                self.log_text()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Stops the process as a kubelet does (SIGTERM) and waits for it to exit.
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status()
                .await;
        }
        match tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await {
            Ok(Ok(_)) => {}
            other => panic!("{} did not stop on SIGTERM: {other:?}", self.name),
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.start_kill();
        if std::thread::panicking() {
            eprintln!("---- {} log ----\n{}", self.name, self.log_text());
        }
    }
}

/// The first container's environment of a chart Deployment, with the downward-API values a kubelet would
/// fill in (Pod name and namespace).
pub fn container_env(deployment: &Deployment, pod_name: &str) -> BTreeMap<String, String> {
    let spec = deployment.spec.template.spec.as_ref().expect("pod spec");
    let namespace = deployment.metadata.namespace.clone().unwrap_or_default();
    let mut env = BTreeMap::new();
    for EnvVar {
        name,
        value,
        value_from,
    } in spec.containers[0].env.clone().unwrap_or_default()
    {
        let value = match (value, value_from.and_then(|f| f.field_ref)) {
            (Some(v), _) => v,
            (None, Some(field)) if field.field_path == "metadata.name" => pod_name.to_string(),
            (None, Some(field)) if field.field_path == "metadata.namespace" => namespace.clone(),
            (None, other) => panic!("{name}: unsupported env source {other:?}"),
        };
        env.insert(name, value);
    }
    env
}

/// A volume of a chart Deployment's Pod, by name.
/// The ConfigMap behind `deployment`'s volume `name`.
pub fn config_map_of(deployment: &Deployment, name: &str) -> String {
    volume(deployment, name)
        .config_map
        .as_ref()
        .map(|c| c.name.clone())
        .unwrap_or_else(|| panic!("{name} volume"))
}

/// The Secret behind `deployment`'s volume `name`.
pub fn secret_of(deployment: &Deployment, name: &str) -> String {
    volume(deployment, name)
        .secret
        .as_ref()
        .and_then(|s| s.secret_name.clone())
        .unwrap_or_else(|| panic!("{name} volume"))
}

/// A Secret's keys as the files a kubelet mounts.
pub fn secret_files(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    secret
        .data
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|(k, ByteString(v))| (k, v))
        .collect()
}

/// provider-service's environment from its Deployment, run here: its /etc/peerpods under `dir`, gRPC on
/// 127.0.0.1:`grpc_port`, the admin port on `admin`, `home` as HOME and the API server through `kubeconfig`.
pub fn provider_service_env(
    deployment: &Deployment,
    dir: &Path,
    grpc_port: u16,
    admin: SocketAddr,
    home: &Path,
    kubeconfig: &Path,
) -> BTreeMap<String, String> {
    let mut env = container_env(deployment, "provider-service-0");
    relocate(&mut env, "/etc/peerpods", &dir.join("etc/peerpods"));
    env.insert("LISTEN".into(), format!("127.0.0.1:{grpc_port}"));
    env.insert("ADMIN_LISTEN".into(), admin.to_string());
    // The secure metrics port on a free one: several services share this host.
    env.insert("METRICS_LISTEN".into(), "127.0.0.1:0".into());
    env.insert("HOME".into(), home.display().to_string());
    env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    env
}

pub fn volume<'a>(deployment: &'a Deployment, name: &str) -> &'a Volume {
    deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .and_then(|v| v.iter().find(|v| v.name == name))
        .unwrap_or_else(|| panic!("volume {name} in {:?}", deployment.metadata.name))
}

/// Where a container mounts volume `name`.
pub fn mount_path(deployment: &Deployment, name: &str) -> String {
    deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.containers[0].volume_mounts.as_ref())
        .and_then(|m| m.iter().find(|m| m.name == name))
        .map(|m| m.mount_path.clone())
        .unwrap_or_else(|| panic!("mount of {name} in {:?}", deployment.metadata.name))
}

/// Rewrites paths inside the Pod (`from`) to where the test laid the files out (`to`).
pub fn relocate(env: &mut BTreeMap<String, String>, from: &str, to: &Path) {
    for value in env.values_mut() {
        let parts: Vec<String> = value
            .split(',')
            .map(|p| match p.strip_prefix(from) {
                Some(rest) => format!("{}{rest}", to.display()),
                None => p.to_string(),
            })
            .collect();
        *value = parts.join(",");
    }
}

/// Writes each `key -> bytes` as a file in `dir`, as a kubelet mounts a ConfigMap or Secret.
pub fn mount_files(dir: &Path, files: &BTreeMap<String, Vec<u8>>) {
    std::fs::create_dir_all(dir).expect("mount dir");
    for (key, bytes) in files {
        std::fs::write(dir.join(key), bytes).expect("writing mounted file");
    }
}

/// Runs helm against control plane `cp`; returns (success, stdout, stderr).
pub async fn helm(cp: &testenv::ControlPlane, args: &[&str]) -> (bool, String, String) {
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let mut all: Vec<&str> = args.to_vec();
    all.extend(["--kubeconfig", &kubeconfig]);
    run(&tool("helm"), &all, None).await
}

/// Like [`helm`], but it must succeed; returns stdout.
pub async fn helm_ok(cp: &testenv::ControlPlane, args: &[&str]) -> String {
    let (ok, out, err) = helm(cp, args).await;
    assert!(ok, "helm {} failed:\n{err}\n{out}", args.join(" "));
    out
}

/// Runs kubectl against control plane `cp`, which must succeed.
pub async fn kubectl_ok(cp: &testenv::ControlPlane, args: &[&str]) -> String {
    let kubeconfig = cp.kubeconfig_path().display().to_string();
    let mut all: Vec<&str> = vec!["--kubeconfig", &kubeconfig];
    all.extend(args);
    run_ok(&tool("kubectl"), &all, None).await
}

/// provider-service's own namespace in a release installed into `ns` (the chart's default,
/// providerService.namespace): it, its credential and its TLS key live there, its callers in `ns`.
pub fn provider_namespace(ns: &str) -> String {
    format!("{ns}-provider")
}

/// The chart's Deployment of `component` (`provider-service`, `peerpod-ctrl`, ...) in a release whose full name
/// is `fullname`.
pub async fn deployment_of(
    deployments: &Api<Deployment>,
    fullname: &str,
    component: &str,
) -> Deployment {
    deployments
        .get(&format!("{fullname}-{component}"))
        .await
        .unwrap_or_else(|e| panic!("{component} Deployment: {e}"))
}

/// The ServiceAccount a chart Deployment's Pods run as.
pub fn service_account_of(deployment: &Deployment) -> String {
    deployment
        .spec
        .template
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .expect("serviceAccountName")
}

/// The PeerPod API.
pub fn peerpod_resource() -> ApiResource {
    let gvk = GroupVersionKind::gvk("confidentialcontainers.org", "v1alpha1", "PeerPod");
    ApiResource::from_gvk_with_plural(&gvk, "peerpods")
}

/// A libvirt test-driver host with one running domain per UUID; provider-service opens it as
/// `test:///<file>`.
pub fn libvirt_host(vms: &[String]) -> String {
    let mut xml = String::from("<node>\n");
    for (i, uuid) in vms.iter().enumerate() {
        xml.push_str(&format!(
            "  <domain type='test'>\n    <name>podvm-{i}</name>\n    <uuid>{uuid}</uuid>\n    \
             <memory>1048576</memory>\n    <vcpu>1</vcpu>\n    <os><type>hvm</type></os>\n  </domain>\n"
        ));
    }
    xml.push_str("</node>\n");
    xml
}

/// A Pod of a workload (it never runs: the local control plane has no kubelet).
pub async fn workload_pod(pods: &Api<Pod>, name: &str) -> Pod {
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "registry.example/app"}]}
    }))
    .expect("Pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .expect("create Pod")
}

/// Whether object `name` exists.
pub async fn exists<K>(api: &Api<K>, name: &str) -> bool
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.get_opt(name).await.expect("get").is_some()
}

/// Waits (up to `within`) until object `name` is gone; `what` says what that means, for the failure.
pub async fn wait_gone<K>(what: &str, api: &Api<K>, name: &str, within: Duration)
where
    K: Clone + k8s_openapi::serde::de::DeserializeOwned + std::fmt::Debug,
{
    testenv::wait_for(what, within, || async {
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
}

/// provider-service of a chart release, laid out to run here by [`lay_out_provider_service`].
pub struct ProviderServiceLayout {
    /// Its environment (see [`provider_service_env`]).
    pub env: BTreeMap<String, String>,
    /// Its gRPC port on 127.0.0.1.
    pub grpc_port: u16,
    /// Its admin address.
    pub admin: SocketAddr,
    /// The token of its own ServiceAccount it reaches the API server with.
    pub token: String,
}

/// provider-service's volumes of `deployment` (in `ns`) laid out under `<work>/provider-service` as a kubelet
/// would: peer-pods-cm, its own credential and its TLS Secret, read as the admin (provider-service itself reads
/// only the mounted files, and the chart lets it read nothing else). It reaches the API server with its own
/// ServiceAccount's token (so the audit log tells its requests apart), gRPC and admin on free ports.
pub async fn lay_out_provider_service(
    cp: &testenv::ControlPlane,
    admin: &kube::Client,
    ns: &str,
    deployment: &Deployment,
    work: &Path,
) -> ProviderServiceLayout {
    let config_maps: Api<ConfigMap> = Api::namespaced(admin.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    let dir = work.join("provider-service");
    let mounted = |name: &str| dir.join(mount_path(deployment, name).trim_start_matches('/'));
    let cm = config_maps
        .get(&config_map_of(deployment, "config"))
        .await
        .expect("peer-pods-cm for the config volume");
    mount_files(
        &mounted("config"),
        &cm.data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, v.into_bytes()))
            .collect(),
    );
    // Its own credential (providerService.credentials.secretName): an optional volume, so a missing Secret
    // mounts as an empty directory, as a kubelet mounts it.
    let credentials = secrets
        .get_opt(&secret_of(deployment, "credentials"))
        .await
        .expect("provider-service's credential for the credentials volume");
    mount_files(
        &mounted("credentials"),
        &credentials.as_ref().map(secret_files).unwrap_or_default(),
    );
    let tls = secrets
        .get(&secret_of(deployment, "tls"))
        .await
        .expect("TLS Secret from the chart");
    mount_files(&mounted("tls"), &secret_files(&tls));
    let token =
        testenv::service_account_token(admin, ns, &service_account_of(deployment), &[]).await;
    let kubeconfig = work.join("provider-service.kubeconfig");
    token_kubeconfig(cp, &kubeconfig, &token);
    let grpc_port = free_port();
    let admin_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let env = provider_service_env(deployment, &dir, grpc_port, admin_addr, work, &kubeconfig);
    ProviderServiceLayout {
        env,
        grpc_port,
        admin: admin_addr,
        token,
    }
}

/// A controller replica (Pod `pod`) of a chart Deployment, laid out to run here by [`lay_out_controller`].
pub struct ControllerLayout {
    /// Its environment.
    pub env: BTreeMap<String, String>,
    /// Its admin address.
    pub admin: SocketAddr,
    /// Where its projected `provider-service` volume is mounted: `token` and `ca.crt`.
    pub mount: PathBuf,
    /// The name provider-service's certificate is verified under (the chart's Service's).
    pub server_name: String,
}

/// Controller replica `pod` of `deployment` (in `ns`) laid out under `<work>/<pod>`: the chart's environment,
/// its projected `provider-service` volume as a kubelet mounts it (a token of its ServiceAccount for that
/// volume's audience, the CA from the chart's Secret), the API server through a kubeconfig with `api_token`,
/// and provider-service on 127.0.0.1:`grpc_port`, verified under the chart's Service name.
#[allow(clippy::too_many_arguments)]
pub async fn lay_out_controller(
    cp: &testenv::ControlPlane,
    admin: &kube::Client,
    ns: &str,
    deployment: &Deployment,
    pod: &str,
    api_token: &str,
    grpc_port: u16,
    work: &Path,
) -> ControllerLayout {
    let dir = work.join(pod);
    let sources = volume(deployment, "provider-service")
        .projected
        .clone()
        .and_then(|p| p.sources)
        .expect("projected volume");
    let audience = sources
        .iter()
        .find_map(|s| s.service_account_token.as_ref()?.audience.clone())
        .expect("token audience");
    let ca_secret = sources
        .iter()
        .find_map(|s| s.secret.as_ref().map(|s| s.name.clone()))
        .expect("CA Secret");
    let provider_token =
        testenv::service_account_token(admin, ns, &service_account_of(deployment), &[&audience])
            .await;
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), ns);
    let ca = secret_files(&secrets.get(&ca_secret).await.expect("CA Secret"))
        .remove("ca.crt")
        .expect("ca.crt");
    let mount = dir.join("mount");
    mount_files(
        &mount,
        &BTreeMap::from([
            ("token".to_owned(), provider_token.into_bytes()),
            ("ca.crt".to_owned(), ca),
        ]),
    );
    let kubeconfig = dir.join("kubeconfig");
    token_kubeconfig(cp, &kubeconfig, api_token);
    let admin_addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let mut env = container_env(deployment, pod);
    relocate(
        &mut env,
        &mount_path(deployment, "provider-service"),
        &mount,
    );
    let server_name = env
        .get("PROVIDER_ENDPOINT")
        .expect("PROVIDER_ENDPOINT")
        .trim_start_matches("https://")
        .rsplit_once(':')
        .map(|(h, _)| h.to_owned())
        .expect("https endpoint");
    env.insert(
        "PROVIDER_ENDPOINT".into(),
        format!("https://127.0.0.1:{grpc_port}"),
    );
    env.insert("PROVIDER_SERVER_NAME".into(), server_name.clone());
    env.insert("ADMIN_LISTEN".into(), admin_addr.to_string());
    // The secure metrics port on a free one: several services share this host.
    env.insert("METRICS_LISTEN".into(), "127.0.0.1:0".into());
    env.insert("KUBECONFIG".into(), kubeconfig.display().to_string());
    ControllerLayout {
        env,
        admin: admin_addr,
        mount,
        server_name,
    }
}

/// A provider-service client on 127.0.0.1:`grpc_port` that trusts `ca_file`, verifies the certificate under
/// `server_name` and sends the token in `token_file`.
pub fn provider_client(
    grpc_port: u16,
    ca_file: &Path,
    server_name: &str,
    token_file: &Path,
) -> peerpods_provider_client::ProviderClient {
    peerpods_provider_client::connect(&peerpods_provider_client::ProviderClientConfig {
        endpoint: format!("https://127.0.0.1:{grpc_port}"),
        ca_file: Some(ca_file.to_path_buf()),
        tls_server_name: Some(server_name.to_owned()),
        token_file: Some(token_file.to_path_buf()),
        timeout: Some(Duration::from_secs(10)),
    })
    .expect("provider client")
}
