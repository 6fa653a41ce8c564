//! The one libvirt connection all calls share: opened lazily, reopened when broken, each call on
//! tokio's blocking pool, bounded in time and in threads, each attempt counted.

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use tokio::sync::Semaphore;
use virt::connect::Connect;
use virt::error::Error as VirtError;

use peerpods_provider_core::{CloudCalls, Error};

use crate::failure::{is_connection_error, map_error};
use crate::settings::{KEEPALIVE_COUNT, KEEPALIVE_INTERVAL_SECS, is_remote};

const NAME: &str = "libvirt";

/// The shared libvirt connection and the bounds of the calls made on it.
pub(crate) struct Connection {
    pub(crate) uri: String,
    conn: Arc<Mutex<Option<Connect>>>,
    calls: CloudCalls,
    call_timeout: Duration,
    /// Slots of the blocking threads libvirt calls may occupy.
    blocking: Arc<Semaphore>,
}

impl Connection {
    /// Connects lazily, on the first call.
    pub(crate) fn new(
        uri: String,
        calls: CloudCalls,
        call_timeout: Duration,
        max_blocking: usize,
    ) -> Self {
        Connection {
            uri,
            conn: Arc::new(Mutex::new(None)),
            calls,
            call_timeout,
            blocking: Arc::new(Semaphore::new(max_blocking)),
        }
    }

    /// Runs `op` with a live connection on the blocking pool, reconnecting once when the
    /// connection turns out to be broken.
    pub(crate) async fn with_conn<T, F>(&self, op_name: &'static str, op: F) -> Result<T, Error>
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
                // Held until libvirt returns, even after the caller gave up (see the crate doc).
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

/// libvirt's default event loop, which keepalive needs, registered once before the first remote
/// connection and run on a thread of its own for the life of the process.
pub(crate) fn start_event_loop() {
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
