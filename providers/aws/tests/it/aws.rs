//! The AWS provider against moto server, through the `Provider` trait, with the real AWS SDK.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::aws_support::{
    SERIAL, config_for, moto, moto_config, run_instances, state_of, unknown_id,
};
use futures::future::join_all;
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::CloudCalls;
use peerpods_provider_core::Error;
use peerpods_provider_core::{DeleteOutcome, Provider};

/// moto knows every instance at once and never forgets one, so its NotFound is the truth: these
/// tests believe it at once (EC2's consistency window is tested in `aws_consistency.rs`).
const TRUST_NOT_FOUND: (&str, &str) = ("AWS_NOT_FOUND_WINDOW_SECS", "0");

async fn provider(extra: &[(&str, &str)]) -> Arc<AwsProvider> {
    let config = moto_config(extra);
    Arc::new(
        AwsProvider::from_config(&config, CloudCalls::default())
            .await
            .expect("provider"),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_a_running_instance_terminates_it() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    let provider = provider(&[]).await;

    let outcome = provider.delete_instance(&ids[0]).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(state_of(&client, &ids[0]).await, "terminated");
    assert_eq!(provider.api_calls("TerminateInstances"), 1);
    // Deleted is said only once a later lookup saw it terminated.
    assert_eq!(provider.api_calls("DescribeInstances"), 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn deleting_twice_or_an_unknown_id_is_already_gone() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    let provider = provider(&[TRUST_NOT_FOUND]).await;

    assert_eq!(
        provider.delete_instance(&ids[0]).await.expect("first"),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        provider.delete_instance(&ids[0]).await.expect("second"),
        DeleteOutcome::AlreadyGone
    );
    assert_eq!(
        provider
            .delete_instance(&unknown_id(1))
            .await
            .expect("unknown"),
        DeleteOutcome::AlreadyGone
    );
    // An 8-digit id of the older format is accepted and unknown, too.
    assert_eq!(
        provider
            .delete_instance("i-0badc0de")
            .await
            .expect("short unknown"),
        DeleteOutcome::AlreadyGone
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_deletes_are_batched_and_each_caller_gets_its_own_answer() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let real = run_instances(&client, 150, &[("cluster", "storm")]).await;
    let provider = provider(&[TRUST_NOT_FOUND]).await;

    // 200 callers: 150 real instances, 40 ids EC2 never heard of, and 10 callers asking for an
    // instance someone else is deleting at the same moment.
    let mut requests: Vec<(String, DeleteOutcome)> = real
        .iter()
        .map(|id| (id.clone(), DeleteOutcome::Deleted))
        .collect();
    requests.extend((0..40).map(|n| (unknown_id(1000 + n), DeleteOutcome::AlreadyGone)));
    requests.extend(
        real[..10]
            .iter()
            .map(|id| (id.clone(), DeleteOutcome::Deleted)),
    );
    assert_eq!(requests.len(), 200);

    let answers = join_all(requests.iter().map(|(id, _)| {
        let provider = Arc::clone(&provider);
        let id = id.clone();
        tokio::spawn(async move { provider.delete_instance(&id).await })
    }))
    .await;

    for ((id, expected), answer) in requests.iter().zip(answers) {
        let answer = answer
            .expect("task")
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(&answer, expected, "{id}");
    }
    for id in &real {
        assert_eq!(state_of(&client, id).await, "terminated", "{id}");
    }
    let terminate_calls = provider.api_calls("TerminateInstances");
    let describe_calls = provider.api_calls("DescribeAddresses");
    println!(
        "200 concurrent deletes: {terminate_calls} TerminateInstances, {describe_calls} DescribeAddresses calls"
    );
    assert!(
        terminate_calls <= 20,
        "{terminate_calls} TerminateInstances calls"
    );
    assert!(
        describe_calls <= 20,
        "{describe_calls} DescribeAddresses calls"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_deletes_of_one_instance_make_one_call() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    let provider = provider(&[]).await;

    let answers = join_all((0..25).map(|_| {
        let provider = Arc::clone(&provider);
        let id = ids[0].clone();
        tokio::spawn(async move { provider.delete_instance(&id).await })
    }))
    .await;

    for answer in answers {
        assert_eq!(
            answer.expect("task").expect("delete"),
            DeleteOutcome::Deleted
        );
    }
    assert_eq!(provider.api_calls("TerminateInstances"), 1);
}

/// Allocates an Elastic IP with `tags` and associates it with `instance_id`; its allocation id.
async fn elastic_ip(
    client: &aws_sdk_ec2::Client,
    instance_id: &str,
    tags: &[(&str, &str)],
) -> String {
    use aws_sdk_ec2::types::{ResourceType, Tag, TagSpecification};
    let mut request = client
        .allocate_address()
        .domain(aws_sdk_ec2::types::DomainType::Vpc);
    if !tags.is_empty() {
        let mut spec = TagSpecification::builder().resource_type(ResourceType::ElasticIp);
        for (key, value) in tags {
            spec = spec.tags(Tag::builder().key(*key).value(*value).build());
        }
        request = request.tag_specifications(spec.build());
    }
    let allocation = request.send().await.expect("AllocateAddress");
    let allocation_id = allocation
        .allocation_id()
        .expect("allocation id")
        .to_owned();
    client
        .associate_address()
        .instance_id(instance_id)
        .allocation_id(&allocation_id)
        .send()
        .await
        .expect("AssociateAddress");
    allocation_id
}

/// The allocation ids of the Elastic IPs moto still has.
async fn allocated(client: &aws_sdk_ec2::Client) -> Vec<String> {
    let mut ids: Vec<String> = client
        .describe_addresses()
        .send()
        .await
        .expect("DescribeAddresses")
        .addresses()
        .iter()
        .filter_map(|address| address.allocation_id().map(str::to_owned))
        .collect();
    ids.sort();
    ids
}

/// Only an Elastic IP tagged as cloud-api-adaptor tags what it makes for the VM (the VM's `Name`
/// and `TAGS`) is the VM's, and it is released once the VM is gone; an operator's address attached
/// to a peer-pod VM survives (the old code released every associated address), as does one tagged
/// for the VM but marked do-not-delete or lacking the cluster tag (the guard on every part).
#[tokio::test(flavor = "multi_thread")]
async fn an_operators_elastic_ip_survives_while_caas_is_released() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let cluster = ("peerpods.io/cluster", "prod");
    let caa_tags = ("owner", "caa");
    let vm = |name: &'static str| [("Name", name), cluster, caa_tags];
    let with_caas = run_instances(&client, 1, &vm("podvm-a")).await;
    let with_operators = run_instances(&client, 1, &vm("podvm-b")).await;
    let with_marked = run_instances(&client, 1, &vm("podvm-c")).await;
    let with_untagged = run_instances(&client, 1, &vm("podvm-d")).await;
    let caas = elastic_ip(&client, &with_caas[0], &vm("podvm-a")).await;
    // The operator's: tagged for the cluster, but not named for the VM.
    let operators = elastic_ip(&client, &with_operators[0], &[cluster, caa_tags]).await;
    let marked = elastic_ip(
        &client,
        &with_marked[0],
        &[
            ("Name", "podvm-c"),
            cluster,
            caa_tags,
            (peerpods_provider_core::DO_NOT_DELETE_TAG, "true"),
        ],
    )
    .await;
    let untagged = elastic_ip(&client, &with_untagged[0], &[("Name", "podvm-d"), caa_tags]).await;
    let provider = provider(&[
        ("CLUSTER_TAG", "peerpods.io/cluster=prod"),
        ("TAGS", "owner=caa"),
    ])
    .await;

    let vms = [&with_caas, &with_operators, &with_marked, &with_untagged];
    let answers = join_all(vms.iter().map(|ids| provider.delete_instance(&ids[0]))).await;

    for (answer, ids) in answers.into_iter().zip(vms) {
        assert_eq!(answer.expect("delete"), DeleteOutcome::Deleted, "{ids:?}");
        assert_eq!(state_of(&client, &ids[0]).await, "terminated");
    }
    let mut kept = vec![operators, marked, untagged];
    kept.sort();
    assert_eq!(
        allocated(&client).await,
        kept,
        "only CAA's {caas} is released"
    );
    assert_eq!(provider.api_calls("ReleaseAddress"), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_protected_instance_fails_alone_and_the_rest_of_its_batch_is_deleted() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 3, &[]).await;
    client
        .modify_instance_attribute()
        .instance_id(&ids[0])
        .disable_api_termination(
            aws_sdk_ec2::types::AttributeBooleanValue::builder()
                .value(true)
                .build(),
        )
        .send()
        .await
        .expect("ModifyInstanceAttribute");
    let provider = provider(&[]).await;

    // The protected instance goes first: moto (unlike EC2) terminates the instances before the
    // failing one in a call, which would turn their answers into AlreadyGone.
    let answers = join_all(ids.iter().map(|id| provider.delete_instance(id))).await;

    // The batched call fails as a whole; asking per id gives each caller its true answer.
    let protected = answers[0].as_ref().expect_err("protected instance");
    assert!(
        protected.to_string().contains("OperationNotPermitted"),
        "{protected}"
    );
    assert!(
        !matches!(protected, Error::InvalidArgument { .. }),
        "{protected:?}"
    );
    assert_eq!(
        answers[1].as_ref().expect("second"),
        &DeleteOutcome::Deleted
    );
    assert_eq!(answers[2].as_ref().expect("third"), &DeleteOutcome::Deleted);
    assert_eq!(state_of(&client, &ids[0]).await, "running");
    // One batched call plus one per id.
    assert_eq!(provider.api_calls("TerminateInstances"), 4);
}

#[tokio::test(flavor = "multi_thread")]
async fn malformed_ids_are_invalid_arguments_and_reach_no_cloud() {
    let provider = provider(&[]).await;
    for bad in ["", "i-xyz", "vm-0123456789abcdef0", "i-0123456789ABCDEF0"] {
        assert!(provider.validate_instance_id(bad).is_err(), "{bad:?}");
        match provider.delete_instance(bad).await {
            Err(Error::InvalidArgument { field, .. }) => assert_eq!(field, "instance_id"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(provider.api_calls("TerminateInstances"), 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn instances_are_listed_by_tag_without_terminated_ones() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let mine = run_instances(&client, 2, &[("cluster", "a"), ("role", "peerpod")]).await;
    let other = run_instances(&client, 1, &[("cluster", "b")]).await;
    let provider = provider(&[]).await;
    provider.delete_instance(&mine[1]).await.expect("delete");

    let selector = BTreeMap::from([("cluster".to_owned(), "a".to_owned())]);
    let listed = provider.list_instances(&selector).await.expect("list");

    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].id, mine[0]);
    assert!(listed[0].created.is_some());
    assert_eq!(
        listed[0].tags.get("role").map(String::as_str),
        Some("peerpod")
    );
    let all = provider
        .list_instances(&BTreeMap::new())
        .await
        .expect("list all");
    let mut all_ids: Vec<&str> = all.iter().map(|i| i.id.as_str()).collect();
    all_ids.sort_unstable();
    let mut expected = vec![mine[0].as_str(), other[0].as_str()];
    expected.sort_unstable();
    assert_eq!(all_ids, expected);
}

#[tokio::test(flavor = "multi_thread")]
async fn capacity_reports_the_account_limit_and_the_cluster_instances() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    run_instances(&client, 3, &[("cluster", "c1")]).await;
    run_instances(&client, 2, &[("cluster", "c2")]).await;
    let provider = provider(&[("TAGS", "cluster=c1")]).await;

    let capacity = provider.capacity().await.expect("capacity");

    // moto reports the default account attribute `max-instances` = 20.
    assert_eq!(capacity.instances.limit, Some(20));
    assert_eq!(capacity.instances.in_use, Some(3));
    // Neither moto nor EC2's DescribeInstances says anything about memory: unknown, not zero.
    assert_eq!(capacity.memory_mib.limit, None);
    assert_eq!(capacity.memory_mib.in_use, None);
    assert_eq!(capacity.vcpus.limit, None);
    let health = provider.health().await;
    assert!(health.healthy, "{health:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stopped_instance_is_deleted_too() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let ids = run_instances(&client, 1, &[]).await;
    client
        .stop_instances()
        .instance_ids(&ids[0])
        .send()
        .await
        .expect("StopInstances");
    assert_eq!(state_of(&client, &ids[0]).await, "stopped");
    let provider = provider(&[]).await;

    let outcome = provider.delete_instance(&ids[0]).await.expect("delete");

    assert_eq!(outcome, DeleteOutcome::Deleted);
    assert_eq!(state_of(&client, &ids[0]).await, "terminated");
}

/// With `CLUSTER_TAG`, only this cluster's instances are deleted: one without the tag is refused
/// (FAILED_PRECONDITION, reason NotOwnedByCluster) and keeps running, in a batch with a tagged one
/// that is deleted; an unknown id is still already gone. `DELETE_UNTAGGED=allow` turns the check off.
#[tokio::test(flavor = "multi_thread")]
async fn deletes_are_refused_for_instances_without_the_cluster_tag() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let tag = ("peerpods.io/cluster", "prod");
    let ours = run_instances(&client, 1, &[tag]).await;
    let other_cluster = run_instances(&client, 1, &[("peerpods.io/cluster", "staging")]).await;
    let untagged = run_instances(&client, 1, &[]).await;
    let guarded = provider(&[("CLUSTER_TAG", "peerpods.io/cluster=prod"), TRUST_NOT_FOUND]).await;

    let unknown = unknown_id(7);
    let (ours_answer, other_answer, untagged_answer, unknown_answer) = tokio::join!(
        guarded.delete_instance(&ours[0]),
        guarded.delete_instance(&other_cluster[0]),
        guarded.delete_instance(&untagged[0]),
        guarded.delete_instance(&unknown),
    );
    assert_eq!(ours_answer.expect("ours"), DeleteOutcome::Deleted);
    for (answer, id) in [
        (other_answer, &other_cluster[0]),
        (untagged_answer, &untagged[0]),
    ] {
        let error = answer.expect_err("not ours");
        assert!(
            matches!(error, Error::NotOwnedByCluster { .. }),
            "{error:?}"
        );
        assert_eq!(error.reason(), "NotOwnedByCluster");
        assert_eq!(
            state_of(&client, id).await,
            "running",
            "{id} must not be touched"
        );
    }
    assert_eq!(unknown_answer.expect("unknown"), DeleteOutcome::AlreadyGone);
    assert_eq!(state_of(&client, &ours[0]).await, "terminated");
    // The check costs one DescribeInstances per batch, not one per instance.
    assert!(
        guarded.api_calls("DescribeInstances") <= 2,
        "{}",
        guarded.api_calls("DescribeInstances")
    );

    let unchecked = provider(&[
        ("CLUSTER_TAG", "peerpods.io/cluster=prod"),
        ("DELETE_UNTAGGED", "allow"),
    ])
    .await;
    assert_eq!(
        unchecked
            .delete_instance(&untagged[0])
            .await
            .expect("allowed"),
        DeleteOutcome::Deleted
    );
    assert_eq!(state_of(&client, &untagged[0]).await, "terminated");
    // Even unrestricted, the tags are read (the do-not-delete check) before the delete, and a
    // later lookup confirms it.
    assert_eq!(unchecked.api_calls("DescribeInstances"), 2);
}

/// An instance tagged `peerpods.io/do-not-delete` (or the portable `peerpods-do-not-delete`) is
/// refused on every configuration (FAILED_PRECONDITION, reason DoNotDelete, naming the key it
/// carries) and keeps running, in a batch with others that are deleted; the value `false` does not
/// protect.
#[tokio::test(flavor = "multi_thread")]
async fn instances_marked_do_not_delete_are_never_terminated() {
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let cluster = ("peerpods.io/cluster", "prod");
    let marked = run_instances(
        &client,
        1,
        &[cluster, (peerpods_provider_core::DO_NOT_DELETE_TAG, "true")],
    )
    .await;
    let unmarked = run_instances(
        &client,
        1,
        &[
            cluster,
            (peerpods_provider_core::DO_NOT_DELETE_TAG, "false"),
        ],
    )
    .await;
    let portable = run_instances(
        &client,
        1,
        &[
            cluster,
            (peerpods_provider_core::DO_NOT_DELETE_PORTABLE_TAG, "yes"),
        ],
    )
    .await;
    let plain = run_instances(&client, 1, &[cluster]).await;
    for config in [
        vec![("CLUSTER_TAG", "peerpods.io/cluster=prod")],
        vec![("DELETE_UNTAGGED", "allow")],
        vec![],
    ] {
        let provider = provider(&config).await;
        let error = provider
            .delete_instance(&marked[0])
            .await
            .expect_err("marked do-not-delete");
        assert!(
            matches!(error, Error::DoNotDelete { .. }),
            "{config:?}: {error:?}"
        );
        assert_eq!(error.reason(), "DoNotDelete");
        assert!(error.to_string().contains(&marked[0]), "{error}");
        assert_eq!(state_of(&client, &marked[0]).await, "running", "{config:?}");
        let error = provider
            .delete_instance(&portable[0])
            .await
            .expect_err("marked with the portable key");
        assert!(
            matches!(&error, Error::DoNotDelete { tag, .. } if *tag == peerpods_provider_core::DO_NOT_DELETE_PORTABLE_TAG),
            "{config:?}: {error:?}"
        );
        assert_eq!(
            state_of(&client, &portable[0]).await,
            "running",
            "{config:?}"
        );
        assert_eq!(provider.api_calls("TerminateInstances"), 0, "{config:?}");
    }
    let provider = provider(&[("DELETE_UNTAGGED", "allow")]).await;
    let (unmarked_answer, plain_answer) = tokio::join!(
        provider.delete_instance(&unmarked[0]),
        provider.delete_instance(&plain[0]),
    );
    assert_eq!(
        unmarked_answer.expect("false does not protect"),
        DeleteOutcome::Deleted
    );
    assert_eq!(plain_answer.expect("plain"), DeleteOutcome::Deleted);
    assert_eq!(state_of(&client, &marked[0]).await, "running");
}

/// What one confirmed delete costs, counted by moto (every request the provider signed): a VM
/// alone, then a VM with an Elastic IP of its own.
#[tokio::test(flavor = "multi_thread")]
async fn the_cloud_calls_of_one_confirmed_delete() {
    const KEY: &str = "AKIDPROVIDERCOST";
    let _serial = SERIAL.lock().await;
    moto().reset();
    let client = moto().client();
    let vm = [("Name", "podvm-cost")];
    let alone = run_instances(&client, 1, &vm).await;
    let with_address = run_instances(&client, 1, &vm).await;
    elastic_ip(&client, &with_address[0], &vm).await;
    let provider = AwsProvider::from_config(
        &config_for(&moto().endpoint, &[("AWS_ACCESS_KEY_ID", KEY)]),
        CloudCalls::default(),
    )
    .await
    .expect("provider");

    let mut costs = Vec::new();
    for id in [&alone[0], &with_address[0]] {
        let before: u64 = moto().requests_signed_by(KEY).values().sum();
        assert_eq!(
            provider.delete_instance(id).await.expect("delete"),
            DeleteOutcome::Deleted
        );
        let calls = moto().requests_signed_by(KEY);
        println!("one confirmed delete of {id}: {calls:?} so far");
        costs.push(calls.values().sum::<u64>() - before);
    }
    println!("calls per confirmed delete: {costs:?} (a VM alone, a VM with an Elastic IP)");
    // A VM alone: a lookup, the listing of its addresses, the terminate, a lookup that sees it
    // terminated, the listing again. With an address of its own: reading it, releasing it (moto
    // keeps it associated: disassociating first) and a lookup that no longer finds it.
    assert_eq!(costs, vec![5, 9]);
    assert!(allocated(&client).await.is_empty());
}
