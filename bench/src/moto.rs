//! moto (an EC2 emulator) for the bench: test-support's moto server, one of the run's own per scenario, with its
//! log in the run's log directory, and the bench's EC2 helpers on top of it.
//!
//! Cloud calls are counted on the cloud's side: the layer test-support serves in front of moto counts every
//! request by EC2 `Action` and by the access key that signed it. provider-service signs with
//! [`PROVIDER_ACCESS_KEY_ID`], the bench's own arranging and polling with test-support's key, so the figure counts
//! provider-service's requests only, SDK retries included.

use std::collections::BTreeMap;
use std::path::Path;

use aws_sdk_ec2::types::{Filter, InstanceType};
pub use test_support::moto::Moto;

use crate::Error;

/// provider-service's credentials: requests signed with this key are the ones the cloud-call figure counts.
pub const PROVIDER_ACCESS_KEY_ID: &str = "AKIDPROVIDERSERVICE";
const PROVIDER_SECRET_ACCESS_KEY: &str = "provider-secret-not-a-real-key";
/// An AMI moto knows in every region.
const IMAGE_ID: &str = test_support::moto::IMAGE_ID;
/// Instances per RunInstances call while arranging a storm.
const LAUNCH_CHUNK: usize = 100;

/// Starts a moto server of the run's own with `python` (`make moto`'s venv), its log `moto.log` in `log_dir`.
/// A Python that cannot be run is [`Error::Missing`]: the scenario is skipped, saying how to install moto.
pub async fn start(python: &Path, log_dir: &Path) -> Result<Moto, Error> {
    std::fs::create_dir_all(log_dir)
        .map_err(|e| Error::io(format!("creating {}", log_dir.display()), e))?;
    let python = python.to_owned();
    let log_path = log_dir.join("moto.log");
    // Starting waits for moto to print its port (a second or two of Python imports): not on the runtime's
    // threads.
    tokio::task::spawn_blocking(move || Moto::start(&python, &log_path, &[]))
        .await
        .map_err(|e| Error::setup_from("starting moto", e))?
        .map_err(not_started)
}

/// The shared moto server of this process (test-support's), for the scenarios that drive its fault layer.
pub fn shared() -> Result<&'static Moto, Error> {
    test_support::moto::shared(&[]).map_err(not_started)
}

/// Why moto is not there: missing (how to install it), or failed to start.
fn not_started<E>(error: E) -> Error
where
    E: std::borrow::Borrow<test_support::Error> + std::error::Error + Send + Sync + 'static,
{
    if let test_support::Error::MotoMissing { .. } = error.borrow() {
        return Error::Missing {
            what: "moto".into(),
            hint: error.to_string(),
            source: Some(Box::new(error)),
        };
    }
    Error::Start {
        name: "moto".into(),
        message: String::new(),
        source: Some(Box::new(error)),
    }
}

/// EC2 requests moto has received so far that provider-service signed, by action (retries included).
pub fn provider_requests(moto: &Moto) -> BTreeMap<String, u64> {
    moto.requests_signed_by(PROVIDER_ACCESS_KEY_ID)
}

/// provider-service's configuration keys for `moto` (cloud-api-adaptor's names), with provider-service's own
/// credentials.
pub fn provider_config(moto: &Moto) -> Vec<(String, String)> {
    moto.config(&[
        ("AWS_ACCESS_KEY_ID", PROVIDER_ACCESS_KEY_ID),
        ("AWS_SECRET_ACCESS_KEY", PROVIDER_SECRET_ACCESS_KEY),
        // The bench's instances carry no cluster tag: deleting them is allowed explicitly.
        ("DELETE_UNTAGGED", "allow"),
    ])
}

/// Launches `count` running instances; returns their ids.
pub async fn run_instances(
    client: &aws_sdk_ec2::Client,
    count: usize,
) -> Result<Vec<String>, Error> {
    let mut ids = Vec::with_capacity(count);
    while ids.len() < count {
        let chunk = i32::try_from((count - ids.len()).min(LAUNCH_CHUNK)).unwrap_or(1);
        let output = client
            .run_instances()
            .image_id(IMAGE_ID)
            .instance_type(InstanceType::T3Micro)
            .min_count(chunk)
            .max_count(chunk)
            .send()
            .await
            .map_err(|e| Error::ec2_from("RunInstances", e))?;
        ids.extend(
            output
                .instances()
                .iter()
                .filter_map(|i| i.instance_id().map(str::to_owned)),
        );
    }
    Ok(ids)
}

/// `DescribeInstances` of `ids`, filtered by `instance-id` as provider-service asks.
pub async fn describe(client: &aws_sdk_ec2::Client, ids: &[String]) -> Result<(), Error> {
    let by_id = Filter::builder()
        .name("instance-id")
        .set_values(Some(ids.to_vec()))
        .build();
    client
        .describe_instances()
        .filters(by_id)
        .send()
        .await
        .map_err(|e| Error::ec2_from("DescribeInstances", e))?;
    Ok(())
}

/// `TerminateInstances` of `ids`.
pub async fn terminate(client: &aws_sdk_ec2::Client, ids: &[String]) -> Result<(), Error> {
    client
        .terminate_instances()
        .set_instance_ids(Some(ids.to_vec()))
        .send()
        .await
        .map_err(|e| Error::ec2_from("TerminateInstances", e))?;
    Ok(())
}

/// How many instances moto holds that are not terminated. Filtered by state on moto's side: moto renders each
/// instance it answers with for about 4 ms, so listing 1,000 terminated ones to count none took seconds of a
/// storm's measured time.
pub async fn live_instances(client: &aws_sdk_ec2::Client) -> Result<usize, Error> {
    let not_terminated = Filter::builder()
        .name("instance-state-name")
        .set_values(Some(
            ["pending", "running", "shutting-down", "stopping", "stopped"]
                .map(str::to_owned)
                .to_vec(),
        ))
        .build();
    let mut live = 0;
    let mut token = None;
    loop {
        let page = client
            .describe_instances()
            .filters(not_terminated.clone())
            .set_next_token(token)
            .max_results(1000)
            .send()
            .await
            .map_err(|e| Error::ec2_from("DescribeInstances", e))?;
        live += page
            .reservations()
            .iter()
            .flat_map(|r| r.instances())
            .filter(|i| i.state().and_then(|s| s.name()).map(|n| n.as_str()) != Some("terminated"))
            .count();
        token = page.next_token().map(str::to_owned);
        if token.is_none() {
            return Ok(live);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn without_moto_the_scenario_is_skipped_saying_how_to_install_it() {
        let logs = tempfile::tempdir().expect("log directory");
        let missing = start(Path::new("/nonexistent/venv/bin/python"), logs.path()).await;
        let Err(Error::Missing { what, hint, source }) = missing else {
            panic!("not Missing: {:?}", missing.err());
        };
        assert_eq!(what, "moto");
        assert!(
            hint.contains("`make moto` installs moto[ec2,server]"),
            "{hint}"
        );
        // The failed spawn stays reachable: test-support's error, with the OS's error under it.
        let source = source.expect("the failed start is the source");
        let start = source
            .downcast_ref::<test_support::Error>()
            .expect("test-support's error is the source");
        assert!(
            matches!(start, test_support::Error::MotoMissing { .. }),
            "{start}"
        );
        let os = std::error::Error::source(start)
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .expect("the spawn's error is under it");
        assert_eq!(os.kind(), std::io::ErrorKind::NotFound);
    }
}
