//! What the `main` of every service that is no controller (provider-service, the webhook, the DRA kubelet plugin)
//! does around its run, written once: report a telemetry set-up that failed, run the service until it stops, log
//! why it stopped with its reason, flush the telemetry, and turn the outcome into the exit code. Controllers have
//! [`crate::binary`] for the same and more (admin server, client, Lease).

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;

use crate::telemetry::Telemetry;

/// A service's error as its `main` logs it on stopping: the message, and the short stable reason that log queries
/// and alerts key on (each crate's `Error::reason`).
pub trait StopReason: Display {
    fn reason(&self) -> &'static str;
}

/// Runs `service` once `telemetry` is set up, as `component`'s `main` does. `service` is a future: nothing of it
/// runs, and nothing is logged, before the telemetry it logs through is in place.
pub async fn run<T, E, F>(component: &str, telemetry: Result<Telemetry, T>, service: F) -> ExitCode
where
    T: Display,
    E: StopReason,
    F: Future<Output = Result<(), E>>,
{
    let telemetry = match telemetry {
        Ok(telemetry) => telemetry,
        Err(error) => {
            // No subscriber to log through: the container's log gets the line.
            eprintln!("{component}: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = service.await;
    if let Err(error) = &result {
        tracing::error!(%error, reason = error.reason(), "{component} stopped");
    }
    telemetry.shutdown().await;
    if result.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
