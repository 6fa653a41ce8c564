//! How the AWS provider reports a cloud it cannot use: unreachable, throttling, refusing our
//! credentials. Secrets never show up in what callers see.

use std::time::Duration;

use crate::aws_support::{SECRET_ACCESS_KEY, closed_port, config_for, unknown_id};
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::CloudCalls;
use peerpods_provider_core::Error;
use peerpods_provider_core::Provider;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// No retries inside the SDK: each test checks the answer of one attempt.
const ONE_ATTEMPT: (&str, &str) = ("AWS_MAX_ATTEMPTS", "1");

#[tokio::test(flavor = "multi_thread")]
async fn an_unreachable_endpoint_is_unavailable() {
    let endpoint = format!("http://127.0.0.1:{}", closed_port());
    let provider = AwsProvider::from_config(
        &config_for(&endpoint, &[ONE_ATTEMPT]),
        CloudCalls::default(),
    )
    .await
    .expect("provider");

    let error = provider
        .delete_instance(&unknown_id(7))
        .await
        .expect_err("nothing listens there");

    assert!(matches!(error, Error::Unavailable { .. }), "{error:?}");
    assert!(!error.to_string().contains(SECRET_ACCESS_KEY), "{error}");
    assert!(
        !format!("{error:?}").contains(SECRET_ACCESS_KEY),
        "{error:?}"
    );
    let health = provider.health().await;
    assert!(!health.healthy);
    assert!(
        !health.message.contains(SECRET_ACCESS_KEY),
        "{}",
        health.message
    );
    let list = provider.list_instances(&Default::default()).await;
    assert!(matches!(list, Err(Error::Unavailable { .. })), "{list:?}");
}

/// EC2's throttling answer, as EC2 sends it. moto cannot throttle on demand, so this one error
/// path uses a scripted endpoint (see the project's testing rules).
const THROTTLED: &str = "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>\
<Code>RequestLimitExceeded</Code><Message>Request limit exceeded.</Message></Error></Errors>\
<RequestID>5b4d0bc5-0000-4000-8000-000000000000</RequestID></Response>";

/// Answers every request with `status` and `body`, on 127.0.0.1; stops with the test runtime.
async fn scripted_ec2(status: &'static str, body: &'static str) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let endpoint = format!("http://{}", listener.local_addr().expect("addr"));
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                if read_request(&mut socket).await.is_none() {
                    return;
                }
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Type: text/xml\r\nContent-Length: {}\r\n\
                     Connection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
                let _ = socket.shutdown().await;
            });
        }
    });
    endpoint
}

/// Reads one HTTP/1.1 request (headers and a Content-Length body) so that the answer is not
/// cut short by unread bytes.
async fn read_request(socket: &mut tokio::net::TcpStream) -> Option<()> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let n = socket.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buffer.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buffer);
        if let Some(end) = text.find("\r\n\r\n") {
            let length = text[..end]
                .lines()
                .find_map(|line| {
                    let (name, value) = line.split_once(':')?;
                    name.eq_ignore_ascii_case("content-length")
                        .then(|| value.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if buffer.len() >= end + 4 + length {
                return Some(());
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn throttling_asks_the_caller_to_retry_later() {
    let endpoint = scripted_ec2("503 Service Unavailable", THROTTLED).await;
    let provider = AwsProvider::from_config(
        &config_for(&endpoint, &[ONE_ATTEMPT]),
        CloudCalls::default(),
    )
    .await
    .expect("provider");

    let error = provider
        .delete_instance(&unknown_id(8))
        .await
        .expect_err("throttled");

    match error {
        Error::Throttled { retry_after, .. } => assert!(retry_after >= Duration::from_secs(1)),
        other => panic!("expected Throttled, got {other:?}"),
    }
    // The first call of a deletion reads the instances' tags (the do-not-delete and owner check);
    // throttled there, nothing else is tried.
    assert_eq!(provider.api_calls("DescribeInstances"), 1);
    assert_eq!(provider.api_calls("DescribeAddresses"), 0);
    assert_eq!(provider.api_calls("TerminateInstances"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_garbage_answer_is_unavailable_not_a_panic() {
    let endpoint = scripted_ec2("200 OK", "this is not EC2").await;
    let provider = AwsProvider::from_config(
        &config_for(&endpoint, &[ONE_ATTEMPT]),
        CloudCalls::default(),
    )
    .await
    .expect("provider");

    let result = provider.delete_instance(&unknown_id(9)).await;

    assert!(
        matches!(
            result,
            Err(Error::Unavailable { .. } | Error::Internal { .. })
        ),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn incomplete_static_credentials_name_the_missing_key() {
    let config = peerpods_provider_core::ProviderConfig::from_pairs([
        ("AWS_REGION", "us-east-1"),
        ("AWS_ACCESS_KEY_ID", "AKIDTESTPEERPODS"),
    ]);
    match AwsProvider::from_config(&config, CloudCalls::default()).await {
        Err(Error::Config { key, .. }) => assert_eq!(key, "AWS_SECRET_ACCESS_KEY"),
        Err(other) => panic!("expected a config error, got {other:?}"),
        Ok(_) => panic!("expected a config error"),
    }
}
