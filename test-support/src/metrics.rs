//! Samples of a metrics scrape: the Prometheus text format (what kube-apiserver serves) or OpenMetrics text
//! (what prometheus-client encodes, ending in `# EOF`), parsed by nom-openmetrics.
//!
//! A sample is looked up by its exact name as it appears in the text: a counter's `<name>_total`, a
//! histogram's `<name>_bucket`, `<name>_sum` and `<name>_count`.

use std::collections::BTreeMap;

use crate::Error;

/// One sample: its name, labels (values unescaped) and value.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

impl Sample {
    /// The value of label `key`, `""` when the sample has none (as Prometheus treats a missing label).
    pub fn label(&self, key: &str) -> &str {
        self.labels.get(key).map(String::as_str).unwrap_or("")
    }

    /// Whether the sample carries every `(key, value)` of `want`.
    pub fn has_labels(&self, want: &[(&str, &str)]) -> bool {
        want.iter().all(|(k, v)| self.label(k) == *v)
    }
}

/// A parsed scrape.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    samples: Vec<Sample>,
}

impl Scrape {
    /// Parses a whole scrape; any line that is not valid text format is an error (not a silently missing
    /// sample).
    pub fn parse(text: &str) -> Result<Scrape, Error> {
        // Both grammars end every line with a newline; a text cut right after its last value is still whole.
        let owned;
        let text = if text.is_empty() || text.ends_with('\n') {
            text
        } else {
            owned = format!("{text}\n");
            &owned
        };
        let parsed = if text.trim_end().ends_with("# EOF") {
            nom_openmetrics::parser::openmetrics(text)
        } else {
            nom_openmetrics::parser::prometheus(text)
        };
        let families = match parsed {
            Ok((_, families)) => families,
            Err(nom::Err::Error(e) | nom::Err::Failure(e)) => {
                let at = e.errors.first().map_or("", |(rest, _)| *rest);
                return Err(unparsable(text, at));
            }
            Err(nom::Err::Incomplete(_)) => return Err(unparsable(text, "")),
        };
        let samples = families
            .iter()
            .flat_map(|family| &family.samples)
            .map(|s| Sample {
                name: s.name().to_owned(),
                labels: s
                    .labels()
                    .iter()
                    .map(|l| (l.name.to_owned(), l.value.clone()))
                    .collect(),
                value: s.number(),
            })
            .collect();
        Ok(Scrape { samples })
    }

    /// Every sample named `name`.
    pub fn samples<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// Sum of the samples named `name` that carry every `(key, value)` of `want`; zero when there are none.
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.samples(name)
            .filter(|s| s.has_labels(want))
            .map(|s| s.value)
            .sum()
    }
}

/// The error for a text that does not parse at `rest` (a suffix of `text`): its line number and that line.
fn unparsable(text: &str, rest: &str) -> Error {
    let offset = text.len().saturating_sub(rest.len());
    let line = text[..offset].matches('\n').count() + 1;
    Error::MetricsText {
        line,
        text: rest
            .lines()
            .next()
            .unwrap_or("")
            .chars()
            .take(200)
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kube-apiserver's format (Prometheus text 0.0.4).
    const APISERVER: &str = r#"# HELP apiserver_request_total [STABLE] Counter of apiserver requests.
# TYPE apiserver_request_total counter
apiserver_request_total{code="201",resource="nodes",subresource="",verb="PATCH"} 12
apiserver_request_total{code="200",resource="nodes",subresource="status",verb="PATCH"} 3
apiserver_request_total{code="200",resource="nodes",subresource="",verb="GET"} 7
apiserver_request_total{code="200",resource="a\"b,} \\ \n",verb="PATCH"} 1.5
# HELP apiserver_request_total_other Another metric whose name starts the same.
# TYPE apiserver_request_total_other gauge
apiserver_request_total_other 99
# HELP apiserver_request_duration_seconds [STABLE] Response latency.
# TYPE apiserver_request_duration_seconds histogram
apiserver_request_duration_seconds_bucket{verb="GET",le="0.05"} 4
apiserver_request_duration_seconds_bucket{verb="GET",le="+Inf"} 6
apiserver_request_duration_seconds_sum{verb="GET"} 0.25
apiserver_request_duration_seconds_count{verb="GET"} 6
"#;

    /// prometheus-client's format (OpenMetrics text), with a counter's `_total` sample and a histogram.
    fn openmetrics() -> String {
        use prometheus_client::metrics::counter::Counter;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::histogram::Histogram;
        let mut registry = prometheus_client::registry::Registry::default();
        let calls = Family::<Vec<(String, String)>, Counter>::default();
        registry.register("calls", "Calls \"made\".", calls.clone());
        calls
            .get_or_create(&vec![
                ("method".into(), "DeleteInstance".into()),
                ("provider".into(), "li\"b,virt}".into()),
            ])
            .inc_by(2);
        calls
            .get_or_create(&vec![
                ("method".into(), "GetCapacity".into()),
                ("provider".into(), "aws".into()),
            ])
            .inc();
        let release = Histogram::new([0.1, 1.0]);
        release.observe(0.5);
        release.observe(3.0);
        registry.register("release_seconds", "Release time.", release);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encode");
        text
    }

    #[test]
    fn labels_with_escapes_are_unescaped() {
        let scrape = Scrape::parse(APISERVER).expect("parses");
        let escaped: Vec<_> = scrape
            .samples("apiserver_request_total")
            .filter(|s| s.label("code") == "200" && s.label("verb") == "PATCH")
            .map(|s| s.label("resource"))
            .collect();
        assert_eq!(escaped, ["nodes", "a\"b,} \\ \n"]);
        assert_eq!(
            scrape.sum("apiserver_request_total", &[("resource", "a\"b,} \\ \n")]),
            1.5
        );

        let scrape = Scrape::parse(&openmetrics()).expect("parses");
        assert_eq!(
            scrape.sum("calls_total", &[("provider", "li\"b,virt}")]),
            2.0
        );
    }

    #[test]
    fn sums_by_exact_name_and_labels() {
        let scrape = Scrape::parse(APISERVER).expect("parses");
        assert_eq!(scrape.samples("apiserver_request_total").count(), 4);
        assert_eq!(
            scrape.sum("apiserver_request_total", &[("verb", "PATCH")]),
            16.5
        );
        assert_eq!(
            scrape.sum(
                "apiserver_request_total",
                &[("verb", "PATCH"), ("resource", "nodes")]
            ),
            15.0
        );
        // A missing label matches the empty value, as in Prometheus.
        assert_eq!(
            scrape.sum(
                "apiserver_request_total",
                &[("resource", "nodes"), ("subresource", "")]
            ),
            19.0
        );
        assert_eq!(scrape.sum("apiserver_request_total_other", &[]), 99.0);

        let scrape = Scrape::parse(&openmetrics()).expect("parses");
        assert_eq!(scrape.sum("calls_total", &[]), 3.0);
        assert_eq!(scrape.sum("calls_total", &[("method", "GetCapacity")]), 1.0);
        assert_eq!(
            scrape.samples("calls").count(),
            0,
            "the sample is calls_total"
        );
    }

    #[test]
    fn histogram_buckets_sum_and_count() {
        let scrape = Scrape::parse(APISERVER).expect("parses");
        let name = "apiserver_request_duration_seconds";
        let buckets: Vec<_> = scrape
            .samples(&format!("{name}_bucket"))
            .map(|s| (s.label("le").to_owned(), s.value))
            .collect();
        assert_eq!(buckets, [("0.05".into(), 4.0), ("+Inf".into(), 6.0)]);
        assert_eq!(scrape.sum(&format!("{name}_sum"), &[("verb", "GET")]), 0.25);
        assert_eq!(scrape.sum(&format!("{name}_count"), &[]), 6.0);

        let scrape = Scrape::parse(&openmetrics()).expect("parses");
        assert_eq!(scrape.sum("release_seconds_count", &[]), 2.0);
        assert_eq!(scrape.sum("release_seconds_sum", &[]), 3.5);
        assert_eq!(scrape.sum("release_seconds_bucket", &[("le", "1.0")]), 1.0);
        assert_eq!(scrape.sum("release_seconds_bucket", &[("le", "+Inf")]), 2.0);
    }

    #[test]
    fn a_missing_metric_has_no_samples() {
        for text in [APISERVER.to_owned(), openmetrics(), String::new()] {
            let scrape = Scrape::parse(&text).expect("parses");
            assert_eq!(scrape.samples("peerpod_ctrl_reconciles_total").count(), 0);
            assert_eq!(scrape.sum("peerpod_ctrl_reconciles_total", &[]), 0.0);
        }
    }

    #[test]
    fn a_text_cut_after_its_last_value_parses() {
        let scrape = Scrape::parse("up 1\nup_total{a=\"x\"} 2").expect("parses");
        assert_eq!(scrape.sum("up_total", &[("a", "x")]), 2.0);
    }

    #[test]
    fn a_broken_line_is_an_error_naming_it() {
        let text = "ok 1\nbroken{a=\"unterminated} 2\nlater 3\n";
        let err = Scrape::parse(text).expect_err("refused");
        assert!(
            matches!(&err, Error::MetricsText { line: 2, text } if text.starts_with("broken")),
            "{err:?}"
        );
    }
}
