//! gRPC overhead: DeleteInstance of a real (libvirt `test:///default`) domain, timed call by call, once through
//! provider-service's gRPC server over loopback and once calling the same libvirt backend directly.
//!
//! Both run in this process so they share the test driver's domains. Each call deletes a domain defined just before
//! it (untimed); direct and gRPC calls alternate, so drift on the machine loads both sides alike.
//! Hand-timed rather than with criterion: criterion reports means and medians of batched iterations, while this
//! figure is the p50/p99 of single calls, each of which needs a fresh domain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use peerpods_proto::v1::provider_service_client::ProviderServiceClient;
use peerpods_proto::v1::{DeleteInstanceRequest, DeleteResult};
use peerpods_runtime::admin::Readiness;
use peerpods_runtime::shutdown::CancellationToken;
use provider_service::config::ProviderConfig;
use provider_service::grpc::ProviderApi;
use provider_service::libvirt::LibvirtProvider;
use provider_service::provider::{DeleteOutcome, Provider, Registry, SharedRegistry};
use provider_service::server::{GrpcServer, serve};
use virt::connect::Connect;

use crate::Error;
use crate::options::Options;
use crate::report::Grpc;
use crate::stats::percentile;

const URI: &str = "test:///default";
/// Calls each way before timing starts (connections, caches, the blocking pool).
const WARMUP: usize = 50;

pub async fn run(options: &Options) -> Result<Grpc, Error> {
    let libvirt =
        Connect::open(Some(URI)).map_err(|e| Error::Libvirt(format!("open {URI}: {e}")))?;
    let config = ProviderConfig::from_pairs([("CLOUD_PROVIDER", "libvirt"), ("LIBVIRT_URI", URI)]);
    let mut prometheus = prometheus_client::registry::Registry::default();
    let metrics = provider_service::metrics::Metrics::register(&mut prometheus);
    let backend = |config: &ProviderConfig| {
        LibvirtProvider::from_config(config, metrics.cloud.clone())
            .map_err(|e| Error::Provider(e.to_string()))
    };
    let direct = backend(&config)?;
    let served: Arc<dyn Provider> = Arc::new(backend(&config)?);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| Error::io("binding provider-service's gRPC port", e))?;
    let addr = listener
        .local_addr()
        .map_err(|e| Error::io("reading provider-service's address", e))?;
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(serve(
        GrpcServer {
            listener,
            api: ProviderApi::new(
                SharedRegistry::new(Registry::new([served])),
                metrics.clone(),
            ),
            reviewer: None,
            tls: None,
            readiness: Readiness::default(),
        },
        shutdown.clone(),
    ));
    let measured = measure(options.grpc_calls, &libvirt, &direct, addr).await;
    shutdown.cancel();
    let _ = server.await;
    let (mut direct_times, mut grpc_times) = measured?;
    direct_times.sort();
    grpc_times.sort();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let (direct_p50, grpc_p50) = (
        percentile(&direct_times, 50.0),
        percentile(&grpc_times, 50.0),
    );
    Ok(Grpc {
        calls: options.grpc_calls,
        direct_p50_us: us(direct_p50),
        direct_p99_us: us(percentile(&direct_times, 99.0)),
        grpc_p50_us: us(grpc_p50),
        grpc_p99_us: us(percentile(&grpc_times, 99.0)),
        overhead_p50_us: us(grpc_p50) - us(direct_p50),
    })
}

async fn measure(
    calls: usize,
    libvirt: &Connect,
    direct: &LibvirtProvider,
    addr: std::net::SocketAddr,
) -> Result<(Vec<Duration>, Vec<Duration>), Error> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| Error::Grpc(e.to_string()))?
        .connect()
        .await
        .map_err(|e| Error::Grpc(format!("connecting to {addr}: {e}")))?;
    let mut client = ProviderServiceClient::new(channel);
    let mut direct_times = Vec::with_capacity(calls);
    let mut grpc_times = Vec::with_capacity(calls);
    for i in 0..WARMUP + calls {
        let uuid = define_domain(libvirt)?;
        let started = Instant::now();
        direct
            .validate_instance_id(&uuid)
            .map_err(|e| Error::Provider(e.to_string()))?;
        let outcome = direct
            .delete_instance(&uuid)
            .await
            .map_err(|e| Error::Provider(e.to_string()))?;
        let took = started.elapsed();
        if outcome != DeleteOutcome::Deleted {
            return Err(Error::Provider(format!(
                "direct delete of {uuid}: {outcome:?}"
            )));
        }

        let uuid_grpc = define_domain(libvirt)?;
        let request = DeleteInstanceRequest {
            cloud_provider: "libvirt".into(),
            instance_id: uuid_grpc.clone(),
            requester: None,
        };
        let started = Instant::now();
        let answer = client
            .delete_instance(request)
            .await
            .map_err(|e| Error::Grpc(format!("DeleteInstance {uuid_grpc}: {e}")))?;
        let took_grpc = started.elapsed();
        if answer.get_ref().result != DeleteResult::Deleted as i32 {
            return Err(Error::Grpc(format!(
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
        .map_err(|e| Error::Libvirt(format!("define {uuid}: {e}")))?;
    domain
        .create()
        .map_err(|e| Error::Libvirt(format!("start {uuid}: {e}")))?;
    Ok(uuid)
}
