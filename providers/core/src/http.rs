//! What an HTTP answer of a cloud's REST API means for the caller (pure), shared by the backends
//! that speak REST: one mapping of status codes and `Retry-After`, so every cloud reports
//! throttling, outages and refused credentials the same way.

use std::time::Duration;

use http::StatusCode;

use crate::Error;
use crate::provider::DEFAULT_RETRY_AFTER;

/// The wait a `Retry-After` header value asks for: delta-seconds or an HTTP-date (RFC 9110
/// §10.2.3), measured from `now`. `None` when absent or unreadable.
pub fn retry_after(value: Option<&str>, now: jiff::Timestamp) -> Option<Duration> {
    let value = value?.trim();
    if let Ok(seconds) = value.parse::<u64>() {
        return Some(Duration::from_secs(seconds));
    }
    // IMF-fixdate ("Sun, 06 Nov 1994 08:49:37 GMT") is an RFC 2822 date.
    let at = jiff::fmt::rfc2822::parse(value).ok()?.timestamp();
    let wait = at.duration_since(now);
    Some(Duration::try_from(wait).unwrap_or(Duration::ZERO))
}

/// The error for a non-success answer. `message` is the cloud's own text (already redacted);
/// `operation` names the call for the reader, e.g. `deleting virtual machine vm-1`.
///
/// - 429 → [`Error::Throttled`] with the cloud's wait, or [`DEFAULT_RETRY_AFTER`];
/// - 401 → [`Error::CloudUnauthenticated`]: this service's credentials are wrong or expired;
/// - 403 → [`Error::CloudPermissionDenied`]: they lack a permission;
/// - 408, 5xx → [`Error::Unavailable`];
/// - anything else → [`Error::Internal`] (a request this service should not have sent).
pub fn status_error(
    status: StatusCode,
    retry_after: Option<Duration>,
    operation: &str,
    message: &str,
) -> Error {
    let message = format!("{operation}: HTTP {}: {message}", status.as_u16());
    match status {
        StatusCode::TOO_MANY_REQUESTS => {
            Error::throttled(retry_after.unwrap_or(DEFAULT_RETRY_AFTER), message)
        }
        StatusCode::UNAUTHORIZED => Error::cloud_unauthenticated(message),
        StatusCode::FORBIDDEN => Error::cloud_permission_denied(message),
        StatusCode::REQUEST_TIMEOUT => Error::unavailable(message),
        s if s.is_server_error() => Error::unavailable(message),
        _ => Error::internal(message),
    }
}

/// The error for a request that got no answer (connect, TLS, timeout, broken body). The message
/// spells out the whole chain (a gRPC caller sees only the message); the error itself is the source,
/// so a log walking the chain reaches the transport's own cause.
pub fn transport_error(
    operation: &str,
    error: impl std::error::Error + Send + Sync + 'static,
) -> Error {
    let mut message = format!("{operation}: {error}");
    let mut source = error.source();
    while let Some(s) = source {
        message.push_str(": ");
        message.push_str(&s.to_string());
        source = s.source();
    }
    Error::unavailable(message).with_source(error)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now() -> jiff::Timestamp {
        "1994-11-06T08:49:30Z".parse().expect("timestamp")
    }

    /// A transport error whose cause is the socket's own error, as an HTTP client reports a refused
    /// connection.
    #[derive(Debug)]
    struct ConnectFailed(std::io::Error);

    impl std::fmt::Display for ConnectFailed {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("error sending request")
        }
    }

    impl std::error::Error for ConnectFailed {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_transport_error_keeps_its_chain_down_to_the_socket() {
        let refused =
            std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "connection refused");
        let error = transport_error("listing instances", ConnectFailed(refused));

        assert_eq!(
            error.to_string(),
            "cloud unavailable: listing instances: error sending request: connection refused"
        );
        let mut chain = std::iter::successors(std::error::Error::source(&error), |e| e.source());
        assert!(chain.next().is_some_and(|e| e.is::<ConnectFailed>()));
        let socket = chain
            .next()
            .and_then(|e| e.downcast_ref::<std::io::Error>())
            .expect("the chain reaches the socket's error");
        assert_eq!(socket.kind(), std::io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn retry_after_reads_seconds_and_dates() {
        assert_eq!(retry_after(Some("7"), now()), Some(Duration::from_secs(7)));
        assert_eq!(
            retry_after(Some("Sun, 06 Nov 1994 08:49:37 GMT"), now()),
            Some(Duration::from_secs(7))
        );
        // A date in the past means "now", not a negative wait.
        assert_eq!(
            retry_after(Some("Sun, 06 Nov 1994 08:00:00 GMT"), now()),
            Some(Duration::ZERO)
        );
        assert_eq!(retry_after(Some("soon"), now()), None);
        assert_eq!(retry_after(None, now()), None);
    }

    #[test]
    fn statuses_map_to_what_the_caller_can_do() {
        let e = status_error(
            StatusCode::TOO_MANY_REQUESTS,
            Some(Duration::from_secs(3)),
            "deleting vm",
            "slow down",
        );
        assert!(
            matches!(e, Error::Throttled { retry_after, .. } if retry_after == Duration::from_secs(3))
        );
        let e = status_error(StatusCode::TOO_MANY_REQUESTS, None, "op", "");
        assert!(
            matches!(e, Error::Throttled { retry_after, .. } if retry_after == DEFAULT_RETRY_AFTER)
        );
        assert_eq!(
            status_error(StatusCode::UNAUTHORIZED, None, "op", "").reason(),
            "CloudUnauthenticated"
        );
        assert_eq!(
            status_error(StatusCode::FORBIDDEN, None, "op", "").reason(),
            "CloudPermissionDenied"
        );
        for s in [500, 502, 503, 504, 408] {
            let s = StatusCode::from_u16(s).expect("status");
            assert_eq!(status_error(s, None, "op", "").reason(), "CloudUnavailable");
        }
        let e = status_error(StatusCode::BAD_REQUEST, None, "deleting vm", "bad body");
        assert_eq!(e.reason(), "Internal");
        assert_eq!(e.to_string(), "internal: deleting vm: HTTP 400: bad body");
    }
}
