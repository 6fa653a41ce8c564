//! The eventual consistency of the layer in front of moto, through the real AWS SDK: each kind of
//! call misses a new instance on its own (a call naming it as `InstanceId.N`, a filtered
//! `DescribeInstances`, a `TerminateInstances`), flapping answers, and nothing hidden by default.
//! Windows are an hour long and flapping is bounded by a count of answers: no verdict depends on
//! timing.

use std::time::Duration;

use aws_sdk_ec2::error::ProvideErrorMetadata;
use aws_sdk_ec2::types::Filter;
use test_support::moto::{self, CallKind, Faults, Flapping, Visibility};
use test_support::visibility_checks::found_missed_found;

const HOUR: Duration = Duration::from_secs(3600);
const TAG: (&str, &str) = ("owner", "peerpods");

/// `DescribeInstances` of `id` by `InstanceId.N`: `true` if it answered the instance, `false`
/// for `InvalidInstanceID.NotFound`.
async fn get(client: &aws_sdk_ec2::Client, id: &str) -> bool {
    match client.describe_instances().instance_ids(id).send().await {
        Ok(output) => {
            let listed = listed(&output, id);
            assert!(listed, "{id} answered without the instance: {output:?}");
            true
        }
        Err(e) => {
            assert_eq!(e.code(), Some("InvalidInstanceID.NotFound"), "{e:?}");
            false
        }
    }
}

fn listed(
    output: &aws_sdk_ec2::operation::describe_instances::DescribeInstancesOutput,
    id: &str,
) -> bool {
    output
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .any(|i| i.instance_id() == Some(id))
}

/// `DescribeInstances` filtered by `filter`: whether it lists `id`.
async fn list_by(client: &aws_sdk_ec2::Client, filter: Filter, id: &str) -> bool {
    let output = client
        .describe_instances()
        .filters(filter)
        .send()
        .await
        .expect("DescribeInstances with a filter");
    listed(&output, id)
}

fn by_id(id: &str) -> Filter {
    Filter::builder().name("instance-id").values(id).build()
}

fn by_tag() -> Filter {
    Filter::builder()
        .name(format!("tag:{}", TAG.0))
        .values(TAG.1)
        .build()
}

/// Every list: filtered by `instance-id`, by tag, and not filtered at all; they must agree.
async fn list(client: &aws_sdk_ec2::Client, id: &str) -> bool {
    let by_id = list_by(client, by_id(id), id).await;
    let by_tag = list_by(client, by_tag(), id).await;
    let all = listed(
        &client
            .describe_instances()
            .send()
            .await
            .expect("DescribeInstances"),
        id,
    );
    assert_eq!((by_id, by_tag), (all, all), "the lists disagree about {id}");
    all
}

/// `TerminateInstances` of `id`: `true` if accepted, `false` for `InvalidInstanceID.NotFound`.
async fn terminate(client: &aws_sdk_ec2::Client, id: &str) -> bool {
    match client.terminate_instances().instance_ids(id).send().await {
        Ok(_) => true,
        Err(e) => {
            assert_eq!(e.code(), Some("InvalidInstanceID.NotFound"), "{e:?}");
            false
        }
    }
}

async fn one_instance(client: &aws_sdk_ec2::Client) -> String {
    moto::run_instances(client, 1, &[TAG]).await.remove(0)
}

#[tokio::test(flavor = "multi_thread")]
async fn defaults_hide_nothing() {
    let (_serial, client) = moto::alone().await;
    moto::moto().set_faults(&Faults::default());
    let id = one_instance(&client).await;
    for _ in 0..3 {
        assert!(get(&client, &id).await);
        assert!(list(&client, &id).await);
    }
    assert!(terminate(&client, &id).await);
    assert_eq!(moto::moto().injected().not_found, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_lookup_misses_what_a_filtered_describe_lists() {
    let (_serial, client) = moto::alone().await;
    moto::moto().set_faults(&Faults {
        invisible: Visibility::only(&[CallKind::Get], HOUR),
        ..Faults::default()
    });
    let id = one_instance(&client).await;
    assert!(!get(&client, &id).await);
    assert!(!get(&client, &id).await);
    assert!(list(&client, &id).await);
    assert_eq!(moto::moto().injected().not_found, 2);
    assert!(terminate(&client, &id).await);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_filtered_describe_misses_what_a_lookup_finds() {
    let (_serial, client) = moto::alone().await;
    moto::moto().set_faults(&Faults {
        invisible: Visibility::only(&[CallKind::List], HOUR),
        ..Faults::default()
    });
    let id = one_instance(&client).await;
    // Three lists, each leaving the instance out once.
    assert!(!list(&client, &id).await);
    assert_eq!(moto::moto().injected().not_found, 3);
    assert!(get(&client, &id).await);
    assert!(terminate(&client, &id).await);
    assert_eq!(moto::moto().injected().not_found, 3);
    assert_eq!(moto::state_of(&client, &id).await, "terminated");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_termination_misses_what_a_lookup_finds() {
    let (_serial, client) = moto::alone().await;
    moto::moto().set_faults(&Faults {
        invisible: Visibility::only(&[CallKind::Delete], HOUR),
        ..Faults::default()
    });
    let id = one_instance(&client).await;
    assert!(!terminate(&client, &id).await);
    assert!(get(&client, &id).await);
    assert!(list(&client, &id).await);
    assert_eq!(moto::state_of(&client, &id).await, "running");
    assert_eq!(moto::moto().injected().not_found, 1);
}

/// `invisible_after_launch` is every kind, the filtered describe included.
#[tokio::test(flavor = "multi_thread")]
async fn invisible_after_launch_hides_from_every_kind_of_call() {
    let (_serial, client) = moto::alone().await;
    moto::moto().set_faults(&Faults {
        invisible_after_launch: HOUR,
        ..Faults::default()
    });
    let id = one_instance(&client).await;
    assert!(!get(&client, &id).await);
    assert!(!list(&client, &id).await);
    assert!(!terminate(&client, &id).await);
    assert_eq!(moto::moto().injected().not_found, 5);
    moto::moto().set_faults(&Faults::default());
    assert!(list(&client, &id).await);
}

/// 36 answers of `kind` about `id` (a lookup, or a describe filtered by `instance-id`).
async fn answers(client: &aws_sdk_ec2::Client, kind: CallKind, id: &str) -> Vec<bool> {
    let mut found = Vec::new();
    for _ in 0..36 {
        found.push(match kind {
            CallKind::Get => get(client, id).await,
            _ => list_by(client, by_id(id), id).await,
        });
    }
    found
}

#[tokio::test(flavor = "multi_thread")]
async fn lookups_and_filtered_describes_flap_as_the_seed_draws() {
    let (_serial, client) = moto::alone().await;
    for kind in [CallKind::Get, CallKind::List] {
        let faults = Faults {
            flapping: Flapping::for_answers(30, &[kind]),
            seed: 5,
            ..Faults::default()
        };
        moto::moto().set_faults(&faults);
        let id = one_instance(&client).await;
        let first = answers(&client, kind, &id).await;
        assert!(
            found_missed_found(&first),
            "{kind:?}: never found, not found, found: {first:?}"
        );
        assert!(first[30..].iter().all(|f| *f), "{kind:?}: {first:?}");
        let misses = first.iter().filter(|f| !**f).count();
        assert!((5..=25).contains(&misses), "{kind:?}: {first:?}");
        assert_eq!(moto::moto().injected().not_found, misses as u64);
        // The other kind does not flap.
        let other = if kind == CallKind::Get {
            CallKind::List
        } else {
            CallKind::Get
        };
        assert!(answers(&client, other, &id).await.iter().all(|f| *f));
        // Set again with the seed: the same answers.
        moto::moto().set_faults(&faults);
        assert_eq!(answers(&client, kind, &id).await, first, "{kind:?}");
        assert!(terminate(&client, &id).await);
    }
    moto::moto().set_faults(&Faults::default());
}
