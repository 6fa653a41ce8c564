//! The part of Compute Engine's list `filter` syntax the backend sends: label equalities,
//! each in parentheses, ANDed by juxtaposition: `(labels.a = "x") (labels.b = "y")`. A single
//! expression may go without parentheses. Anything else is refused as an invalid filter.

/// The `(key, value)` pairs of a label filter; `Err` for any other expression.
pub fn labels(filter: &str) -> Result<Vec<(String, String)>, ()> {
    let filter = filter.trim();
    if filter.is_empty() {
        return Ok(Vec::new());
    }
    if !filter.starts_with('(') {
        return Ok(vec![equality(filter)?]);
    }
    let mut pairs = Vec::new();
    let mut rest = filter;
    while !rest.is_empty() {
        let inner = rest.strip_prefix('(').ok_or(())?;
        let end = inner.find(')').ok_or(())?;
        pairs.push(equality(&inner[..end])?);
        rest = inner[end + 1..].trim_start();
    }
    Ok(pairs)
}

/// `labels.KEY = "VALUE"` (the value may also go unquoted).
fn equality(expression: &str) -> Result<(String, String), ()> {
    let (left, right) = expression.split_once('=').ok_or(())?;
    let key = left.trim().strip_prefix("labels.").ok_or(())?;
    let right = right.trim();
    let value = right
        .strip_prefix('"')
        .and_then(|v| v.strip_suffix('"'))
        .unwrap_or(right);
    let valid = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
    };
    if valid(key) && valid(value) {
        Ok((key.to_owned(), value.to_owned()))
    } else {
        Err(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_label_equalities() {
        assert_eq!(
            labels("(labels.cluster = \"blue\") (labels.owner = \"caa\")"),
            Ok(vec![
                ("cluster".into(), "blue".into()),
                ("owner".into(), "caa".into())
            ])
        );
        assert_eq!(
            labels("labels.cluster = blue"),
            Ok(vec![("cluster".into(), "blue".into())])
        );
        assert_eq!(labels(""), Ok(vec![]));
    }

    #[test]
    fn refuses_anything_else() {
        assert_eq!(labels("name != x"), Err(()));
        assert_eq!(labels("(labels.cluster = \"blue\""), Err(()));
        assert_eq!(labels("(labels.Cluster = \"blue\")"), Err(()));
    }
}
