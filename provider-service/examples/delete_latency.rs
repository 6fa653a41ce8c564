//! Measures DeleteInstance over gRPC on loopback against libvirt's `test:///default` driver:
//! defines and starts N domains with a volume each, deletes them through a real client and
//! prints p50/p99. `cargo run --release -p provider-service --example delete_latency -- 500`

use std::time::{Duration, Instant};

use peerpods_proto::v1 as pb;
use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use peerpods_runtime::admin::Readiness;
use provider_service::grpc::ProviderApi;
use provider_service::metrics::Metrics;
use provider_service::reload::ConfigReloader;
use provider_service::server::{GrpcServer, serve};
use tokio_util::sync::CancellationToken;
use virt::connect::Connect;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args().nth(1).map_or(Ok(300), |a| a.parse())?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("CLOUD_PROVIDER"), "libvirt")?;
    std::fs::write(dir.path().join("LIBVIRT_URI"), "test:///default")?;

    // Domains first, through our own connection (which keeps the test driver's state alive).
    let conn = Connect::open(Some("test:///default"))?;
    let pool = conn.lookup_storage_pool_by_name("default-pool")?;
    let mut ids = Vec::with_capacity(n);
    for i in 0..n {
        let uuid = uuid::Uuid::new_v4().to_string();
        let vol = virt::storage_vol::StorageVol::create_xml(
            &pool,
            &format!(
                "<volume><name>bench-{i}.img</name><capacity unit='MiB'>1</capacity></volume>"
            ),
            0,
        )?;
        let xml = format!(
            "<domain type='test'><name>bench-{i}</name><uuid>{uuid}</uuid><memory unit='MiB'>64</memory>\
             <vcpu>1</vcpu><os><type>hvm</type></os><devices><disk type='file' device='disk'>\
             <source file='{}'/><target dev='vda'/></disk></devices></domain>",
            vol.path()?
        );
        conn.define_domain_xml(&xml)?.create()?;
        ids.push(uuid);
    }

    let metrics = Metrics::default();
    let readiness = Readiness::default();
    let reloader = ConfigReloader::start(
        vec![dir.path().to_owned()],
        metrics.clone(),
        readiness.clone(),
    )
    .await?;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let shutdown = CancellationToken::new();
    let server = GrpcServer {
        listener,
        api: ProviderApi::new(reloader.registry(), metrics),
        reviewer: None,
        tls: None,
        readiness,
    };
    let task = tokio::spawn(serve(server, shutdown.clone()));
    let mut client = ProviderServiceClient::connect(format!("http://{addr}")).await?;

    let mut latencies = Vec::with_capacity(n);
    for id in &ids {
        let started = Instant::now();
        let answer = client
            .delete_instance(pb::DeleteInstanceRequest {
                cloud_provider: "libvirt".into(),
                instance_id: id.clone(),
                requester: None,
            })
            .await?
            .into_inner();
        latencies.push(started.elapsed());
        assert_eq!(answer.result(), pb::DeleteResult::Deleted);
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1)];
    let show = |d: Duration| format!("{:.3} ms", d.as_secs_f64() * 1000.0);
    println!(
        "DeleteInstance over loopback, libvirt test driver, {n} sequential deletes: p50 {} p99 {} max {}",
        show(pct(0.50)),
        show(pct(0.99)),
        show(pct(1.0))
    );
    shutdown.cancel();
    task.await??;
    Ok(())
}
