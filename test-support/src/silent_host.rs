//! A TCP host that accepts every connection and never says a word: a hung libvirt (`qemu+tcp`) host,
//! or any server that stopped answering after the handshake.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// A silent host on 127.0.0.1. It holds every connection open until it is dropped.
pub struct SilentHost {
    port: u16,
    accepted: Arc<AtomicUsize>,
    holder: JoinHandle<()>,
}

impl SilentHost {
    /// Listens on a free port of 127.0.0.1.
    ///
    /// # Panics
    /// When no port can be bound: for tests.
    pub async fn start() -> SilentHost {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("bind a silent host: {e}"));
        let port = listener
            .local_addr()
            .unwrap_or_else(|e| panic!("a silent host's address: {e}"))
            .port();
        let accepted = Arc::new(AtomicUsize::new(0));
        let holder = tokio::spawn({
            let accepted = accepted.clone();
            async move {
                let mut held = Vec::new();
                while let Ok((socket, _)) = listener.accept().await {
                    accepted.fetch_add(1, Ordering::SeqCst);
                    held.push(socket);
                }
            }
        });
        SilentHost {
            port,
            accepted,
            holder,
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A libvirt URI for this host.
    pub fn libvirt_uri(&self) -> String {
        format!("qemu+tcp://127.0.0.1:{}/system", self.port)
    }

    /// How many connections it has accepted so far.
    pub fn connections(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }
}

impl Drop for SilentHost {
    fn drop(&mut self) {
        self.holder.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn accepts_and_never_answers() {
        let host = SilentHost::start().await;
        let mut client = tokio::net::TcpStream::connect(("127.0.0.1", host.port()))
            .await
            .expect("connect");
        let mut byte = [0u8; 1];
        let read = tokio::time::timeout(
            std::time::Duration::from_millis(200),
            client.read(&mut byte),
        )
        .await;
        assert!(read.is_err(), "the host said something: {read:?}");
        assert_eq!(host.connections(), 1);
    }
}
