//! libvirt backend (the `virt` crate over the system libvirt library).
//!
//! Instance ids are domain UUIDs. A delete runs provider-core's deletion engine
//! ([`Deleter`](peerpods_provider_core::Deleter)) over this backend's ports ([`DomainPorts`]): look
//! the domain up by UUID (its metadata tags, its file-backed disks that are pool volumes), refuse
//! it when the guard says so (do-not-delete in its metadata tags; this cluster's tag only where
//! `CLUSTER_TAG` is set), destroy it when it runs and undefine it with its NVRAM (falling back to a
//! plain undefine for drivers without NVRAM support), confirm it gone by a later lookup, then
//! delete only the volumes cloud-api-adaptor created for it. CAA names them for the domain:
//! `<name>-root.qcow2` (the overlay on the shared base image) and `<name>-cloudinit.iso`; every
//! other volume the domain uses (the base image itself, a volume shared with other domains, an
//! operator's) is left alone, as are disk files no pool manages. A volume carries no tags: it is
//! guarded by its domain's.
//!
//! libvirt is strongly consistent (a domain is defined or not, on the host that answers), so its
//! not-found window `LIBVIRT_NOT_FOUND_WINDOW_SECS` defaults to 0: an unknown UUID is already gone
//! at once.
//!
//! libvirt has no tags. Tags are read from a metadata element of the domain,
//! `<peerpods:tags xmlns:peerpods="urn:peerpods:tags:v1"><peerpods:tag key="k">v</peerpods:tag>...`;
//! domains without it have no tags, so they never match a non-empty selector (and therefore are
//! never mistaken for this cluster's orphans).
//!
//! libvirt calls block, so each runs on tokio's blocking pool. One connection is shared (libvirt
//! connections are thread-safe); when a call fails because the connection broke, the connection
//! is dropped, reopened and the call retried once — every operation here is idempotent.
//!
//! A hung host or connection must not hang callers or eat threads: each call (connecting
//! included) is answered `Unavailable` after `LIBVIRT_CALL_TIMEOUT_SECS` and the connection is
//! dropped, so the next call opens a new one; at most `LIBVIRT_MAX_BLOCKING_CALLS` blocking threads
//! run libvirt calls at once (a thread stuck in libvirt keeps its slot until libvirt returns, so
//! stuck calls cannot grow the pool); remote connections send keepalives (every
//! [`KEEPALIVE_INTERVAL_SECS`] s, closed after [`KEEPALIVE_COUNT`] unanswered), so libvirt itself
//! notices a dead host and ends the calls stuck on it.
//!
//! Each attempt (a connect and call; the reconnect is a second one) is counted in
//! `cloud_api_attempts` as libvirt's HTTP-speaking peers count theirs: `ok`, `transport_error`
//! (no connection, a broken one, no answer in time) or `client_error` (libvirt refused the call).
//!
//! - [`LibvirtProvider`] (`provider`): the [`Provider`](peerpods_provider_core::Provider)
//!   implementation; the entry the service builds from its configuration.
//! - `settings`: configuration keys, their defaults, what a `LIBVIRT_URI` names.
//! - `instance_id`: syntax of the instance id (a domain UUID).
//! - `connection`: the shared connection; every libvirt call bounded, retried once, counted.
//! - `domains`: the libvirt calls on domains and volumes; `metadata`: reading their XML (tags,
//!   file-backed disks).
//! - `failure`: what libvirt's failures mean as the core `Error`.
//! - `ports`: the deletion engine's ports ([`DomainPorts`]); the engine
//!   (`peerpods_provider_core::Deleter`) decides what "deleted" means.

mod connection;
mod domains;
mod failure;
mod instance_id;
mod metadata;
mod ports;
mod provider;
mod settings;

pub use domains::CAA_VOLUME_SUFFIXES;
pub use metadata::{TAGS_NAMESPACE, parse_tags};
pub use ports::DomainPorts;
pub use provider::LibvirtProvider;
pub use settings::{
    DEFAULT_CALL_TIMEOUT, DEFAULT_MAX_BLOCKING_CALLS, DEFAULT_URI, KEEPALIVE_COUNT,
    KEEPALIVE_INTERVAL_SECS, NOT_FOUND_WINDOW, NOT_FOUND_WINDOW_SETTING, PACE,
};
