//! libvirt backend (the `virt` crate over the system libvirt library).
//!
//! Instance ids are domain UUIDs. A delete runs provider-core's deletion engine ([`Deleter`]) over
//! this backend's ports ([`DomainPorts`]): look the domain up by UUID (its metadata tags, its
//! file-backed disks that are pool volumes), refuse it when the guard says so (do-not-delete in
//! its metadata tags; this cluster's tag only where `CLUSTER_TAG` is set), destroy it when it runs
//! and undefine it with its NVRAM (falling back to a plain undefine for drivers without NVRAM
//! support), confirm it gone by a later lookup, then delete only the volumes cloud-api-adaptor
//! created for it. CAA names them for the domain: `<name>-root.qcow2` (the overlay on the shared
//! base image) and `<name>-cloudinit.iso`; every other volume the domain uses (the base image
//! itself, a volume shared with other domains, an operator's) is left alone, as are disk files no
//! pool manages. A volume carries no tags: it is guarded by its domain's.
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

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::Semaphore;
use virt::connect::Connect;
use virt::domain::Domain;
use virt::error::{Error as VirtError, ErrorNumber};

use peerpods_provider_core::CloudCalls;
use peerpods_provider_core::Error;
use peerpods_provider_core::ProviderConfig;
use peerpods_provider_core::deletion::{
    Bound, DeleteAnswer, Lookup, Part, PartId, PartKind, Sighting, Tie, window_from_config,
};
use peerpods_provider_core::{
    Capacity, DeleteOutcome, Deleter, DeletionPorts, Figure, Health, Instance, InstanceKey,
    OwnerTag, Pace, Provider, ProviderName, TagSelector,
};

/// `LIBVIRT_URI` when the configuration sets none, in development mode only
/// ([`ProviderConfig::is_development`]): libvirt's in-process test driver, so the service runs
/// locally without a hypervisor. Outside development mode `LIBVIRT_URI` is required and `test:`
/// URIs are refused: a simulated host would answer "already gone" for VMs that still run.
pub const DEFAULT_URI: &str = "test:///default";

/// XML namespace of the tags metadata element.
pub const TAGS_NAMESPACE: &str = "urn:peerpods:tags:v1";

const NAME: &str = "libvirt";

/// Defaults of `LIBVIRT_CALL_TIMEOUT_SECS` and `LIBVIRT_MAX_BLOCKING_CALLS`.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(60);
pub const DEFAULT_MAX_BLOCKING_CALLS: usize = 8;
/// libvirt keepalive of remote connections: a probe every this many seconds...
pub const KEEPALIVE_INTERVAL_SECS: i32 = 5;
/// ...and the connection closed after this many unanswered.
pub const KEEPALIVE_COUNT: u32 = 3;

/// The setting of libvirt's not-found window (whole seconds).
pub const NOT_FOUND_WINDOW_SETTING: &str = "LIBVIRT_NOT_FOUND_WINDOW_SECS";
/// Its default: libvirt is strongly consistent, so a domain it does not know is gone at once.
pub const NOT_FOUND_WINDOW: Duration = Duration::ZERO;
/// The deletion engine's pace: libvirt answers synchronously, so a wait only spaces out the
/// lookups of a domain or volume that stays busy.
pub const PACE: Duration = Duration::from_millis(250);

/// The libvirt provider.
pub struct LibvirtProvider {
    uri: String,
    conn: Arc<Mutex<Option<Connect>>>,
    calls: CloudCalls,
    call_timeout: Duration,
    /// Slots of the blocking threads libvirt calls may occupy.
    blocking: Arc<Semaphore>,
    deleter: Deleter,
}

impl LibvirtProvider {
    /// Reads `LIBVIRT_URI` (in development mode: default [`DEFAULT_URI`], `test:` URIs allowed).
    /// Connects lazily, on the first call.
    pub fn from_config(config: &ProviderConfig, calls: CloudCalls) -> Result<Self, Error> {
        let uri = match config.get("LIBVIRT_URI") {
            Some(uri) => uri,
            None if config.is_development() => DEFAULT_URI,
            None => {
                return Err(Error::config(
                    "LIBVIRT_URI",
                    "not set: name the libvirt host (e.g. qemu+ssh://root@host/system); \
                              the in-memory test driver is for development mode only",
                ));
            }
        };
        validate_uri(uri)?;
        if is_test_driver(uri) && !config.is_development() {
            return Err(Error::config(
                "LIBVIRT_URI",
                format!(
                    "{uri:?} is libvirt's in-memory test driver, which only simulates VMs: \
                     allowed in development mode only"
                ),
            ));
        }
        // libvirt prints every error to stderr by default; we return and log them ourselves
        // (lookups of gone domains are normal and must not look like failures).
        virt::error::clear_error_callback();
        if is_remote(uri) {
            start_event_loop();
        }
        if is_test_driver(uri) {
            tracing::warn!(
                uri,
                "libvirt test driver in use: instances are simulated in memory"
            );
        }
        let call_timeout = config
            .positive_duration_secs("LIBVIRT_CALL_TIMEOUT_SECS")?
            .unwrap_or(DEFAULT_CALL_TIMEOUT);
        let max_blocking = config
            .positive("LIBVIRT_MAX_BLOCKING_CALLS")?
            .unwrap_or(DEFAULT_MAX_BLOCKING_CALLS);
        let deleter = Deleter::new(
            ProviderName::Libvirt,
            OwnerTag::from_config(config)?.guard(),
            window_from_config(config, NOT_FOUND_WINDOW_SETTING, NOT_FOUND_WINDOW)?,
            NOT_FOUND_WINDOW_SETTING,
            Pace::every(PACE),
        )
        .with_bound(Bound {
            within: call_timeout.saturating_mul(2),
            setting: "twice LIBVIRT_CALL_TIMEOUT_SECS",
        });
        Ok(LibvirtProvider {
            uri: uri.to_owned(),
            conn: Arc::new(Mutex::new(None)),
            calls,
            call_timeout,
            blocking: Arc::new(Semaphore::new(max_blocking)),
            deleter,
        })
    }

    /// Deletes the domain by the engine's rules. Each libvirt call is bounded by
    /// `LIBVIRT_CALL_TIMEOUT_SECS`; the waits of one delete by twice that
    /// ([`Deleter::with_bound`]), so a domain or volume that stays busy is answered a retryable
    /// `Unavailable` instead of waited for without end.
    async fn delete(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        let ports = DomainPorts {
            provider: self,
            seen: Mutex::default(),
        };
        self.deleter.delete(&ports, instance_id).await
    }

    /// Runs `op` with a live connection on the blocking pool, reconnecting once when the
    /// connection turns out to be broken.
    async fn with_conn<T, F>(&self, op_name: &'static str, op: F) -> Result<T, Error>
    where
        T: Send + 'static,
        F: Fn(&Connect) -> Result<T, VirtError> + Send + 'static,
    {
        let uri = self.uri.clone();
        let conn = self.conn.clone();
        let calls = self.calls.clone();
        let blocking = self.blocking.clone();
        let attempts = Arc::new(Attempts::new(self.calls.clone(), op_name));
        let thread_attempts = attempts.clone();
        let call = async move {
            let slot = blocking
                .acquire_owned()
                .await
                .map_err(|_| Error::internal("libvirt call limiter closed"))?;
            let joined = tokio::task::spawn_blocking(move || {
                // Held until libvirt returns, even after the caller gave up (see the module doc).
                let _slot = slot;
                run_with_conn(&conn, &uri, &calls, &thread_attempts, op_name, &op)
            })
            .await;
            joined.map_err(|e| {
                Error::internal(format!("libvirt call {op_name} did not finish: {e}"))
                    .with_source(e)
            })?
        };
        match tokio::time::timeout(self.call_timeout, call).await {
            Ok(answer) => answer,
            Err(_) => {
                // The connection may be the one hanging: the next call opens a new one.
                if let Ok(mut guard) = self.conn.lock() {
                    *guard = None;
                }
                self.calls.record(NAME, op_name, "error");
                attempts.abandon();
                tracing::warn!(
                    op = op_name,
                    timeout = ?self.call_timeout,
                    "libvirt did not answer in time"
                );
                Err(Error::unavailable(format!(
                    "libvirt did not answer {op_name} within {} s (LIBVIRT_CALL_TIMEOUT_SECS)",
                    self.call_timeout.as_secs()
                )))
            }
        }
    }
}

/// One libvirt operation on the shared connection, on the calling (blocking) thread, reconnecting
/// once when the connection turns out to be broken.
fn run_with_conn<T, F>(
    conn: &Mutex<Option<Connect>>,
    uri: &str,
    calls: &CloudCalls,
    attempts: &Attempts,
    op_name: &'static str,
    op: &F,
) -> Result<T, Error>
where
    F: Fn(&Connect) -> Result<T, VirtError>,
{
    let mut last = None;
    for _attempt in 0..2 {
        if !attempts.start() {
            // The caller stopped waiting (and dropped the connection): nobody wants the answer.
            return Err(Error::unavailable(format!(
                "libvirt call {op_name} abandoned by its caller"
            )));
        }
        // Connecting counts: a reconnect is part of what the call waited for.
        let started = std::time::Instant::now();
        let c = match connection(conn, uri) {
            Ok(c) => c,
            Err(e) => {
                calls.record_timed(NAME, op_name, "error", started.elapsed());
                attempts.end(TRANSPORT_ERROR);
                return Err(e);
            }
        };
        match op(&c) {
            Ok(v) => {
                calls.record_timed(NAME, op_name, "ok", started.elapsed());
                attempts.end("ok");
                return Ok(v);
            }
            Err(e) if is_connection_error(&e) => {
                calls.record_timed(NAME, op_name, "error", started.elapsed());
                attempts.end(TRANSPORT_ERROR);
                tracing::warn!(error = %e.message(), "libvirt connection broken, reconnecting");
                if let Ok(mut guard) = conn.lock() {
                    *guard = None;
                }
                last = Some(e);
            }
            Err(e) => {
                calls.record_timed(NAME, op_name, "error", started.elapsed());
                // libvirt answered and refused (no such domain, busy, denied, ...).
                attempts.end("client_error");
                return Err(map_error(e));
            }
        }
    }
    Err(last.map_or_else(|| Error::internal("libvirt: no attempt made"), map_error))
}

/// The `cloud_api_attempts` result of an attempt libvirt did not answer: no connection, a
/// broken one, or no answer before `LIBVIRT_CALL_TIMEOUT_SECS`.
const TRANSPORT_ERROR: &str = "transport_error";

/// The attempts of one call (each connect-and-call on the blocking thread), each counted once in
/// `cloud_api_attempts`: by the thread when libvirt answers, or as `transport_error` by the
/// caller that stopped waiting for the one in flight, since a thread stuck in libvirt may never
/// come back to count it.
struct Attempts {
    calls: CloudCalls,
    op_name: &'static str,
    state: Mutex<AttemptState>,
}

#[derive(Default)]
struct AttemptState {
    in_flight: bool,
    abandoned: bool,
}

impl Attempts {
    fn new(calls: CloudCalls, op_name: &'static str) -> Self {
        Attempts {
            calls,
            op_name,
            state: Mutex::default(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, AttemptState> {
        // The state stays consistent whatever panicked while holding it: two booleans.
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// An attempt begins; `false` when the caller has given up, so none should.
    fn start(&self) -> bool {
        let mut state = self.state();
        state.in_flight = !state.abandoned;
        state.in_flight
    }

    /// The attempt in flight ended with `result`, unless the caller already counted it.
    fn end(&self, result: &'static str) {
        let mut state = self.state();
        if std::mem::take(&mut state.in_flight) {
            self.calls.record_attempt(NAME, self.op_name, result);
        }
    }

    /// The caller stopped waiting: the attempt in flight, if any, got no answer in time.
    fn abandon(&self) {
        let mut state = self.state();
        state.abandoned = true;
        if std::mem::take(&mut state.in_flight) {
            self.calls
                .record_attempt(NAME, self.op_name, TRANSPORT_ERROR);
        }
    }
}

/// The shared connection, opened when missing or dead. The lock is never held while libvirt is
/// called: an open that hangs on a dead host must not hold up the callers that give up on it.
fn connection(conn: &Mutex<Option<Connect>>, uri: &str) -> Result<Connect, Error> {
    let existing = conn
        .lock()
        .map_err(|_| Error::internal("libvirt connection lock poisoned"))?
        .clone();
    // A clone is a new reference to the same connection.
    if let Some(c) = existing
        && c.is_alive().unwrap_or(false)
    {
        return Ok(c);
    }
    let c = Connect::open(Some(uri)).map_err(|e| {
        Error::unavailable(format!("cannot connect to libvirt: {}", e.message())).with_source(e)
    })?;
    if is_remote(uri) {
        // Fails (harmlessly) for a server without keepalive support or without the event loop.
        if let Err(e) = c.set_keep_alive(KEEPALIVE_INTERVAL_SECS, KEEPALIVE_COUNT) {
            tracing::debug!(error = %e.message(), "libvirt keepalive not enabled");
        }
    }
    if let Ok(mut guard) = conn.lock() {
        *guard = Some(c.clone());
    }
    Ok(c)
}

/// Whether `uri` reaches libvirt over a network transport (`qemu+ssh://`, `qemu+tcp://`,
/// `qemu+tls://`, or a URI naming a host), where keepalive matters.
fn is_remote(uri: &str) -> bool {
    let Some((scheme, rest)) = uri.split_once(':') else {
        return false;
    };
    scheme.contains('+')
        || rest
            .strip_prefix("//")
            .is_some_and(|r| !r.is_empty() && !r.starts_with('/'))
}

/// libvirt's default event loop, which keepalive needs, registered once before the first remote
/// connection and run on a thread of its own for the life of the process.
fn start_event_loop() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        if let Err(e) = virt::event::event_register_default_impl() {
            tracing::warn!(error = %e.message(), "libvirt event loop not registered: no keepalive");
            return;
        }
        let spawned = std::thread::Builder::new()
            .name("libvirt-events".into())
            .spawn(|| {
                loop {
                    if let Err(e) = virt::event::event_run_default_impl() {
                        tracing::warn!(error = %e.message(), "libvirt event loop failed");
                        std::thread::sleep(Duration::from_secs(1));
                    }
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "libvirt event loop thread not started: no keepalive");
        }
    });
}

#[async_trait]
impl Provider for LibvirtProvider {
    fn name(&self) -> ProviderName {
        ProviderName::Libvirt
    }

    fn validate_instance_id(&self, instance_id: &str) -> Result<(), Error> {
        // libvirt prints UUIDs hyphenated; other spellings uuid accepts (braced, urn) would be
        // lookups of ids no caller got from libvirt.
        if instance_id.len() == 36 && uuid::Uuid::try_parse(instance_id).is_ok() {
            Ok(())
        } else {
            Err(Error::invalid(
                "instance_id",
                "not a libvirt domain UUID (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)",
            ))
        }
    }

    async fn delete_instance(&self, instance_id: &str) -> Result<DeleteOutcome, Error> {
        self.delete(instance_id).await
    }

    async fn capacity(&self) -> Result<Capacity, Error> {
        self.with_conn("capacity", capacity).await
    }

    async fn list_instances(&self, selector: &TagSelector) -> Result<Vec<Instance>, Error> {
        let mut instances = self.with_conn("list_domains", list_domains).await?;
        instances.retain(|i| i.matches(selector));
        instances.sort_by(|a, b| a.id.cmp(&b.id));
        Ok(instances)
    }

    async fn health(&self) -> Health {
        match self.with_conn("driver_type", |c| c.driver_type()).await {
            Ok(driver) => Health {
                healthy: true,
                message: format!("libvirt answers (driver {driver})"),
            },
            Err(e) => Health {
                healthy: false,
                message: e.to_string(),
            },
        }
    }
}

/// A domain as a lookup shows it: what the delete needs of it before it is gone.
#[derive(Debug, Clone)]
struct Shown {
    name: String,
    tags: BTreeMap<String, String>,
    /// Its file-backed disks that are pool volumes: (path, volume name).
    volumes: Vec<(String, String)>,
}

impl Shown {
    /// Whether cloud-api-adaptor created the volume `name` for this domain: it names its root
    /// disk `<domain>-root.qcow2` and its cloud-init disk `<domain>-cloudinit.iso`.
    fn created_for_it(&self, volume: &str) -> bool {
        volume
            .strip_prefix(self.name.as_str())
            .is_some_and(|rest| CAA_VOLUME_SUFFIXES.contains(&rest))
    }
}

/// The suffixes of the volumes cloud-api-adaptor's libvirt provider creates for a domain, after
/// the domain's name (`CreateDomain`: `<name>-root.qcow2`, `<name>-cloudinit.iso`).
pub const CAA_VOLUME_SUFFIXES: [&str; 2] = ["-root.qcow2", "-cloudinit.iso"];

/// What this delete has seen of the domain (the ports of one delete; nothing outlives it).
#[derive(Debug, Default)]
struct Seen {
    /// The domain as the latest lookup showed it; `None` when libvirt did not know it.
    latest: Option<Shown>,
    /// The tags of the domain as last shown in this delete: its volumes' guard.
    tags: BTreeMap<String, String>,
}

/// The deletion engine's ports for one libvirt delete. Each port is one blocking libvirt call
/// on the shared connection (counted as one call by its operation name).
pub struct DomainPorts<'a> {
    provider: &'a LibvirtProvider,
    seen: Mutex<Seen>,
}

impl DomainPorts<'_> {
    fn seen(&self) -> MutexGuard<'_, Seen> {
        self.seen.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn volume_only(part: &PartId) -> Result<String, Error> {
    match part.kind {
        PartKind::Volume => Ok(part.id.clone()),
        kind => Err(Error::internal(format!(
            "libvirt domains have no {} parts here, yet {} was asked about",
            kind.as_str(),
            part.id
        ))),
    }
}

#[async_trait]
impl DeletionPorts for DomainPorts<'_> {
    /// A domain has no creation time libvirt reports: its age is known from its first sighting.
    async fn look_up(&self, instance: &InstanceKey) -> Result<Lookup, Error> {
        let uuid = instance.id().to_owned();
        let shown = self
            .provider
            .with_conn("look_up_domain", move |c| look_up_domain(c, &uuid))
            .await?;
        let mut seen = self.seen();
        let sighting = match &shown {
            Some(domain) => {
                seen.tags = domain.tags.clone();
                Sighting::Present(domain.tags.clone())
            }
            None => Sighting::NotFound,
        };
        seen.latest = shown;
        Ok(Lookup::of(sighting))
    }

    async fn request_delete(&self, instance: &InstanceKey) -> Result<DeleteAnswer, Error> {
        let uuid = instance.id().to_owned();
        self.provider
            .with_conn("delete_domain", move |c| delete_domain(c, &uuid))
            .await
    }

    /// The volumes of the domain the latest lookup showed (read then, before a transient domain
    /// vanishes with its destroy); none once libvirt does not know the domain.
    async fn parts(&self, _instance: &InstanceKey) -> Result<Vec<Part>, Error> {
        let seen = self.seen();
        let Some(domain) = &seen.latest else {
            return Ok(Vec::new());
        };
        Ok(domain
            .volumes
            .iter()
            .map(|(path, name)| Part {
                id: PartId::new(PartKind::Volume, path.as_str()),
                tags: domain.tags.clone(),
                tie: if domain.created_for_it(name) {
                    Tie::CreatedForVm
                } else {
                    Tie::NotTheVms
                },
            })
            .collect())
    }

    async fn delete_part(
        &self,
        _instance: &InstanceKey,
        part: &PartId,
    ) -> Result<DeleteAnswer, Error> {
        let path = volume_only(part)?;
        self.provider
            .with_conn("delete_volume", move |c| delete_volume(c, &path))
            .await
    }

    async fn look_up_part(
        &self,
        _instance: &InstanceKey,
        part: &PartId,
    ) -> Result<Sighting, Error> {
        let path = volume_only(part)?;
        let exists = self
            .provider
            .with_conn("look_up_volume", move |c| {
                match c.lookup_storage_vol_by_path(&path) {
                    Ok(_) => Ok(true),
                    Err(e) if e.code().is(ErrorNumber::NoStorageVolume) => Ok(false),
                    Err(e) => Err(e),
                }
            })
            .await?;
        Ok(if exists {
            Sighting::Present(self.seen().tags.clone())
        } else {
            Sighting::NotFound
        })
    }
}

/// The domain `uuid` with its tags and pool volumes, `None` when libvirt does not know it.
fn look_up_domain(conn: &Connect, uuid: &str) -> Result<Option<Shown>, VirtError> {
    let gone = |e: &VirtError| e.code().is(ErrorNumber::NoDomain);
    let domain = match conn.lookup_domain_by_uuid_string(uuid) {
        Ok(d) => d,
        Err(e) if gone(&e) => return Ok(None),
        Err(e) => return Err(e),
    };
    let read = || -> Result<Shown, VirtError> {
        let tags = match domain.metadata(
            virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(TAGS_NAMESPACE),
            0,
        ) {
            Ok(xml) => parse_tags(&xml),
            Err(e) if e.code().is(ErrorNumber::NoDomainMetadata) => BTreeMap::new(),
            Err(e) => return Err(e),
        };
        let mut volumes = Vec::new();
        for path in file_disks(&domain.xml_desc(0)?) {
            match conn.lookup_storage_vol_by_path(&path) {
                Ok(vol) => volumes.push((path, vol.name()?)),
                Err(e) if e.code().is(ErrorNumber::NoStorageVolume) => {
                    tracing::debug!(path, "disk file is not a pool volume; left alone");
                }
                Err(e) => return Err(e),
            }
        }
        Ok(Shown {
            name: domain.name()?,
            tags,
            volumes,
        })
    };
    match read() {
        Ok(shown) => Ok(Some(shown)),
        // It went away while read.
        Err(e) if gone(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Destroys the domain when it runs and undefines it: accepted, NotFound when libvirt does not
/// know it, WrongState while it is busy (another job holds it).
fn delete_domain(conn: &Connect, uuid: &str) -> Result<DeleteAnswer, VirtError> {
    let gone = |e: &VirtError| e.code().is(ErrorNumber::NoDomain);
    let busy = |e: &VirtError| {
        e.code().is_any(vec![
            ErrorNumber::ResourceBusy,
            ErrorNumber::OperationTimeout,
        ])
    };
    let domain = match conn.lookup_domain_by_uuid_string(uuid) {
        Ok(d) => d,
        Err(e) if gone(&e) => return Ok(DeleteAnswer::NotFound),
        Err(e) => return Err(e),
    };
    let stop_and_undefine = || -> Result<(), VirtError> {
        if domain.is_active()? {
            match domain.destroy() {
                Ok(()) => {}
                // It stopped between the check and the call: that is what we wanted.
                Err(e) if e.code().is(ErrorNumber::OperationInvalid) => {}
                Err(e) => return Err(e),
            }
        }
        // A transient domain is gone once destroyed (its lookup answers NoDomain).
        if domain.is_persistent()? {
            undefine(&domain)?;
        }
        Ok(())
    };
    match stop_and_undefine() {
        Ok(()) => Ok(DeleteAnswer::Accepted),
        Err(e) if gone(&e) => Ok(DeleteAnswer::Accepted),
        Err(e) if busy(&e) => {
            tracing::debug!(uuid, error = %e.message(), "domain busy; the delete waits");
            Ok(DeleteAnswer::WrongState)
        }
        Err(e) => Err(e),
    }
}

fn undefine(domain: &Domain) -> Result<(), VirtError> {
    match domain.undefine_flags(virt::sys::VIR_DOMAIN_UNDEFINE_NVRAM) {
        Ok(()) => Ok(()),
        Err(e) if e.code().is(ErrorNumber::NoDomain) => Ok(()),
        Err(e) => {
            tracing::debug!(error = %e.message(), "undefine with NVRAM refused, plain undefine");
            match domain.undefine() {
                Err(e) if e.code().is(ErrorNumber::NoDomain) => Ok(()),
                other => other,
            }
        }
    }
}

/// Deletes the pool volume at `path`: accepted, NotFound when no pool has it, WrongState while
/// it is busy.
fn delete_volume(conn: &Connect, path: &str) -> Result<DeleteAnswer, VirtError> {
    let missing = |e: &VirtError| e.code().is(ErrorNumber::NoStorageVolume);
    let vol = match conn.lookup_storage_vol_by_path(path) {
        Ok(vol) => vol,
        Err(e) if missing(&e) => return Ok(DeleteAnswer::NotFound),
        Err(e) => return Err(e),
    };
    match vol.delete(0) {
        Ok(()) => Ok(DeleteAnswer::Accepted),
        Err(e) if missing(&e) => Ok(DeleteAnswer::NotFound),
        Err(e) if is_busy(&e) => Ok(DeleteAnswer::WrongState),
        Err(e) => Err(e),
    }
}

/// Source paths of the file-backed disks in a domain XML.
fn file_disks(xml: &str) -> Vec<String> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return Vec::new();
    };
    doc.descendants()
        .filter(|n| n.has_tag_name("disk") && n.attribute("type") == Some("file"))
        .filter_map(|disk| {
            disk.children()
                .find(|n| n.has_tag_name("source"))
                .and_then(|s| s.attribute("file"))
                .map(str::to_owned)
        })
        .collect()
}

fn capacity(conn: &Connect) -> Result<Capacity, VirtError> {
    let node = conn.node_info()?;
    let domains = conn.list_all_domains(0)?;
    let (mut vcpus, mut memory_kib) = (0u64, 0u64);
    for d in &domains {
        let info = d.info()?;
        vcpus += u64::from(info.nr_virt_cpu);
        memory_kib += info.max_mem;
    }
    Ok(Capacity {
        // libvirt sets no limit on the number of domains; the host's CPUs and memory are the limit.
        instances: Figure {
            limit: None,
            in_use: Some(domains.len() as u64),
        },
        vcpus: Figure {
            limit: Some(u64::from(node.cpus)),
            in_use: Some(vcpus),
        },
        memory_mib: Figure {
            limit: Some(node.memory / 1024),
            in_use: Some(memory_kib / 1024),
        },
    })
}

fn list_domains(conn: &Connect) -> Result<Vec<Instance>, VirtError> {
    let mut out = Vec::new();
    for d in conn.list_all_domains(0)? {
        let id = d.uuid_string()?;
        let tags = match d.metadata(
            virt::sys::VIR_DOMAIN_METADATA_ELEMENT as i32,
            Some(TAGS_NAMESPACE),
            0,
        ) {
            Ok(xml) => parse_tags(&xml),
            Err(e) if e.code().is(ErrorNumber::NoDomainMetadata) => BTreeMap::new(),
            // The domain went away while listing: it is not an instance any more.
            Err(e) if e.code().is(ErrorNumber::NoDomain) => continue,
            Err(e) => return Err(e),
        };
        out.push(Instance {
            id,
            created: None,
            tags,
            // cloud-api-adaptor's name for the pod VM.
            name: d.name()?,
        });
    }
    Ok(out)
}

/// Tags from the metadata element libvirt returns for [`TAGS_NAMESPACE`]. libvirt hands it
/// back without the namespace (`<tags><tag key="k">v</tag></tags>`): the lookup by namespace
/// already picked our element. Entries without a key are skipped.
pub fn parse_tags(xml: &str) -> BTreeMap<String, String> {
    let Ok(doc) = roxmltree::Document::parse(xml) else {
        return BTreeMap::new();
    };
    doc.descendants()
        .filter(|n| n.tag_name().name() == "tag")
        .filter_map(|n| {
            let key = n.attribute("key")?;
            Some((key.to_owned(), n.text().unwrap_or_default().to_owned()))
        })
        .collect()
}

/// A connection URI needs a scheme (`qemu:///system`, `qemu+ssh://host/system`, `test:///default`).
fn validate_uri(uri: &str) -> Result<(), Error> {
    let scheme_ok = uri.split_once(':').is_some_and(|(scheme, _)| {
        !scheme.is_empty()
            && scheme
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '+' || c == '-' || c == '.')
    });
    if scheme_ok {
        Ok(())
    } else {
        Err(Error::config(
            "LIBVIRT_URI",
            "not a libvirt connection URI (e.g. qemu:///system)",
        ))
    }
}

/// Whether `uri` opens libvirt's test driver (`test:///default`, `test:///path/to/host.xml`).
fn is_test_driver(uri: &str) -> bool {
    uri.split_once(':')
        .is_some_and(|(scheme, _)| scheme.eq_ignore_ascii_case("test"))
}

/// Errors after which the connection is not usable any more.
fn is_connection_error(e: &VirtError) -> bool {
    e.code().is_any(vec![
        ErrorNumber::InvalidConn,
        ErrorNumber::NoConnect,
        ErrorNumber::Rpc,
    ])
}

/// libvirt's answers that the domain (or the resource) is in a state that does not allow the
/// call now (`virerror.h`): `VIR_ERR_OPERATION_INVALID` ("operation is not valid", e.g. a domain
/// mid-transition), `VIR_ERR_RESOURCE_BUSY` ("resource is busy") and
/// `VIR_ERR_OPERATION_TIMEOUT` (e.g. "cannot acquire state change lock": another job holds the
/// domain). The state moves on, so the call is worth repeating.
fn is_busy(e: &VirtError) -> bool {
    e.code().is_any(vec![
        ErrorNumber::OperationInvalid,
        ErrorNumber::ResourceBusy,
        ErrorNumber::OperationTimeout,
    ])
}

/// The crate error for libvirt's answer `e`, which stays its source.
fn map_error(e: VirtError) -> Error {
    let message = format!("libvirt: {}", e.message());
    let mapped = if is_connection_error(&e) {
        Error::unavailable(message)
    } else if is_busy(&e) {
        Error::unavailable(format!(
            "{message} (the domain is busy or mid-transition; try again)"
        ))
    } else if e
        .code()
        .is_any(vec![ErrorNumber::AuthFailed, ErrorNumber::AccessDenied])
    {
        Error::cloud_permission_denied(message)
    } else {
        Error::internal(message)
    };
    mapped.with_source(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_call_timeout_or_thread_bound_is_refused_naming_key_and_value() {
        for key in ["LIBVIRT_CALL_TIMEOUT_SECS", "LIBVIRT_MAX_BLOCKING_CALLS"] {
            let config =
                ProviderConfig::from_pairs([("LIBVIRT_URI", "test:///default"), (key, "0")])
                    .for_development(true);
            let Err(error) = LibvirtProvider::from_config(&config, CloudCalls::default()) else {
                panic!("{key}=0 was accepted");
            };
            let text = error.to_string();
            assert!(
                text.starts_with(&format!("config {key}: expected")),
                "{text}"
            );
            assert!(text.ends_with(r#"greater than zero, got "0""#), "{text}");
        }
    }

    /// A real `VIR_ERR_OPERATION_INVALID` from the libvirt library (its test driver: destroying a
    /// domain that is not running) is retryable, not an internal error.
    #[test]
    fn a_domain_in_the_wrong_state_is_retryable() {
        let conn = Connect::open(Some("test:///default")).expect("test driver");
        let domain = conn
            .lookup_domain_by_name("test")
            .expect("its default domain");
        if domain.is_active().expect("state") {
            domain.destroy().expect("the running default domain stops");
        }
        let e = domain.destroy().expect_err("it is not running any more");
        assert!(e.code().is(ErrorNumber::OperationInvalid), "{e}");
        let mapped = map_error(e);
        assert!(
            matches!(&mapped, Error::Unavailable { message, .. } if message.contains("try again")),
            "{mapped:?}"
        );
        // The chain reaches libvirt's own error, code and all.
        let source = std::error::Error::source(&mapped)
            .and_then(|s| s.downcast_ref::<VirtError>())
            .expect("libvirt's error is the source");
        assert!(source.code().is(ErrorNumber::OperationInvalid), "{source}");
        // An error that is not about the domain's state stays what it was.
        let missing = conn
            .lookup_domain_by_name("no-such-domain")
            .expect_err("unknown");
        assert!(matches!(map_error(missing), Error::Internal { .. }));
    }

    #[test]
    fn finds_file_disks_only() {
        let xml = r#"<domain><devices>
            <disk type='file' device='disk'><source file='/pool/a.qcow2'/></disk>
            <disk type='file' device='cdrom'><source file='/pool/ci.iso'/></disk>
            <disk type='block' device='disk'><source dev='/dev/sdb'/></disk>
        </devices></domain>"#;
        assert_eq!(file_disks(xml), vec!["/pool/a.qcow2", "/pool/ci.iso"]);
    }

    #[test]
    fn parses_tags_as_libvirt_returns_them() {
        let xml =
            "<tags>\n  <tag key=\"cluster\">c1</tag><tag key=\"empty\"/><tag>no key</tag>\n</tags>";
        let tags = parse_tags(xml);
        assert_eq!(tags.len(), 2);
        assert_eq!(tags["cluster"], "c1");
        assert_eq!(tags["empty"], "");
        assert!(parse_tags("not xml").is_empty());
    }

    #[test]
    fn the_test_driver_needs_development_mode() {
        let config = |pairs: &[(&str, &str)]| ProviderConfig::from_pairs(pairs.iter().copied());
        let refusal = |config: ProviderConfig| match LibvirtProvider::from_config(
            &config,
            CloudCalls::default(),
        ) {
            Err(Error::Config { key, message, .. }) => (key, message),
            Err(other) => panic!("{other}"),
            Ok(_) => panic!("accepted"),
        };
        let (key, message) = refusal(config(&[]));
        assert_eq!(key, "LIBVIRT_URI");
        assert!(message.contains("not set"), "{message}");
        for uri in ["test:///default", "TEST:///tmp/host.xml"] {
            let (key, message) = refusal(config(&[("LIBVIRT_URI", uri)]));
            assert_eq!(key, "LIBVIRT_URI");
            assert!(message.contains("development mode"), "{message}");
        }
        let dev =
            LibvirtProvider::from_config(&config(&[]).for_development(true), CloudCalls::default())
                .expect("the embedded default in development mode");
        assert_eq!(dev.uri, DEFAULT_URI);
        let real = LibvirtProvider::from_config(
            &config(&[("LIBVIRT_URI", "qemu+ssh://root@192.168.122.1/system")]),
            CloudCalls::default(),
        )
        .expect("a real host without development mode");
        assert_eq!(real.uri, "qemu+ssh://root@192.168.122.1/system");
    }

    #[test]
    fn uris_need_a_scheme() {
        assert!(validate_uri("qemu+ssh://root@192.168.122.1/system?no_verify=1").is_ok());
        assert!(validate_uri("test:///default").is_ok());
        assert!(validate_uri("not a uri").is_err());
        assert!(validate_uri(":///x").is_err());
    }
}
