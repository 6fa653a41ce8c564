//! What every controller binary's `main` does, written once ([`Controller::main`]): print its CRD for the
//! `crd` subcommand, or run telemetry, the admin server (health and metrics) and the controller until SIGTERM,
//! with a Kubernetes client, the replica's identity and its Lease, and turn the outcome into the exit code.
//! `main.rs` only parses flags and builds the controller's settings.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;

use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use crate::admin::{AdminServer, Readiness};
use crate::args::{AdminArgs, ControllerArgs, HealthArgs};
use crate::health::Health;
use crate::leader::LeaderConfig;

/// The subcommands every controller has, next to its default of running.
#[derive(clap::Subcommand, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Print this controller's CustomResourceDefinition as YAML and exit.
    Crd,
}

/// A controller binary as [`Controller::main`] runs it: its name, its CRD and its metrics.
pub struct Controller<M, E> {
    pub component: &'static str,
    pub crd_yaml: fn() -> Result<String, E>,
    pub register_metrics: fn(&mut Registry) -> M,
}

/// What [`Controller::main`] hands a controller besides its metrics.
pub struct Wiring {
    /// The process's shutdown and the health the controller's watches report.
    pub started: Started,
    /// A client from the environment (in-cluster or kubeconfig).
    pub client: kube::Client,
    /// This replica's name (Lease holder, Event reporter).
    pub identity: String,
    /// The Lease to compete for; `None` without `--leader-elect`.
    pub leader: Option<LeaderConfig>,
}

/// A controller's errors as its `main` reports them.
pub type BoxError = Box<dyn std::error::Error>;

/// A controller's parsed command line, as [`Controller::main`] reads it.
pub trait ControllerCli {
    /// The subcommand (if any), the flags every controller shares, and the controller's own namespace (the
    /// Lease's unless `--lease-namespace` says otherwise).
    fn parts(&self) -> (Option<Command>, &ControllerArgs, &str);
}

impl<M, E: std::fmt::Display> Controller<M, E> {
    /// The binary's `main` once its flags are parsed: for the `crd` subcommand prints the CRD; otherwise
    /// registers the metrics and runs `controller` with the command line under [`run_controller`], with the
    /// [`Wiring`] the shared flags ask for.
    pub async fn main<C, F, Fut>(self, cli: C, controller: F) -> ExitCode
    where
        C: ControllerCli,
        F: FnOnce(C, M, Wiring) -> Fut,
        Fut: Future<Output = Result<(), BoxError>>,
    {
        let (command, shared, namespace) = cli.parts();
        if command == Some(Command::Crd) {
            return print_crd((self.crd_yaml)());
        }
        let (args, namespace) = (shared.clone(), namespace.to_owned());
        let mut registry = Registry::default();
        let metrics = (self.register_metrics)(&mut registry);
        let component = self.component;
        run_controller(
            component,
            &args.admin,
            &args.health,
            registry,
            |started| async move {
                let client = kube::Client::try_default().await?;
                let wiring = Wiring {
                    started,
                    client,
                    identity: args.leader.identity(component),
                    leader: args.leader.config(component, &namespace),
                };
                controller(cli, metrics, wiring).await
            },
        )
        .await
    }
}

/// The `crd` subcommand: prints the CustomResourceDefinition YAML, or the error.
pub fn print_crd<E: std::fmt::Display>(yaml: Result<String, E>) -> ExitCode {
    match yaml {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// What a controller runs with: the process's shutdown token (cancelled on SIGTERM/SIGINT) and the health its
/// watches report to the admin server.
pub struct Started {
    pub shutdown: CancellationToken,
    pub health: Health,
}

/// Runs `controller` as the binary `component`: telemetry from `admin`, the admin server on its address serving
/// `registry`'s metrics and the health (liveness bound from `health`), then the controller. When the controller
/// returns, the admin server stops, telemetry is flushed and a failure is logged with the component's name.
pub async fn run_controller<F, Fut>(
    component: &'static str,
    admin: &AdminArgs,
    health: &HealthArgs,
    registry: Registry,
    controller: F,
) -> ExitCode
where
    F: FnOnce(Started) -> Fut,
    Fut: Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let telemetry = match admin.init_telemetry(component) {
        Ok(t) => t,
        Err(error) => {
            eprintln!("{component}: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = serve(component, admin, health, registry, controller).await;
    telemetry.shutdown().await;
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, component, "stopped with an error");
            ExitCode::FAILURE
        }
    }
}

async fn serve<F, Fut>(
    component: &'static str,
    admin: &AdminArgs,
    health: &HealthArgs,
    mut registry: Registry,
    controller: F,
) -> Result<(), Box<dyn std::error::Error>>
where
    F: FnOnce(Started) -> Fut,
    Fut: Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let health = Health {
        readiness: Readiness::default(),
        liveness: health.liveness(),
    };
    registry.register_collector(Box::new(crate::metrics::Leader::new(
        component,
        health.readiness.clone(),
    )));
    let server = AdminServer::bind(
        admin.admin_listen,
        health.readiness.clone(),
        Arc::new(registry),
    )
    .await?
    .with_liveness(health.liveness.clone())
    .with_secure_metrics(admin.secure_metrics().await?);
    serve_until(server, health, controller, crate::shutdown::signal()).await
}

/// Readiness component that turns false when the process is asked to stop.
pub const SHUTDOWN: &str = "shutdown";

/// Serves `server` and runs `controller` until `stop` completes (SIGTERM or SIGINT in a binary), then stops in
/// this order: not ready first (readiness component [`SHUTDOWN`]), then the controller's token is cancelled so it
/// drains the work in flight, and the admin server keeps answering (`/readyz` false, `/healthz` as before) until
/// the controller has returned. A probe or a load balancer sees the replica leave before it stops working.
pub async fn serve_until<F, Fut>(
    server: AdminServer,
    health: Health,
    controller: F,
    stop: impl Future<Output = ()> + Send + 'static,
) -> Result<(), Box<dyn std::error::Error>>
where
    F: FnOnce(Started) -> Fut,
    Fut: Future<Output = Result<(), Box<dyn std::error::Error>>>,
{
    let shutdown = CancellationToken::new();
    let admin_stop = CancellationToken::new();
    let server = tokio::spawn(server.serve(admin_stop.clone().cancelled_owned()));
    let stopping = {
        let readiness = health.readiness.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            stop.await;
            readiness.set(SHUTDOWN, false, "stopping: finishing the work in flight");
            shutdown.cancel();
        })
    };
    let result = controller(Started {
        shutdown: shutdown.clone(),
        health,
    })
    .await;
    stopping.abort();
    shutdown.cancel();
    admin_stop.cancel();
    server.await??;
    result
}
