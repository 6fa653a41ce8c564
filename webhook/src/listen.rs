//! Listen addresses written the Go way, as upstream's flags take them (`--health-probe-bind-address=:8081`):
//! `:port` is every interface, `host:port` one address, and `0` turns the listener off (controller-runtime's
//! meaning).

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::str::FromStr;

use tokio::net::TcpListener;

use crate::Error;

/// Where to listen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ListenAddr {
    /// `:port`: every interface, IPv6 and IPv4.
    AnyInterface(u16),
    /// `ip:port` or `[ipv6]:port`.
    Socket(SocketAddr),
    /// `0`: not at all.
    Off,
}

impl FromStr for ListenAddr {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self, Error> {
        let fail = |problem| Error::ListenAddress {
            address: text.to_owned(),
            problem,
        };
        if text == "0" {
            return Ok(ListenAddr::Off);
        }
        if let Some(port) = text.strip_prefix(':') {
            return port
                .parse()
                .map(ListenAddr::AnyInterface)
                .map_err(|_| fail("the port is not a number from 0 to 65535"));
        }
        if let Some(port) = text.strip_prefix("localhost:") {
            let port = port
                .parse()
                .map_err(|_| fail("the port is not a number from 0 to 65535"))?;
            return Ok(ListenAddr::Socket(SocketAddr::from((
                Ipv4Addr::LOCALHOST,
                port,
            ))));
        }
        text.parse()
            .map(ListenAddr::Socket)
            .map_err(|_| fail("expected :port, ip:port, [ipv6]:port or 0"))
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ListenAddr::AnyInterface(port) => write!(f, ":{port}"),
            ListenAddr::Socket(addr) => write!(f, "{addr}"),
            ListenAddr::Off => f.write_str("0"),
        }
    }
}

impl ListenAddr {
    /// Binds the address; `None` when it is [`ListenAddr::Off`]. Every interface is `[::]`, which on Linux also
    /// takes IPv4, falling back to `0.0.0.0` where the node has no IPv6.
    pub async fn bind(self, what: &str) -> Result<Option<TcpListener>, Error> {
        let bind = |addr: SocketAddr| async move {
            TcpListener::bind(addr)
                .await
                .map_err(|e| Error::io(format!("binding the {what} port to {addr}"), e))
        };
        match self {
            ListenAddr::Off => Ok(None),
            ListenAddr::Socket(addr) => bind(addr).await.map(Some),
            ListenAddr::AnyInterface(port) => {
                match TcpListener::bind((Ipv6Addr::UNSPECIFIED, port)).await {
                    Ok(listener) => Ok(Some(listener)),
                    Err(e) => {
                        tracing::debug!(error = %e, port, "no IPv6 listener; listening on IPv4 only");
                        bind(SocketAddr::from((Ipv4Addr::UNSPECIFIED, port)))
                            .await
                            .map(Some)
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_style_addresses() {
        let parse = |s: &str| s.parse::<ListenAddr>().unwrap();
        assert_eq!(parse(":8081"), ListenAddr::AnyInterface(8081));
        assert_eq!(parse("0"), ListenAddr::Off);
        assert_eq!(
            parse("127.0.0.1:9443"),
            ListenAddr::Socket("127.0.0.1:9443".parse().unwrap())
        );
        assert_eq!(
            parse("[::1]:9443"),
            ListenAddr::Socket("[::1]:9443".parse().unwrap())
        );
        assert_eq!(
            parse("localhost:8080"),
            ListenAddr::Socket("127.0.0.1:8080".parse().unwrap())
        );
        assert_eq!(parse(":0"), ListenAddr::AnyInterface(0));
        for bad in [
            "",
            ":",
            ":http",
            ":70000",
            "8081",
            "example.com:80",
            "1.2.3.4",
        ] {
            let error = bad.parse::<ListenAddr>().unwrap_err();
            assert_eq!(error.reason(), "ListenAddress", "{bad}");
        }
        for text in [":8081", "0", "127.0.0.1:9443", "[::1]:9443"] {
            assert_eq!(parse(text).to_string(), text);
        }
    }

    #[tokio::test]
    async fn every_interface_takes_ipv4_connections() {
        let listener = ListenAddr::AnyInterface(0)
            .bind("test")
            .await
            .unwrap()
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let accept = tokio::spawn(async move { listener.accept().await.map(|_| ()) });
        tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))
            .await
            .unwrap();
        accept.await.unwrap().unwrap();
        assert!(ListenAddr::Off.bind("test").await.unwrap().is_none());
    }
}
