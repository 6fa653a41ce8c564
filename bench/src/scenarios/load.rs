//! provider-service and the webhook under load, in this process (no cluster needed):
//!
//! - **Idle connections.** 500 idle TCP connections are held open against each TLS port (provider-service's
//!   gRPC port and the webhook's HTTPS port), then new clients connect one after the other, each with a TCP
//!   connect, a TLS handshake and one call (ListProviders; an AdmissionReview). Their latency is reported beside
//!   the same clients' latency with no idle connection held (target: within 50 ms).
//! - **Capacity flood during a cleanup storm.** Instances in moto are deleted through DeleteInstance, 32 at a time
//!   (a caller with 32 calls in flight): alone, while one caller asks GetCapacity every 5 s, and while 1,000
//!   pollers (a node's CAA each) call GetCapacity once a second. Cleanup throughput each way (target: the flood
//!   within 10% of alone), and the capacity refreshes (DescribeAccountAttributes, counted by moto) each run
//!   caused. The lone caller's first call finds the cache empty, so its run shows what one capacity refresh
//!   costs the deletes: moto answers its DescribeInstances by serialising every instance it holds under
//!   Python's GIL (seconds of CPU for 3,000 instances, on the cores the deletes share), which a real cloud does
//!   elsewhere. provider-service keeps a slow answer fresh for ten times as long as it took (up to 60 s), so
//!   the flood that follows meets the answer that refresh made, and shows what the polls themselves cost.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use peerpods_proto::v1::{DeleteInstanceRequest, DeleteResult, GetCapacityRequest};
use peerpods_provider_client::{ProviderClientConfig, connect};
use peerpods_runtime::shutdown::CancellationToken;
use peerpods_webhook::listen::ListenAddr;
use peerpods_webhook::mutation::Target;
use provider_service::service::{CallerAuth, Listen, Options as ServiceOptions};
use serde::Serialize;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

use crate::Error;
use crate::moto::{self, run_instances};
use crate::options::Options;
use crate::stats::percentile;

/// Idle connections held against each port, from this many loopback addresses.
const IDLE: usize = 500;
const IDLE_PEERS: usize = 10;
/// New clients timed per port and way.
const SAMPLES: usize = 50;
/// Instances deleted per cleanup run, and how many deletes run at once.
const DELETES: usize = 1000;
const DELETE_CONCURRENCY: usize = 32;
/// Pollers of the flood, each calling GetCapacity once a second, over this many connections.
const POLLERS: usize = 1000;
const POLL_CONNECTIONS: usize = 50;
const POLL_PERIOD: Duration = Duration::from_secs(1);
/// The lone caller's period: provider-service's capacity answers are fresh for at least 5 s (longer when the
/// cloud was slow to give them), so it costs the cloud what the cached flood does.
const REFRESH_PERIOD: Duration = Duration::from_secs(5);
/// Pollers start their rhythm (and the first capacity refresh is made) before a cleanup is timed.
const WARM_UP: Duration = Duration::from_secs(2);

#[derive(Debug, Serialize)]
pub struct Load {
    pub idle_connections: usize,
    pub samples: usize,
    pub webhook: PortLatency,
    pub provider_service: PortLatency,
    pub deletes: usize,
    pub pollers: usize,
    /// DeleteInstance calls answered per second with no polls.
    pub cleanup_alone_per_second: f64,
    /// The same while one caller asks GetCapacity every 5 s: its first call, against a cache the alone run left
    /// empty, refreshes the capacity while the cleanup runs (what one refresh costs the deletes sharing moto).
    pub cleanup_under_refresh_per_second: f64,
    /// DescribeAccountAttributes calls moto received during that run (one per capacity refresh).
    pub refresh_cloud_calls: u64,
    /// The same while the pollers run.
    pub cleanup_under_polls_per_second: f64,
    /// cleanup_under_polls_per_second / cleanup_alone_per_second (target: at least 0.9).
    pub cleanup_ratio: f64,
    /// cleanup_under_polls_per_second / cleanup_under_refresh_per_second.
    pub cleanup_ratio_to_refresh: f64,
    /// GetCapacity answers the pollers got during the cleanup, per second.
    pub polls_per_second: f64,
    /// Polls refused as overloaded (RESOURCE_EXHAUSTED) or failed otherwise during the cleanup (the pollers'
    /// first second, against a cold cache and a slow cloud, is not counted).
    pub polls_refused: u64,
    pub polls_failed: u64,
    /// DescribeAccountAttributes calls moto received during the flooded cleanup (one per capacity refresh).
    pub capacity_cloud_calls: u64,
}

/// New-client latency of one port: connect, TLS handshake, one call.
#[derive(Debug, Serialize)]
pub struct PortLatency {
    pub quiet_p50_ms: f64,
    pub quiet_p99_ms: f64,
    pub idle_held_p50_ms: f64,
    pub idle_held_p99_ms: f64,
    pub idle_held_max_ms: f64,
}

pub async fn run(options: &Options) -> Result<Load, Error> {
    let files =
        tempfile::tempdir().map_err(|e| Error::io("creating a directory for TLS files", e))?;
    let ca_der = issue_certificate(files.path())?;

    let (webhook, provider_service) = idle_latency(files.path(), &ca_der).await?;
    let flood = capacity_flood(options).await?;
    Ok(Load {
        idle_connections: IDLE,
        samples: SAMPLES,
        webhook,
        provider_service,
        ..flood
    })
}

/// A self-signed certificate for 127.0.0.1 and localhost, written for both servers (and as the clients' CA file);
/// returns its DER.
fn issue_certificate(dir: &Path) -> Result<Vec<u8>, Error> {
    let setup = |e: rcgen::Error| Error::setup_from("issuing a certificate", e);
    let key = rcgen::KeyPair::generate().map_err(setup)?;
    let cert = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
        .map_err(setup)?
        .self_signed(&key)
        .map_err(setup)?;
    for (name, contents) in [
        ("tls.crt", cert.pem()),
        ("tls.key", key.serialize_pem()),
        ("ca.pem", cert.pem()),
    ] {
        std::fs::write(dir.join(name), contents)
            .map_err(|e| Error::io(format!("writing {name}"), e))?;
    }
    Ok(cert.der().to_vec())
}

async fn idle_latency(files: &Path, ca_der: &[u8]) -> Result<(PortLatency, PortLatency), Error> {
    let stop = CancellationToken::new();
    let _stop_on_return = stop.clone().drop_guard();

    let webhook = peerpods_webhook::server::start(
        peerpods_webhook::server::Options {
            webhook: ListenAddr::Socket(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
            health: ListenAddr::Off,
            secure_metrics: None,
            cert_dir: files.to_owned(),
            cert_poll_interval: Duration::from_secs(5),
            tls_min_version: peerpods_webhook::tls::TlsVersion::Tls12,
            tls_cipher_suites: Vec::new(),
            target: Target::new("", ""),
            admission: peerpods_webhook::server::AdmissionLimits::default(),
        },
        stop.clone(),
    )
    .await
    .map_err(|e| Error::setup_from("starting the webhook", e))?;

    let config_dir = files.join("config");
    std::fs::create_dir_all(&config_dir)
        .map_err(|e| Error::io("creating the config directory", e))?;
    for (key, value) in [
        ("CLOUD_PROVIDER", "libvirt"),
        ("LIBVIRT_URI", "test:///default"),
    ] {
        std::fs::write(config_dir.join(key), value)
            .map_err(|e| Error::io(format!("writing config key {key}"), e))?;
    }
    let provider = provider_service::service::start(
        ServiceOptions {
            grpc: Listen::Addr(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
            admin: None,
            secure_metrics: None,
            config_dirs: vec![config_dir],
            development: true,
            reload_interval: Duration::from_secs(5),
            tls: Some((files.join("tls.crt"), files.join("tls.key"))),
            auth: CallerAuth::None,
        },
        stop.clone(),
    )
    .await
    .map_err(|e| Error::provider_from("", e))?;

    let webhook_call = {
        let addr = webhook.webhook_addr;
        let der = ca_der.to_vec();
        move || admission_round_trip(addr, der.clone())
    };
    let provider_call = {
        let endpoint = format!("https://{}", provider.grpc_addr);
        let ca_file = files.join("ca.pem");
        move || list_providers_round_trip(endpoint.clone(), ca_file.clone())
    };

    let webhook_quiet = time_samples(&webhook_call).await?;
    let provider_quiet = time_samples(&provider_call).await?;
    let idle_webhook = hold_idle(webhook.webhook_addr).await?;
    let idle_provider = hold_idle(provider.grpc_addr).await?;
    let webhook_held = time_samples(&webhook_call).await?;
    let provider_held = time_samples(&provider_call).await?;
    drop((idle_webhook, idle_provider));
    stop.cancel();
    Ok((
        latency(&webhook_quiet, &webhook_held),
        latency(&provider_quiet, &provider_held),
    ))
}

fn latency(quiet: &[Duration], held: &[Duration]) -> PortLatency {
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    PortLatency {
        quiet_p50_ms: ms(percentile(quiet, 50.0)),
        quiet_p99_ms: ms(percentile(quiet, 99.0)),
        idle_held_p50_ms: ms(percentile(held, 50.0)),
        idle_held_p99_ms: ms(percentile(held, 99.0)),
        idle_held_max_ms: ms(held.last().copied().unwrap_or_default()),
    }
}

/// `SAMPLES` new-client round trips one after the other, sorted.
async fn time_samples<F, Fut>(call: &F) -> Result<Vec<Duration>, Error>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<(), Error>>,
{
    let mut took = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let started = Instant::now();
        tokio::time::timeout(Duration::from_secs(30), call())
            .await
            .map_err(|_| Error::Timeout {
                what: "a new client's call".into(),
                seconds: 30,
            })??;
        took.push(started.elapsed());
    }
    took.sort();
    Ok(took)
}

async fn hold_idle(addr: SocketAddr) -> Result<Vec<tokio::net::TcpStream>, Error> {
    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let socket = tokio::net::TcpSocket::new_v4().map_err(|e| Error::io("a socket", e))?;
        let peer = u8::try_from(2 + i % IDLE_PEERS).unwrap_or(2);
        socket
            .bind(SocketAddr::from((Ipv4Addr::new(127, 0, 0, peer), 0)))
            .map_err(|e| Error::io("binding an idle connection", e))?;
        idle.push(
            socket
                .connect(addr)
                .await
                .map_err(|e| Error::io("opening an idle connection", e))?,
        );
    }
    Ok(idle)
}

async fn admission_round_trip(addr: SocketAddr, ca_der: Vec<u8>) -> Result<(), Error> {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from(ca_der))
        .map_err(|e| Error::setup_from("CA", e))?;
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| Error::setup_from("", e))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| Error::io("connecting to the webhook", e))?;
    tcp.set_nodelay(true)
        .map_err(|e| Error::io("TCP_NODELAY", e))?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| Error::setup_from("", e))?;
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .map_err(|e| Error::io("TLS handshake with the webhook", e))?;
    let body = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "bench",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "operation": "CREATE",
            "userInfo": {},
            "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"},
                       "spec": {"containers": [{"name": "c", "image": "i"}]}}
        }
    })
    .to_string();
    let request = format!(
        "POST {} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        peerpods_webhook::server::WEBHOOK_PATH,
        body.len()
    );
    tls.write_all(request.as_bytes())
        .await
        .map_err(|e| Error::io("sending an AdmissionReview", e))?;
    let mut answer = Vec::new();
    // The server closes after answering; rustls reports a close without close_notify after the bytes.
    let _ = tls.read_to_end(&mut answer).await;
    if answer.starts_with(b"HTTP/1.1 200") {
        Ok(())
    } else {
        Err(Error::setup(format!(
            "the webhook answered {:?}",
            String::from_utf8_lossy(&answer[..answer.len().min(80)])
        )))
    }
}

async fn list_providers_round_trip(
    endpoint: String,
    ca_file: std::path::PathBuf,
) -> Result<(), Error> {
    let mut client = connect(&ProviderClientConfig {
        endpoint,
        ca_file: Some(ca_file),
        tls_server_name: Some("localhost".into()),
        ..Default::default()
    })
    .map_err(|e| Error::grpc_from("", e))?;
    client
        .list_providers(peerpods_proto::v1::ListProvidersRequest {})
        .await
        .map(|_| ())
        .map_err(|e| Error::grpc_from("", e))
}

async fn capacity_flood(options: &Options) -> Result<Load, Error> {
    let moto = moto::start(&options.moto_python, &options.log_dir).await?;
    let config_dir =
        tempfile::tempdir().map_err(|e| Error::io("creating a config directory", e))?;
    for (key, value) in moto::provider_config(&moto) {
        std::fs::write(config_dir.path().join(&key), value)
            .map_err(|e| Error::io(format!("writing config key {key}"), e))?;
    }
    let stop = CancellationToken::new();
    let _stop_on_return = stop.clone().drop_guard();
    let provider = provider_service::service::start(
        ServiceOptions {
            grpc: Listen::Addr(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))),
            admin: None,
            secure_metrics: None,
            config_dirs: vec![config_dir.path().to_owned()],
            development: false,
            reload_interval: Duration::from_secs(5),
            tls: None,
            auth: CallerAuth::None,
        },
        stop.clone(),
    )
    .await
    .map_err(|e| Error::provider_from("", e))?;
    let endpoint = format!("http://{}", provider.grpc_addr);
    let ec2 = moto.client();

    // Every run's instances exist before the first cleanup: moto answers DescribeInstances by walking every
    // instance it holds, terminated ones included, so a later run would otherwise face more instances.
    let alone_ids = run_instances(&ec2, DELETES).await?;
    let refresh_ids = run_instances(&ec2, DELETES).await?;
    let flooded_ids = run_instances(&ec2, DELETES).await?;
    let alone = cleanup(&endpoint, &alone_ids).await?;

    let before_refresh = moto::provider_requests(&moto);
    let refreshing = Polling::start(&endpoint, 1, 1, REFRESH_PERIOD)?;
    tokio::time::sleep(WARM_UP).await;
    let under_refresh = cleanup(&endpoint, &refresh_ids).await?;
    refreshing.stop().await;
    let after_refresh = moto::provider_requests(&moto);

    let before = moto::provider_requests(&moto);
    let polling = Polling::start(&endpoint, POLLERS, POLL_CONNECTIONS, POLL_PERIOD)?;
    tokio::time::sleep(WARM_UP).await;
    let counted_before = polling.counts();
    let flood_started = Instant::now();
    let flooded = cleanup(&endpoint, &flooded_ids).await?;
    let flood_seconds = flood_started.elapsed().as_secs_f64();
    let counted = polling.counts();
    polling.stop().await;
    let after = moto::provider_requests(&moto);
    let describe = |counts: &std::collections::BTreeMap<String, u64>| {
        counts
            .get("DescribeAccountAttributes")
            .copied()
            .unwrap_or(0)
    };
    stop.cancel();

    let per_second = |n: usize, d: Duration| n as f64 / d.as_secs_f64().max(f64::EPSILON);
    let cleanup_alone_per_second = per_second(DELETES, alone);
    let cleanup_under_refresh_per_second = per_second(DELETES, under_refresh);
    let cleanup_under_polls_per_second = per_second(DELETES, flooded);
    let ratio = |a: f64, b: f64| a / b.max(f64::EPSILON);
    Ok(Load {
        idle_connections: IDLE,
        samples: SAMPLES,
        webhook: latency(&[], &[]),
        provider_service: latency(&[], &[]),
        deletes: DELETES,
        pollers: POLLERS,
        cleanup_alone_per_second,
        cleanup_under_refresh_per_second,
        refresh_cloud_calls: describe(&after_refresh).saturating_sub(describe(&before_refresh)),
        cleanup_under_polls_per_second,
        cleanup_ratio: ratio(cleanup_under_polls_per_second, cleanup_alone_per_second),
        cleanup_ratio_to_refresh: ratio(
            cleanup_under_polls_per_second,
            cleanup_under_refresh_per_second,
        ),
        polls_per_second: (counted.answered - counted_before.answered) as f64
            / flood_seconds.max(f64::EPSILON),
        polls_refused: counted.refused - counted_before.refused,
        polls_failed: counted.failed - counted_before.failed,
        capacity_cloud_calls: describe(&after).saturating_sub(describe(&before)),
    })
}

/// GetCapacity answers counted by the pollers so far.
#[derive(Debug, Clone, Copy, Default)]
struct PollCounts {
    answered: u64,
    refused: u64,
    failed: u64,
}

/// Callers of GetCapacity, each once per period, spread over the period (as nodes started at different times),
/// until stopped.
struct Polling {
    stop: CancellationToken,
    answered: Arc<AtomicU64>,
    refused: Arc<AtomicU64>,
    failed: Arc<AtomicU64>,
    pollers: Vec<tokio::task::JoinHandle<()>>,
}

impl Polling {
    fn start(
        endpoint: &str,
        pollers: usize,
        connections: usize,
        period: Duration,
    ) -> Result<Polling, Error> {
        let mut polling = Polling {
            stop: CancellationToken::new(),
            answered: Arc::new(AtomicU64::new(0)),
            refused: Arc::new(AtomicU64::new(0)),
            failed: Arc::new(AtomicU64::new(0)),
            pollers: Vec::with_capacity(pollers),
        };
        let per_connection = pollers.div_ceil(connections.max(1));
        for connection in 0..connections {
            let client = connect(&ProviderClientConfig {
                endpoint: endpoint.to_owned(),
                ..Default::default()
            })
            .map_err(|e| Error::grpc_from("", e))?;
            for poller in 0..per_connection {
                let index = connection * per_connection + poller;
                if index >= pollers {
                    break;
                }
                let mut client = client.clone();
                let (stop, answered, refused, failed) = (
                    polling.stop.clone(),
                    polling.answered.clone(),
                    polling.refused.clone(),
                    polling.failed.clone(),
                );
                let offset = period.mul_f64(index as f64 / pollers as f64);
                polling.pollers.push(tokio::spawn(async move {
                    tokio::time::sleep(offset).await;
                    let mut tick = tokio::time::interval(period);
                    loop {
                        tokio::select! {
                            () = stop.cancelled() => return,
                            _ = tick.tick() => {}
                        }
                        let asked = client
                            .get_capacity(GetCapacityRequest {
                                cloud_provider: "aws".into(),
                            })
                            .await;
                        match asked {
                            Ok(_) => answered.fetch_add(1, Ordering::Relaxed),
                            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                                refused.fetch_add(1, Ordering::Relaxed)
                            }
                            Err(_) => failed.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }));
            }
        }
        Ok(polling)
    }

    fn counts(&self) -> PollCounts {
        PollCounts {
            answered: self.answered.load(Ordering::Relaxed),
            refused: self.refused.load(Ordering::Relaxed),
            failed: self.failed.load(Ordering::Relaxed),
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        for poller in self.pollers {
            let _ = poller.await;
        }
    }
}

/// Deletes `ids` through DeleteInstance, `DELETE_CONCURRENCY` at a time; how long it took.
async fn cleanup(endpoint: &str, ids: &[String]) -> Result<Duration, Error> {
    let client = connect(&ProviderClientConfig {
        endpoint: endpoint.to_owned(),
        ..Default::default()
    })
    .map_err(|e| Error::grpc_from("", e))?;
    let started = Instant::now();
    let answers: Vec<Result<(), Error>> = futures::stream::iter(ids.iter().cloned())
        .map(|id| {
            let mut client = client.clone();
            async move {
                let answer = client
                    .delete_instance(DeleteInstanceRequest {
                        cloud_provider: "aws".into(),
                        instance_id: id.clone(),
                        requester: None,
                        accept_in_progress: false,
                    })
                    .await
                    .map_err(|e| Error::grpc_from(format!("DeleteInstance {id}"), e))?
                    .into_inner();
                if answer.result() == DeleteResult::Deleted {
                    Ok(())
                } else {
                    Err(Error::grpc(format!(
                        "DeleteInstance {id}: {:?}",
                        answer.result()
                    )))
                }
            }
        })
        .buffer_unordered(DELETE_CONCURRENCY)
        .collect()
        .await;
    let took = started.elapsed();
    answers.into_iter().collect::<Result<Vec<()>, Error>>()?;
    Ok(took)
}

/// The rows of the table printed at the end.
pub fn rows(load: &Load) -> Vec<(String, String)> {
    let ms = |p50: f64, p99: f64| format!("{p50:.1} / {p99:.1} ms");
    let mut rows = Vec::new();
    for (port, l) in [
        ("webhook", &load.webhook),
        ("provider-service", &load.provider_service),
    ] {
        rows.push((
            format!("{port} new client p50 / p99, quiet"),
            ms(l.quiet_p50_ms, l.quiet_p99_ms),
        ));
        rows.push((
            format!(
                "{port} new client p50 / p99, {} idle held",
                load.idle_connections
            ),
            ms(l.idle_held_p50_ms, l.idle_held_p99_ms),
        ));
    }
    rows.push((
        format!("cleanup of {} alone", load.deletes),
        format!("{:.1} deletes/s", load.cleanup_alone_per_second),
    ));
    rows.push((
        format!("cleanup of {} under one GetCapacity per 5 s", load.deletes),
        format!(
            "{:.1} deletes/s ({} capacity refreshes)",
            load.cleanup_under_refresh_per_second, load.refresh_cloud_calls
        ),
    ));
    rows.push((
        format!("cleanup of {} under {} pollers", load.deletes, load.pollers),
        format!(
            "{:.1} deletes/s ({:.0}% of alone, {:.0}% of one caller's)",
            load.cleanup_under_polls_per_second,
            load.cleanup_ratio * 100.0,
            load.cleanup_ratio_to_refresh * 100.0
        ),
    ));
    rows.push((
        "GetCapacity answered / refused / failed".into(),
        format!(
            "{:.0}/s / {} / {}",
            load.polls_per_second, load.polls_refused, load.polls_failed
        ),
    ));
    rows.push((
        "capacity refreshes (DescribeAccountAttributes) during the flood".into(),
        load.capacity_cloud_calls.to_string(),
    ));
    rows
}
