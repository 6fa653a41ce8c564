//! Listing by label: the server-side filter expression for `instances.list` (pure).
//!
//! Compute Engine labels are lowercase: keys `[a-z][a-z0-9_-]{0,62}`, values `[a-z0-9_-]{0,63}`.
//! A selector pair that cannot be a label goes unfiltered on the server; every answer is also
//! filtered here, so the result is the same either way.

use peerpods_provider_core::TagSelector;

/// The `filter` for instances carrying every label of `selector` that can be a label, e.g.
/// `(labels.cluster = "a") (labels.owner = "caa")`; `None` when there is nothing to filter on.
pub fn filter(selector: &TagSelector) -> Option<String> {
    let expressions: Vec<String> = selector
        .iter()
        .filter(|(key, value)| is_label_key(key) && is_label_value(value))
        .map(|(key, value)| format!("(labels.{key} = \"{value}\")"))
        .collect();
    (!expressions.is_empty()).then(|| expressions.join(" "))
}

fn is_label_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-'
}

fn is_label_key(key: &str) -> bool {
    key.len() <= 63
        && key.starts_with(|c: char| c.is_ascii_lowercase())
        && key.chars().all(is_label_char)
}

fn is_label_value(value: &str) -> bool {
    !value.is_empty() && value.len() <= 63 && value.chars().all(is_label_char)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn selector(pairs: &[(&str, &str)]) -> TagSelector {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn every_label_is_one_anded_expression() {
        assert_eq!(
            filter(&selector(&[("owner", "caa"), ("cluster", "blue-1")])).as_deref(),
            Some("(labels.cluster = \"blue-1\") (labels.owner = \"caa\")")
        );
        assert_eq!(filter(&TagSelector::new()), None);
    }

    #[test]
    fn pairs_that_cannot_be_labels_are_left_to_the_client_side_filter() {
        // Quotes or spaces would break the expression; upper case never matches a label.
        assert_eq!(filter(&selector(&[("Cluster", "a")])), None);
        assert_eq!(filter(&selector(&[("cluster", "a\" OR name = \"x")])), None);
        assert_eq!(
            filter(&selector(&[("peerpods.io/cluster", "a"), ("cluster", "b")])).as_deref(),
            Some("(labels.cluster = \"b\")")
        );
    }
}
