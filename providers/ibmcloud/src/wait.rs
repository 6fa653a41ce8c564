//! Waiting, bounded, for an asynchronous deletion to finish.

use std::future::Future;
use std::time::Duration;

use peerpods_provider_core::Error;

/// Asks `gone` every `poll` until it says yes (`Ok(true)`) or `timeout` has passed
/// (`Ok(false)`: the cloud accepted the deletion but still shows the resource). Errors end the
/// wait at once.
pub async fn until_gone<F, Fut>(
    timeout: Duration,
    poll: Duration,
    mut gone: F,
) -> Result<bool, Error>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool, Error>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if gone().await? {
            return Ok(true);
        }
        if tokio::time::Instant::now() + poll > deadline {
            return Ok(false);
        }
        tokio::time::sleep(poll).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn stops_when_gone_or_when_time_is_up() {
        let mut asked = 0;
        let gone = until_gone(Duration::from_secs(10), Duration::from_millis(1), || {
            asked += 1;
            let now = asked;
            async move { Ok(now >= 3) }
        })
        .await;
        assert_eq!(gone.ok(), Some(true));
        assert_eq!(asked, 3);

        let mut asked = 0;
        let gone = until_gone(Duration::from_millis(50), Duration::from_millis(20), || {
            asked += 1;
            async { Ok(false) }
        })
        .await;
        assert_eq!(gone.ok(), Some(false));
        assert!((2..=3).contains(&asked), "{asked}");
    }
}
