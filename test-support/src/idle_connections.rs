//! Idle TCP connections held open against a listener, to show that a client finishing its handshake
//! is served beside them (a listener that waits for idle handshakes to give up before accepting
//! again serves it only after closing some).
#![allow(clippy::unwrap_used)] // test support: a failed step ends the test with its message

use std::io::{ErrorKind, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};

use tokio::net::TcpSocket;

/// Idle connections held open, from this many loopback addresses (each under the per-peer
/// handshake bound, so the listener has no reason to drop any: the new client must be served
/// beside them, not instead of one).
pub const IDLE: usize = 500;
pub const IDLE_PEERS: usize = 10;

/// Opens `IDLE` TCP connections to `addr` that never send a byte, as plain sockets to probe.
pub async fn hold_idle(addr: SocketAddr) -> Vec<TcpStream> {
    let mut idle = Vec::with_capacity(IDLE);
    for i in 0..IDLE {
        let socket = TcpSocket::new_v4().unwrap();
        let source = Ipv4Addr::new(127, 0, 0, 2 + (i % IDLE_PEERS) as u8);
        socket.bind(SocketAddr::from((source, 0))).unwrap();
        idle.push(socket.connect(addr).await.unwrap().into_std().unwrap());
    }
    idle
}

/// How many of `idle` the server has closed (end of file or reset); the others are still open and
/// silent.
pub fn closed_by_server(idle: &mut [TcpStream]) -> usize {
    let mut closed = 0;
    for socket in idle.iter_mut() {
        let mut byte = [0u8; 1];
        if !matches!(socket.read(&mut byte), Err(e) if e.kind() == ErrorKind::WouldBlock) {
            closed += 1;
        }
    }
    closed
}
