//! Reading the JSON answers of ECS and VPC (pure). Shapes are those of the API references'
//! response examples: `Instances.Instance[]`, `EipAddresses.EipAddress[]`,
//! `AccountAttributeItems.AccountAttributeItem[].AttributeValues.ValueItem[]`.

use std::collections::BTreeMap;

use serde_json::Value;

/// An instance as `DescribeInstances` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EcsInstance {
    pub id: String,
    /// `Pending`, `Running`, `Starting`, `Stopping`, `Stopped`.
    pub status: String,
    pub created: Option<jiff::Timestamp>,
    pub tags: BTreeMap<String, String>,
    /// Network interfaces other than the primary one: cloud-api-adaptor's add-on NIC
    /// (`peerpod-nic-<instance id>`) is one, and its EIP is bound to it.
    pub secondary_nics: Vec<String>,
    pub vcpus: Option<u64>,
    pub memory_mib: Option<u64>,
}

/// One page of `DescribeInstances`.
#[derive(Debug, PartialEq, Eq)]
pub struct InstancesPage {
    pub instances: Vec<EcsInstance>,
    /// `NextToken`; empty or absent on the last page.
    pub next_token: Option<String>,
}

/// An EIP as `DescribeEipAddresses` reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eip {
    pub allocation_id: String,
    /// `Associating`, `Unassociating`, `InUse`, `Available`, `Releasing`.
    pub status: String,
    /// The resource it is bound to, and that resource's kind (`NetworkInterface`, `EcsInstance`).
    pub bound_to: Option<(String, String)>,
    /// `Description`: cloud-api-adaptor allocates its EIPs with one fixed description.
    pub description: String,
    /// `Tags.Tag[]` (`Key`, `Value`).
    pub tags: BTreeMap<String, String>,
}

fn text(value: &Value, key: &str) -> Option<String> {
    match value.get(key)? {
        Value::String(s) if !s.is_empty() => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn number(value: &Value, key: &str) -> Option<u64> {
    match value.get(key)? {
        Value::Number(n) => n.as_u64(),
        Value::String(s) => s.parse().ok(),
        _ => None,
    }
}

/// `{"Outer": {"Inner": [ ... ]}}` → the items, or nothing when absent.
fn items<'a>(value: &'a Value, outer: &str, inner: &str) -> &'a [Value] {
    value
        .get(outer)
        .and_then(|v| v.get(inner))
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or_default()
}

/// The latest moment an instance may have been created, from its `CreationTime`: ECS writes
/// `2017-12-10T04:04Z` (whole minutes; the instance may have been made up to the end of that
/// minute, so the end it is: an age from it is never too old) or a time with seconds.
pub fn creation_time(text: &str) -> Option<jiff::Timestamp> {
    // jiff reads a time without seconds as the minute's start.
    let at: jiff::Timestamp = text.parse().ok()?;
    let whole_minutes = text
        .split_once('T')
        .is_some_and(|(_, time)| time.matches(':').count() == 1 && time.ends_with('Z'));
    if whole_minutes {
        at.checked_add(jiff::SignedDuration::from_secs(60)).ok()
    } else {
        Some(at)
    }
}

pub fn instances_page(answer: &Value) -> Result<InstancesPage, String> {
    if answer.get("Instances").is_none() {
        return Err("DescribeInstances answer has no Instances".into());
    }
    let mut instances = Vec::new();
    for item in items(answer, "Instances", "Instance") {
        let Some(id) = text(item, "InstanceId") else {
            return Err("DescribeInstances answer lists an instance without InstanceId".into());
        };
        let tags = items(item, "Tags", "Tag")
            .iter()
            .filter_map(|tag| {
                Some((
                    text(tag, "TagKey")?,
                    text(tag, "TagValue").unwrap_or_default(),
                ))
            })
            .collect();
        let secondary_nics = items(item, "NetworkInterfaces", "NetworkInterface")
            .iter()
            .filter(|nic| text(nic, "Type").as_deref() != Some("Primary"))
            .filter_map(|nic| text(nic, "NetworkInterfaceId"))
            .collect();
        instances.push(EcsInstance {
            id,
            status: text(item, "Status").unwrap_or_default(),
            created: text(item, "CreationTime").and_then(|t| creation_time(&t)),
            tags,
            secondary_nics,
            vcpus: number(item, "Cpu"),
            memory_mib: number(item, "Memory"),
        });
    }
    Ok(InstancesPage {
        instances,
        next_token: text(answer, "NextToken"),
    })
}

pub fn eips(answer: &Value) -> Result<Vec<Eip>, String> {
    if answer.get("EipAddresses").is_none() {
        return Err("DescribeEipAddresses answer has no EipAddresses".into());
    }
    items(answer, "EipAddresses", "EipAddress")
        .iter()
        .map(|item| {
            Ok(Eip {
                allocation_id: text(item, "AllocationId")
                    .ok_or("DescribeEipAddresses answer lists an EIP without AllocationId")?,
                status: text(item, "Status").unwrap_or_default(),
                bound_to: text(item, "InstanceId")
                    .map(|id| (id, text(item, "InstanceType").unwrap_or_default())),
                description: text(item, "Description").unwrap_or_default(),
                tags: items(item, "Tags", "Tag")
                    .iter()
                    .filter_map(|tag| {
                        Some((text(tag, "Key")?, text(tag, "Value").unwrap_or_default()))
                    })
                    .collect(),
            })
        })
        .collect()
}

/// `TotalCount` of a paged answer, when present.
pub fn total_count(answer: &Value) -> Option<usize> {
    number(answer, "TotalCount").and_then(|n| usize::try_from(n).ok())
}

/// The value of account attribute `name`: the sum over its value items (one per zone when
/// the attribute is per zone), `None` when the answer does not carry it or it is not a number.
pub fn account_attribute(answer: &Value, name: &str) -> Option<u64> {
    let attribute = items(answer, "AccountAttributeItems", "AccountAttributeItem")
        .iter()
        .find(|item| text(item, "AttributeName").as_deref() == Some(name))?;
    let values = items(attribute, "AttributeValues", "ValueItem");
    if values.is_empty() {
        return None;
    }
    values.iter().map(|v| number(v, "Value")).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn instances_with_tags_nics_and_minute_times() {
        let answer = json!({
            "RequestId": "473469C7-AA6F-4DC5-B3DB-A3DC0DE3C83E",
            "NextToken": "caeba0bbb2be03f84eb48b699f0a****",
            "Instances": {"Instance": [{
                "InstanceId": "i-bp67acfmxazb4ph3xxxx",
                "Status": "Running",
                "CreationTime": "2017-12-10T04:04Z",
                "Cpu": 8,
                "Memory": 16384,
                "Tags": {"Tag": [{"TagKey": "cluster", "TagValue": "c1"}]},
                "NetworkInterfaces": {"NetworkInterface": [
                    {"Type": "Primary", "NetworkInterfaceId": "eni-primary"},
                    {"Type": "Secondary", "NetworkInterfaceId": "eni-addon"}
                ]}
            }]}
        });
        let page = instances_page(&answer).expect("page");
        assert_eq!(
            page.next_token.as_deref(),
            Some("caeba0bbb2be03f84eb48b699f0a****")
        );
        let instance = &page.instances[0];
        assert_eq!(instance.id, "i-bp67acfmxazb4ph3xxxx");
        assert_eq!(instance.secondary_nics, vec!["eni-addon"]);
        assert_eq!(instance.tags.get("cluster").map(String::as_str), Some("c1"));
        assert_eq!(instance.vcpus, Some(8));
        assert_eq!(instance.memory_mib, Some(16384));
        assert_eq!(
            instance.created,
            Some("2017-12-10T04:05:00Z".parse().expect("time"))
        );
        assert_eq!(
            creation_time("2021-04-23T01:37:38Z"),
            Some("2021-04-23T01:37:38Z".parse().expect("time"))
        );
        assert_eq!(creation_time("yesterday"), None);
    }

    #[test]
    fn last_page_and_malformed_answers() {
        let page =
            instances_page(&json!({"Instances": {"Instance": []}, "NextToken": ""})).expect("page");
        assert!(page.instances.is_empty());
        assert_eq!(page.next_token, None);
        assert!(instances_page(&json!({"RequestId": "x"})).is_err());
        assert!(
            instances_page(&json!({"Instances": {"Instance": [{"Status": "Running"}]}})).is_err()
        );
    }

    #[test]
    fn eips_and_their_binding() {
        let answer = json!({"EipAddresses": {"EipAddress": [
            {"AllocationId": "eip-1", "Status": "InUse", "InstanceId": "eni-addon", "InstanceType": "NetworkInterface",
             "Description": "Peerpod External Network EIP", "Tags": {"Tag": [{"Key": "KeyTest", "Value": "ValueTest"}]}},
            {"AllocationId": "eip-2", "Status": "Available", "InstanceId": ""}
        ]}});
        let eips = eips(&answer).expect("eips");
        assert_eq!(
            eips[0].bound_to,
            Some(("eni-addon".into(), "NetworkInterface".into()))
        );
        assert_eq!(eips[0].description, "Peerpod External Network EIP");
        assert_eq!(
            eips[0].tags.get("KeyTest").map(String::as_str),
            Some("ValueTest")
        );
        assert_eq!(eips[1].bound_to, None);
        assert!(eips[1].tags.is_empty());
        assert_eq!(eips[1].status, "Available");
    }

    #[test]
    fn account_attributes_are_numbers_or_unknown() {
        let answer = json!({"AccountAttributeItems": {"AccountAttributeItem": [
            {"AttributeName": "max-postpaid-instance-vcpu-count",
             "AttributeValues": {"ValueItem": [{"Value": "800", "Count": 1}]}},
            {"AttributeName": "used-postpaid-instance-vcpu-count",
             "AttributeValues": {"ValueItem": [{"Value": "10", "ZoneId": "cn-beijing-a"}, {"Value": "6", "ZoneId": "cn-beijing-b"}]}},
            {"AttributeName": "real-name-authentication",
             "AttributeValues": {"ValueItem": [{"Value": "yes"}]}}
        ]}});
        assert_eq!(
            account_attribute(&answer, "max-postpaid-instance-vcpu-count"),
            Some(800)
        );
        assert_eq!(
            account_attribute(&answer, "used-postpaid-instance-vcpu-count"),
            Some(16)
        );
        assert_eq!(account_attribute(&answer, "real-name-authentication"), None);
        assert_eq!(account_attribute(&answer, "max-security-groups"), None);
    }
}
