//! The API server's own throttling, kept with its wait.
//!
//! kube turns an error answer into a [`kube::Error::Api`] carrying the server's `Status`, and reads the wait of a
//! 429 from `details.retryAfterSeconds`. But the throttling most often met, API Priority and Fairness (and the
//! max-in-flight filter), answers 429 in plain text ("Too many requests, please try again later.") with the wait
//! only in `Retry-After`: kube cannot parse the body, drops the headers, and the wait is lost. The client this
//! backend builds restates such an answer as the `Status` the API server gives a 429 of its own (apimachinery's
//! `NewTooManyRequests`), carrying that wait, so throttling goes back to the caller with the server's wait.

use http::header::{CONTENT_LENGTH, CONTENT_TYPE, RETRY_AFTER};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::Either;
use kube::client::Body;
use tower::ServiceBuilder;

/// A Kubernetes client over `service` (anything in front of the API server) whose plain-text 429s keep their
/// wait, as the client this backend builds for itself (see the module documentation).
pub fn client_over<S>(service: S, default_namespace: &str) -> kube::Client
where
    S: tower::Service<Request<Body>, Response = Response<Body>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<tower::BoxError>,
{
    kube::client::ClientBuilder::new(
        ServiceBuilder::new()
            .map_response(restate_plain_throttling::<Body>)
            .service(service),
        default_namespace,
    )
    .build()
}

/// A 429 whose body is not JSON and whose `Retry-After` is a number of seconds, as the `Status` the API server
/// sends for a 429 of its own; any other answer as it is.
pub fn restate_plain_throttling<B>(response: Response<B>) -> Response<Either<B, Body>> {
    let wait = (response.status() == StatusCode::TOO_MANY_REQUESTS && !is_json(response.headers()))
        .then(|| retry_after_seconds(response.headers()))
        .flatten();
    let Some(seconds) = wait else {
        return response.map(Either::Left);
    };
    let status = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": "Too many requests, please try again later.",
        "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": seconds},
        "code": 429,
    });
    let (mut parts, _plain_text) = response.into_parts();
    parts
        .headers
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    parts.headers.remove(CONTENT_LENGTH);
    Response::from_parts(
        parts,
        Either::Right(Body::from(status.to_string().into_bytes())),
    )
}

fn is_json(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"))
}

/// `Retry-After` in whole seconds (the API server never sends the HTTP-date form).
fn retry_after_seconds(headers: &HeaderMap) -> Option<u32> {
    headers.get(RETRY_AFTER)?.to_str().ok()?.trim().parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, content_type: &str, retry_after: Option<&str>) -> Response<Body> {
        let mut response = Response::new(Body::from(
            b"Too many requests, please try again later.\n".to_vec(),
        ));
        *response.status_mut() = StatusCode::from_u16(status).unwrap();
        response
            .headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_str(content_type).unwrap());
        if let Some(wait) = retry_after {
            response
                .headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from_str(wait).unwrap());
        }
        response
    }

    async fn body_of(response: Response<Either<Body, Body>>) -> serde_json::Value {
        use http_body_util::BodyExt;
        let bytes = response.into_body().collect().await.unwrap().to_bytes();
        serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
    }

    #[tokio::test]
    async fn a_plain_text_429_becomes_a_status_with_its_wait() {
        let restated =
            restate_plain_throttling(answer(429, "text/plain; charset=utf-8", Some("5")));
        assert_eq!(restated.status(), 429);
        let status = body_of(restated).await;
        assert_eq!(status["reason"], "TooManyRequests");
        assert_eq!(status["details"]["retryAfterSeconds"], 5);
        // And kube reads it as the API error it is.
        let parsed: kube::core::Status = serde_json::from_value(status).unwrap();
        assert_eq!(parsed.code, 429);
    }

    #[tokio::test]
    async fn other_answers_pass_unchanged() {
        for (status, content_type, wait) in [
            (429, "application/json", Some("5")),
            (429, "text/plain", None),
            (429, "text/plain", Some("Wed, 21 Oct 2015 07:28:00 GMT")),
            (503, "text/plain", Some("5")),
        ] {
            let restated = restate_plain_throttling(answer(status, content_type, wait));
            assert!(
                matches!(restated.body(), Either::Left(_)),
                "{status} {content_type} {wait:?}"
            );
        }
    }
}
