//! Pure figures: percentiles of latencies, `/proc/<pid>/status` fields, spreads. (Metrics scrapes are read with
//! `test_support::metrics`.)

use std::time::Duration;

/// The `p`-th percentile (0 < p <= 100) by nearest rank of `sorted` (ascending); zero when empty.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
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
