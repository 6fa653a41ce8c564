//! The one TLS listener of the services' ports (provider-service's gRPC port and the webhook's HTTPS port), and
//! the TLS settings cloud-api-adaptor's webhook takes from its environment (`TLS_MIN_VERSION`,
//! `TLS_CIPHER_SUITES`).
//!
//! Accepting never waits for a handshake: every accepted socket gets TCP_NODELAY and keepalive and its handshake
//! runs in a task of its own with a short deadline. Handshakes in progress are bounded per peer address and in
//! total; past a bound the *oldest* handshake of that peer (or of all) is dropped, never the new one. So a client
//! that opens idle connections costs only the slots it holds, and a well-behaved client that finishes its
//! handshake in milliseconds is served however many idle sockets are held open against the port.
//!
//! Established connections are bounded too, per peer address and in all ([`OpenConnections`], the decision is
//! [`connection_fits`]): each holds buffers, TLS state and (over HTTP/2) streams, so their number bounds what a
//! flood of connections costs before any request is authenticated or decided. One past a cap is closed at once,
//! before any byte of it is read, and counted by the cap that refused it. [`TlsListener`] applies them to the
//! ports served with axum; provider-service applies the same [`OpenConnections`] to its gRPC connections.

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tokio_rustls::rustls::CipherSuite;
use tokio_rustls::rustls::server::ResolvesServerCert;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

use crate::Error;
use crate::telemetry::RateLimitedLog;

/// Lowest TLS version a port accepts, by the names of Go's `crypto/tls` that `TLS_MIN_VERSION` takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum TlsVersion {
    #[default]
    #[value(name = "VersionTLS12")]
    Tls12,
    #[value(name = "VersionTLS13")]
    Tls13,
}

/// The TLS version and cipher settings of a port, as cloud-api-adaptor's webhook reads them: a minimum version
/// and, for TLS 1.2, an allow-list of cipher suites by their Go (IANA) names. TLS 1.3 suites are not
/// configurable (as in Go): with a list, TLS 1.2 clients may only use the listed suites and TLS 1.3 clients any
/// TLS 1.3 suite.
#[derive(Debug, Clone, Default)]
pub struct TlsPolicy {
    pub min_version: TlsVersion,
    /// TLS 1.2 suites allowed; empty allows every suite this build implements.
    tls12_suites: Vec<CipherSuite>,
}

/// Go's TLS 1.2 suite names that rustls implements (AEAD with forward secrecy), with the older aliases
/// Kubernetes' `cliflag.TLSCipherSuites` also accepts.
const TLS12_SUITES: &[(&str, CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// TLS 1.3 suite names Go accepts in the list and ignores (TLS 1.3 suites are always on).
const TLS13_SUITES: &[&str] = &[
    "TLS_AES_128_GCM_SHA256",
    "TLS_AES_256_GCM_SHA384",
    "TLS_CHACHA20_POLY1305_SHA256",
];

/// Suites Go knows but rustls does not implement (CBC, RC4, 3DES, RSA key exchange): a list naming them still
/// works, without them.
const UNSUPPORTED_SUITES: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
];

impl TlsPolicy {
    /// The policy of `TLS_MIN_VERSION` and `TLS_CIPHER_SUITES` (already split at commas), with upstream's rules:
    /// names are trimmed and empty ones dropped, an unknown name is an error, and a list with a minimum of
    /// TLS 1.3 is an error (TLS 1.3 suites are not configurable). Suites Go knows but this build does not
    /// implement are left out and returned, for the caller to log; a list left with no TLS 1.2 suite at all is
    /// an error, since it would silently allow every one.
    pub fn new(
        min_version: TlsVersion,
        cipher_suites: &[String],
    ) -> Result<(Self, Vec<String>), Error> {
        let names: Vec<&str> = cipher_suites
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .collect();
        if names.is_empty() {
            return Ok((
                TlsPolicy {
                    min_version,
                    tls12_suites: Vec::new(),
                },
                Vec::new(),
            ));
        }
        if min_version == TlsVersion::Tls13 {
            return Err(Error::Tls {
                message: "TLS_CIPHER_SUITES may not be set when TLS_MIN_VERSION is VersionTLS13: \
                          TLS 1.3 cipher suites are not configurable"
                    .into(),
                source: None,
            });
        }
        let mut tls12_suites = Vec::new();
        let mut left_out = Vec::new();
        for name in names {
            if let Some((_, suite)) = TLS12_SUITES.iter().find(|(n, _)| *n == name) {
                if !tls12_suites.contains(suite) {
                    tls12_suites.push(*suite);
                }
            } else if UNSUPPORTED_SUITES.contains(&name) {
                left_out.push(name.to_owned());
            } else if !TLS13_SUITES.contains(&name) {
                let valid: Vec<&str> = TLS12_SUITES
                    .iter()
                    .map(|(n, _)| *n)
                    .chain(TLS13_SUITES.iter().copied())
                    .collect();
                return Err(Error::Tls {
                    message: format!(
                        "TLS_CIPHER_SUITES: unknown cipher suite {name:?}; valid names: {}",
                        valid.join(", ")
                    ),
                    source: None,
                });
            }
        }
        if tls12_suites.is_empty() {
            return Err(Error::Tls {
                message: format!(
                    "TLS_CIPHER_SUITES names no TLS 1.2 cipher suite this build implements (left out: {})",
                    left_out.join(", ")
                ),
                source: None,
            });
        }
        Ok((
            TlsPolicy {
                min_version,
                tls12_suites,
            },
            left_out,
        ))
    }

    /// The TLS 1.2 suites the list allows; empty when every implemented one is.
    pub fn tls12_suites(&self) -> &[CipherSuite] {
        &self.tls12_suites
    }

    /// A rustls server configuration with this policy, serving the certificate `resolver` picks and speaking
    /// the `alpn` protocols (e.g. `h2` for gRPC, `http/1.1` for the webhook).
    pub fn server_config(
        &self,
        resolver: Arc<dyn ResolvesServerCert>,
        alpn: &[&[u8]],
    ) -> Result<Arc<rustls::ServerConfig>, Error> {
        let mut provider = rustls::crypto::ring::default_provider();
        if !self.tls12_suites.is_empty() {
            provider.cipher_suites.retain(|s| match s {
                rustls::SupportedCipherSuite::Tls13(_) => true,
                rustls::SupportedCipherSuite::Tls12(_) => self.tls12_suites.contains(&s.suite()),
            });
        }
        let versions: &[&rustls::SupportedProtocolVersion] = match self.min_version {
            TlsVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
            TlsVersion::Tls13 => &[&rustls::version::TLS13],
        };
        let mut config = rustls::ServerConfig::builder_with_provider(Arc::new(provider))
            .with_protocol_versions(versions)
            .map_err(|e| Error::Tls {
                message: String::new(),
                source: Some(Box::new(e)),
            })?
            .with_no_client_auth()
            .with_cert_resolver(resolver);
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(Arc::new(config))
    }
}

/// Bounds of the handshakes a listener runs.
#[derive(Debug, Clone, Copy)]
pub struct HandshakeLimits {
    /// A handshake not finished by then is dropped. A client on the cluster network finishes in milliseconds;
    /// the API server gives a webhook call 10 s in all.
    pub timeout: Duration,
    /// Handshakes in progress from one peer address at most; a new one past this drops that peer's oldest.
    pub per_peer: usize,
    /// Handshakes in progress at most; a new one past this drops the oldest of all.
    pub total: usize,
}

impl Default for HandshakeLimits {
    fn default() -> Self {
        HandshakeLimits {
            timeout: Duration::from_secs(10),
            per_peer: 64,
            total: 1024,
        }
    }
}

/// TCP keepalive of accepted connections: a peer that vanished without a FIN is noticed.
pub const TCP_KEEPALIVE: Duration = Duration::from_secs(60);

/// Connections that finished their TLS handshake on `listener`, until `shutdown` (or until the receiver is
/// dropped). See the module doc for how handshakes are run and bounded.
pub fn incoming(
    listener: TcpListener,
    config: Arc<rustls::ServerConfig>,
    limits: HandshakeLimits,
    shutdown: CancellationToken,
) -> mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(accept_loop(
        listener,
        TlsAcceptor::from(config),
        limits,
        tx,
        shutdown,
    ));
    rx
}

/// Connections that completed their TLS handshake, for `axum::serve`, from [`incoming`]: accepting never waits
/// for a handshake, each runs in its own task with a short deadline, and idle connections cost only the
/// handshake slots they hold. Established connections are capped by its [`OpenConnections`]: one past a cap is
/// closed at once. The webhook's port and the secure metrics port both serve through it.
pub struct TlsListener {
    connections: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    open: OpenConnections,
    /// The port's name in the log ("webhook", "metrics").
    port: &'static str,
    /// Stops the accept loop (and so closes the port) when the listener is dropped.
    stop: CancellationToken,
}

impl TlsListener {
    /// A listener with the default connection caps ([`ConnectionLimits::default`]).
    pub fn new(listener: TcpListener, config: Arc<rustls::ServerConfig>) -> std::io::Result<Self> {
        Self::with_caps(
            listener,
            config,
            OpenConnections::new(ConnectionLimits::default()),
            "TLS",
        )
    }

    /// A listener whose established connections are counted and capped by `open` (whose metrics the caller
    /// registers), logged as the `port`'s.
    pub fn with_caps(
        listener: TcpListener,
        config: Arc<rustls::ServerConfig>,
        open: OpenConnections,
        port: &'static str,
    ) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let stop = CancellationToken::new();
        let connections = incoming(listener, config, HandshakeLimits::default(), stop.clone());
        Ok(TlsListener {
            connections,
            local_addr,
            open,
            port,
            stop,
        })
    }
}

impl Drop for TlsListener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = Established<TlsStream<TcpStream>>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let Some((io, peer)) = self.connections.recv().await else {
                // The accept loop only ends when stopped, and then nothing is accepted any more.
                return std::future::pending().await;
            };
            match self.open.admit(peer.ip()) {
                Ok(permit) => {
                    return (Established::new(io, permit), peer);
                }
                Err(refusal) => {
                    // Dropped unread: the cost of a flood stays one accept and one handshake each.
                    drop(io);
                    refusal.log(self.port);
                }
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<SocketAddr> {
        Ok(self.local_addr)
    }
}

/// Sets the socket options every accepted connection gets: TCP_NODELAY (a response's last small frame must not
/// wait for the peer's delayed ACK) and keepalive.
pub fn tune_accepted(tcp: &TcpStream, peer: SocketAddr) {
    if let Err(e) = tcp.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "TCP_NODELAY not set");
    }
    let keepalive = socket2::TcpKeepalive::new().with_time(TCP_KEEPALIVE);
    if let Err(e) = socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive) {
        tracing::debug!(%peer, error = %e, "TCP keepalive not set");
    }
}

async fn accept_loop(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    limits: HandshakeLimits,
    connections: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
    shutdown: CancellationToken,
) {
    let pending = Arc::new(Mutex::new(Pending::default()));
    loop {
        let accepted = tokio::select! {
            () = shutdown.cancelled() => return,
            () = connections.closed() => return,
            accepted = listener.accept() => accepted,
        };
        let (tcp, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(e) => {
                // E.g. too many open files: back off instead of spinning.
                tracing::warn!(error = %e, "accepting a connection failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        tune_accepted(&tcp, peer);
        let (id, dropped) = match pending.lock() {
            Ok(mut p) => p.admit(peer.ip(), &limits, shutdown.child_token()),
            Err(_) => return,
        };
        let (acceptor, connections, pending) =
            (acceptor.clone(), connections.clone(), pending.clone());
        tokio::spawn(async move {
            let handshake = tokio::select! {
                () = dropped.cancelled() => None,
                h = tokio::time::timeout(limits.timeout, acceptor.accept(tcp)) => Some(h),
            };
            if let Ok(mut p) = pending.lock() {
                p.finish(peer.ip(), id);
            }
            match handshake {
                Some(Ok(Ok(stream))) => {
                    let _ = connections.send((stream, peer)).await;
                }
                Some(Ok(Err(e))) => tracing::debug!(%peer, error = %e, "TLS handshake failed"),
                Some(Err(_)) => tracing::debug!(%peer, "TLS handshake timed out"),
                None => tracing::debug!(%peer, "TLS handshake dropped for a newer one"),
            }
        });
    }
}

/// Bounds of the established connections a port holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Established connections from one peer address at most.
    pub per_peer: usize,
    /// Established connections at most.
    pub total: usize,
}

impl Default for ConnectionLimits {
    /// What a port that few clients call needs (a metrics port: Prometheus and a few scrapers): room for several
    /// callers behind one address (SNAT, hostNetwork), and as many in all as handshakes in progress.
    fn default() -> Self {
        ConnectionLimits {
            per_peer: 64,
            total: 1024,
        }
    }
}

/// Which cap refused a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectionCap {
    /// The peer address holds as many as it may ([`ConnectionLimits::per_peer`]).
    PerPeer,
    /// The port holds as many as it may ([`ConnectionLimits::total`]).
    Total,
}

impl ConnectionCap {
    pub fn as_str(self) -> &'static str {
        match self {
            ConnectionCap::PerPeer => "per_peer",
            ConnectionCap::Total => "total",
        }
    }
}

/// The label of the refusal counters: which cap refused.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapLabels {
    /// `per_peer` or `total` ([`ConnectionCap`]).
    pub cap: &'static str,
}

/// Whether one more connection from a peer that holds `from_peer` fits, with `total` open in all. The peer's cap
/// is judged first: a flood from one address is named as such even when it also fills the port.
pub fn connection_fits(
    from_peer: usize,
    total: usize,
    limits: &ConnectionLimits,
) -> Result<(), ConnectionCap> {
    if from_peer >= limits.per_peer.max(1) {
        Err(ConnectionCap::PerPeer)
    } else if total >= limits.total.max(1) {
        Err(ConnectionCap::Total)
    } else {
        Ok(())
    }
}

/// At most one log line about refused connections per this long, per port.
pub const REFUSALS_LOG_EVERY: Duration = Duration::from_secs(10);

/// The established connections of a port, per peer address and in all, with their caps and metrics. Cheap to
/// clone; clones share the counts.
#[derive(Clone, Debug)]
pub struct OpenConnections {
    limits: Arc<RwLock<ConnectionLimits>>,
    counts: Arc<Mutex<Counts>>,
    /// Established connections now.
    pub gauge: Gauge,
    /// Connections closed at once, past a cap, by `cap`.
    pub refused: Family<CapLabels, Counter>,
    log: Arc<RateLimitedLog>,
}

#[derive(Debug, Default)]
struct Counts {
    per_peer: HashMap<IpAddr, usize>,
    total: usize,
}

/// Why a connection was refused, for the caller's log line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Refusal {
    pub cap: ConnectionCap,
    pub peer: IpAddr,
    /// Connections its peer held.
    pub from_peer: usize,
    /// Connections the port held.
    pub total: usize,
    /// The cap's value.
    pub limit: usize,
    /// `Some(refused since the last line)` when a log line is due ([`REFUSALS_LOG_EVERY`]).
    pub log_due: Option<u64>,
}

impl Refusal {
    /// The warning of a refusal, when one is due, naming the cap.
    pub fn log(&self, port: &str) {
        if let Some(refused) = self.log_due {
            tracing::warn!(
                peer = %self.peer,
                cap = self.cap.as_str(),
                from_peer = self.from_peer,
                total = self.total,
                limit = self.limit,
                refused,
                "closing a new {port} connection: its {} holds as many as it may; logged at most every 10 s",
                match self.cap {
                    ConnectionCap::PerPeer => "peer address",
                    ConnectionCap::Total => "port",
                }
            );
        }
    }
}

impl OpenConnections {
    pub fn new(limits: ConnectionLimits) -> Self {
        OpenConnections {
            limits: Arc::new(RwLock::new(limits)),
            counts: Arc::default(),
            gauge: Gauge::default(),
            refused: Family::default(),
            log: Arc::new(RateLimitedLog::new(REFUSALS_LOG_EVERY)),
        }
    }

    /// Puts other caps in place (a configuration read again); connections already held stay.
    pub fn set_limits(&self, limits: ConnectionLimits) {
        match self.limits.write() {
            Ok(mut l) => *l = limits,
            Err(poisoned) => *poisoned.into_inner() = limits,
        }
    }

    pub fn limits(&self) -> ConnectionLimits {
        match self.limits.read() {
            Ok(l) => *l,
            Err(poisoned) => *poisoned.into_inner(),
        }
    }

    fn counts(&self) -> std::sync::MutexGuard<'_, Counts> {
        // Only counts are behind the lock; a panic elsewhere cannot leave them torn.
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A place for a connection just established from `peer`, held until the permit is dropped; or the
    /// [`Refusal`] (counted in [`OpenConnections::refused`]) when it must be closed at once.
    pub fn admit(&self, peer: IpAddr) -> Result<ConnectionPermit, Refusal> {
        let limits = self.limits();
        let mut counts = self.counts();
        let from_peer = counts.per_peer.get(&peer).copied().unwrap_or(0);
        match connection_fits(from_peer, counts.total, &limits) {
            Ok(()) => {
                counts.total += 1;
                *counts.per_peer.entry(peer).or_insert(0) += 1;
                drop(counts);
                self.gauge.inc();
                Ok(ConnectionPermit {
                    open: self.clone(),
                    peer,
                })
            }
            Err(cap) => {
                let total = counts.total;
                drop(counts);
                self.refused
                    .get_or_create(&CapLabels { cap: cap.as_str() })
                    .inc();
                Err(Refusal {
                    cap,
                    peer,
                    from_peer,
                    total,
                    limit: match cap {
                        ConnectionCap::PerPeer => limits.per_peer,
                        ConnectionCap::Total => limits.total,
                    },
                    log_due: self.log.admit(),
                })
            }
        }
    }

    /// Established connections now.
    pub fn count(&self) -> usize {
        self.counts().total
    }
}

/// An established connection's place among the open ones, given back when the connection closes.
#[derive(Debug)]
pub struct ConnectionPermit {
    open: OpenConnections,
    peer: IpAddr,
}

impl Drop for ConnectionPermit {
    fn drop(&mut self) {
        let mut counts = self.open.counts();
        counts.total = counts.total.saturating_sub(1);
        if let Some(n) = counts.per_peer.get_mut(&self.peer) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                counts.per_peer.remove(&self.peer);
            }
        }
        drop(counts);
        self.open.gauge.dec();
    }
}

/// A connection counted against its port's caps until it is dropped.
pub struct Established<IO> {
    io: IO,
    _permit: ConnectionPermit,
}

impl<IO> Established<IO> {
    /// `io`, holding `permit` ([`OpenConnections::admit`]) until it is dropped.
    pub fn new(io: IO, permit: ConnectionPermit) -> Self {
        Established {
            io,
            _permit: permit,
        }
    }
}

/// A tonic server's connections carry what the one they wrap says of its peer.
#[cfg(feature = "grpc-server")]
impl<IO: tonic::transport::server::Connected> tonic::transport::server::Connected
    for Established<IO>
{
    type ConnectInfo = IO::ConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl<IO: tokio::io::AsyncRead + Unpin> tokio::io::AsyncRead for Established<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: tokio::io::AsyncWrite + Unpin> tokio::io::AsyncWrite for Established<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// Handshakes in progress, oldest first per peer. Ids grow with each accept, so the oldest of all is the
/// smallest id at the front of a peer's queue.
#[derive(Default)]
struct Pending {
    next_id: u64,
    by_peer: HashMap<IpAddr, VecDeque<(u64, CancellationToken)>>,
    count: usize,
}

impl Pending {
    /// Registers a new handshake from `peer`, dropping older ones past the limits.
    fn admit(
        &mut self,
        peer: IpAddr,
        limits: &HandshakeLimits,
        token: CancellationToken,
    ) -> (u64, CancellationToken) {
        let queue = self.by_peer.entry(peer).or_default();
        if queue.len() >= limits.per_peer.max(1)
            && let Some((_, oldest)) = queue.pop_front()
        {
            oldest.cancel();
            self.count -= 1;
        }
        while self.count >= limits.total.max(1) {
            let oldest = self
                .by_peer
                .iter()
                .filter_map(|(ip, q)| q.front().map(|(id, _)| (*id, *ip)))
                .min();
            let Some((_, ip)) = oldest else { break };
            if let Some((_, token)) = self.by_peer.get_mut(&ip).and_then(VecDeque::pop_front) {
                token.cancel();
                self.count -= 1;
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.by_peer
            .entry(peer)
            .or_default()
            .push_back((id, token.clone()));
        self.count += 1;
        (id, token)
    }

    /// Forgets a handshake that ended (or was dropped: then it is gone already).
    fn finish(&mut self, peer: IpAddr, id: u64) {
        if let Some(queue) = self.by_peer.get_mut(&peer) {
            let before = queue.len();
            queue.retain(|(i, _)| *i != id);
            self.count -= before - queue.len();
            if queue.is_empty() {
                self.by_peer.remove(&peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn cipher_suites_follow_upstreams_rules() {
        let (policy, left_out) = TlsPolicy::new(TlsVersion::Tls12, &names(&[])).unwrap();
        assert!(policy.tls12_suites().is_empty());
        assert!(left_out.is_empty());

        let (policy, left_out) = TlsPolicy::new(
            TlsVersion::Tls12,
            &names(&[
                " TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256 ",
                "",
                "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
                "TLS_AES_128_GCM_SHA256",
            ]),
        )
        .unwrap();
        assert_eq!(
            policy.tls12_suites(),
            &[CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256]
        );
        assert_eq!(left_out, ["TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA"]);

        let unknown = TlsPolicy::new(TlsVersion::Tls12, &names(&["INVALID_CIPHER_SUITE"]))
            .unwrap_err()
            .to_string();
        assert!(unknown.contains("unknown cipher suite"), "{unknown}");

        let with13 = TlsPolicy::new(
            TlsVersion::Tls13,
            &names(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]),
        )
        .unwrap_err()
        .to_string();
        assert!(with13.contains("VersionTLS13"), "{with13}");

        let nothing_left =
            TlsPolicy::new(TlsVersion::Tls12, &names(&["TLS_RSA_WITH_AES_128_CBC_SHA"]))
                .unwrap_err()
                .to_string();
        assert!(
            nothing_left.contains("no TLS 1.2 cipher suite"),
            "{nothing_left}"
        );
    }

    #[test]
    fn connections_are_capped_per_peer_then_in_all() {
        let limits = ConnectionLimits {
            per_peer: 2,
            total: 3,
        };
        assert_eq!(connection_fits(1, 2, &limits), Ok(()));
        assert_eq!(connection_fits(2, 2, &limits), Err(ConnectionCap::PerPeer));
        assert_eq!(connection_fits(2, 3, &limits), Err(ConnectionCap::PerPeer));
        assert_eq!(connection_fits(0, 3, &limits), Err(ConnectionCap::Total));

        let open = OpenConnections::new(limits);
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let a1 = open.admit(a).expect("first from a");
        let _a2 = open.admit(a).expect("second from a");
        let refused = open.admit(a).expect_err("a holds its cap");
        assert_eq!(
            (refused.cap, refused.from_peer, refused.limit),
            (ConnectionCap::PerPeer, 2, 2)
        );
        let _b1 = open.admit(b).expect("b has its own cap");
        let refused = open.admit(b).expect_err("the port holds its cap");
        assert_eq!(
            (refused.cap, refused.total, refused.limit),
            (ConnectionCap::Total, 3, 3)
        );
        assert_eq!((open.count(), open.gauge.get()), (3, 3));
        drop(a1);
        assert!(open.admit(a).is_ok(), "a place came back");
        let refused = |cap| open.refused.get_or_create(&CapLabels { cap }).get();
        assert_eq!((refused("per_peer"), refused("total")), (1, 1));
    }

    #[test]
    fn the_oldest_handshake_makes_room() {
        let limits = HandshakeLimits {
            timeout: Duration::from_secs(1),
            per_peer: 2,
            total: 3,
        };
        let mut pending = Pending::default();
        let a: IpAddr = [10, 0, 0, 1].into();
        let b: IpAddr = [10, 0, 0, 2].into();
        let (_, a0) = pending.admit(a, &limits, CancellationToken::new());
        let (a1_id, a1) = pending.admit(a, &limits, CancellationToken::new());
        let (_, a2) = pending.admit(a, &limits, CancellationToken::new());
        assert!(a0.is_cancelled(), "a peer's third drops its first");
        assert!(!a1.is_cancelled() && !a2.is_cancelled());
        let (_, b0) = pending.admit(b, &limits, CancellationToken::new());
        assert!(!b0.is_cancelled());
        let (_, b1) = pending.admit(b, &limits, CancellationToken::new());
        assert!(a1.is_cancelled(), "past the total, the oldest of all goes");
        assert!(!a2.is_cancelled() && !b0.is_cancelled() && !b1.is_cancelled());
        pending.finish(a, a1_id);
        assert_eq!(pending.count, 3);
    }
}
