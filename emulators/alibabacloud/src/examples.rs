//! Response examples of Alibaba Cloud's API reference (sources in the README), to be served
//! with [`AlibabaCloudEmulator::answer_next_verbatim`](crate::AlibabaCloudEmulator::answer_next_verbatim).

/// ECS `DescribeInstances`: one instance, `NextToken` to a further page.
pub const DESCRIBE_INSTANCES: &str = include_str!("../fixtures/describe_instances.json");
/// ECS `DescribeAccountAttributes`: the `max-security-groups` attribute.
pub const DESCRIBE_ACCOUNT_ATTRIBUTES: &str =
    include_str!("../fixtures/describe_account_attributes.json");
