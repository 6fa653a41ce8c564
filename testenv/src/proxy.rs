//! A TCP proxy on 127.0.0.1 in front of another local address that a test can turn into a black hole: from
//! then on connections are still accepted and every connection stays open, but nothing is forwarded in either
//! direction, as when a network drops packets without resetting anything. Clients see requests that never
//! get an answer, not errors. The proxy and every connection through it end when the [`Proxy`] is dropped.

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};

/// A running proxy. See the module documentation.
pub struct Proxy {
    addr: SocketAddr,
    black_holed: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<Proxy> {
        let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
        let addr = listener.local_addr()?;
        let (black_holed, mode) = watch::channel(false);
        let task = tokio::spawn(async move {
            // Owned here, so dropping the accept loop drops (aborts) every connection.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((inbound, _)) => {
                            connections.spawn(serve(inbound, target, mode.clone()));
                        }
                        Err(_) => return,
                    },
                    // Reap finished connections so the set does not grow.
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
        Ok(Proxy {
            addr,
            black_holed,
            task,
        })
    }

    /// Where clients connect: `127.0.0.1:<port>`.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on forwards nothing: open connections hang, new ones are accepted and hang too.
    pub fn black_hole(&self) {
        self.black_holed.send_replace(true);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut inbound: TcpStream, target: SocketAddr, mut black_holed: watch::Receiver<bool>) {
    if *black_holed.borrow_and_update() {
        // Accepted, never answered; held until the proxy ends.
        return std::future::pending().await;
    }
    let Ok(mut outbound) = TcpStream::connect(target).await else {
        return;
    };
    let hole = tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => false,
        _ = black_holed.wait_for(|hole| *hole) => true,
    };
    if hole {
        // Both sockets stay open and silent: the client waits for an answer that never comes.
        let _held = (inbound, outbound);
        std::future::pending::<()>().await;
    }
}
