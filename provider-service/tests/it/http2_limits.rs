//! provider-service's HTTP/2 limits seen on the wire, by raw HTTP/2 clients over TLS that do what
//! no gRPC client does: the SETTINGS the server advertises carry its stream limit (read by the
//! `h2` crate's client); a rapid-reset flood (CVE-2023-44487) and a flood of streams the server
//! must reset for protocol errors (RUSTSEC-2024-0003), framed by hand, each close their connection
//! with GOAWAY ENHANCE_YOUR_CALM, and a caller connecting afterwards is served.
//!
//! The floods are written in batches of at most one TLS record, each followed by a PING, and the
//! client writes nothing more until the PING's answer or a GOAWAY: the server reads a whole batch
//! before it answers. A client still writing when the server closes would lose the GOAWAY to the
//! TCP reset its unread bytes cause (seen as `EPIPE`).

use std::sync::Arc;

use peerpods_proto::v1 as pb;
use peerpods_provider_client::{ProviderClientConfig, connect};
use provider_service::auth::Grant;
use provider_service::server::MAX_STREAMS_PER_CONNECTION;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName};

const AUDIENCE: &str = "provider-service";

/// provider-service over TLS with a self-signed `localhost` certificate, its callers reviewed by
/// `admin`'s API server; returns the server, the certificate's DER and the directories to hold.
async fn start_tls(
    admin: &kube::Client,
    grants: Vec<Grant>,
) -> (
    crate::common::TestServer,
    Vec<u8>,
    tempfile::TempDir,
    tempfile::TempDir,
) {
    let certs = tempfile::tempdir().unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
        .unwrap()
        .self_signed(&key)
        .unwrap();
    std::fs::write(certs.path().join("cert.pem"), cert.pem()).unwrap();
    std::fs::write(certs.path().join("key.pem"), key.serialize_pem()).unwrap();
    std::fs::write(certs.path().join("ca.pem"), cert.pem()).unwrap();
    let dir = crate::common::libvirt_config_dir();
    let server = crate::common::start(
        dir.path(),
        crate::common::Options {
            tls: Some((certs.path().join("cert.pem"), certs.path().join("key.pem"))),
            auth: crate::common::CallerAuth::TokenReview {
                client: Some(admin.clone()),
                audience: AUDIENCE.into(),
                grants,
            },
            ..crate::common::Options::development()
        },
    )
    .await;
    (server, cert.der().to_vec(), certs, dir)
}

/// A TLS connection to `server` offering only HTTP/2 (ALPN `h2`), as gRPC clients connect.
async fn tls(server: &crate::common::TestServer, der: &[u8]) -> TlsStream<tokio::net::TcpStream> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from(der.to_vec())).unwrap();
    let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").unwrap(), tcp)
        .await
        .unwrap()
}

/// HTTP/2 frame types and flags (RFC 9113, section 6).
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const ACK: u8 = 0x1;
const CANCEL: u32 = 0x8;
const ENHANCE_YOUR_CALM: u32 = 0xb;

/// A request head in HPACK: `:method POST`, `:scheme https`, `:path /`, all from the static
/// table (RFC 7541, appendix A). The path is never served: the server drops each stream first.
const REQUEST: [u8; 3] = [0x83, 0x87, 0x84];
/// `content-length: 5`, a literal without indexing on the static table's name (index 28).
const CONTENT_LENGTH_5: [u8; 4] = [0x0f, 0x0d, 0x01, b'5'];

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let length = u32::try_from(payload.len()).unwrap().to_be_bytes();
    let mut frame = length[1..].to_vec();
    frame.extend([kind, flags]);
    frame.extend(stream.to_be_bytes());
    frame.extend(payload);
    frame
}

/// How the server answered a batch.
#[derive(Debug, PartialEq)]
enum Answer {
    /// The PING after it: the server read the batch and kept the connection.
    Pong,
    GoAway {
        error: u32,
        debug: String,
    },
    /// The connection ended without a GOAWAY.
    Closed(String),
}

/// An HTTP/2 connection framed by hand: streams opened in order, frames read until an answer.
struct RawH2 {
    tls: TlsStream<tokio::net::TcpStream>,
    next_stream: u32,
    batches: u64,
}

impl RawH2 {
    async fn connect(server: &crate::common::TestServer, der: &[u8]) -> RawH2 {
        let mut tls = tls(server, der).await;
        let mut preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec();
        preface.extend(frame(SETTINGS, 0, 0, &[]));
        tls.write_all(&preface).await.unwrap();
        RawH2 {
            tls,
            next_stream: 1,
            batches: 0,
        }
    }

    /// Frames of `count` new streams, each `stream(id)`'s frames.
    fn streams(&mut self, count: usize, stream: impl Fn(u32) -> Vec<u8>) -> Vec<u8> {
        let mut batch = Vec::new();
        for _ in 0..count {
            batch.extend(stream(self.next_stream));
            self.next_stream += 2;
        }
        batch
    }

    /// Writes `batch` and a PING behind it at once, then reads until the server answers.
    async fn send(&mut self, mut batch: Vec<u8>) -> Answer {
        self.batches += 1;
        let opaque = self.batches.to_be_bytes();
        batch.extend(frame(PING, 0, 0, &opaque));
        if let Err(e) = self.tls.write_all(&batch).await {
            return Answer::Closed(format!("write: {e}"));
        }
        loop {
            let mut head = [0u8; 9];
            if let Err(e) = self.tls.read_exact(&mut head).await {
                return Answer::Closed(format!("read: {e}"));
            }
            let length = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
            let mut payload = vec![0u8; length];
            if let Err(e) = self.tls.read_exact(&mut payload).await {
                return Answer::Closed(format!("read: {e}"));
            }
            match (head[3], head[4]) {
                (GOAWAY, _) => {
                    return Answer::GoAway {
                        error: u32::from_be_bytes(payload[4..8].try_into().unwrap()),
                        debug: String::from_utf8_lossy(&payload[8..]).into_owned(),
                    };
                }
                (PING, ACK) if payload == opaque => return Answer::Pong,
                // SETTINGS, its ACK, WINDOW_UPDATE, RST_STREAM, a keepalive PING: not an answer.
                _ => {}
            }
        }
    }
}

/// A fresh caller, as CAA connects (TLS, its projected token in a file), deletes an instance.
async fn a_fresh_caller_is_served(
    server: &crate::common::TestServer,
    certs: &tempfile::TempDir,
    token: &str,
) {
    let token_file = certs.path().join("token");
    std::fs::write(&token_file, token).unwrap();
    let mut caa = connect(&ProviderClientConfig {
        endpoint: format!("https://{}", server.addr),
        ca_file: Some(certs.path().join("ca.pem")),
        tls_server_name: Some("localhost".into()),
        token_file: Some(token_file),
        ..Default::default()
    })
    .unwrap();
    let deleted = caa
        .delete_instance(pb::DeleteInstanceRequest {
            cloud_provider: "libvirt".into(),
            instance_id: "2f0c1c55-8d7e-4f43-a4b6-1f9e6c0b7a11".into(),
            requester: None,
            accept_in_progress: true,
        })
        .await
        .expect("a caller connecting after the flood is served");
    assert!(
        matches!(
            deleted.get_ref().result(),
            pb::DeleteResult::AlreadyGone | pb::DeleteResult::InProgress
        ),
        "{deleted:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn the_servers_settings_advertise_its_stream_limit() {
    let admin = testenv::shared().client().await;
    let (server, der, _certs, _dir) = start_tls(&admin, Vec::new()).await;
    let (_send, mut connection) = h2::client::Builder::new()
        .handshake::<_, &'static [u8]>(tls(&server, &der).await)
        .await
        .unwrap();
    // The server's SETTINGS are its first frame: once a PING is answered, they have been applied.
    let mut ping_pong = connection.ping_pong().unwrap();
    tokio::select! {
        ended = &mut connection => panic!("the connection ended: {ended:?}"),
        pong = ping_pong.ping(h2::Ping::opaque()) => pong.expect("PING answered"),
    };
    assert_eq!(
        connection.max_concurrent_send_streams(),
        MAX_STREAMS_PER_CONNECTION as usize,
        "SETTINGS_MAX_CONCURRENT_STREAMS (h2's client assumes no limit when none is advertised)"
    );
}

/// Sends batches of `per_batch` streams, each stream's frames `stream(id)`, at most `batches`
/// of them, until the server answers one otherwise than with the PING behind it.
async fn flood(
    connection: &mut RawH2,
    batches: usize,
    per_batch: usize,
    stream: impl Fn(u32) -> Vec<u8>,
) -> Answer {
    for _ in 0..batches {
        let batch = connection.streams(per_batch, &stream);
        // One TLS record at most (16 KiB), so the server reads a batch as a whole.
        assert!(batch.len() < 16 * 1024 - 64, "{} bytes", batch.len());
        match connection.send(batch).await {
            Answer::Pong => continue,
            other => return other,
        }
    }
    Answer::Pong
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rapid_reset_flood_is_closed_with_goaway_and_a_fresh_caller_is_served() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-rapid-reset").await;
    let grants: Vec<Grant> = vec![format!("{ns}/caa=DeleteInstance").parse().unwrap()];
    let (server, der, certs, _dir) = start_tls(&admin, grants).await;
    let token = testenv::service_account_token(&admin, &ns, "caa", &[AUDIENCE]).await;

    // Each stream opened and reset at once (HEADERS, then RST_STREAM), 100 a batch, 5000 in all:
    // 250 times the 20 resets of streams not yet accepted that the server bears.
    let mut connection = RawH2::connect(&server, &der).await;
    let answer = flood(&mut connection, 50, 100, |id| {
        let mut frames = frame(HEADERS, END_HEADERS, id, &REQUEST);
        frames.extend(frame(RST_STREAM, 0, id, &CANCEL.to_be_bytes()));
        frames
    })
    .await;
    assert_eq!(
        answer,
        Answer::GoAway {
            error: ENHANCE_YOUR_CALM,
            debug: "too_many_resets".into()
        },
        "after {} batches",
        connection.batches
    );

    a_fresh_caller_is_served(&server, &certs, &token).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_streams_reset_for_protocol_errors_is_closed_with_goaway() {
    let cp = testenv::shared();
    let admin = cp.client().await;
    let ns = testenv::namespace(&admin, "provider-error-resets").await;
    let grants: Vec<Grant> = vec![format!("{ns}/caa=DeleteInstance").parse().unwrap()];
    let (server, der, certs, _dir) = start_tls(&admin, grants).await;
    let token = testenv::service_account_token(&admin, &ns, "caa", &[AUDIENCE]).await;

    // Each stream announces a 5-byte body and sends 10: the server resets it (PROTOCOL_ERROR)
    // before any service sees it. 400 a batch, 4000 in all: about four times the 1024 such resets
    // the server bears on one connection.
    let mut connection = RawH2::connect(&server, &der).await;
    let answer = flood(&mut connection, 10, 400, |id| {
        let mut head = REQUEST.to_vec();
        head.extend(CONTENT_LENGTH_5);
        let mut frames = frame(HEADERS, END_HEADERS, id, &head);
        frames.extend(frame(DATA, END_STREAM, id, b"0123456789"));
        frames
    })
    .await;
    assert_eq!(
        answer,
        Answer::GoAway {
            error: ENHANCE_YOUR_CALM,
            debug: "too_many_internal_resets".into()
        },
        "after {} batches",
        connection.batches
    );

    a_fresh_caller_is_served(&server, &certs, &token).await;
}
