//! `make bench`: figures for what users feel, from the real parts (local control plane, moto, the release builds
//! of provider-service and both controllers), never from timed tests.
//!
//! - [`options`]: sizes and paths of one run.
//! - [`report`]: the results (`target/bench/results.json`) and the printed table.
//! - [`stats`]: pure figures: percentiles, `/proc` status, spreads.
//! - [`procs`]: the services as child processes (ready checks, admin port, peak RSS, stop).
//! - [`moto`]: the EC2 emulator.
//! - [`cluster`]: the control plane of the run and the objects scenarios create.
//! - [`scenarios`]: cleanup storm (with cloud calls), memory, convergence, gRPC overhead, and the fault storm on
//!   every cloud (`scenarios::fault_storm`).

pub mod cluster;
mod error;
pub mod moto;
pub mod options;
pub mod procs;
pub mod report;
pub mod scenarios;
pub mod stats;

pub use error::Error;
pub use scenarios::run;
