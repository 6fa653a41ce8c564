//! Facts to text. Pure: the same facts and the same `now` give the same text, rows sorted, times shown as
//! ages relative to `now` (as kubectl does), so the output can be compared with a checked-in file.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use comfy_table::{Table, presets};
use jiff::Timestamp;

use crate::facts::{self, Facts, Finding, FindingKind, PeerPodFacts, Place};

/// How the text is dressed: colour only for a terminal.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Style {
    pub colour: bool,
}

impl Style {
    fn heading(self, text: &str, warn: bool) -> String {
        if !self.colour {
            return text.to_string();
        }
        let style = if warn {
            anstyle::Style::new()
                .bold()
                .fg_color(Some(anstyle::AnsiColor::Red.into()))
        } else {
            anstyle::Style::new().bold()
        };
        format!("{style}{text}{style:#}")
    }
}

/// `kubectl peerpods status`: counts per provider, then every PeerPod or VM that needs a look, then capacity.
pub fn status(facts: &Facts, now: Timestamp, style: Style) -> String {
    let findings = facts::findings(&facts.scan_events, &facts.peerpods);
    let mut peerpods: Vec<&PeerPodFacts> = facts.peerpods.iter().collect();
    peerpods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));

    let mut counts: BTreeMap<&str, Counts> = BTreeMap::new();
    for pp in &peerpods {
        counts
            .entry(&pp.provider)
            .or_default()
            .add(facts::place(pp));
    }
    for finding in &findings {
        let c = counts.entry(&finding.provider).or_default();
        match finding.kind {
            FindingKind::Orphan => c.orphans += 1,
            FindingKind::Adoptable => c.adoptable += 1,
        }
    }

    let mut out = String::new();
    section(&mut out, style, "Providers", counts.len(), false);
    if !counts.is_empty() {
        let mut table = table([
            "PROVIDER",
            "LIVE",
            "TERMINATING",
            "DELETING",
            "STUCK",
            "REVERSE ORPHANS",
            "ORPHANS",
            "ADOPTABLE",
        ]);
        for (provider, c) in &counts {
            table.add_row([
                provider.to_string(),
                c.live.to_string(),
                c.terminating.to_string(),
                c.in_progress.to_string(),
                c.stuck.to_string(),
                c.reverse_orphans.to_string(),
                c.orphans.to_string(),
                c.adoptable.to_string(),
            ]);
        }
        push_table(&mut out, &table);
    }

    let places = [
        (Place::Stuck, "Stuck deletes", true),
        (Place::InProgress, "Deletes in progress", false),
        (Place::Terminating, "Terminating", false),
        (
            Place::ReverseOrphan,
            "Reverse orphans (VM gone, PeerPod live)",
            true,
        ),
    ];
    for (place, title, warn) in places {
        let rows: Vec<&&PeerPodFacts> = peerpods
            .iter()
            .filter(|pp| facts::place(pp) == place)
            .collect();
        out.push('\n');
        section(&mut out, style, title, rows.len(), warn && !rows.is_empty());
        if rows.is_empty() {
            continue;
        }
        let mut table = table([
            "PEERPOD", "PROVIDER", "INSTANCE", "STATE", "REASON", "SINCE",
        ]);
        for pp in rows {
            table.add_row([
                format!("{}/{}", pp.namespace, pp.name),
                pp.provider.clone(),
                pp.instance_id.clone(),
                format!("{:?}", pp.state),
                pp.reason.clone().unwrap_or_default(),
                age(now, pp.since()),
            ]);
        }
        push_table(&mut out, &table);
    }

    out.push('\n');
    orphans_section(&mut out, &findings, now, style, false);

    out.push('\n');
    section(
        &mut out,
        style,
        "Capacity (kata.peerpods.io/vm)",
        facts.nodes.len(),
        false,
    );
    if !facts.nodes.is_empty() {
        let mut nodes: Vec<_> = facts.nodes.iter().collect();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        let mut table = table(["NODE", "CAPACITY", "ALLOCATABLE"]);
        for node in nodes {
            table.add_row([
                node.name.clone(),
                node.capacity.clone().unwrap_or_default(),
                node.allocatable.clone().unwrap_or_default(),
            ]);
        }
        push_table(&mut out, &table);
    }
    out
}

/// `kubectl peerpods orphans`: the orphan scan's findings that still stand, with what it said about each.
pub fn orphans(facts: &Facts, now: Timestamp, style: Style) -> String {
    let findings = facts::findings(&facts.scan_events, &facts.peerpods);
    let mut out = String::new();
    orphans_section(&mut out, &findings, now, style, true);
    out
}

/// `kubectl peerpods describe`: one PeerPod's cleanup, its conditions (what provider-service answered is the
/// Cleaned condition's message) and its Events.
pub fn describe(
    pp: &PeerPodFacts,
    events: &[facts::EventFacts],
    now: Timestamp,
    style: Style,
) -> String {
    let mut out = String::new();
    let place = facts::place(pp);
    let mut fields = vec![
        ("PeerPod", format!("{}/{}", pp.namespace, pp.name)),
        ("Provider", pp.provider.clone()),
        ("Instance", pp.instance_id.clone()),
        ("State", format!("{:?}", pp.state)),
        ("Reason", pp.reason.clone().unwrap_or_default()),
        ("Place", place_name(place).to_string()),
    ];
    if pp.deleting_since.is_some() {
        fields.push(("Deleting since", age(now, pp.deleting_since)));
    }
    if pp.waiting_since.is_some() {
        fields.push(("Waiting since", age(now, pp.waiting_since)));
    }
    if pp.last_attempt.is_some() {
        fields.push(("Last attempt", age(now, pp.last_attempt)));
    }
    fields.push(("Finalizers", pp.finalizers.join(", ")));
    let width = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0) + 1;
    for (key, value) in fields {
        let _ = writeln!(out, "{:width$} {value}", format!("{key}:"));
    }

    out.push('\n');
    section(&mut out, style, "Conditions", pp.conditions.len(), false);
    if !pp.conditions.is_empty() {
        let mut conditions: Vec<_> = pp.conditions.iter().collect();
        conditions.sort_by(|a, b| a.type_.cmp(&b.type_));
        let mut table = table(["TYPE", "STATUS", "REASON", "SINCE", "MESSAGE"]);
        for c in conditions {
            table.add_row([
                c.type_.clone(),
                c.status.clone(),
                c.reason.clone(),
                age(now, c.since),
                c.message.clone(),
            ]);
        }
        push_table(&mut out, &table);
    }

    out.push('\n');
    section(&mut out, style, "Events", events.len(), false);
    if !events.is_empty() {
        let mut events: Vec<_> = events.iter().collect();
        events.sort_by(|a, b| (a.time, &a.reason).cmp(&(b.time, &b.reason)));
        let mut table = table(["TYPE", "REASON", "AGE", "COUNT", "MESSAGE"]);
        for e in events {
            table.add_row([
                e.type_.clone(),
                e.reason.clone(),
                age(now, e.time),
                e.count.to_string(),
                e.message.clone(),
            ]);
        }
        push_table(&mut out, &table);
    }
    out
}

fn orphans_section(
    out: &mut String,
    findings: &[Finding],
    now: Timestamp,
    style: Style,
    with_message: bool,
) {
    section(
        out,
        style,
        "Orphan VMs (no PeerPod)",
        findings.len(),
        !findings.is_empty(),
    );
    if findings.is_empty() {
        return;
    }
    let mut header = vec!["PROVIDER", "INSTANCE", "KIND", "LAST REPORTED"];
    if with_message {
        header.push("MESSAGE");
    }
    let mut table = table(header);
    // findings() yields them by provider and instance id already; sorted again so the order is this
    // function's promise, not an accident of the other.
    let mut findings: Vec<_> = findings.iter().collect();
    findings.sort_by(|a, b| (&a.provider, &a.instance_id).cmp(&(&b.provider, &b.instance_id)));
    for f in findings {
        let kind = match f.kind {
            FindingKind::Orphan => "orphan",
            FindingKind::Adoptable => "adoptable",
        };
        let mut row = vec![
            f.provider.clone(),
            f.instance_id.clone(),
            kind.to_string(),
            age(now, f.last_reported),
        ];
        if with_message {
            row.push(f.message.clone());
        }
        table.add_row(row);
    }
    push_table(out, &table);
}

#[derive(Default)]
struct Counts {
    live: usize,
    terminating: usize,
    in_progress: usize,
    stuck: usize,
    reverse_orphans: usize,
    orphans: usize,
    adoptable: usize,
}

impl Counts {
    fn add(&mut self, place: Place) {
        match place {
            Place::Live => self.live += 1,
            Place::ReverseOrphan => self.reverse_orphans += 1,
            Place::Terminating => self.terminating += 1,
            Place::InProgress => self.in_progress += 1,
            Place::Stuck => self.stuck += 1,
        }
    }
}

fn place_name(place: Place) -> &'static str {
    match place {
        Place::Live => "live",
        Place::ReverseOrphan => "reverse orphan (the cloud has no VM for it)",
        Place::Terminating => "terminating",
        Place::InProgress => "delete in progress",
        Place::Stuck => "stuck delete",
    }
}

fn section(out: &mut String, style: Style, title: &str, count: usize, warn: bool) {
    let _ = writeln!(
        out,
        "{}",
        style.heading(&format!("{title} ({count})"), warn)
    );
}

/// A borderless table, like kubectl's own.
fn table<I, T>(header: I) -> Table
where
    I: IntoIterator<Item = T>,
    T: Into<comfy_table::Cell>,
{
    let mut table = Table::new();
    table.load_style(presets::NOTHING).set_header(header);
    // kubectl's columns: flush left, three blanks apart.
    for column in table.column_iter_mut() {
        column.set_padding((0, 3));
    }
    table
}

/// The table with its cells' trailing padding trimmed: kubectl's output has none either.
fn push_table(out: &mut String, table: &Table) {
    for line in table.lines() {
        let _ = writeln!(out, "{}", line.trim_end());
    }
}

/// How long ago `then` was, as kubectl shows ages: `45s`, `12m`, `5h`, `3d`; `<unknown>` without a time.
pub fn age(now: Timestamp, then: Option<Timestamp>) -> String {
    let Some(then) = then else {
        return "<unknown>".to_string();
    };
    let secs = now.as_second().saturating_sub(then.as_second()).max(0);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 48 * 3600 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_like_kubectl() {
        let now: Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
        let ago = |secs: i64| age(now, Some(now - jiff::SignedDuration::from_secs(secs)));
        assert_eq!(ago(5), "5s");
        assert_eq!(ago(119), "119s");
        assert_eq!(ago(120), "2m");
        assert_eq!(ago(3 * 3600), "3h");
        assert_eq!(ago(3 * 86400), "3d");
        assert_eq!(ago(-10), "0s");
        assert_eq!(age(now, None), "<unknown>");
    }

    #[test]
    fn colour_only_when_asked() {
        let now: Timestamp = "2026-01-02T00:00:00Z".parse().unwrap();
        let plain = status(&Facts::default(), now, Style::default());
        assert!(!plain.contains('\u{1b}'));
        let coloured = status(&Facts::default(), now, Style { colour: true });
        assert!(coloured.contains('\u{1b}'));
    }
}
