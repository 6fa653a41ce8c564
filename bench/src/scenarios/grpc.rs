//! gRPC overhead: DeleteInstance of a real (libvirt `test:///default`) domain, timed call by call, once through
//! provider-service's gRPC server over loopback and once calling the same libvirt backend directly. The server
//! runs as deployed: TLS and callers authenticated with TokenReview against the run's control plane (a projected
//! ServiceAccount token with the provider-service audience); the Rust client is the controllers' own (runtime's
//! `connect`, reading the CA and token files).
//!
//! Then the Go client cloud-api-adaptor uses (proto/clienttest's BenchmarkRoundTrip, with CAA's Go release) times
//! a health Check and a DeleteInstance over the same TLS connection and token: what a Go caller sees, including
//! any stall from Nagle's algorithm, which a Rust client's prompt ACKs hide.
//!
//! Then the same authenticated DeleteInstance is timed under a flood of what anyone who reaches the port can send:
//! idle TCP connections from many peer addresses (every 127/8 address is this host's), and TLS connections
//! each running many streams of DeleteInstance calls with no token or a forged one (a real token's shape,
//! audience and expiry, its signature replaced, so only the API server can refuse it). Every flood call must be
//! refused, and the authenticated calls served; the figure is their latency meanwhile.
//!
//! Both Rust measurements run in this process so they share the test driver's domains. Each call deletes a domain
//! defined just before it (untimed); direct and gRPC calls alternate, so drift on the machine loads both sides
//! alike. Hand-timed rather than with criterion: criterion reports means and medians of batched iterations, while
//! this figure is the p50/p99 of single calls, each of which needs a fresh domain.

use std::net::SocketAddr;
use std::path::Path;
use std::time::{Duration, Instant};

use peerpods_proto::v1::{DeleteInstanceRequest, DeleteResult};
use peerpods_provider_client::{ProviderClient, ProviderClientConfig, connect};
use peerpods_provider_core::ProviderConfig;
use peerpods_provider_core::{DeleteOutcome, Provider};
use peerpods_provider_libvirt::LibvirtProvider;
use peerpods_runtime::shutdown::CancellationToken;
use provider_service::auth::Grant;
use provider_service::metrics::Metrics;
use provider_service::service::{CallerAuth, Listen, Options as ServiceOptions};
use virt::connect::Connect;

use crate::Error;
use crate::cluster::Cluster;
use crate::options::Options;
use crate::report::Grpc;
use crate::stats::percentile;

const URI: &str = "test:///default";
/// Calls each way before timing starts (connections, caches, the blocking pool).
const WARMUP: usize = 50;
/// The audience and name the chart uses; the certificate is issued for the in-cluster Service name.
const AUDIENCE: &str = "provider-service";
const SERVER_NAME: &str = "provider-service.peerpods.svc";
const CALLER_NAMESPACE: &str = "bench-grpc";
const CALLER: &str = "cloud-api-adaptor";
/// The flood: idle connections from each of this many peer addresses...
const FLOOD_PEERS: u8 = 40;
/// ...this many from each (under the per-peer cap, so all are held)...
const FLOOD_IDLE_PER_PEER: usize = 50;
/// ...and TLS connections each running this many streams in a loop, half without a token, half forged.
const FLOOD_CONNECTIONS: usize = 32;
const FLOOD_STREAMS: usize = 16;

pub async fn run(options: &Options, cluster: &Cluster) -> Result<Grpc, Error> {
    let libvirt =
        Connect::open(Some(URI)).map_err(|e| Error::libvirt_from(format!("open {URI}"), e))?;
    // libvirt's test driver is accepted in development mode only.
    let config = ProviderConfig::from_pairs([("CLOUD_PROVIDER", "libvirt"), ("LIBVIRT_URI", URI)])
        .for_development(true);
    let direct = LibvirtProvider::from_config(&config, Metrics::default().cloud)
        .map_err(|e| Error::provider_from("", e))?;

    let files =
        tempfile::tempdir().map_err(|e| Error::io("creating a directory for TLS files", e))?;
    issue_certificates(files.path())?;
    let config_dir = files.path().join("config");
    std::fs::create_dir(&config_dir).map_err(|e| Error::io("creating the config directory", e))?;
    write(&config_dir.join("CLOUD_PROVIDER"), b"libvirt")?;
    write(&config_dir.join("LIBVIRT_URI"), URI.as_bytes())?;
    cluster.namespace(CALLER_NAMESPACE).await?;
    let token = {
        let client = cluster.client.clone();
        // testenv's helper panics on failure (it is made for tests); a task turns that into an error.
        tokio::spawn(async move {
            testenv::service_account_token(&client, CALLER_NAMESPACE, CALLER, &[AUDIENCE]).await
        })
        .await
        .map_err(|e| Error::setup_from("minting a ServiceAccount token", e))?
    };
    write(&files.path().join("token"), token.as_bytes())?;
    let grant: Grant = format!("{CALLER_NAMESPACE}/{CALLER}=DeleteInstance+GetCapacity")
        .parse()
        .map_err(Error::setup)?;

    // provider-service as main.rs starts it, in this process (it shares the test driver's domains).
    let shutdown = CancellationToken::new();
    let server = provider_service::service::start(
        ServiceOptions {
            grpc: Listen::Addr(SocketAddr::from(([127, 0, 0, 1], 0))),
            admin: None,
            secure_metrics: None,
            config_dirs: vec![config_dir],
            development: true,
            reload_interval: Duration::from_secs(5),
            tls: Some((files.path().join("tls.crt"), files.path().join("tls.key"))),
            auth: CallerAuth::TokenReview {
                client: Some(cluster.client.clone()),
                audience: AUDIENCE.into(),
                grants: vec![grant],
            },
        },
        shutdown.clone(),
    )
    .await
    .map_err(|e| Error::provider_from("", e))?;
    let addr = server.grpc_addr;
    let client_config = ProviderClientConfig {
        endpoint: format!("https://{addr}"),
        ca_file: Some(files.path().join("ca.crt")),
        tls_server_name: Some(SERVER_NAME.into()),
        token_file: Some(files.path().join("token")),
        timeout: Some(Duration::from_secs(30)),
    };
    let measured = match connect(&client_config) {
        Ok(client) => measure(options.grpc_calls, &libvirt, &direct, client).await,
        Err(e) => Err(Error::grpc_from("", e)),
    };
    let flooded = match &measured {
        Ok(_) => {
            flooded(
                options.grpc_calls,
                &libvirt,
                &client_config,
                addr,
                &token,
                files.path(),
            )
            .await
        }
        Err(_) => Err(Error::setup("the Rust client failed first")),
    };
    let go = match &measured {
        Ok(_) => go_client(options.grpc_calls, &client_config).await,
        Err(_) => Err(Error::setup("the Rust client failed first")),
    };
    shutdown.cancel();
    let _ = server.wait().await;
    let (mut direct_times, mut grpc_times) = measured?;
    let mut flood = flooded?;
    flood.times.sort();
    let go = go?;
    direct_times.sort();
    grpc_times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (direct_p50, grpc_p50) = (
        percentile(&direct_times, 50.0),
        percentile(&grpc_times, 50.0),
    );
    Ok(Grpc {
        calls: options.grpc_calls,
        tls: true,
        token_review: true,
        direct_p50_us: us(direct_p50),
        direct_p99_us: us(percentile(&direct_times, 99.0)),
        grpc_p50_us: us(grpc_p50),
        grpc_p99_us: us(percentile(&grpc_times, 99.0)),
        overhead_p50_us: us(grpc_p50) - us(direct_p50),
        go_check_p50_us: go.check_p50_us,
        go_check_p99_us: go.check_p99_us,
        go_delete_p50_us: go.delete_p50_us,
        go_delete_p99_us: go.delete_p99_us,
        flood_idle_connections: flood.idle_connections,
        flood_streams: FLOOD_CONNECTIONS * FLOOD_STREAMS,
        flood_calls_refused: flood.refused,
        flood_delete_p50_us: us(percentile(&flood.times, 50.0)),
        flood_delete_p99_us: us(percentile(&flood.times, 99.0)),
    })
}

/// What the flood phase measured.
struct Flood {
    times: Vec<Duration>,
    idle_connections: usize,
    refused: u64,
}

/// `token` with its signature replaced.
fn forged(token: &str, i: usize) -> String {
    let signed = token.rsplit_once('.').map_or(token, |(signed, _)| signed);
    format!("{signed}.{}{i:08}", "A".repeat(300))
}

/// Times `calls` authenticated DeleteInstance calls (after a warm-up) while the flood runs.
async fn flooded(
    calls: usize,
    libvirt: &Connect,
    config: &ProviderClientConfig,
    addr: SocketAddr,
    token: &str,
    dir: &Path,
) -> Result<Flood, Error> {
    let mut idle = Vec::new();
    for peer in 2..2 + FLOOD_PEERS {
        for _ in 0..FLOOD_IDLE_PER_PEER {
            let socket =
                tokio::net::TcpSocket::new_v4().map_err(|e| Error::io("a flood socket", e))?;
            socket
                .bind(SocketAddr::from(([127, 0, 0, peer], 0)))
                .map_err(|e| Error::io("binding a flood socket", e))?;
            if let Ok(stream) = socket.connect(addr).await {
                idle.push(stream);
            }
        }
    }
    let idle_connections = idle.len();
    let stop = CancellationToken::new();
    let served = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let refused = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let mut flood = tokio::task::JoinSet::new();
    for c in 0..FLOOD_CONNECTIONS {
        let token_file = if c % 2 == 0 {
            None
        } else {
            let path = dir.join(format!("forged-{c}"));
            write(&path, forged(token, c).as_bytes())?;
            Some(path)
        };
        let client = connect(&ProviderClientConfig {
            token_file,
            ..config.clone()
        })
        .map_err(|e| Error::grpc_from("a flood client", e))?;
        for _ in 0..FLOOD_STREAMS {
            let (mut client, stop, served, refused) = (
                client.clone(),
                stop.clone(),
                served.clone(),
                refused.clone(),
            );
            flood.spawn(async move {
                while !stop.is_cancelled() {
                    let request = DeleteInstanceRequest {
                        cloud_provider: "libvirt".into(),
                        instance_id: uuid::Uuid::new_v4().to_string(),
                        requester: None,
                        accept_in_progress: true,
                    };
                    let counter = match client.delete_instance(request).await {
                        Ok(_) => &served,
                        Err(_) => &refused,
                    };
                    counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    }
    let mut client =
        connect(config).map_err(|e| Error::grpc_from("the authenticated client", e))?;
    let mut times = Vec::with_capacity(calls);
    let mut failed = None;
    for i in 0..WARMUP + calls {
        let uuid = define_domain(libvirt)?;
        let request = DeleteInstanceRequest {
            cloud_provider: "libvirt".into(),
            instance_id: uuid.clone(),
            requester: None,
            accept_in_progress: false,
        };
        let started = Instant::now();
        let answer = client.delete_instance(request).await;
        let took = started.elapsed();
        match answer {
            Ok(answer) if answer.get_ref().result == DeleteResult::Deleted as i32 => {}
            Ok(answer) => {
                failed = Some(Error::grpc(format!(
                    "DeleteInstance {uuid} under the flood: result {}",
                    answer.get_ref().result
                )));
                break;
            }
            Err(e) => {
                failed = Some(Error::grpc_from(
                    format!("DeleteInstance {uuid} under the flood"),
                    e,
                ));
                break;
            }
        }
        if i >= WARMUP {
            times.push(took);
        }
    }
    stop.cancel();
    while flood.join_next().await.is_some() {}
    drop(idle);
    if let Some(e) = failed {
        return Err(e);
    }
    let served = served.load(std::sync::atomic::Ordering::Relaxed);
    if served > 0 {
        return Err(Error::grpc(format!(
            "{served} unauthenticated flood calls were served"
        )));
    }
    Ok(Flood {
        times,
        idle_connections,
        refused: refused.load(std::sync::atomic::Ordering::Relaxed),
    })
}

/// A CA and a serving certificate it signs for [`SERVER_NAME`]: `ca.crt`, `tls.crt`, `tls.key` in `dir`.
fn issue_certificates(dir: &Path) -> Result<(), Error> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let fail = |e: rcgen::Error| Error::setup_from("issuing the bench certificate", e);
    let ca_key = KeyPair::generate().map_err(fail)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(fail)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca = ca_params.self_signed(&ca_key).map_err(fail)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(fail)?;
    let leaf = CertificateParams::new(vec![SERVER_NAME.to_owned()])
        .map_err(fail)?
        .signed_by(&key, &issuer)
        .map_err(fail)?;
    write(&dir.join("ca.crt"), ca.pem().as_bytes())?;
    write(&dir.join("tls.crt"), leaf.pem().as_bytes())?;
    write(&dir.join("tls.key"), key.serialize_pem().as_bytes())
}

fn write(path: &Path, contents: &[u8]) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(|e| Error::io(format!("writing {}", path.display()), e))
}

/// Round trips as the Go client sees them (microseconds).
struct GoFigures {
    check_p50_us: f64,
    check_p99_us: f64,
    delete_p50_us: f64,
    delete_p99_us: f64,
}

/// The Go release cloud-api-adaptor builds with; `go` fetches it through the module proxy (mk/provider.mk uses the
/// same).
const GO_TOOLCHAIN: &str = "go1.25.7";

/// Runs proto/clienttest's BenchmarkRoundTrip against the running service and reads its reported metrics.
async fn go_client(calls: usize, config: &ProviderClientConfig) -> Result<GoFigures, Error> {
    let path = |p: &Option<std::path::PathBuf>| {
        p.as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    };
    let output = tokio::process::Command::new("go")
        .args([
            "test",
            "-run",
            "^$",
            "-bench",
            "^BenchmarkRoundTrip$",
            "-benchtime",
            &format!("{calls}x"),
            "./clienttest",
        ])
        .current_dir(testenv::repo_root().join("proto"))
        .env("GOTOOLCHAIN", GO_TOOLCHAIN)
        .env("PROVIDER_SERVICE_ENDPOINT", &config.endpoint)
        .env("PROVIDER_SERVICE_CA_FILE", path(&config.ca_file))
        .env("PROVIDER_SERVICE_TOKEN_FILE", path(&config.token_file))
        .env(
            "PROVIDER_SERVICE_SERVER_NAME",
            config.tls_server_name.clone().unwrap_or_default(),
        )
        .output()
        .await
        .map_err(|e| Error::Missing {
            what: "go".into(),
            hint: format!("the Go client benchmark needs the Go toolchain: {e}"),
            source: Some(Box::new(e)),
        })?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    if !output.status.success() {
        return Err(Error::grpc(format!(
            "Go client benchmark failed:\n{text}{}",
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    let metric = |unit: &str| {
        go_bench_metric(&text, unit)
            .ok_or_else(|| Error::grpc(format!("no {unit} in the Go benchmark output:\n{text}")))
    };
    Ok(GoFigures {
        check_p50_us: metric("check-p50-us")?,
        check_p99_us: metric("check-p99-us")?,
        delete_p50_us: metric("delete-p50-us")?,
        delete_p99_us: metric("delete-p99-us")?,
    })
}

/// The value reported for `unit` on the benchmark's result line (`... 692.0 check-p50-us ...`).
fn go_bench_metric(output: &str, unit: &str) -> Option<f64> {
    let line = output
        .lines()
        .find(|l| l.starts_with("BenchmarkRoundTrip"))?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    fields
        .windows(2)
        .find(|w| w[1] == unit)
        .and_then(|w| w[0].parse().ok())
}

async fn measure(
    calls: usize,
    libvirt: &Connect,
    direct: &LibvirtProvider,
    mut client: ProviderClient,
) -> Result<(Vec<Duration>, Vec<Duration>), Error> {
    let mut direct_times = Vec::with_capacity(calls);
    let mut grpc_times = Vec::with_capacity(calls);
    for i in 0..WARMUP + calls {
        let uuid = define_domain(libvirt)?;
        let started = Instant::now();
        direct
            .validate_instance_id(&uuid)
            .map_err(|e| Error::provider_from("", e))?;
        let outcome = direct
            .delete_instance(&uuid)
            .await
            .map_err(|e| Error::provider_from("", e))?;
        let took = started.elapsed();
        if outcome != DeleteOutcome::Deleted {
            return Err(Error::provider(format!(
                "direct delete of {uuid}: {outcome:?}"
            )));
        }

        let uuid_grpc = define_domain(libvirt)?;
        let request = DeleteInstanceRequest {
            cloud_provider: "libvirt".into(),
            instance_id: uuid_grpc.clone(),
            requester: None,
            accept_in_progress: false,
        };
        let started = Instant::now();
        let answer = client
            .delete_instance(request)
            .await
            .map_err(|e| Error::grpc_from(format!("DeleteInstance {uuid_grpc}"), e))?;
        let took_grpc = started.elapsed();
        if answer.get_ref().result != DeleteResult::Deleted as i32 {
            return Err(Error::grpc(format!(
                "DeleteInstance {uuid_grpc}: result {}",
                answer.get_ref().result
            )));
        }
        if i >= WARMUP {
            direct_times.push(took);
            grpc_times.push(took_grpc);
        }
    }
    Ok((direct_times, grpc_times))
}

/// A running, persistent test-driver domain; returns its UUID.
fn define_domain(libvirt: &Connect) -> Result<String, Error> {
    let uuid = uuid::Uuid::new_v4().to_string();
    let xml = format!(
        "<domain type='test'><name>bench-{uuid}</name><uuid>{uuid}</uuid>\
         <memory unit='MiB'>128</memory><vcpu>1</vcpu><os><type arch='i686'>hvm</type></os></domain>"
    );
    let domain = libvirt
        .define_domain_xml(&xml)
        .map_err(|e| Error::libvirt_from(format!("define {uuid}"), e))?;
    domain
        .create()
        .map_err(|e| Error::libvirt_from(format!("start {uuid}"), e))?;
    Ok(uuid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_go_benchmark_metrics() {
        let output = "goos: linux\nBenchmarkRoundTrip-2   \t     300\t   1634446 ns/op\t       692.0 check-p50-us\t       969.0 check-p99-us\t       920.0 delete-p50-us\t      1200 delete-p99-us\nok\n";
        assert_eq!(go_bench_metric(output, "check-p50-us"), Some(692.0));
        assert_eq!(go_bench_metric(output, "delete-p99-us"), Some(1200.0));
        assert_eq!(go_bench_metric(output, "other"), None);
        assert_eq!(go_bench_metric("FAIL\n", "check-p50-us"), None);
    }
}
