//! The one way to start the plugin: both sockets, then both gRPC servers until shutdown.
//!
//! Both sockets are bound before either server runs, the DRA one first: the kubelet dials the DRA socket as soon
//! as the registration succeeded, and a bound socket queues that connection until it is served. On shutdown the
//! registration socket goes first (the kubelet's watcher sees it go and deregisters the driver), then the DRA
//! server finishes the calls in flight and its socket goes too. If either server fails, both stop.

use std::path::PathBuf;

use peerpods_runtime::shutdown::CancellationToken;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use crate::Error;
use crate::api::dra::dra_plugin_server::DraPluginServer;
use crate::api::pluginregistration::registration_server::RegistrationServer;
use crate::authority;
use crate::driver::DriverName;
use crate::node::DraService;
use crate::registration::{RegistrationService, plugin_info};
use crate::sockets::{self, Paths};

/// What the plugin needs to run.
#[derive(Debug, Clone)]
pub struct Options {
    pub driver: DriverName,
    /// The kubelet's root directory (its `--root-dir`), as the kubelet sees it.
    pub kubelet_dir: PathBuf,
    /// The node's name, for logs only.
    pub node: String,
}

/// Serves until `shutdown` is cancelled (then returns `Ok`) or a server fails. The sockets are removed either way.
pub async fn run(options: Options, shutdown: CancellationToken) -> Result<(), Error> {
    let paths = Paths::new(&options.kubelet_dir, &options.driver);
    let dra_socket = sockets::bind(&paths.dra)?;
    let registration_socket = sockets::bind(&paths.registration)?;
    tracing::info!(
        node = %options.node,
        driver = %options.driver,
        registration = %paths.registration.display(),
        dra = %paths.dra.display(),
        "serving"
    );

    // A failing server stops the other one through `stop`; the DRA server outlives the registration one.
    let stop = shutdown.child_token();
    let dra_stop = CancellationToken::new();

    let registration = RegistrationService::new(
        plugin_info(&options.driver, &paths.dra),
        options.node.clone(),
    );
    let registration = async {
        let (listener, file) = registration_socket;
        let result = Server::builder()
            .add_service(RegistrationServer::new(registration))
            .serve_with_incoming_shutdown(incoming(listener), stop.cancelled())
            .await;
        drop(file);
        dra_stop.cancel();
        result.map_err(|source| Error::Serve {
            server: "registration",
            source,
        })
    };
    let dra = DraService::new(options.driver.to_string(), options.node.clone());
    let dra = async {
        let (listener, file) = dra_socket;
        let result = Server::builder()
            .add_service(DraPluginServer::new(dra))
            .serve_with_incoming_shutdown(incoming(listener), dra_stop.cancelled())
            .await;
        drop(file);
        stop.cancel();
        result.map_err(|source| Error::Serve {
            server: "DRA",
            source,
        })
    };
    let (registration, dra) = tokio::join!(registration, dra);
    registration.and(dra)
}

/// The accepted connections of `listener`, each behind the `:authority` rewrite (see [`authority`]): the
/// kubelet's registration calls need it, and its DRA calls pass through unchanged.
fn incoming(
    listener: tokio::net::UnixListener,
) -> impl tokio_stream::Stream<Item = std::io::Result<authority::Rewritten>> {
    UnixListenerStream::new(listener).map(|accepted| accepted.map(authority::rewritten))
}
