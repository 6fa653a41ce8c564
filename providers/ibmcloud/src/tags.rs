//! User tags of a resource, read from the Global Tagging API (`GET /v3/tags?attached_to=<crn>`).
//! IBM tags are plain strings; `key:value` (how cloud-api-adaptor writes `coco-pod-vm:<cluster>`)
//! is read as that key and value, a tag without `:` as the key with an empty value.

use std::collections::BTreeMap;

use peerpods_provider_core::Error;
use serde::Deserialize;

use crate::cloud::Cloud;

/// Tags fetched per page; the API allows up to 1000.
const PAGE: usize = 1000;

#[derive(Deserialize)]
struct TagList {
    #[serde(default)]
    total_count: Option<usize>,
    #[serde(default)]
    items: Vec<TagItem>,
}

#[derive(Deserialize)]
struct TagItem {
    name: String,
}

/// One tag string as a key and value.
pub fn split_tag(tag: &str) -> (String, String) {
    match tag.split_once(':') {
        Some((key, value)) => (key.to_owned(), value.to_owned()),
        None => (tag.to_owned(), String::new()),
    }
}

/// The user tags attached to the resource `crn`.
pub async fn user_tags(
    cloud: &Cloud,
    tagging_url: &str,
    crn: &str,
) -> Result<BTreeMap<String, String>, Error> {
    let url = format!("{tagging_url}/v3/tags");
    let mut tags = BTreeMap::new();
    let mut offset = 0usize;
    loop {
        let answer = cloud
            .call(
                "ListTags",
                "listing the tags of an instance",
                |client, token| {
                    client
                        .get(&url)
                        .bearer_auth(peerpods_provider_core::ExposeSecret::expose_secret(
                            &token.bearer,
                        ))
                        .query(&[
                            ("attached_to", crn),
                            ("tag_type", "user"),
                            ("offset", &offset.to_string()),
                            ("limit", &PAGE.to_string()),
                        ])
                },
            )
            .await?;
        if answer.is_gone() {
            return Err(answer.into_error("listing the tags of an instance", &cloud.http));
        }
        let page: TagList = answer.json("listing the tags of an instance")?;
        let count = page.items.len();
        tags.extend(page.items.iter().map(|item| split_tag(&item.name)));
        offset += count;
        if count == 0 || page.total_count.is_none_or(|total| offset >= total) {
            return Ok(tags);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_split_at_the_first_colon() {
        assert_eq!(
            split_tag("coco-pod-vm:cluster-1"),
            ("coco-pod-vm".into(), "cluster-1".into())
        );
        assert_eq!(split_tag("a:b:c"), ("a".into(), "b:c".into()));
        assert_eq!(split_tag("plain"), ("plain".into(), String::new()));
    }
}
