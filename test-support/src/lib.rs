//! What the crates' tests share, so each harness exists once.
//!
//! - [`byom`]: a bring-your-own-machine pool on the local control plane, as cloud-api-adaptor writes it.
//! - [`cloud`]: what every local cloud emulator (`emulators/<cloud>`) offers the tests.
//! - [`fault_checks`]: what every cloud backend's tests check against its emulator's fault layer.
//! - [`faults`]: the fault layer of the cloud emulators (latency, hangs, 5xx, throttling, eventual
//!   consistency, long-running operations).
//! - [`idle_connections`]: idle TCP connections held open against a listener, and which of them it closed.
//! - [`metrics`]: samples of a metrics scrape (Prometheus text or OpenMetrics), by name and labels.
//! - [`moto`]: one moto server (the EC2 emulator from PyPI) per test binary, and helpers that arrange
//!   and inspect its state with the real AWS SDK.
//! - [`provider_checks`]: what every cloud backend's tests check of its `Provider` against its
//!   emulator (malformed ids, throttling, deletions under way, ownership).
//! - [`silent_host`]: a TCP host that accepts connections and never answers (a hung libvirt host).
//! - [`visibility_checks`]: what every emulator's tests check of its eventual consistency, kind of
//!   call by kind of call, and of flapping answers.

pub mod byom;
pub mod cloud;
pub mod fault_checks;
pub mod faults;
pub mod idle_connections;
pub mod metrics;
pub mod moto;
pub mod provider_checks;
pub mod silent_host;
pub mod visibility_checks;

/// What the shared helpers report instead of panicking (where a caller outside tests uses them).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A metrics scrape that is neither Prometheus text nor OpenMetrics text.
    #[error("metrics text does not parse at line {line}: {text:?}")]
    MetricsText { line: usize, text: String },

    /// moto's Python cannot be run: moto is not installed where it is looked for.
    #[error(
        "cannot run {} ({source}); `make moto` installs moto[ec2,server] into the venv",
        python.display()
    )]
    MotoMissing {
        python: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },

    /// moto's Python ran, but the server did not print its port.
    #[error("moto did not start (printed {printed:?}); its log {}:\n{log}", log_path.display())]
    MotoStart {
        printed: String,
        log_path: std::path::PathBuf,
        log: String,
    },

    /// A file or pipe of the moto server could not be used.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}
