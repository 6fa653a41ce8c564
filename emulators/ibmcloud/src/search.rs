//! IBM Cloud's Global Search API, `POST /v3/resources/search` (IBM's Go SDK `globalsearchv2`,
//! API version 2.0.1): query parameter `limit` (1 to 1000, default 10), JSON body `query` (Lucene,
//! default `*`), `fields` (default `account_id`, `name`, `type`, `family`, `crn`; `crn` always
//! comes back; `*` for all) and `search_cursor`. The answer is a `ScanResult`:
//! `{"search_cursor", "limit", "items": [{"crn", ...fields}]}`; each call returns the cursor to
//! send on the next one, and an empty `items` (without `search_cursor`) ends the result set.
//!
//! The emulator understands the Lucene subset a client needs: `*`, or clauses joined by `AND`
//! (optionally in parentheses), each `field:value`, `field:"a phrase"` (with `\"` and `\\`
//! escapes) or `field:prefix*`, on the fields `crn`, `name`, `family`, `type`, `region`,
//! `tags` and `account_id`. Anything else answers 400, so a client can not silently rely on
//! what the emulator does not check.

use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use crate::common::ACCOUNT_ID;

/// The largest `limit` the API takes.
pub const MAX_LIMIT: usize = 1000;
const DEFAULT_LIMIT: usize = 10;
const DEFAULT_FIELDS: [&str; 5] = ["account_id", "name", "type", "family", "crn"];

/// One indexed resource.
#[derive(Clone, Debug)]
pub struct Document {
    pub crn: String,
    pub name: String,
    pub family: String,
    /// The `type` field.
    pub kind: String,
    pub region: String,
    /// User tags as the tagging API stores them (`key:value`).
    pub tags: Vec<String>,
    pub creation_date: Option<String>,
}

impl Document {
    fn field(&self, name: &str) -> Option<Value> {
        Some(match name {
            "crn" => json!(self.crn),
            "name" => json!(self.name),
            "family" => json!(self.family),
            "type" => json!(self.kind),
            "region" => json!(self.region),
            "tags" => json!(self.tags),
            "account_id" => json!(ACCOUNT_ID),
            "creation_date" => json!(self.creation_date.as_ref()?),
            _ => return None,
        })
    }

    fn values(&self, field: &str) -> Vec<String> {
        match field {
            "tags" => self.tags.clone(),
            "crn" => vec![self.crn.clone()],
            "name" => vec![self.name.clone()],
            "family" => vec![self.family.clone()],
            "type" => vec![self.kind.clone()],
            "region" => vec![self.region.clone()],
            "account_id" => vec![ACCOUNT_ID.to_owned()],
            _ => Vec::new(),
        }
    }
}

/// The region of a VPC zone (`us-south-1` → `us-south`).
pub fn region_of_zone(zone: &str) -> String {
    match zone.rsplit_once('-') {
        Some((region, n)) if n.chars().all(|c| c.is_ascii_digit()) => region.to_owned(),
        _ => zone.to_owned(),
    }
}

/// `PEERPODS_EMULATOR_SEARCH_LAG_SECS`: Global Search's indexing lag (default none).
pub fn lag_from_env() -> std::time::Duration {
    std::env::var("PEERPODS_EMULATOR_SEARCH_LAG_SECS")
        .ok()
        .and_then(|v| v.parse::<f64>().ok())
        .filter(|secs| secs.is_finite() && *secs >= 0.0)
        .map(std::time::Duration::from_secs_f64)
        .unwrap_or_default()
}

/// One `field:value` clause.
#[derive(Debug, PartialEq, Eq)]
struct Clause {
    field: String,
    value: String,
    prefix: bool,
}

impl Clause {
    fn matches(&self, document: &Document) -> bool {
        document.values(&self.field).iter().any(|v| {
            if self.prefix {
                v.starts_with(&self.value)
            } else {
                *v == self.value
            }
        })
    }
}

/// The query's clauses (empty for `*`), or why the emulator does not take it.
fn parse(query: &str) -> Result<Vec<Clause>, String> {
    let text = query.trim();
    if text == "*" || text.is_empty() {
        return Ok(Vec::new());
    }
    let mut parts = Vec::new();
    let mut current = String::new();
    let mut quoted = false;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if quoted => {
                current.push(c);
                if let Some(next) = chars.next() {
                    current.push(next);
                }
            }
            '"' => {
                quoted = !quoted;
                current.push(c);
            }
            ' ' if !quoted => {
                if !current.is_empty() {
                    parts.push(std::mem::take(&mut current));
                }
            }
            _ => current.push(c),
        }
    }
    if quoted {
        return Err(format!("unterminated phrase in query {query:?}"));
    }
    if !current.is_empty() {
        parts.push(current);
    }
    let mut clauses = Vec::new();
    for (n, part) in parts.iter().enumerate() {
        if n % 2 == 1 {
            if part != "AND" {
                return Err(format!(
                    "the emulator takes only clauses joined by AND, got {part:?} in {query:?}"
                ));
            }
            continue;
        }
        // Parentheses around the whole query or a clause group nothing else here.
        let text = part.trim_start_matches('(').trim_end_matches(')');
        clauses.push(clause(text).ok_or_else(|| format!("unsupported clause {part:?}"))?);
    }
    if parts.len() % 2 == 0 {
        return Err(format!("query {query:?} ends with an operator"));
    }
    Ok(clauses)
}

fn clause(text: &str) -> Option<Clause> {
    let (field, value) = text.split_once(':')?;
    if !matches!(
        field,
        "crn" | "name" | "family" | "type" | "region" | "tags" | "account_id"
    ) {
        return None;
    }
    if let Some(inner) = value.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        let mut unescaped = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            unescaped.push(if c == '\\' { chars.next()? } else { c });
        }
        return Some(Clause {
            field: field.to_owned(),
            value: unescaped,
            prefix: false,
        });
    }
    if value.is_empty() || value.contains(['"', '\\', '?']) {
        return None;
    }
    let (value, prefix) = match value.strip_suffix('*') {
        Some(stem) => (stem, true),
        None => (value, false),
    };
    (!value.contains('*')).then(|| Clause {
        field: field.to_owned(),
        value: value.to_owned(),
        prefix,
    })
}

/// Live cursors: where each one stands in which query.
#[derive(Default)]
pub struct Cursors {
    seq: u64,
    open: BTreeMap<String, (String, String)>,
}

/// The answer to one search request over `documents`, or the reason for a 400.
pub fn answer(
    cursors: &mut Cursors,
    documents: &[Document],
    query: &BTreeMap<String, String>,
    body: &[u8],
) -> Result<Value, String> {
    let limit = match query.get("limit") {
        None => DEFAULT_LIMIT,
        Some(text) => text
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| format!("limit must be a number from 1 to {MAX_LIMIT}"))?,
    };
    let request: Map<String, Value> = if body.is_empty() {
        Map::new()
    } else {
        serde_json::from_slice(body).map_err(|e| format!("the body is not a JSON object: {e}"))?
    };
    let text = match request.get("query") {
        None => "*".to_owned(),
        Some(Value::String(q)) => q.clone(),
        Some(_) => return Err("query must be a string".into()),
    };
    let fields: Vec<String> = match request.get("fields") {
        None => DEFAULT_FIELDS.iter().map(|f| (*f).to_owned()).collect(),
        Some(Value::Array(list)) => list
            .iter()
            .map(|f| f.as_str().map(str::to_owned))
            .collect::<Option<_>>()
            .ok_or("fields must be strings")?,
        Some(_) => return Err("fields must be an array".into()),
    };
    // A live cursor carries its query and where it stands; a cursor never issued (or already
    // used up) is refused.
    let (text, after) = match request.get("search_cursor") {
        None => (text, String::new()),
        Some(Value::String(cursor)) => cursors
            .open
            .remove(cursor)
            .ok_or_else(|| format!("search_cursor {cursor:?} is not a live cursor"))?,
        Some(_) => return Err("search_cursor must be a string".into()),
    };
    let clauses = parse(&text)?;
    let mut hits: Vec<&Document> = documents
        .iter()
        .filter(|d| d.crn > after && clauses.iter().all(|c| c.matches(d)))
        .collect();
    hits.sort_by(|a, b| a.crn.cmp(&b.crn));
    hits.truncate(limit);
    let items: Vec<Value> = hits
        .iter()
        .map(|d| {
            let mut item = Map::new();
            item.insert("crn".into(), json!(d.crn));
            let all = fields.iter().any(|f| f == "*");
            for name in [
                "account_id",
                "name",
                "type",
                "family",
                "region",
                "tags",
                "creation_date",
            ] {
                if (all || fields.iter().any(|f| f == name))
                    && let Some(value) = d.field(name)
                {
                    item.insert(name.into(), value);
                }
            }
            Value::Object(item)
        })
        .collect();
    let mut page = json!({ "limit": limit, "items": items });
    if let Some(last) = hits.last() {
        cursors.seq += 1;
        let cursor = format!("emulated-cursor-{}", cursors.seq);
        cursors
            .open
            .insert(cursor.clone(), (text, last.crn.clone()));
        page["search_cursor"] = json!(cursor);
    }
    Ok(page)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_and_joined_clauses() {
        let clauses =
            parse(r#"(family:is AND type:instance AND region:us-south* AND tags:"a:b \"c\"")"#)
                .expect("query");
        assert_eq!(clauses.len(), 4);
        assert_eq!(
            clauses[2],
            Clause {
                field: "region".into(),
                value: "us-south".into(),
                prefix: true
            }
        );
        assert_eq!(clauses[3].value, r#"a:b "c""#);
        assert!(parse("*").expect("all").is_empty());
        assert!(parse("family:is OR type:instance").is_err());
        assert!(parse("family:is AND").is_err());
        assert!(parse("colour:red").is_err());
        assert!(parse(r#"tags:"open"#).is_err());
    }

    fn document(crn: &str, tags: &[&str]) -> Document {
        Document {
            crn: crn.into(),
            name: "vm".into(),
            family: "is".into(),
            kind: "instance".into(),
            region: "us-south".into(),
            tags: tags.iter().map(|t| (*t).to_owned()).collect(),
            creation_date: None,
        }
    }

    #[test]
    fn pages_follow_the_cursor_to_an_empty_page() {
        let documents: Vec<Document> = (0..3)
            .map(|n| document(&format!("crn:{n}"), &["k:v"]))
            .collect();
        let mut cursors = Cursors::default();
        let query: BTreeMap<String, String> = [("limit".to_owned(), "2".to_owned())].into();
        let body = br#"{"query":"tags:\"k:v\"","fields":["crn","tags"]}"#;
        let first = answer(&mut cursors, &documents, &query, body).expect("first");
        assert_eq!(first["items"].as_array().map(Vec::len), Some(2));
        assert_eq!(first["items"][0]["tags"], json!(["k:v"]));
        assert!(
            first["items"][0].get("name").is_none(),
            "only the fields asked"
        );
        let cursor = first["search_cursor"].as_str().expect("cursor").to_owned();
        let next = json!({ "search_cursor": cursor }).to_string();
        let second = answer(&mut cursors, &documents, &query, next.as_bytes()).expect("second");
        assert_eq!(second["items"].as_array().map(Vec::len), Some(1));
        let cursor = second["search_cursor"].as_str().expect("cursor").to_owned();
        let next = json!({ "search_cursor": cursor }).to_string();
        let end = answer(&mut cursors, &documents, &query, next.as_bytes()).expect("end");
        assert_eq!(end["items"], json!([]));
        assert!(end.get("search_cursor").is_none());
        assert!(
            answer(&mut cursors, &documents, &query, next.as_bytes()).is_err(),
            "used up"
        );
    }

    #[test]
    fn limits_outside_the_documented_range_are_refused() {
        let mut cursors = Cursors::default();
        for limit in ["0", "1001", "ten"] {
            let query: BTreeMap<String, String> = [("limit".to_owned(), limit.to_owned())].into();
            assert!(answer(&mut cursors, &[], &query, b"{}").is_err(), "{limit}");
        }
        let page = answer(&mut cursors, &[], &BTreeMap::new(), b"").expect("defaults");
        assert_eq!(page["limit"], json!(10));
    }
}
