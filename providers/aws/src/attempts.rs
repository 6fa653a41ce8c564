//! Every HTTP attempt the EC2 SDK makes, counted and classified: the SDK retries throttling and
//! server errors inside one call (standard mode, `AWS_MAX_ATTEMPTS`), so a call that succeeded on
//! its third attempt counts as one `ok` call in `cloud_api_calls` and leaves no trace of the two
//! throttled answers. This interceptor sees each attempt and counts it in `cloud_api_attempts`
//! (see [`CloudCalls::record_attempt`]); attempts beyond one per call are the SDK's retries.

use aws_sdk_ec2::config::interceptors::FinalizerInterceptorContextRef;
use aws_sdk_ec2::config::{ConfigBag, Intercept, RuntimeComponents};
use aws_smithy_runtime_api::client::orchestrator::Metadata;
use peerpods_provider_core::{CloudCalls, attempt_result};

use super::settings::NAME;

/// The operations this backend calls, as labels (label values are static and few).
const OPERATIONS: &[&str] = &[
    "DescribeAccountAttributes",
    "DescribeAddresses",
    "DescribeInstances",
    "DisassociateAddress",
    "ReleaseAddress",
    "TerminateInstances",
];

/// EC2 error codes that mean "slow down" (EC2 API reference, "Error codes"); EC2 answers them
/// with HTTP 503 (RequestLimitExceeded) or 400, not 429.
const THROTTLING_CODES: &[&str] = &[
    "RequestLimitExceeded",
    "Throttling",
    "ThrottlingException",
    "TooManyRequestsException",
    "RequestThrottled",
];

/// Counts each attempt in the shared [`CloudCalls`].
#[derive(Debug)]
pub struct AttemptCounter {
    calls: CloudCalls,
}

impl AttemptCounter {
    pub fn new(calls: CloudCalls) -> Self {
        AttemptCounter { calls }
    }
}

/// The attempt result of an EC2 answer: its HTTP status, and its error code where the body names
/// a throttling one.
pub fn classify(status: Option<u16>, body: Option<&[u8]>) -> &'static str {
    let throttling_code = body.is_some_and(|body| {
        let text = String::from_utf8_lossy(body);
        THROTTLING_CODES
            .iter()
            .any(|code| text.contains(&format!("<Code>{code}</Code>")))
    });
    match status {
        Some(s) if s >= 400 && throttling_code => "throttled",
        other => attempt_result(other),
    }
}

impl Intercept for AttemptCounter {
    fn name(&self) -> &'static str {
        "peerpods-attempt-counter"
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let operation = cfg
            .load::<Metadata>()
            .and_then(|m| OPERATIONS.iter().find(|op| **op == m.name()).copied())
            .unwrap_or("other");
        let response = context.response();
        let status = response.map(|r| r.status().as_u16());
        let body = response.and_then(|r| r.body().bytes());
        let result = classify(status, body);
        self.calls.record_attempt(NAME, operation, result);
        if result != "ok" {
            tracing::debug!(operation, result, status, "EC2 attempt failed");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ec2_throttling_is_told_by_its_code() {
        let throttled = b"<Response><Errors><Error><Code>RequestLimitExceeded</Code></Error></Errors></Response>";
        assert_eq!(classify(Some(503), Some(throttled)), "throttled");
        let overloaded =
            b"<Response><Errors><Error><Code>Unavailable</Code></Error></Errors></Response>";
        assert_eq!(classify(Some(503), Some(overloaded)), "server_error");
        assert_eq!(classify(Some(429), None), "throttled");
        assert_eq!(
            classify(Some(400), Some(b"<Code>InvalidInstanceID.NotFound</Code>")),
            "client_error"
        );
        assert_eq!(classify(Some(200), None), "ok");
        assert_eq!(classify(None, None), "transport_error");
    }
}
