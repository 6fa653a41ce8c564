//! VPC instances and their user tags from one query to IBM Cloud's Global Search API
//! (`POST /v3/resources/search`, IBM's Go SDK `globalsearchv2`), instead of one Global Tagging
//! call per instance.
//!
//! The query is Lucene: `family:is AND type:instance AND region:<region>*`, plus
//! `tags:"<key>:<value>"` for each tag of the selector. The body names the `fields` wanted
//! (`crn` always comes back) and, after the first page, the `search_cursor` the previous page
//! returned; `limit` (a query parameter) is at most 1000. An empty `items` ends the result set
//! (IBM: "An empty array signals the end of the result set"); a page shorter than `limit` does
//! not, since the `timeout` of a search may cut a page short.
//!
//! Global Search is global: the region clause keeps another region's instances out, and the
//! CRN's location (`us-south-1`) is checked again here. The instance id is the CRN's last
//! segment (`crn:v1:bluemix:public:is:<zone>:a/<account>::instance:<id>`, as the VPC API's own
//! `crn` field shows).
//!
//! Global Search is eventually consistent: it indexes what the platform reports, so an instance
//! created (or tagged) moments ago may be missing from the results for a while, and one just
//! deleted may still be listed. Both callers of `ListInstances` absorb that: peerpod-ctrl's
//! reverse scan reports a live PeerPod's VM missing only after it stayed unlisted across two
//! scans at least `REVERSE_GRACE` (default 5 minutes) apart, and the orphan scan deletes only
//! VMs listed, untracked and older than `ORPHAN_GRACE` (default 30 minutes), where a stale,
//! already deleted VM costs one `DeleteInstance` answered by the VPC's 404.

use std::collections::BTreeMap;

use peerpods_provider_core::{Error, ExposeSecret, Instance, TagSelector};
use serde::{Deserialize, Serialize};

use crate::cloud::Cloud;
use crate::{tags, timestamps};

/// Results per page: the API's maximum (its default is 10).
pub const PAGE: u32 = 1000;

/// What each result item carries: `tags` are the user tags as `key:value` strings,
/// `creation_date` the resource's creation time when the index has one.
const FIELDS: [&str; 4] = ["crn", "name", "tags", "creation_date"];

#[derive(Serialize)]
struct SearchBody<'a> {
    query: &'a str,
    fields: &'a [&'a str],
    #[serde(skip_serializing_if = "Option::is_none")]
    search_cursor: Option<&'a str>,
}

#[derive(Deserialize)]
struct ScanResult {
    #[serde(default)]
    search_cursor: Option<String>,
    #[serde(default)]
    items: Vec<ResultItem>,
}

#[derive(Deserialize)]
struct ResultItem {
    crn: String,
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    creation_date: Option<String>,
}

/// A phrase of a Lucene query, quoted, with `\` and `"` escaped.
fn phrase(text: &str) -> String {
    let mut quoted = String::with_capacity(text.len() + 2);
    quoted.push('"');
    for c in text.chars() {
        if c == '"' || c == '\\' {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

/// The Lucene query of the region's VPC instances carrying every tag of `selector`.
pub fn query(region: &str, selector: &TagSelector) -> String {
    // The region keeps its wildcard: IBM's examples search VPC instances by `region:us-east*`
    // since their location is a zone (`us-east-1`); the CRN check below is exact.
    let mut query = format!("family:is AND type:instance AND region:{region}*");
    for (key, value) in selector {
        query.push_str(" AND tags:");
        query.push_str(&phrase(&format!("{key}:{value}")));
    }
    query
}

/// The VPC instance id a CRN names when it is an instance of `region`, else `None`.
pub fn instance_of_region<'a>(crn: &'a str, region: &str) -> Option<&'a str> {
    // crn:v1:<cname>:<ctype>:<service>:<location>:<scope>:<service-instance>:<type>:<resource>
    let segments: Vec<&str> = crn.split(':').collect();
    let ["crn", "v1", _, _, "is", location, _, _, "instance", id] = segments.as_slice() else {
        return None;
    };
    let in_region = *location == region
        || location
            .strip_prefix(region)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()));
    // Not held to `instance_id::vpc_problem`: an instance of another id shape (the VPC API's own
    // examples have bare UUIDs) still exists, and the reverse scan must see it listed.
    (in_region && !id.is_empty()).then_some(*id)
}

/// The region's VPC instances carrying every tag of `selector`, ordered by id: one search
/// request per page.
pub async fn instances(
    cloud: &Cloud,
    search_url: &str,
    region: &str,
    selector: &TagSelector,
) -> Result<Vec<Instance>, Error> {
    const WHAT: &str = "searching the region's instances";
    let url = format!("{search_url}/v3/resources/search");
    let query = query(region, selector);
    let mut found: BTreeMap<String, Instance> = BTreeMap::new();
    let mut cursor: Option<String> = None;
    loop {
        let body = serde_json::to_string(&SearchBody {
            query: &query,
            fields: &FIELDS,
            search_cursor: cursor.as_deref(),
        })
        .map_err(|e| Error::internal(format!("{WHAT}: {e}")).with_source(e))?;
        let answer = cloud
            .call("SearchResources", WHAT, |client, token| {
                client
                    .post(&url)
                    .bearer_auth(token.bearer.expose_secret())
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .header(reqwest::header::ACCEPT, "application/json")
                    .query(&[("limit", PAGE)])
                    .body(body.clone())
            })
            .await?;
        if answer.is_gone() {
            return Err(answer.into_error(WHAT, &cloud.http));
        }
        let page: ScanResult = answer.json(WHAT)?;
        if page.items.is_empty() {
            return Ok(found.into_values().collect());
        }
        for item in page.items {
            let Some(id) = instance_of_region(&item.crn, region) else {
                tracing::debug!(crn = item.crn, region, "search result outside the region");
                continue;
            };
            let listed = Instance {
                id: id.to_owned(),
                created: item.creation_date.as_deref().and_then(timestamps::parse),
                tags: item.tags.iter().map(|t| tags::split_tag(t)).collect(),
                name: String::new(),
            };
            // Lucene matching is the index's; the selector is applied exactly here too.
            if listed.matches(selector) {
                found.insert(listed.id.clone(), listed);
            }
        }
        match page.search_cursor {
            Some(next) if !next.is_empty() => cursor = Some(next),
            // IBM omits the cursor only when no item came back; without one there is no next page.
            _ => return Ok(found.into_values().collect()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_query_names_the_region_and_every_tag_as_a_phrase() {
        let selector: TagSelector = [
            ("coco-pod-vm".to_owned(), "c1".to_owned()),
            ("odd".to_owned(), r#"a"b\c"#.to_owned()),
        ]
        .into_iter()
        .collect();
        assert_eq!(
            query("us-south", &selector),
            r#"family:is AND type:instance AND region:us-south* AND tags:"coco-pod-vm:c1" AND tags:"odd:a\"b\\c""#
        );
        assert_eq!(
            query("eu-de", &TagSelector::new()),
            "family:is AND type:instance AND region:eu-de*"
        );
    }

    #[test]
    fn instance_ids_are_the_last_segment_of_the_regions_instance_crns() {
        let crn = "crn:v1:bluemix:public:is:us-south-1:a/aa2432b1fa4d4ace891e9b80fc104e34::instance:0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0";
        assert_eq!(
            instance_of_region(crn, "us-south"),
            Some("0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0")
        );
        assert_eq!(instance_of_region(crn, "us-east"), None, "another region");
        assert_eq!(instance_of_region(crn, "us"), None, "a prefix is no region");
        let floating_ip = crn.replace("::instance:", "::floating-ip:");
        assert_eq!(instance_of_region(&floating_ip, "us-south"), None);
        let power =
            "crn:v1:bluemix:public:power-iaas:dal10:a/x:7e0ba4c4-4d5e-4b3b-9c5e-0d1e2f3a4b5c::";
        assert_eq!(instance_of_region(power, "us-south"), None);
        assert_eq!(
            instance_of_region(
                "crn:v1:bluemix:public:is:us-south-1:a/x::instance:",
                "us-south"
            ),
            None
        );
    }

    #[test]
    fn the_sdks_scan_result_shape_parses() {
        // The Search mock answer of IBM's Go SDK (`globalsearchv2/global_search_v2_test.go`).
        let page: ScanResult = serde_json::from_str(
            r#"{"search_cursor": "SearchCursor", "limit": 5, "items": [{"crn": "CRN"}]}"#,
        )
        .expect("scan result");
        assert_eq!(page.search_cursor.as_deref(), Some("SearchCursor"));
        assert_eq!(page.items.len(), 1);
        assert!(page.items[0].tags.is_empty());
        let end: ScanResult = serde_json::from_str(r#"{"limit": 5, "items": []}"#).expect("end");
        assert!(end.search_cursor.is_none() && end.items.is_empty());
    }
}
