//! Pure figures: percentiles of latencies, samples of the Prometheus text format, `/proc/<pid>/status` fields.

use std::collections::BTreeMap;
use std::time::Duration;

/// The `p`-th percentile (0 < p <= 100) by nearest rank of `sorted` (ascending); zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// One sample of a Prometheus text exposition: its labels and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// Every sample of metric `name` (exact name, e.g. `apiserver_request_total`) in `text`.
// Hand-written: the text format is a few lines of grammar here, and prometheus-client only encodes it.
pub fn samples(text: &str, name: &str) -> Vec<Sample> {
    text.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = if let Some(rest) = rest.strip_prefix('{') {
                let end = label_block_end(rest)?;
                (parse_labels(&rest[..end]), rest[end + 1..].trim())
            } else if rest.starts_with(' ') {
                (BTreeMap::new(), rest.trim())
            } else {
                return None; // another metric whose name starts with `name`
            };
            let value = value.split_whitespace().next()?.parse().ok()?;
            Some(Sample { labels, value })
        })
        .collect()
}

/// Sum of the samples of `name` whose labels include every `(key, value)` of `want`.
pub fn sum(text: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    samples(text, name)
        .iter()
        .filter(|s| {
            want.iter()
                .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|s| s.value)
        .sum()
}

/// Index of the `}` closing a label block (skipping quoted values with escapes).
fn label_block_end(block: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in block.char_indices() {
        match (quoted, escaped, c) {
            (true, true, _) => escaped = false,
            (true, false, '\\') => escaped = true,
            (_, false, '"') => quoted = !quoted,
            (false, _, '}') => return Some(i),
            _ => {}
        }
    }
    None
}

fn parse_labels(block: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = block;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let Some(after) = rest[eq + 1..].strip_prefix('"') else {
            break;
        };
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, other)) => value.push(other),
                    None => {}
                },
                '"' => {
                    end = i + 1;
                    break;
                }
                other => value.push(other),
            }
        }
        labels.insert(key, value);
        rest = &after[end..];
    }
    labels
}

/// `VmHWM` (peak resident set size) in KiB from the text of `/proc/<pid>/status`.
pub fn peak_rss_kib(status: &str) -> Option<u64> {
    status_kib(status, "VmHWM:")
}

/// `VmRSS` (resident set size now) in KiB from the text of `/proc/<pid>/status`.
pub fn rss_kib(status: &str) -> Option<u64> {
    status_kib(status, "VmRSS:")
}

fn status_kib(status: &str, field: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(field)?;
        value.split_whitespace().next()?.parse().ok()
    })
}

/// Whether capacity values (one per selected node, `None` when missing) are a spread of `total`: every node has
/// one, they sum to `total` and differ by at most one.
pub fn is_spread_of(values: &[Option<u32>], total: u32) -> bool {
    let Some(values) = values.iter().copied().collect::<Option<Vec<u32>>>() else {
        return false;
    };
    let (Some(min), Some(max)) = (values.iter().min(), values.iter().max()) else {
        return total == 0;
    };
    values.iter().map(|v| u64::from(*v)).sum::<u64>() == u64::from(total) && max - min <= 1
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: &[u64]) -> Vec<Duration> {
        v.iter().map(|m| Duration::from_millis(*m)).collect()
    }

    #[test]
    fn nearest_rank_percentiles() {
        let sorted = ms(&(1..=100).collect::<Vec<_>>());
        assert_eq!(percentile(&sorted, 50.0), Duration::from_millis(50));
        assert_eq!(percentile(&sorted, 99.0), Duration::from_millis(99));
        assert_eq!(percentile(&sorted, 100.0), Duration::from_millis(100));
        assert_eq!(percentile(&ms(&[7]), 99.0), Duration::from_millis(7));
        assert_eq!(percentile(&[], 50.0), Duration::ZERO);
        assert_eq!(percentile(&ms(&[1, 2, 3]), 1.0), Duration::from_millis(1));
    }

    #[test]
    fn prometheus_samples_with_labels_and_escapes() {
        let text = "# HELP x help\n# TYPE x counter\n\
            apiserver_request_total{code=\"201\",resource=\"nodes\",verb=\"PATCH\"} 12\n\
            apiserver_request_total{code=\"200\",resource=\"nodes\",verb=\"GET\"} 3\n\
            apiserver_request_total_other 99\n\
            apiserver_request_total{resource=\"a\\\"b,}\",verb=\"PATCH\"} 1.5\n\
            plain 4\n";
        let all = samples(text, "apiserver_request_total");
        assert_eq!(all.len(), 3);
        assert_eq!(all[2].labels["resource"], "a\"b,}");
        assert_eq!(
            sum(text, "apiserver_request_total", &[("verb", "PATCH")]),
            13.5
        );
        assert_eq!(
            sum(
                text,
                "apiserver_request_total",
                &[("verb", "PATCH"), ("resource", "nodes")]
            ),
            12.0
        );
        assert_eq!(sum(text, "plain", &[]), 4.0);
        assert_eq!(sum(text, "missing", &[]), 0.0);
    }

    #[test]
    fn peak_rss_from_proc_status() {
        let status =
            "Name:\tpeerpod-ctrl\nVmPeak:\t  123 kB\nVmHWM:\t   45678 kB\nVmRSS:\t 40000 kB\n";
        assert_eq!(peak_rss_kib(status), Some(45678));
        assert_eq!(peak_rss_kib("Name:\tx\n"), None);
    }

    #[test]
    fn spread_check() {
        assert!(is_spread_of(&[Some(3), Some(2), Some(3)], 8));
        assert!(!is_spread_of(&[Some(4), Some(2), Some(2)], 8), "uneven");
        assert!(
            !is_spread_of(&[Some(3), None, Some(3)], 6),
            "a node without a value"
        );
        assert!(!is_spread_of(&[Some(3), Some(3)], 7), "wrong sum");
        assert!(is_spread_of(&[], 0));
        assert!(!is_spread_of(&[], 1));
    }
}
