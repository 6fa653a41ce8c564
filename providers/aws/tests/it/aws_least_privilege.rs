//! provider-service's AWS policy (`docs/least-privilege/aws.json`, read at test time) against what the
//! backend calls, on a moto server of its own that enforces IAM: every call is signed by an IAM user
//! created from the policy, so an SDK call the policy lacks is refused, and the policy allows no
//! action the backend never calls. What moto cannot evaluate (resources and conditions, so the
//! cluster-tag wall and the do-not-delete denies) stays with review and IAM's policy simulator
//! (`docs/least-privilege/README.md`, "How these are checked").

use std::collections::BTreeSet;

use crate::aws_support::{Moto, config_for, moto_with_env, run_instances, state_of};
use aws_sdk_ec2::error::ProvideErrorMetadata;
use peerpods_provider_aws::AwsProvider;
use peerpods_provider_core::{CloudCalls, DeleteOutcome, Error, Provider};
use serde_json::{Value, json};

const CLUSTER: (&str, &str) = ("peerpods.io/cluster", "prod");
const CAA_TAGS: (&str, &str) = ("owner", "caa");
/// The error code of moto's IAM refusal, for EC2 as for any service (EC2 itself answers
/// `UnauthorizedOperation`; the backend maps both to a permission error).
const REFUSED: &str = "AccessDenied";

/// A user who may call anything, for arranging and inspecting moto's state.
fn arranger() -> User {
    User {
        name: "arranger".to_owned(),
        policies: vec![json!({
            "Version": "2012-10-17",
            "Statement": [{ "Effect": "Allow", "Action": "*", "Resource": "*" }],
        })],
    }
}

/// provider-service's AWS policy as the repository ships it.
fn shipped_policy() -> Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../docs/least-privilege/aws.json"
    );
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn statements(policy: &Value) -> &Vec<Value> {
    policy["Statement"].as_array().expect("Statement list")
}

/// A statement's `Action`, a string or a list of them.
fn actions_of(statement: &Value) -> Vec<String> {
    match &statement["Action"] {
        Value::String(action) => vec![action.clone()],
        Value::Array(actions) => actions
            .iter()
            .map(|a| a.as_str().expect("action").to_owned())
            .collect(),
        other => panic!("Action {other}"),
    }
}

/// Every action an `Allow` statement of `policy` grants.
fn allowed(policy: &Value) -> BTreeSet<String> {
    statements(policy)
        .iter()
        .filter(|s| s["Effect"] == "Allow")
        .flat_map(actions_of)
        .collect()
}

/// `policy` as moto 5 can evaluate it, changed no further than that requires. moto
/// (`moto/iam/access_control.py`, `IAMPolicyStatement`) authorizes every EC2 call against the
/// resource `*`, and outside a role's trust policy it finds every `Condition` holding: it knows only
/// `StringEquals` and compares it only with values collected for `sts:AssumeRole*`
/// (`sts:ExternalId`), skips other operators, and with no value to compare a condition holds. So:
/// - an `Allow` gets `Resource` `*`: moto matches the statement's ARN against `*`, which
///   `arn:aws:ec2:*:*:instance/*` does not match, and would refuse every call it should allow.
///   Its `Condition` stays (moto finds it holding). Which resources and tags an action may touch
///   is therefore not checked here, only which actions are granted.
/// - a `Deny` with a `Condition` is left out: moto would find the condition holding and deny its
///   actions on every resource, refusing every terminate and release where AWS refuses only those
///   on a resource marked do-not-delete. So the do-not-delete denies cannot be checked on moto.
/// - a `Deny` without a `Condition` is kept as written: moto evaluates it as AWS does, and it wins
///   over any `Allow`, of this policy or of another attached to the same user.
fn as_moto_evaluates(policy: &Value) -> Value {
    let kept: Vec<Value> = statements(policy)
        .iter()
        .filter_map(|statement| {
            let conditional = statement.get("Condition").is_some();
            match statement["Effect"].as_str() {
                Some("Allow") => {
                    let mut allow = statement.clone();
                    allow["Resource"] = json!("*");
                    Some(allow)
                }
                Some("Deny") if conditional => None,
                Some("Deny") => Some(statement.clone()),
                other => panic!("Effect {other:?}"),
            }
        })
        .collect();
    json!({ "Version": policy["Version"], "Statement": kept })
}

/// `policy` without `action` in any `Allow` (a statement left with no action goes too).
fn without(policy: &Value, action: &str) -> Value {
    let kept: Vec<Value> = statements(policy)
        .iter()
        .filter_map(|statement| {
            if statement["Effect"] != "Allow" {
                return Some(statement.clone());
            }
            let rest: Vec<String> = actions_of(statement)
                .into_iter()
                .filter(|a| a != action)
                .collect();
            let mut statement = statement.clone();
            statement["Action"] = json!(rest);
            (!rest.is_empty()).then_some(statement)
        })
        .collect();
    json!({ "Version": policy["Version"], "Statement": kept })
}

/// An IAM user to create before moto starts enforcing, with its inline policies.
struct User {
    name: String,
    policies: Vec<Value>,
}

/// An IAM user's access key.
struct Keys {
    id: String,
    secret: String,
}

/// The text of `<tag>` in moto's XML answer.
fn xml_text(answer: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = answer
        .find(&open)
        .unwrap_or_else(|| panic!("{tag} in {answer}"))
        + open.len();
    let end = answer[start..]
        .find(&format!("</{tag}>"))
        .expect("closing tag")
        + start;
    answer[start..end].to_owned()
}

/// A moto server that authenticates and authorizes every request after those that create `users`
/// (`INITIAL_NO_AUTH_ACTION_COUNT` is exactly their number), and each user's keys.
fn enforcing_moto(users: &[User]) -> (Moto, Vec<Keys>) {
    let setup_calls: usize = users.iter().map(|u| 2 + u.policies.len()).sum();
    let moto = moto_with_env(&[("INITIAL_NO_AUTH_ACTION_COUNT", &setup_calls.to_string())]);
    let keys = users
        .iter()
        .map(|user| {
            moto.iam_unsigned(&[("Action", "CreateUser"), ("UserName", &user.name)]);
            for (n, policy) in user.policies.iter().enumerate() {
                moto.iam_unsigned(&[
                    ("Action", "PutUserPolicy"),
                    ("UserName", &user.name),
                    ("PolicyName", &format!("policy-{n}")),
                    ("PolicyDocument", &policy.to_string()),
                ]);
            }
            let answer =
                moto.iam_unsigned(&[("Action", "CreateAccessKey"), ("UserName", &user.name)]);
            Keys {
                id: xml_text(&answer, "AccessKeyId"),
                secret: xml_text(&answer, "SecretAccessKey"),
            }
        })
        .collect();
    (moto, keys)
}

/// Allocates an Elastic IP tagged as CAA tags what it makes for a VM and associates it.
async fn caas_elastic_ip(client: &aws_sdk_ec2::Client, instance_id: &str, tags: &[(&str, &str)]) {
    use aws_sdk_ec2::types::{DomainType, ResourceType, Tag, TagSpecification};
    let mut spec = TagSpecification::builder().resource_type(ResourceType::ElasticIp);
    for (key, value) in tags {
        spec = spec.tags(Tag::builder().key(*key).value(*value).build());
    }
    let allocation = client
        .allocate_address()
        .domain(DomainType::Vpc)
        .tag_specifications(spec.build())
        .send()
        .await
        .expect("AllocateAddress");
    client
        .associate_address()
        .instance_id(instance_id)
        .allocation_id(allocation.allocation_id().expect("allocation id"))
        .send()
        .await
        .expect("AssociateAddress");
}

/// The backend, signing with `keys`, configured as for a cluster whose VMs CAA tags.
async fn provider(moto: &Moto, keys: &Keys) -> AwsProvider {
    let config = config_for(
        &moto.endpoint,
        &[
            ("AWS_ACCESS_KEY_ID", &keys.id),
            ("AWS_SECRET_ACCESS_KEY", &keys.secret),
            ("CLUSTER_TAG", "peerpods.io/cluster=prod"),
            ("TAGS", "owner=caa"),
            // A refusal is final; nothing to gain from retrying it.
            ("AWS_MAX_ATTEMPTS", "1"),
        ],
    );
    AwsProvider::from_config(&config, CloudCalls::default())
        .await
        .expect("provider")
}

/// Everything provider-service does on AWS, signed with `keys`: list this cluster's VMs, report
/// capacity and health, and delete a VM with the Elastic IP CAA bound to it. `Ok` when all of it
/// succeeded (checked by `admin`: the VM terminated, the address released), else what failed.
async fn everything_provider_service_does(
    moto: &Moto,
    admin: &aws_sdk_ec2::Client,
    keys: &Keys,
    name: &str,
) -> Result<(), String> {
    let vm = [("Name", name), CLUSTER, CAA_TAGS];
    let id = run_instances(admin, 1, &vm).await.remove(0);
    caas_elastic_ip(admin, &id, &vm).await;
    let provider = provider(moto, keys).await;
    let mut failed = Vec::new();

    let selector = [(CLUSTER.0.to_owned(), CLUSTER.1.to_owned())].into();
    match provider.list_instances(&selector).await {
        Ok(listed) if listed.iter().any(|i| i.id == id) => {}
        other => failed.push(format!("list: {other:?}")),
    }
    if let Err(e) = provider.capacity().await {
        failed.push(format!("capacity: {e}"));
    }
    let health = provider.health().await;
    if !health.healthy {
        failed.push(format!("health: {}", health.message));
    }
    match provider.delete_instance(&id).await {
        Ok(DeleteOutcome::Deleted) => {}
        other => failed.push(format!("delete: {other:?}")),
    }
    let state = state_of(admin, &id).await;
    if state != "terminated" {
        failed.push(format!("instance {state}"));
    }
    let addresses = admin
        .describe_addresses()
        .filters(
            aws_sdk_ec2::types::Filter::builder()
                .name("tag:Name")
                .values(name)
                .build(),
        )
        .send()
        .await
        .expect("DescribeAddresses");
    if !addresses.addresses().is_empty() {
        failed.push("the VM's Elastic IP is not released".to_owned());
    }
    if failed.is_empty() {
        Ok(())
    } else {
        Err(failed.join("; "))
    }
}

/// With exactly the policy's actions the backend does all it does, and it calls every action the
/// policy allows and no other; without any one of them it fails. Each user below is created
/// unauthenticated before moto starts enforcing; everything after is signed with their keys.
#[tokio::test(flavor = "multi_thread")]
async fn the_aws_policy_allows_every_call_the_backend_makes_and_no_other() {
    let shipped = shipped_policy();
    let policy = as_moto_evaluates(&shipped);
    let actions: Vec<String> = allowed(&shipped).into_iter().collect();
    let mut users = vec![
        arranger(),
        User {
            name: "provider-service".to_owned(),
            policies: vec![policy.clone()],
        },
    ];
    users.extend(actions.iter().enumerate().map(|(n, action)| User {
        name: format!("provider-service-without-{n}"),
        policies: vec![without(&policy, action)],
    }));
    let (moto, keys) = enforcing_moto(&users);
    let admin = moto.client_as(&keys[0].id, &keys[0].secret);

    everything_provider_service_does(&moto, &admin, &keys[1], "podvm-full")
        .await
        .unwrap_or_else(|failed| panic!("with the policy's actions: {failed}"));
    let called: BTreeSet<String> = moto
        .requests_signed_by(&keys[1].id)
        .into_keys()
        .map(|action| format!("ec2:{action}"))
        .collect();
    assert_eq!(
        called,
        allowed(&shipped),
        "the backend's calls are the policy's actions"
    );

    for (n, action) in actions.iter().enumerate() {
        let outcome =
            everything_provider_service_does(&moto, &admin, &keys[2 + n], &format!("podvm-{n}"))
                .await;
        assert!(
            outcome.is_err(),
            "without {action} the backend still does everything: moto does not enforce it, or \
             the backend no longer needs it"
        );
        println!("without {action}: {}", outcome.unwrap_err());
    }
}

/// The control, in the words of the error: without `ec2:TerminateInstances` the delete is refused
/// as a permission error and the VM keeps running.
#[tokio::test(flavor = "multi_thread")]
async fn without_terminate_instances_the_delete_is_refused_and_the_vm_runs() {
    let policy = without(
        &as_moto_evaluates(&shipped_policy()),
        "ec2:TerminateInstances",
    );
    let (moto, keys) = enforcing_moto(&[
        arranger(),
        User {
            name: "provider-service".to_owned(),
            policies: vec![policy],
        },
    ]);
    let admin = moto.client_as(&keys[0].id, &keys[0].secret);
    let id = run_instances(&admin, 1, &[("Name", "podvm"), CLUSTER, CAA_TAGS])
        .await
        .remove(0);

    let refused = provider(&moto, &keys[1])
        .await
        .delete_instance(&id)
        .await
        .expect_err("no TerminateInstances");

    assert!(
        matches!(refused, Error::CloudPermissionDenied { .. }),
        "{refused:?}"
    );
    assert_eq!(state_of(&admin, &id).await, "running");
}

/// The policy's `Deny` of tag writes (no condition, so moto evaluates it) holds even where another
/// policy attached to the same user allows them.
#[tokio::test(flavor = "multi_thread")]
async fn the_aws_policy_refuses_tag_writes_whatever_else_is_attached() {
    let broader = json!({
        "Version": "2012-10-17",
        "Statement": [{ "Effect": "Allow", "Action": "ec2:*", "Resource": "*" }],
    });
    let (moto, keys) = enforcing_moto(&[
        arranger(),
        User {
            name: "provider-service".to_owned(),
            policies: vec![as_moto_evaluates(&shipped_policy()), broader],
        },
    ]);
    let admin = moto.client_as(&keys[0].id, &keys[0].secret);
    let id = run_instances(&admin, 1, &[("Name", "podvm"), CLUSTER])
        .await
        .remove(0);
    let provider_service = moto.client_as(&keys[1].id, &keys[1].secret);
    let tag = aws_sdk_ec2::types::Tag::builder()
        .key(peerpods_provider_core::DO_NOT_DELETE_TAG)
        .value("true")
        .build();

    let created = provider_service
        .create_tags()
        .resources(&id)
        .tags(tag.clone())
        .send()
        .await;
    let deleted = provider_service
        .delete_tags()
        .resources(&id)
        .tags(tag)
        .send()
        .await;
    // The broader policy alone allows any EC2 call: the refusals are the Deny's.
    let read = provider_service.describe_instance_types().send().await;

    assert_eq!(
        created
            .err()
            .and_then(|e| e.code().map(str::to_owned))
            .as_deref(),
        Some(REFUSED)
    );
    assert_eq!(
        deleted
            .err()
            .and_then(|e| e.code().map(str::to_owned))
            .as_deref(),
        Some(REFUSED)
    );
    assert!(read.is_ok(), "{read:?}");
}
